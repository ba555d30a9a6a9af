"""The injection path: torch versions whose C++ source is not reachable (design notes, §6).

The official wheel's libraries stay untouched. The engine of ``c10_overlay/`` is built with
``UM_MODE=inject`` into its own library, ``torch/lib/libtorch_um.so``, against the wheel's
headers, ``libc10.so`` and ``libc10_cuda.so`` and the CUDA runtime of the wheel's CUDA
version. It defines ``cudaMalloc``/``cudaFree`` (and the stream-capture and IPC-handle calls)
in the runtime's own version node, so that the caching allocator's references bind to it
once ``import torch`` has loaded it with RTLD_GLOBAL before the CUDA libraries; the patch
series (``patches/<version>/``) changes only the wheel's Python files that do that loading.

 1. fetch      the official wheel and the CUDA header packages, verified
 2. extract    torch/include, libc10.so, libc10_cuda.so and the Python files to patch,
               each Python file checked against upstream.yaml's ``sources``
 3. series     the Python patches, applied with no fuzz into a scratch copy
 4. build      CMake + Ninja on c10_overlay/ (UM_MODE=inject) -> libtorch_um.so
 5. gate       SONAME, RPATH, the interposed symbols in the runtime's version node
 6. tag+repack the honest platform tag; official wheel + library + Python -> dist/

``python -m build_scripts.inject_path bundle`` runs steps 1-5 and writes the folder that
``tests/gpu/run_on_device.sh`` stages on a GPU host (no wheel, < 20 MB).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile
from elftools.elf.gnuversions import GNUVerDefSection, GNUVerSymSection

from build_scripts import (
    abi,
    fetch,
    matrix,
    overlay_build,
    platform_tag,
    progress,
    repack,
    series,
    wheel_parts,
)
from build_scripts.errors import BuildError
from build_scripts.fsutil import atomic_dir, digest_of, sha256_file, write_json
from build_scripts.paths import REPO_ROOT, cache_root
from build_scripts.toolchain import Toolchain, gnu_patch, overlay_toolchain

if TYPE_CHECKING:
    from build_scripts import pipeline

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


@dataclass(frozen=True)
class InjectParts:
    """What the injection build adds to or replaces in the official wheel."""

    wheel: Path  # the official wheel, verified
    pin: matrix.WheelPin
    official_library: Path  # the wheel's libc10_cuda.so the library links against
    library: Path  # built libtorch_um.so
    elf: abi.ElfInfo
    files: dict[str, Path]  # path in the wheel -> content (library, patched + overlay Python)
    replaced: dict[str, str]  # path in the wheel -> sha256 of the official file replaced


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


def _under(directory: str, also: str | None) -> Callable[[str], bool]:
    """Wheel member filter: everything under ``directory``, plus the file ``also``."""
    return lambda name: name.startswith(directory + "/") or name == also


def _pip_platform(filename: str) -> str:
    """First platform tag of a wheel file name (pip takes one, not a compressed set)."""
    return filename.removesuffix(".whl").rsplit("-", 1)[-1].split(".")[0]


def build_parts(
    m: matrix.VersionMatrix,
    python: str,
    *,
    repo: Path = REPO_ROOT,
    cache: Path | None = None,
    toolchain: Toolchain | None = None,
) -> InjectParts:
    if m.integration != "inject":
        raise BuildError(f"torch {m.torch_version} uses the {m.integration!r} path, not 'inject'")
    cache = cache or cache_root()
    pin = m.wheel.for_python(python)
    tools = toolchain or overlay_toolchain()
    gnu_patch()

    # 1. The official wheel and the CUDA headers, verified against their sha256.
    progress.step(
        f"torch {m.um_version} for Python {python} (inject): official wheel {pin.filename}"
    )
    wheel = fetch.pip_download(
        f"torch=={m.torch_version}",
        pin.filename,
        pin.sha256,
        cache / "wheels",
        python_version=python,
        platform=pin.platform,
        abi=pin.cp_tag,
    )
    cuda_include: list[Path] = []
    cudart: Path | None = None
    for pkg in m.cuda_packages:
        whl = fetch.pip_download(
            f"{pkg.name}=={pkg.version}",
            pkg.filename,
            pkg.sha256,
            cache / "cuda-wheels",
            python_version=python,
            platform=_pip_platform(pkg.filename),
        )
        lib = pkg.library
        root = wheel_parts.extract(
            whl,
            cache / "cuda" / f"{pkg.name}-{pkg.version}",
            _under(pkg.include, lib),
            pkg.name,
        )
        cuda_include.append(wheel_parts.require(root / pkg.include, f"{pkg.name} headers"))
        if lib and "cudart" in Path(lib).name:
            cudart = wheel_parts.require(root / lib, f"{pkg.name} {Path(lib).name}")
    if cudart is None:
        raise BuildError(f"{m.directory}/upstream.yaml: no cuda_packages entry has libcudart")

    # 2. Headers, the libraries to link against, the Python files to patch.
    wanted = {m.overlay.link_library, "torch/lib/libc10.so"} | {f.path for f in m.sources}
    unpacked = wheel_parts.extract(
        wheel,
        cache / "unpacked-inject" / pin.sha256[:16],
        lambda n: n.startswith("torch/include/") or n in wanted,
        "torch/include + libc10 + Python files",
    )
    originals = cache / "inject-sources" / pin.sha256[:16]
    replaced: dict[str, str] = {}
    with atomic_dir(originals) as tmp:
        for f in m.sources:
            src = wheel_parts.require(unpacked / f.path, f"{f.path} in {pin.filename}")
            have = sha256_file(src)
            if have != f.sha256:
                raise BuildError(
                    f"{f.path} in {pin.filename} has sha256 {have}, upstream.yaml pins {f.sha256}"
                )
            (tmp / f.path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, tmp / f.path)
            replaced[f.path] = have

    # 3. The Python patches, no fuzz.
    patched = series.patched_tree(
        originals, m.series_file, cache / "patched" / f"{m.torch_version}-{pin.sha256[:16]}"
    )

    # 4. libtorch_um.so against the official headers, libc10.so and libc10_cuda.so.
    official = abi.read_elf(unpacked / m.overlay.link_library)
    inputs = overlay_build.OverlayInputs(
        source_dir=repo / "c10_overlay",
        torch_include=unpacked / "torch" / "include",
        torch_lib=unpacked / Path(m.overlay.link_library).parent,
        upstream_c10_cuda=unpacked / "torch" / "include" / "c10" / "cuda",  # unused (inject)
        cuda_include=tuple(cuda_include),
        cudart_lib=cudart,
        cxx11_abi=m.wheel.cxx11_abi,
        soname=m.overlay.soname,
        rpath=official.rpath or "",
        mode="inject",
    )
    build_dir = overlay_build.build_dir_for(cache, m.torch_version, python, inputs)
    library = overlay_build.build(inputs, build_dir, toolchain=tools)

    # 5. Gate.
    elf = abi.read_elf(library)
    check_gate(elf, m.overlay.soname, official.rpath, cudart.name)
    progress.step(f"{library.name}: {', '.join(INTERPOSED)} interposed as @@{cudart.name}")

    files: dict[str, Path] = {m.overlay.library: library}
    for f in m.sources:
        files[f.path] = patched / f.path
    files.update(_overlay_python(repo / "c10_overlay"))
    return InjectParts(wheel, pin, unpacked / m.overlay.link_library, library, elf, files, replaced)


def _overlay_python(overlay: Path) -> dict[str, Path]:
    """``c10_overlay/torch/**`` maps to ``torch/**`` inside the wheel (as in pipeline.py)."""
    root = overlay / "torch"
    if not root.is_dir():
        return {}
    return {
        "torch/" + p.relative_to(root).as_posix(): p
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def build(
    m: matrix.VersionMatrix,
    python: str,
    *,
    repo: Path = REPO_ROOT,
    cache: Path | None = None,
    dist: Path | None = None,
    started: float | None = None,
) -> pipeline.BuildResult:
    """The whole injection build: ``dist/torch-X.Y.Z+um-cpNN-cpNN-<tag>.whl``."""
    from build_scripts import pipeline

    started = started if started is not None else time.monotonic()
    cache = cache or cache_root()
    dist = dist or repo / "dist"
    parts = build_parts(m, python, repo=repo, cache=cache)

    # 6. The platform tag the result honestly has, and the repack.
    tag = platform_tag.wheel_platform_tag(parts.pin.platform, parts.elf.version_needs)
    progress.step(f"platform tag: {tag}")
    out = dist / repack.output_name(parts.wheel, m.um_version, tag)
    stamp_key = digest_of(
        {
            "format": pipeline.REPACK_FORMAT,
            "integration": "inject",
            "wheel": parts.pin.sha256,
            "version": m.um_version,
            "tag": tag,
            "files": {k: sha256_file(v) for k, v in sorted(parts.files.items())},
        }
    )
    stamp = cache / "stamps" / f"{out.name}.json"
    if pipeline._stamp_matches(stamp, out, stamp_key):
        progress.step(f"{out} is up to date")
        reused = True
    else:
        spec = repack.RepackSpec(
            source=parts.wheel,
            out_dir=dist,
            version=m.um_version,
            platform=tag,
            files=dict(parts.files),
        )
        out = repack.repack(spec)
        st = out.stat()
        write_json(stamp, {"key": stamp_key, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
        reused = False
    seconds = time.monotonic() - started
    progress.step(f"built {out} in {seconds:.0f} s")
    return pipeline.BuildResult(out, tag, parts.library, parts.official_library, reused, seconds)


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
    parts = build_parts(m, python, repo=repo, cache=cache)
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "files").mkdir(parents=True)
    for rel, src in parts.files.items():
        out = dest / "files" / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, out)
    manifest = {
        "torch_version": m.torch_version,
        "git_version": m.upstream.commit,
        "integration": "inject",
        "built_for_wheel": parts.pin.filename,
        "replaced": parts.replaced,
        "files": {rel: sha256_file(dest / "files" / rel) for rel in sorted(parts.files)},
    }
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    if pylib:
        _pytest_lib(dest / "pylib", cache or cache_root())
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
