"""The C API headers decide; torch/cuda/um.py's ctypes mirror, the config key list and the
injection gate's function list follow them (build_scripts/c_api.py reads the headers).

um.py is imported with a stand-in ``torch`` module (no torch in the lint venv): at import
it finds no engine, and its binding functions are then run against a recorder.
"""

from __future__ import annotations

import ctypes
import importlib.util
import re
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from build_scripts import c_api, inject_path
from build_scripts.paths import REPO_ROOT

OVERLAY = REPO_ROOT / "c10_overlay"
_CTYPES = {
    "int": ctypes.c_int,
    "long": ctypes.c_long,
    "long long": ctypes.c_longlong,
    "size_t": ctypes.c_size_t,
    "char*": ctypes.c_char_p,
    "const char*": ctypes.c_char_p,
    "void*": ctypes.c_void_p,
    "const void*": ctypes.c_void_p,
    "uint64_t": ctypes.c_uint64,
}


@pytest.fixture(scope="module")
def um(tmp_path_factory: pytest.TempPathFactory) -> Iterator[types.ModuleType]:
    fake = types.ModuleType("torch")
    fake.__file__ = str(tmp_path_factory.mktemp("torch") / "__init__.py")
    fake.device = type("device", (), {})  # type: ignore[attr-defined]
    fake.Tensor = type("Tensor", (), {})  # type: ignore[attr-defined]
    saved = sys.modules.get("torch")
    sys.modules["torch"] = fake
    try:
        spec = importlib.util.spec_from_file_location("um_under_test", OVERLAY / "torch/cuda/um.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        yield module
    finally:
        if saved is None:
            sys.modules.pop("torch", None)
        else:
            sys.modules["torch"] = saved


class _Recorder:
    """Stands for a ctypes.CDLL: remembers every function bound and its signature."""

    def __init__(self) -> None:
        self.bound: dict[str, types.SimpleNamespace] = {}

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return self.bound.setdefault(name, types.SimpleNamespace(restype=None, argtypes=None))


@pytest.fixture(scope="module")
def header() -> c_api.Header:
    return c_api.read(OVERLAY)


def _ctype(c_type: str, um: types.ModuleType) -> Any:
    structs = {"TorchUmStats*": um._Stats, "TorchUmInjectInfo*": um._InjectInfo}
    if c_type in structs:
        return ctypes.POINTER(structs[c_type])
    return None if c_type == "void" else _CTYPES[c_type]


def test_every_declared_function_is_bound_with_its_signature(
    um: types.ModuleType, header: c_api.Header
) -> None:
    lib = _Recorder()
    um._bind(lib)
    assert um._bind_inject(lib)
    declared = {f.name: f for f in header.functions}
    assert sorted(lib.bound) == sorted(declared)
    for name, fn in declared.items():
        got = lib.bound[name]
        assert got.restype is _ctype(fn.returns, um), name
        assert list(got.argtypes) == [_ctype(p, um) for p in fn.params], name


@pytest.mark.parametrize(
    ("c_name", "py_name"), [("TorchUmStats", "_Stats"), ("TorchUmInjectInfo", "_InjectInfo")]
)
def test_structures_match_field_for_field(
    um: types.ModuleType, header: c_api.Header, c_name: str, py_name: str
) -> None:
    c_fields = [(name, _CTYPES[t]) for t, name in header.structs[c_name]]
    assert getattr(um, py_name)._fields_ == c_fields
    assert ctypes.sizeof(getattr(um, py_name)) == 8 * len(c_fields)


def test_advice_kinds_constants_and_abi_version(um: types.ModuleType, header: c_api.Header) -> None:
    prefix = "TORCH_UM_ADVISE_"
    advice = {k.removeprefix(prefix).lower(): v for k, v in header.enums["TorchUmAdvice"].items()}
    assert um._ADVICE == advice
    kinds = header.enums["TorchUmWhere"].items()
    assert um._WHERE == {k.removeprefix("TORCH_UM_WHERE_").lower(): v for k, v in kinds}
    assert list(um.Placement._fields) == list(um._WHERE)  # placement() fills them by name
    flags = header.enums["TorchUmTouchFlags"]
    assert (um._TOUCH_READ_ONLY, um._TOUCH_HOLD) == (
        flags["TORCH_UM_TOUCH_READ_ONLY"],
        flags["TORCH_UM_TOUCH_HOLD"],
    )
    assert um.HOST == header.constants["TORCH_UM_HOST"]
    assert um._ABI_VERSION == header.constants["TORCH_UM_ABI_VERSION"]


def test_injection_gate_checks_every_declared_function(tmp_path: Path) -> None:
    """The gate takes its list from the headers: a function added to c_api.h is checked
    without anyone editing the gate."""
    assert len(c_api.function_names(OVERLAY)) == len(c_api.read(OVERLAY).functions) >= 12
    assert c_api.function_names(OVERLAY, inject=False) == tuple(
        f.name for f in c_api.read(OVERLAY, inject=False).functions
    )
    copy = tmp_path / "c10_overlay"
    for rel in (c_api.CORE_HEADER, c_api.INJECT_HEADER):
        (copy / rel).parent.mkdir(parents=True, exist_ok=True)
        (copy / rel).write_text((OVERLAY / rel).read_text())
    core = copy / c_api.CORE_HEADER
    core.write_text(
        core.read_text().replace(
            "#ifdef __cplusplus\n}",
            "TORCH_UM_API int torch_um_new_thing(void);\n#ifdef __cplusplus\n}",
        )
    )
    assert "torch_um_new_thing" in c_api.function_names(copy)
    assert "c_api_functions" in inject_path.check_gate.__code__.co_varnames


def _config_keys_cpp() -> tuple[list[str], list[str]]:
    text = (OVERLAY / "c10/cuda/um/Config.cpp").read_text()
    listed = re.search(r"kKeys\s*=\s*((?:\s*\"[^\"]*\")+)\s*;", text)
    assert listed is not None
    joined = "".join(re.findall(r'"([^"]*)"', listed.group(1)))
    parsed = re.findall(r'key == "(\w+)"', text)
    return [k.strip() for k in joined.split(",")], parsed


def test_config_keys_agree_everywhere(um: types.ModuleType) -> None:
    """Config.cpp's message list and the keys its parser accepts are the same; configure()'s
    keywords and the README's configuration table name only keys the parser accepts."""
    listed, parsed = _config_keys_cpp()
    assert sorted(listed) == sorted(parsed)
    keywords = [
        p
        for p in um.configure.__code__.co_varnames[: um.configure.__code__.co_kwonlyargcount + 1]
        if p != "conf"
    ]
    assert set(keywords) <= set(listed)
    readme = (REPO_ROOT / "README.md").read_text()
    table = re.search(r"\| key \| default \| meaning \|\n\|[-|]+\|\n((?:\|.*\n)+)", readme)
    assert table is not None
    readme_keys = re.findall(r"^\| `(\w+)` \|", table.group(1), re.M)
    assert readme_keys and set(readme_keys) <= set(listed)


def test_header_reader_refuses_what_it_cannot_read() -> None:
    with pytest.raises(Exception, match="could be read"):
        c_api.parse("TORCH_UM_API int (*torch_um_weird(void))(int);\n", "x.h")
