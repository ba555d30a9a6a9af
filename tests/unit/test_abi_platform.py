from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from build_scripts import abi, platform_tag
from build_scripts.errors import BuildError

CXX = shutil.which("c++") or shutil.which("g++")
needs_cxx = pytest.mark.skipif(CXX is None, reason="needs a C++ compiler")


def _lib(
    tmp: Path,
    name: str,
    source: str,
    *,
    soname: str = "libc10_cuda.so",
    extra: tuple[str, ...] = (),
) -> Path:
    src = tmp / f"{name}.cpp"
    src.write_text(source)
    out = tmp / name / "libc10_cuda.so"
    out.parent.mkdir()
    assert CXX is not None
    subprocess.run(
        [
            CXX,
            "-shared",
            "-fPIC",
            "-Wl,--no-as-needed",
            "-o",
            str(out),
            str(src),
            f"-Wl,-soname,{soname}",
            "-Wl,--disable-new-dtags",
            "-Wl,-rpath,$ORIGIN/../x:$ORIGIN",
            *extra,
        ],
        check=True,
    )
    return out


def _exports(n: int, skip: set[int] = frozenset()) -> str:  # type: ignore[assignment]
    fns = "\n".join(f"  int f{i}() {{ return {i}; }}" for i in range(n) if i not in skip)
    return (
        'extern "C" void* cudaMallocManaged(void**, unsigned long, unsigned);\n'
        f"namespace c10 {{ namespace cuda {{\n{fns}\n}} }}\n"
        "int other() { void* p; cudaMallocManaged(&p, 1, 1); return 0; }\n"
    )


@needs_cxx
def test_gate_passes_for_identical_exports(tmp_path: Path) -> None:
    orig = abi.read_elf(_lib(tmp_path, "orig", _exports(5)))
    new = abi.read_elf(_lib(tmp_path, "new", _exports(5)))
    assert orig.soname == "libc10_cuda.so" and orig.rpath == "$ORIGIN/../x:$ORIGIN"
    assert orig.runpath_tag == "DT_RPATH"
    assert abi.imports_symbol(new, "cudaMallocManaged")
    assert not abi.imports_symbol(new, "cudaMalloc")
    assert "GLIBC_2.2.5" in new.version_needs or new.version_needs
    notes = abi.check_gate(orig, new)
    assert notes == ["ABI gate passed: all 5 exported c10 symbols present"]


@needs_cxx
def test_gate_lists_missing_symbols_demangled_first_20_and_count(tmp_path: Path) -> None:
    orig = abi.read_elf(_lib(tmp_path, "orig", _exports(30)))
    new = abi.read_elf(_lib(tmp_path, "new", _exports(30, skip=set(range(25)))))
    with pytest.raises(BuildError) as exc:
        abi.check_gate(orig, new)
    msg = str(exc.value)
    assert "25 c10 symbol(s) exported by the official libc10_cuda.so are missing" in msg
    assert "c10::cuda::f0()" in msg  # demangled
    assert msg.count("c10::cuda::f") == 20
    assert "... and 5 more" in msg


@needs_cxx
def test_gate_checks_soname_needed_and_rpath(tmp_path: Path) -> None:
    orig = abi.read_elf(_lib(tmp_path, "orig", _exports(2)))
    new = abi.read_elf(_lib(tmp_path, "new", _exports(2), soname="libother.so", extra=("-lz",)))
    with pytest.raises(BuildError) as exc:
        abi.check_gate(orig, new)
    msg = str(exc.value)
    assert "SONAME differs: official 'libc10_cuda.so', rebuilt 'libother.so'" in msg
    assert "needs libraries the official one does not: ['libz.so.1']" in msg
    abi.check_gate(
        orig,
        abi.read_elf(_lib(tmp_path, "ok", _exports(2), extra=("-lz",))),
        needed_may_add=["libz.so.1"],
    )


@needs_cxx
def test_gate_refuses_dropped_needed_unless_allowed(tmp_path: Path) -> None:
    orig = abi.read_elf(_lib(tmp_path, "orig", _exports(2), extra=("-lz",)))
    new = abi.read_elf(_lib(tmp_path, "new", _exports(2)))
    with pytest.raises(BuildError, match=r"no longer needs \['libz.so.1'\]"):
        abi.check_gate(orig, new)
    abi.check_gate(orig, new, needed_may_drop=["libz.so.1"])


def test_read_elf_of_non_elf(tmp_path: Path) -> None:
    f = tmp_path / "x.so"
    f.write_text("not elf")
    with pytest.raises(BuildError, match="cannot read ELF file"):
        abi.read_elf(f)


@pytest.mark.parametrize(
    ("needs", "tag"),
    [
        ({"GLIBC_2.2.5", "GLIBCXX_3.4"}, "manylinux_2_5_x86_64"),
        ({"GLIBC_2.17", "CXXABI_1.3.7"}, "manylinux_2_17_x86_64"),
        ({"GLIBC_2.34", "GLIBCXX_3.4.29", "libcudart.so.12"}, "manylinux_2_34_x86_64"),
        ({"GLIBC_2.28", "GLIBCXX_3.4.30"}, "manylinux_2_35_x86_64"),
    ],
)
def test_tag_for_versions(needs: set[str], tag: str) -> None:
    assert platform_tag.tag_for_versions(needs) == tag


def test_unknown_future_glibc_has_no_policy() -> None:
    with pytest.raises(BuildError, match="no manylinux policy covers .*GLIBC_2.99"):
        platform_tag.tag_for_versions({"GLIBC_2.99"})


def test_combine_takes_the_more_restrictive_tag() -> None:
    assert platform_tag.normalize("manylinux1_x86_64") == "manylinux_2_5_x86_64"
    assert platform_tag.normalize("manylinux2014_x86_64") == "manylinux_2_17_x86_64"
    assert (
        platform_tag.combine("manylinux1_x86_64", "manylinux_2_34_x86_64")
        == "manylinux_2_34_x86_64"
    )
    assert (
        platform_tag.combine("manylinux_2_28_x86_64", "manylinux2014_x86_64")
        == "manylinux_2_28_x86_64"
    )
    assert (
        platform_tag.wheel_platform_tag("manylinux1_x86_64", {"GLIBC_2.34"})
        == "manylinux_2_34_x86_64"
    )
    with pytest.raises(BuildError, match="disagree on the architecture"):
        platform_tag.combine("manylinux1_x86_64", "manylinux_2_17_aarch64")
    with pytest.raises(BuildError, match="is not a manylinux platform tag"):
        platform_tag.combine("linux_x86_64", "manylinux_2_17_x86_64")
