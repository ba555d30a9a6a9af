"""The engine's C API as its headers declare it: the one place that decides it.

``c10_overlay/c10/cuda/um/c_api.h`` (both paths) and ``c10_overlay/inject/inject_api.h``
(the injection path) declare the functions, structs, enums and constants of the C API.
The injection gate checks that the built library exports every function declared here,
and ``tests/unit/test_c_api.py`` checks that ``torch/cuda/um.py``'s ctypes mirror (its
structures, advice kinds, constants and bound functions) matches these declarations.

The headers are plain C written in one style (one declaration per ``TORCH_UM_API`` line
group, structs of ``uint64_t`` fields, one enum): this reader handles that style and fails
loudly on anything else rather than guessing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from build_scripts.errors import BuildError
from build_scripts.paths import REPO_ROOT

#: the headers of the C API, relative to c10_overlay/
CORE_HEADER = "c10/cuda/um/c_api.h"
INJECT_HEADER = "inject/inject_api.h"

_COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_FUNCTION = re.compile(
    r"TORCH_UM_API\s+(?P<ret>[^;(]+?)\s*\b(?P<name>torch_um_\w+)\s*\((?P<args>[^)]*)\)\s*;"
)
_STRUCT = re.compile(r"typedef\s+struct\s+(?P<tag>\w+)\s*\{(?P<body>[^}]*)\}\s*(?P<name>\w+)\s*;")
_FIELD = re.compile(r"^(?P<type>[\w ]+?)\s+(?P<name>\w+)$")
_ENUM = re.compile(r"enum\s+(?P<name>\w+)\s*\{(?P<body>[^}]*)\}\s*;")
_DEFINE = re.compile(r"^#define\s+(?P<name>TORCH_UM_\w+)\s+\(?(?P<value>-?\d+)\)?\s*$", re.M)


@dataclass(frozen=True)
class Function:
    name: str
    returns: str  # "int", "long", "void", "const char*"
    params: tuple[str, ...]  # parameter types, e.g. ("const char*", "char*", "size_t")


@dataclass(frozen=True)
class Header:
    functions: tuple[Function, ...]
    structs: dict[str, tuple[tuple[str, str], ...]]  # typedef name -> ((type, field), ...)
    enums: dict[str, dict[str, int]]  # enum name -> {enumerator: value}
    constants: dict[str, int]  # #define TORCH_UM_X <integer>


def _normalise_type(text: str) -> str:
    return re.sub(r"\s*\*", "*", " ".join(text.split()))


def _param_type(param: str) -> str:
    """``const char* conf`` -> ``const char*``; ``void`` -> no parameter."""
    param = " ".join(param.split())
    m = re.match(r"^(?P<type>.*?[\s*])(?P<name>\w+)$", param)
    if m is None or m.group("type").strip() in ("", "const"):
        return _normalise_type(param)
    return _normalise_type(m.group("type"))


def parse(text: str, where: str) -> Header:
    body = _COMMENT.sub(" ", text)
    functions: list[Function] = []
    for m in _FUNCTION.finditer(body):
        raw = [a for a in m.group("args").split(",") if a.strip()]
        params = tuple(_param_type(a) for a in raw)
        if params == ("void",):
            params = ()
        functions.append(Function(m.group("name"), _normalise_type(m.group("ret")), params))
    declared = len(re.findall(r"TORCH_UM_API\s+[^;#]*?\btorch_um_\w+\s*\(", body))
    if declared != len(functions):
        raise BuildError(
            f"{where}: {declared} TORCH_UM_API declarations but {len(functions)} could be read; "
            "keep one plain C prototype per declaration"
        )
    structs: dict[str, tuple[tuple[str, str], ...]] = {}
    for m in _STRUCT.finditer(body):
        fields = []
        for decl in m.group("body").split(";"):
            decl = " ".join(decl.split())
            if not decl:
                continue
            f = _FIELD.match(decl)
            if f is None:
                raise BuildError(f"{where}: struct {m.group('name')}: cannot read field {decl!r}")
            fields.append((f.group("type"), f.group("name")))
        structs[m.group("name")] = tuple(fields)
    enums: dict[str, dict[str, int]] = {}
    for m in _ENUM.finditer(body):
        values: dict[str, int] = {}
        for item in m.group("body").split(","):
            item = item.strip()
            if not item:
                continue
            name, _, value = (x.strip() for x in item.partition("="))
            if not value:
                raise BuildError(f"{where}: enum {m.group('name')}: give {name} an explicit value")
            values[name] = int(value, 0)
        enums[m.group("name")] = values
    constants = {m.group("name"): int(m.group("value")) for m in _DEFINE.finditer(body)}
    return Header(tuple(functions), structs, enums, constants)


def read(overlay: Path | None = None, *, inject: bool = True) -> Header:
    """The C API of ``c10_overlay/``: c_api.h, plus inject_api.h when ``inject``."""
    overlay = overlay or REPO_ROOT / "c10_overlay"
    names = (CORE_HEADER, INJECT_HEADER) if inject else (CORE_HEADER,)
    parts = []
    for name in names:
        path = overlay / name
        try:
            parts.append(parse(path.read_text(), str(path)))
        except OSError as exc:
            raise BuildError(f"cannot read the C API header {path}: {exc}") from None
    return Header(
        functions=tuple(f for p in parts for f in p.functions),
        structs={k: v for p in parts for k, v in p.structs.items()},
        enums={k: v for p in parts for k, v in p.enums.items()},
        constants={k: v for p in parts for k, v in p.constants.items()},
    )


def function_names(overlay: Path | None = None, *, inject: bool = True) -> tuple[str, ...]:
    """Every ``torch_um_*`` function the library built from ``overlay`` must export."""
    return tuple(f.name for f in read(overlay, inject=inject).functions)
