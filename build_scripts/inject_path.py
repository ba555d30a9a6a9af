"""The injection path: torch versions whose C++ source is not reachable (design notes, §6).

The official wheel's libraries stay untouched. The engine of ``c10_overlay/`` is built with
``UM_MODE=inject`` into its own library, ``torch/lib/libtorch_um.so``, against the wheel's
headers, ``libc10.so`` and ``libc10_cuda.so`` and the CUDA runtime of the wheel's CUDA
version. It defines ``cudaMalloc``/``cudaFree`` (and the stream-capture and IPC-handle calls)
in the runtime's own version node, so that the caching allocator's references bind to it
once ``import torch`` has loaded it with RTLD_GLOBAL before the CUDA libraries; the patch
series (``patches/<version>/``) changes only the wheel's Python files that do that loading.

 3. extract    torch/include, libc10.so, libc10_cuda.so and the Python files to patch,
               each Python file checked against upstream.yaml's ``sources``
 4. series     the Python patches, applied with no fuzz into a scratch copy
 5. build      CMake + Ninja on c10_overlay/ (UM_MODE=inject) -> libtorch_um.so
 6. gate       SONAME, RPATH, the interposed symbols in the runtime's version node

Steps 1-2 and 7-8 are the pipeline's (pipeline.py). ``python -m build_scripts.inject_path
bundle`` runs steps 2-6 and writes the folder that ``tests/gpu/run_on_device.sh`` stages on a
GPU host (no wheel, < 20 MB).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerDefSection, GNUVerSymSection

from build_scripts import abi, matrix, official, overlay_build, progress, series
from build_scripts.changes import WheelChanges, overlay_python_files
from build_scripts.errors import BuildError
from build_scripts.fsutil import sha256_file
from build_scripts.official import OfficialInputs, headers_and_libraries, wheel_files
from build_scripts.paths import REPO_ROOT, cache_root
from build_scripts.toolchain import Toolchain, overlay_toolchain

#: what libtorch_um.so must export in the CUDA runtime's version node
INTERPOSED = (
    "cudaMalloc",
    "cudaFree",
    "cudaStreamBeginCapture",
    "cudaStreamEndCapture",
    "cudaIpcGetMemHandle",
)
#: C API the Python module (torch/cuda/um.py) binds
C_API = (
    "torch_um_abi_version",
    "torch_um_configure",
    "torch_um_get_config",
    "torch_um_get_stats",
    "torch_um_inject_attach",
    "torch_um_inject_info",
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
            if dynsym is None:
                return out
            for i, sym in enumerate(dynsym.iter_symbols()):  # type: ignore[attr-defined]
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


def check_gate(elf: abi.ElfInfo, soname: str, rpath: str | None, cudart_soname: str) -> None:
    """The built library is one that ``import torch`` can load and the allocator binds to."""
    problems = []
    if elf.soname != soname:
        problems.append(f"SONAME is {elf.soname!r}, expected {soname!r}")
    if (elf.rpath or "") != (rpath or ""):
        problems.append(f"RPATH is {elf.rpath!r}, expected the official {rpath!r}")
    versions = exported_versions(elf.path)
    for name in INTERPOSED:
        if versions.get(name) != cudart_soname:
            have = versions.get(name)
            problems.append(
                f"{name} is {'not exported' if have is None else f'exported in version {have!r}'}, "
                f"expected {name}@@{cudart_soname}"
            )
    for name in C_API:
        if name not in elf.exported:
            problems.append(f"C API function {name} is not exported")
    if not abi.imports_symbol(elf, "cudaMallocManaged"):
        problems.append("it does not import cudaMallocManaged (the engine is missing)")
    if problems:
        raise BuildError(f"{elf.path} fails the injection gate: " + "; ".join(problems))


def official_sources(m: matrix.VersionMatrix, official: OfficialInputs, cache: Path) -> Path:
    """The official wheel's files that the series patches (upstream.yaml ``sources``, pinned
    as found in the wheel), verified: what the build, ``series check`` and ``series refresh``
    apply the series to on this path."""
    return wheel_files(official, m.sources, cache)


def build(
    m: matrix.VersionMatrix,
    official: OfficialInputs,
    python: str,
    *,
    repo: Path,
    cache: Path,
    toolchain: Toolchain,
) -> WheelChanges:
    if m.integration != "inject":
        raise BuildError(f"torch {m.torch_version} uses the {m.integration!r} path, not 'inject'")

    # 3. Headers, the libraries to link against, the Python files to patch.
    unpacked = headers_and_libraries(m, official, cache)
    originals = official_sources(m, official, cache)

    # 4. The Python patches, no fuzz.
    patched = series.patched_tree(
        originals,
        m.series_file,
        cache / "patched" / f"{m.torch_version}-{official.pin.sha256[:16]}",
    )

    # 5. libtorch_um.so against the official headers, libc10.so and libc10_cuda.so.
    official_lib = unpacked / m.overlay.link_library
    original = abi.read_elf(official_lib)
    library = overlay_build.build_for_version(
        m,
        official,
        unpacked,
        rpath=original.rpath or "",
        upstream_c10_cuda=None,
        python=python,
        repo=repo,
        cache=cache,
        toolchain=toolchain,
    )

    # 6. Gate.
    elf = abi.read_elf(library)
    check_gate(elf, m.overlay.soname, original.rpath, official.cudart.name)
    progress.step(f"{library.name}: {', '.join(INTERPOSED)} interposed as @@{official.cudart.name}")

    files: dict[str, Path] = {m.overlay.library: library}
    for f in m.sources:
        files[f.path] = patched / f.path
    return WheelChanges(library, elf, official_lib, files)


def bundle(
    dest: Path,
    torch_version: str,
    python: str = "3.11",
    *,
    repo: Path = REPO_ROOT,
    cache: Path | None = None,
    pylib: bool = True,
) -> Path:
    """The folder ``tests/gpu/run_on_device.sh`` stages on a GPU host (no network there)."""
    m = matrix.load(torch_version, repo / "patches")
    cache = cache or cache_root()
    inputs = official.fetch_inputs(m, python, cache)
    changes = build(m, inputs, python, repo=repo, cache=cache, toolchain=overlay_toolchain())
    files = {**changes.files, **overlay_python_files(repo / "c10_overlay")}
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "files").mkdir(parents=True)
    for rel, src in files.items():
        out = dest / "files" / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, out)
    manifest = {
        "torch_version": m.torch_version,
        "git_version": m.upstream.commit,
        "integration": "inject",
        "built_for_wheel": inputs.pin.filename,
        "replaced": {f.path: f.sha256 for f in m.sources},
        "files": {rel: sha256_file(dest / "files" / rel) for rel in sorted(files)},
    }
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    if pylib:
        _pytest_lib(dest / "pylib", cache)
    progress.step(f"device bundle in {dest}")
    return dest


def _pytest_lib(dest: Path, cache: Path) -> None:
    """pytest and its pure-Python dependencies, unpacked, for a host without pytest."""
    import subprocess
    import zipfile

    wheels = cache / "pytest-wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    if not any(wheels.glob("pytest-*.whl")):
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--only-binary=:all:",
                "--dest",
                str(wheels),
                "--python-version",
                "3.12",
                "--platform",
                "any",
                "pytest>=8,<9",
            ],
            check=True,
            stdout=sys.stderr,
        )
    dest.mkdir(parents=True, exist_ok=True)
    for whl in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(whl) as zf:
            zf.extractall(dest)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m build_scripts.inject_path")
    sub = ap.add_subparsers(dest="cmd", required=True)
    b = sub.add_parser("bundle", help="write the GPU-host bundle (.device/inject)")
    b.add_argument("--torch-version", default="2.11.0")
    b.add_argument("--python", default="3.11")
    b.add_argument("--dest", type=Path, default=REPO_ROOT / ".device" / "inject")
    b.add_argument("--no-pytest", action="store_true", help="do not add pytest to the bundle")
    args = ap.parse_args(argv)
    try:
        bundle(args.dest, args.torch_version, args.python, pylib=not args.no_pytest)
    except BuildError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
