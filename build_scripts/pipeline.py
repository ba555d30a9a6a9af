"""From ``make build TORCH_VERSION=X.Y.Z`` to ``dist/torch-X.Y.Z+um-...whl``.

Read top to bottom: each step names the module that does it. Every step either
finishes or leaves nothing behind that a rerun would trust; every step reuses its cached
result when its inputs did not change, so a warm rerun takes seconds.

 1. matrix         load patches/<version>/upstream.yaml (what to fetch, with hashes)
 2. official       the official wheel and the CUDA header packages (pip download)
 3-6. integration  the path the version names (an IntegrationPath; docs/design.md):
      source_path  upstream c10/cuda + patch series + engine -> libc10_cuda.so, ABI gate
      inject_path  engine -> libtorch_um.so + patched Python files that load it
 7. platform_tag   the honest manylinux tag of the result
 8. repack         official wheel + changes + c10_overlay/torch/** -> dist/torch-X.Y.Z+um-*.whl
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from build_scripts import integration, matrix, official, platform_tag, progress, repack

__all__ = ["BuildResult", "build", "overlay_python_files", "repack_if_changed"]
from build_scripts.changes import overlay_python_files
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
    m.wheel.for_python(python)  # an unsupported CPython fails before any download
    tools = overlay_toolchain()  # fail before any download when cmake/ninja/c++ are missing
    gnu_patch()

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
    # One stamp per output folder: worktrees sharing the cache build the same file name.
    stamp = cache / "stamps" / f"{digest_of(str(dist.resolve()))[:12]}-{out.name}.json"
    if _stamp_matches(stamp, out, stamp_key):
        progress.step(f"{out} is up to date")
        return out, True
    spec = repack.RepackSpec(
        source=inputs.wheel, out_dir=dist, version=m.um_version, platform=tag, files=files
    )
    out = repack.repack(spec)
    st = out.stat()
    write_json(stamp, {"key": stamp_key, "size": st.st_size, "mtime_ns": st.st_mtime_ns})
    return out, False


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
