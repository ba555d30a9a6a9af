"""What a torch wheel's libraries import that the GPU host's libraries do not define.

    python3 tests/gpu/compare_imports.py NEW_TORCH_WHEEL --host-torch HOST_TORCH_WHEEL \\
        --host DIR_OR_WHEEL... [--extra DIR_OR_WHEEL...]

Run here, before carrying a torch version to the GPU host (README, "A version the GPU host
does not have"). The host is described by the official wheel of its installed torch and by
the wheels of its CUDA packages (``--host``: wheel files, or folders of them, downloaded
with ``pip download`` at the host's versions). A symbol counts as available on the host when
one of those libraries defines it, or when the host's torch imports it (it runs there, so
something there defines it: this covers a package whose exact version the index no longer
serves, such as NCCL 2.28.9). ``--extra`` adds the wheels one plans to carry
(tests/gpu/host_extras.json); the report then shows what is still missing.

For each ``torch/lib/*.so`` of NEW_TORCH_WHEEL: the NEEDED libraries that nothing on the host
provides, and the imported dynamic symbols (``nm -D --undefined-only``, with their symbol
version) that no host library defines, grouped by that version (the library they belong to)
or, for unversioned ones, by the library that defines them in ``--ref`` (the new torch's own
pinned packages, optional). glibc, libstdc++ and libgcc symbols are the host system's and
are left out, and so are the driver's, weak imports and the Python C API (the interpreter's:
carry the wheel of the host's CPython). A library no other one needs (none loads it at
``import torch``) is marked. Exit status 1 when something is missing. Standard library and
binutils' ``nm`` and ``readelf`` only.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import zipfile
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

_SO = re.compile(r"\.so(\.\d+)*$")
_SYSTEM_VERSIONS = re.compile(r"^(GLIBC|GLIBCXX|CXXABI|GCC|QUADMATH)_")
# the host system's (libcuda: the driver's); torch's own copies are found in its wheel
_SYSTEM_SONAMES = re.compile(
    r"^(libc|libm|libdl|librt|libpthread|libutil|libresolv|libstdc\+\+|libgcc_s|ld-linux-x86-64"
    r"|libcuda|libz|libquadmath)\.so(\.\d+)*$"
)
# the Python interpreter's C API: defined by the host's python3 (carry the wheel of its version)
_INTERPRETER = re.compile(r"^_?Py")


def wheels(paths: Iterable[Path]) -> list[Path]:
    """Wheel files, and the wheels in folders of them."""
    out: list[Path] = []
    for p in paths:
        out += sorted(p.glob("*.whl")) if p.is_dir() else [p]
    return out


def libraries(paths: Iterable[Path], dest: Path) -> list[Path]:
    """The shared libraries of wheels, folders of wheels and folders of libraries (a CUDA
    toolkit's lib/ of the host's version, for a package the index no longer serves)."""
    out: list[Path] = []
    for i, p in enumerate(paths):
        if p.is_dir() and not any(p.glob("*.whl")):
            out += sorted(f for f in p.iterdir() if f.is_file() and _SO.search(f.name))
        else:
            for j, whl in enumerate(wheels([p])):
                out += unpack_libraries(whl, dest / f"{i}-{j}")
    return out


def unpack_libraries(wheel: Path, dest: Path, prefix: str = "") -> list[Path]:
    """The shared libraries of ``wheel`` (members under ``prefix``), extracted."""
    libs = []
    with zipfile.ZipFile(wheel) as zf:
        for name in zf.namelist():
            if name.startswith(prefix) and _SO.search(name.rsplit("/", 1)[-1]):
                libs.append(Path(zf.extract(name, dest)))
    return libs


def nm(lib: Path, *flags: str) -> list[tuple[str, str]]:
    """(type letter, symbol with its version) of ``nm -D`` with ``flags``."""
    proc = subprocess.run(
        ["nm", "-D", *flags, str(lib)], capture_output=True, text=True, check=False
    )
    out = []
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2:
            out.append((parts[-2], parts[-1]))
    return out


def needed(lib: Path) -> list[str]:
    proc = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True, check=False)
    return re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", proc.stdout)


def plain(symbol: str) -> tuple[str, str]:
    """``name@@VER`` / ``name@VER`` / ``name`` -> (name, VER or "")."""
    name, _, version = symbol.replace("@@", "@").partition("@")
    return name, version


class Libraries:
    """The dynamic symbols some set of libraries defines, by (name, version)."""

    def __init__(self) -> None:
        self.defined: dict[tuple[str, str], str] = {}
        self.by_name: dict[str, str] = {}
        self.names: set[str] = set()
        self.sonames: set[str] = set()

    def add_definitions(self, lib: Path) -> None:
        self.sonames.add(lib.name)
        for _kind, sym in nm(lib, "--defined-only"):
            name, version = plain(sym)
            self.defined.setdefault((name, version), lib.name)
            self.by_name.setdefault(name, lib.name)
            self.names.add(name)

    def add_imports(self, lib: Path, source: str) -> None:
        """What a library that runs on the host imports (and needs) is there."""
        self.sonames.update(needed(lib))
        for kind, sym in nm(lib, "--undefined-only"):
            if kind.isupper():
                name, version = plain(sym)
                self.defined.setdefault((name, version), source)
                self.names.add(name)

    def has(self, name: str, version: str) -> bool:
        if (name, version) in self.defined:
            return True
        # an unversioned import binds to any version of the name (the default one)
        return not version and name in self.names


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("new", type=Path, help="the torch wheel to carry")
    ap.add_argument("--host-torch", type=Path, required=True, help="the host's torch wheel")
    ap.add_argument(
        "--host", type=Path, nargs="+", required=True, help="host CUDA wheels or library folders"
    )
    ap.add_argument("--extra", type=Path, nargs="*", default=[], help="wheels to carry")
    ap.add_argument("--ref", type=Path, nargs="*", default=[], help="the new torch's pins")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="compare-imports-") as tmp:
        root = Path(tmp)
        host = Libraries()
        for lib in unpack_libraries(args.host_torch, root / "host-torch"):
            host.add_definitions(lib)
            host.add_imports(lib, f"imported by the host's {lib.name}")
        for lib in libraries([*args.host, *args.extra], root / "host"):
            host.add_definitions(lib)
        ref = Libraries()
        for lib in libraries(args.ref, root / "ref"):
            ref.add_definitions(lib)
        own = Libraries()
        new_libs = unpack_libraries(args.new, root / "new", "torch/lib/")
        loaded: set[str] = set()  # what some library of the wheel needs
        for lib in new_libs:
            own.add_definitions(lib)
            loaded.update(needed(lib))

        missing_total = 0
        for lib in sorted(new_libs):
            gaps = [
                n
                for n in needed(lib)
                if n not in host.sonames and n not in own.sonames and not _SYSTEM_SONAMES.match(n)
            ]
            groups: dict[str, list[str]] = defaultdict(list)
            for kind, sym in nm(lib, "--undefined-only"):
                name, version = plain(sym)
                if kind in ("w", "v") or _SYSTEM_VERSIONS.match(version):
                    continue
                if not version and _INTERPRETER.match(name):
                    continue
                if own.has(name, version) or host.has(name, version):
                    continue
                owner = version or ref.by_name.get(name, "unversioned, no --ref defines it")
                groups[owner].append(name)
            if not gaps and not groups:
                print(f"{lib.name}: everything it imports is on the host")
                continue
            roots = ("libtorch_python.so", "libtorch_global_deps.so")
            note = "" if lib.name in loaded or lib.name in roots else " (no library needs it)"
            print(f"{lib.name}{note}:")
            for n in gaps:
                print(f"  NEEDED {n}: no host library has this name")
            for owner, names in sorted(groups.items()):
                print(f"  {len(names)} symbol(s) of {owner}: {', '.join(sorted(names))}")
            missing_total += len(gaps) + sum(len(v) for v in groups.values())
    print(f"{missing_total} thing(s) missing on the host")
    return 1 if missing_total else 0


if __name__ == "__main__":
    sys.exit(main())
