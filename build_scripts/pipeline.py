"""From ``make build TORCH_VERSION=X.Y.Z`` to ``dist/torch-X.Y.Z+um-...whl``.

Read top to bottom: each step names the module that does it. Every step either
finishes or leaves nothing behind that a rerun would trust; every step reuses its cached
result when its inputs did not change, so a warm rerun takes seconds.

 1. matrix         load patches/<version>/upstream.yaml (what to fetch, with hashes)
 2. fetch          the official wheel and the CUDA header packages (pip download)
 3. sources        the pinned upstream c10/cuda files (TORCH_SRC, git, Debian)
 4. series         apply patches/<version>/series onto a scratch copy of them
 5. overlay_build  CMake + Ninja on c10_overlay/ -> libc10_cuda.so
 6. abi            gate the rebuilt library against the official one
 7. platform_tag   the honest manylinux tag of the result
 8. repack         official wheel + rebuilt library -> dist/torch-X.Y.Z+um-*.whl
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from build_scripts import (
    abi,
    fetch,
    inject_path,
    matrix,
    overlay_build,
    platform_tag,
    progress,
    repack,
    series,
    sources,
    wheel_parts,
)
from build_scripts.errors import BuildError
from build_scripts.fsutil import digest_of, read_json, sha256_file, write_json
from build_scripts.paths import REPO_ROOT, cache_root
from build_scripts.toolchain import gnu_patch, overlay_toolchain

#: bump when repack output changes for the same inputs, so stamps stop matching
REPACK_FORMAT = 1


@dataclass(frozen=True)
class BuildResult:
    wheel: Path
    platform_tag: str
    rebuilt_library: Path
    official_library: Path
    reused: bool  # the wheel in dist/ was up to date; nothing was repacked
    seconds: float


def build(
    torch_version: str,
    python: str,
    *,
    repo: Path = REPO_ROOT,
    cache: Path | None = None,
    dist: Path | None = None,
) -> BuildResult:
    started = time.monotonic()
    cache = cache or cache_root()
    dist = dist or repo / "dist"

    # 1. What to build, pinned.
    m = matrix.load(torch_version, repo / "patches")
    if m.integration == "inject":
        # Branch point for torch versions whose C++ sources are not reachable: the
        # engine is built as its own library and injected (design notes, section 6).
        return inject_path.build(m, python, repo=repo, cache=cache, dist=dist, started=started)
    pin = m.wheel.for_python(python)
    tools = overlay_toolchain()  # fail before any download when cmake/ninja/c++ are missing
    gnu_patch()

    # 2. The official wheel and the CUDA headers, verified against their sha256.
    progress.step(f"torch {m.um_version} for Python {python}: official wheel {pin.filename}")
    wheel = fetch.pip_download(
        f"torch=={m.torch_version}",
        pin.filename,
        pin.sha256,
        cache / "wheels",
        python_version=python,
        platform=pin.platform,
        abi=pin.cp_tag,
    )
    wanted = {m.overlay.library, m.overlay.link_library}
    unpacked = wheel_parts.extract(
        wheel,
        cache / "unpacked" / pin.sha256[:16],
        lambda n: n.startswith("torch/include/") or n in wanted,
        "torch/include + libc10",
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
            platform=_platform_of(pkg.filename),
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

    # 3. Exact upstream sources, verified file by file.
    upstream = sources.fetch_upstream(m, cache=cache)

    # 4. The patch series, applied with no fuzz into a scratch copy.
    patched = series.patched_tree(upstream, m.series_file, cache / "patched" / m.torch_version)

    # 5. The overlay library, built against the official headers and libc10.so.
    official = abi.read_elf(unpacked / m.overlay.library)
    inputs = overlay_build.OverlayInputs(
        source_dir=repo / "c10_overlay",
        torch_include=unpacked / "torch" / "include",
        torch_lib=unpacked / Path(m.overlay.link_library).parent,
        upstream_c10_cuda=patched / "c10" / "cuda",
        cuda_include=tuple(cuda_include),
        cudart_lib=cudart,
        cxx11_abi=m.wheel.cxx11_abi,
        soname=m.overlay.soname,
        rpath=official.rpath or "",
    )
    build_dir = overlay_build.build_dir_for(cache, m.torch_version, python, inputs)
    library = overlay_build.build(inputs, build_dir, toolchain=tools)

    # 6. ABI gate: same exported c10 symbols, SONAME, NEEDED and RPATH; uses UM.
    rebuilt = abi.read_elf(library)
    for note in abi.check_gate(
        official,
        rebuilt,
        needed_may_add=m.overlay.needed_may_add,
        needed_may_drop=m.overlay.needed_may_drop,
    ):
        progress.step(note)
    if not abi.imports_symbol(rebuilt, "cudaMallocManaged"):
        raise BuildError(
            f"{library} does not import cudaMallocManaged: the patch series or the engine "
            "did not make it into the build"
        )

    # 7. The platform tag the result honestly has.
    tag = platform_tag.wheel_platform_tag(pin.platform, rebuilt.version_needs)
    progress.step(f"platform tag: {tag}")

    # 8. Repack: the official wheel with the rebuilt library (and the overlay's Python).
    files: dict[str, repack.Content] = {m.overlay.library: library}
    files.update(overlay_python_files(repo / "c10_overlay"))
    out = dist / repack.output_name(wheel, m.um_version, tag)
    stamp_key = digest_of(
        {
            "format": REPACK_FORMAT,
            "wheel": pin.sha256,
            "version": m.um_version,
            "tag": tag,
            "files": {k: _content_digest(v) for k, v in sorted(files.items())},
        }
    )
    stamp = cache / "stamps" / f"{out.name}.json"
    if _stamp_matches(stamp, out, stamp_key):
        progress.step(f"{out} is up to date")
        reused = True
    else:
        spec = repack.RepackSpec(
            source=wheel, out_dir=dist, version=m.um_version, platform=tag, files=files
        )
        out = repack.repack(spec)
        st = out.stat()
        write_json(stamp, {"key": stamp_key, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
        reused = False
    seconds = time.monotonic() - started
    progress.step(f"built {out} in {seconds:.0f} s")
    return BuildResult(out, tag, library, unpacked / m.overlay.library, reused, seconds)


def _under(directory: str, also: str | None) -> Callable[[str], bool]:
    """Wheel member filter: everything under ``directory``, plus the file ``also``."""
    return lambda name: name.startswith(directory + "/") or name == also


def overlay_python_files(overlay: Path) -> dict[str, repack.Content]:
    """``c10_overlay/torch/**`` maps to ``torch/**`` inside the wheel."""
    root = overlay / "torch"
    if not root.is_dir():
        return {}
    return {
        "torch/" + p.relative_to(root).as_posix(): p
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }


def _content_digest(value: repack.Content) -> str:
    if isinstance(value, Path):
        return sha256_file(value)
    return digest_of(value.hex())


def _stamp_matches(stamp: Path, out: Path, key: str) -> bool:
    data = read_json(stamp)
    if not isinstance(data, dict) or data.get("key") != key or not out.is_file():
        return False
    st = out.stat()
    return bool(data.get("size") == st.st_size and data.get("mtime_ns") == st.st_mtime_ns)


def _platform_of(filename: str) -> str:
    """Platform tag of a wheel file name (the last dash-separated field)."""
    return filename.removesuffix(".whl").rsplit("-", 1)[-1]
