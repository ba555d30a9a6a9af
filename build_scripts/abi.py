"""ELF facts of a shared library (pyelftools) and the ABI gate for the rebuilt one.

Every ELF read of the pipeline is here: :func:`read_elf` (SONAME, NEEDED, RPATH, exported
and imported dynamic symbols, the symbol versions it needs) and :func:`exported_versions`
(the version node each exported symbol is defined in, which the injection gate checks).

The gate: every dynamic symbol the official library defines and exports whose mangled
name contains ``c10`` must be exported by the rebuilt library too, its SONAME must be the
same, and its NEEDED entries may differ only as upstream.yaml's ``overlay`` allows.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.dynamic import DynamicSection
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerDefSection, GNUVerNeedSection, GNUVerSymSection
from elftools.elf.sections import SymbolTableSection

from build_scripts.errors import BuildError

_EXPORT_BINDINGS = {"STB_GLOBAL", "STB_WEAK", "STB_GNU_UNIQUE"}
_EXPORT_VISIBILITY = {"STV_DEFAULT", "STV_PROTECTED"}


@dataclass(frozen=True)
class ElfInfo:
    path: Path
    soname: str | None
    needed: tuple[str, ...]
    rpath: str | None  # DT_RPATH, or DT_RUNPATH when there is no DT_RPATH
    runpath_tag: str | None  # "DT_RPATH" / "DT_RUNPATH"
    exported: frozenset[str]  # defined, exported dynamic symbols (mangled)
    undefined: frozenset[str]  # undefined dynamic symbols (imports)
    version_needs: frozenset[str]  # e.g. GLIBC_2.34, GLIBCXX_3.4.29


def read_elf(path: Path) -> ElfInfo:
    try:
        with path.open("rb") as f:
            elf = ELFFile(f)
            soname = None
            needed: list[str] = []
            rpath = runpath = None
            exported: set[str] = set()
            undefined: set[str] = set()
            versions: set[str] = set()
            for section in elf.iter_sections():
                if isinstance(section, DynamicSection):
                    for tag in section.iter_tags():
                        if tag.entry.d_tag == "DT_NEEDED":
                            needed.append(tag.needed)  # type: ignore[attr-defined]
                        elif tag.entry.d_tag == "DT_SONAME":
                            soname = tag.soname  # type: ignore[attr-defined]
                        elif tag.entry.d_tag == "DT_RPATH":
                            rpath = tag.rpath  # type: ignore[attr-defined]
                        elif tag.entry.d_tag == "DT_RUNPATH":
                            runpath = tag.runpath  # type: ignore[attr-defined]
                elif isinstance(section, SymbolTableSection) and section.name == ".dynsym":
                    for sym in section.iter_symbols():
                        if not sym.name:
                            continue
                        if sym["st_shndx"] == "SHN_UNDEF":
                            undefined.add(sym.name)
                        elif (
                            sym["st_info"]["bind"] in _EXPORT_BINDINGS
                            and sym["st_other"]["visibility"] in _EXPORT_VISIBILITY
                        ):
                            exported.add(sym.name)
                elif isinstance(section, GNUVerNeedSection):
                    for _verneed, auxiliaries in section.iter_versions():
                        for aux in auxiliaries:
                            versions.add(aux.name)
    except (OSError, ELFError) as exc:
        raise BuildError(f"cannot read ELF file {path}: {exc}") from None
    return ElfInfo(
        path=path,
        soname=soname,
        needed=tuple(needed),
        rpath=rpath if rpath is not None else runpath,
        runpath_tag="DT_RPATH" if rpath is not None else ("DT_RUNPATH" if runpath else None),
        exported=frozenset(exported),
        undefined=frozenset(undefined),
        version_needs=frozenset(versions),
    )


def exported_versions(path: Path) -> dict[str, str]:
    """Defined dynamic symbols of ``path`` -> the version node they are defined in ("" if none)."""
    try:
        with path.open("rb") as f:
            elf = ELFFile(f)
            dynsym = elf.get_section_by_name(".dynsym")
            versym = next((s for s in elf.iter_sections() if isinstance(s, GNUVerSymSection)), None)
            verdef = next((s for s in elf.iter_sections() if isinstance(s, GNUVerDefSection)), None)
            names: dict[int, str] = {}
            if verdef is not None:
                for vd, auxiliaries in verdef.iter_versions():
                    aux = next(iter(auxiliaries), None)
                    if aux is not None:
                        names[vd["vd_ndx"]] = aux.name
            out: dict[str, str] = {}
            if not isinstance(dynsym, SymbolTableSection):
                return out
            for i, sym in enumerate(dynsym.iter_symbols()):
                if not sym.name or sym["st_shndx"] == "SHN_UNDEF":
                    continue
                ndx = versym.get_symbol(i)["ndx"] if versym is not None else 1
                if isinstance(ndx, str):  # VER_NDX_LOCAL / VER_NDX_GLOBAL
                    out[sym.name] = ""
                else:
                    out[sym.name] = names.get(int(ndx) & 0x7FFF, "")
            return out
    except (OSError, ELFError) as exc:
        raise BuildError(f"cannot read ELF file {path}: {exc}") from None


def imports_symbol(info: ElfInfo, name: str) -> bool:
    return name in info.undefined


def demangle(names: Iterable[str]) -> list[str]:
    """Demangle with ``c++filt`` when it is installed; otherwise return names as they are."""
    names = list(names)
    tool = shutil.which("c++filt")
    if not tool or not names:
        return names
    proc = subprocess.run(
        [tool], input="\n".join(names), capture_output=True, text=True, check=False
    )
    out = proc.stdout.splitlines()
    return out if proc.returncode == 0 and len(out) == len(names) else names


def missing_c10_exports(original: ElfInfo, rebuilt: ElfInfo) -> list[str]:
    wanted = {s for s in original.exported if "c10" in s}
    return sorted(wanted - rebuilt.exported)


def check_gate(
    original: ElfInfo,
    rebuilt: ElfInfo,
    *,
    needed_may_add: Iterable[str] = (),
    needed_may_drop: Iterable[str] = (),
    expect_rpath: bool = True,
) -> list[str]:
    """Raise BuildError when the rebuilt library breaks the contract; return notes."""
    problems: list[str] = []
    missing = missing_c10_exports(original, rebuilt)
    if missing:
        shown = demangle(missing[:20])
        more = f"\n  ... and {len(missing) - 20} more" if len(missing) > 20 else ""
        problems.append(
            f"{len(missing)} c10 symbol(s) exported by the official {original.path.name} are "
            "missing from the rebuilt one (the overlay must compile every c10/cuda source "
            "with default visibility for C10_CUDA_API):\n  " + "\n  ".join(shown) + more
        )
    if original.soname != rebuilt.soname:
        problems.append(
            f"SONAME differs: official {original.soname!r}, rebuilt {rebuilt.soname!r} "
            "(pass -DUM_SONAME / set it in c10_overlay/CMakeLists.txt)"
        )
    new = set(rebuilt.needed) - set(original.needed) - set(needed_may_add)
    if new:
        problems.append(
            f"rebuilt library needs libraries the official one does not: {sorted(new)} "
            "(link only against what the original links, or list them in upstream.yaml "
            "overlay.needed_may_add)"
        )
    dropped = set(original.needed) - set(rebuilt.needed) - set(needed_may_drop)
    if dropped:
        problems.append(
            f"rebuilt library no longer needs {sorted(dropped)}, which the official one "
            "needs (list them in upstream.yaml overlay.needed_may_drop if that is intended)"
        )
    if expect_rpath and original.rpath != rebuilt.rpath:
        problems.append(
            f"RPATH differs: official {original.rpath!r}, rebuilt {rebuilt.rpath!r} "
            "(the build passes the original as -DUM_RPATH; CMakeLists.txt must use it)"
        )
    if problems:
        raise BuildError(f"ABI gate failed for {rebuilt.path}:\n- " + "\n- ".join(problems))
    notes = []
    kept = len({s for s in original.exported if "c10" in s})
    notes.append(f"ABI gate passed: all {kept} exported c10 symbols present")
    return notes
