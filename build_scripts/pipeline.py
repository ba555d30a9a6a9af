"""From ``make build TORCH_VERSION=X.Y.Z`` to ``dist/torch-X.Y.Z+um-...whl``.

Read top to bottom: each step names the module that does it. Every step either
finishes or leaves nothing behind that a rerun would trust; every step reuses its cached
result when its inputs did not change, so a warm rerun takes seconds. Before anything is
downloaded: every tool is found and the compiler tried, the cache and dist/ are writable
with room on their disks, and this version's build lock is taken (a second build of the
same version waits); then the leftovers of killed runs are swept.

 1. matrix         load patches/<version>/upstream.yaml (what to fetch, with hashes)
 2. official       the official wheel and the CUDA header packages (pip download)
 3-6. integration  the path the version names (an IntegrationPath; docs/design.md):
      source_path  upstream c10/cuda + patch series + engine -> libc10_cuda.so, ABI gate
      inject_path  engine -> libtorch_um.so + patched Python files that load it
 7. platform_tag   the honest manylinux tag of the result
 8. repack         official wheel + changes + c10_overlay/torch/** -> dist/torch-X.Y.Z+um-*.whl
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from build_scripts import (
    integration,
    locks,
    matrix,
    official,
    platform_tag,
    progress,
    repack,
)

__all__ = ["BuildResult", "build", "overlay_python_files", "repack_if_changed"]
from build_scripts.changes import overlay_python_files
from build_scripts.errors import BuildError
from build_scripts.fsutil import (
    PARTIAL,
    digest_of,
    file_record,
    matches_record,
    mebibytes,
    mount_point,
    read_json,
    sha256_file,
    sweep_leftovers,
    write_json,
)
from build_scripts.paths import REPO_ROOT, cache_root
from build_scripts.toolchain import Toolchain, build_toolchain

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

    # 1. What to build, pinned; what it needs, checked before any download.
    m = matrix.load(torch_version, repo / "patches")
    pin = m.wheel.for_python(python)  # an unsupported CPython fails before any download
    tools = build_toolchain()  # every missing tool at once; the compiler compiles a probe
    check_directories(cache, dist, official.cached_wheel(cache, pin))
    if os.environ.get("TORCH_SRC") and m.integration != "source":
        progress.step(
            f"TORCH_SRC is not used: torch {m.torch_version} takes the {m.integration} path, "
            "which reads no upstream source"
        )
    with locks.build_lock(cache, m.torch_version):
        for leftover in sweep_leftovers(cache) + sweep_leftovers(dist, depth=1):
            progress.step(f"removed {leftover}, left by a build that was killed")
        return _build(m, python, tools, repo=repo, cache=cache, dist=dist, started=started)


def _build(
    m: matrix.VersionMatrix,
    python: str,
    tools: Toolchain,
    *,
    repo: Path,
    cache: Path,
    dist: Path,
    started: float,
) -> BuildResult:
    # 2. The official wheel and the CUDA headers, verified against their sha256.
    inputs = official.fetch_inputs(m, python, cache)

    # 3-6. The engine, reached through the path this version takes.
    path = integration.for_version(m)
    changes = path.build(m, inputs, python, repo=repo, cache=cache, toolchain=tools)

    # 7. The platform tag the result honestly has.
    tag = platform_tag.wheel_platform_tag(inputs.pin.platform, changes.elf.version_needs)
    progress.step(f"platform tag: {tag}")

    # 8. Repack: the official wheel with the changes and the overlay's Python files.
    files: dict[str, repack.Content] = dict(changes.files)
    files.update(overlay_python_files(repo / "c10_overlay"))
    out, reused = repack_if_changed(inputs, m, tag, files, dist=dist, cache=cache)
    seconds = time.monotonic() - started
    progress.step(f"built {out} in {seconds:.0f} s")
    return BuildResult(out, tag, changes.library, changes.official_library, reused, seconds)


#: room the build needs in the cache: the official wheel (about 0.5-0.8 GB) and the CUDA
#: packages when they are not cached yet, extracted headers and the overlay build always
_CACHE_COLD = 1536 << 20
_CACHE_WARM = 256 << 20
#: room for the wheel in dist/ when the official one is not cached yet (its size if it is)
_DIST_COLD = 1024 << 20


def check_directories(cache: Path, dist: Path, cached_wheel: Path) -> None:
    """The cache and dist/ are writable directories with room for the build on their disks."""
    writable_dir(cache, "the cache", "set TORCH_UM_CACHE to a writable directory")
    writable_dir(dist, "the output directory", "pass another --dist")
    wheel = cached_wheel.stat().st_size if cached_wheel.is_file() else 0
    needs = {
        cache: (_CACHE_WARM if wheel else _CACHE_COLD, "TORCH_UM_CACHE"),
        dist: (wheel + wheel // 16 if wheel else _DIST_COLD, "--dist"),
    }
    by_disk: dict[int, list[Path]] = {}
    for path in needs:
        by_disk.setdefault(path.stat().st_dev, []).append(path)
    for paths in by_disk.values():
        need = sum(needs[p][0] for p in paths)
        free = shutil.disk_usage(paths[0]).free
        if free < need:
            names = " and ".join(str(p) for p in paths)
            knobs = " or ".join(needs[p][1] for p in paths)
            raise BuildError(
                f"only {mebibytes(free)} free on {mount_point(paths[0])} (holding {names}); "
                f"the build needs about {mebibytes(need)} there: free space, or set {knobs} "
                "to a directory on another disk"
            )


def writable_dir(path: Path, what: str, fix: str) -> None:
    """``path`` is (or is made) a directory this process can create files in."""
    if path.exists() and not path.is_dir():
        raise BuildError(f"{what} {path} is not a directory: remove it, or {fix}")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".tmp-probe.", suffix=PARTIAL, dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise BuildError(
            f"cannot write {what} {path} ({exc.strerror}): make it writable, or {fix}"
        ) from None


def repack_if_changed(
    inputs: official.OfficialInputs,
    m: matrix.VersionMatrix,
    tag: str,
    files: dict[str, repack.Content],
    *,
    dist: Path,
    cache: Path,
) -> tuple[Path, bool]:
    """Repack unless dist/ already holds the wheel these exact inputs give."""
    out = dist / repack.output_name(inputs.wheel, m.um_version, tag)
    stamp_key = digest_of(
        {
            "format": REPACK_FORMAT,
            "wheel": inputs.pin.sha256,
            "version": m.um_version,
            "tag": tag,
            "files": {k: _content_digest(v) for k, v in sorted(files.items())},
        }
    )
    # One stamp per output folder: checkouts sharing the cache build the same file name.
    stamp = cache / "stamps" / f"{digest_of(str(dist.resolve()))[:12]}-{out.name}.json"
    if _stamp_matches(stamp, out, stamp_key):
        progress.step(f"{out} is up to date")
        return out, True
    spec = repack.RepackSpec(
        source=inputs.wheel, out_dir=dist, version=m.um_version, platform=tag, files=files
    )
    out = repack.repack(spec)
    write_json(stamp, {"key": stamp_key, "wheel": file_record(out)})
    return out, False


def _content_digest(value: repack.Content) -> str:
    if isinstance(value, Path):
        return sha256_file(value)
    return digest_of(value.hex())


def _stamp_matches(stamp: Path, out: Path, key: str) -> bool:
    """The stamp is of these inputs, and ``out`` is still the wheel that was written (its
    stat, ctime included, or else its sha256, is as recorded)."""
    data = read_json(stamp)
    if not isinstance(data, dict) or data.get("key") != key:
        return False
    return matches_record(out, data.get("wheel"))
