"""Upstream source files, from the first provider that can serve them.

Order: ``TORCH_SRC`` (a local tree or tarball), the upstream git repository at the
pinned commit, then Debian's source package. Whatever served a file, its sha256 must
match upstream.yaml before the build uses it. A warm cache is reused only when it holds
exactly the pinned files with their hashes, and never when ``TORCH_SRC`` is set: then the
files are taken from ``TORCH_SRC`` and verified, warm cache or not.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from build_scripts import progress
from build_scripts.errors import BuildError
from build_scripts.fsutil import atomic_dir, sha256_file
from build_scripts.matrix import UpstreamFile, VersionMatrix
from build_scripts.paths import cache_root
from build_scripts.sources.base import Provider, ProviderUnavailable
from build_scripts.sources.debian import DebianProvider
from build_scripts.sources.git import GitRawProvider
from build_scripts.sources.local import LocalProvider

__all__ = [
    "Provider",
    "ProviderUnavailable",
    "default_providers",
    "fetch_upstream",
    "verify_tree",
]


def default_providers(cache: Path | None = None) -> list[Provider]:
    cache = cache or cache_root()
    providers: list[Provider] = []
    torch_src = os.environ.get("TORCH_SRC")
    if torch_src:
        providers.append(LocalProvider(Path(torch_src).expanduser()))
    if os.environ.get("TORCH_UM_NO_GIT", "") == "":
        providers.append(GitRawProvider())
    providers.append(DebianProvider(cache_dir=cache))
    return providers


def verify_tree(root: Path, files: Sequence[UpstreamFile], served_by: str) -> None:
    """Every pinned file exists under ``root`` with its pinned sha256."""
    for f in files:
        p = root / f.path
        if not p.is_file():
            raise BuildError(f"{served_by} did not provide {f.path}")
        actual = sha256_file(p)
        if actual != f.sha256:
            raise BuildError(
                f"upstream file {f.path} from {served_by} has sha256 {actual}, but "
                f"upstream.yaml pins {f.sha256}: the source is not the pinned upstream "
                "commit (point TORCH_SRC at the right tree, or update the pin deliberately)"
            )


def _extra_files(root: Path, files: Sequence[UpstreamFile]) -> str:
    pinned = {f.path for f in files}
    extra = sorted(
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if not p.is_dir() and p.relative_to(root).as_posix() not in pinned
    )
    return ", ".join(extra[:3])


def fetch_upstream(
    matrix: VersionMatrix,
    providers: Sequence[Provider] | None = None,
    cache: Path | None = None,
) -> Path:
    """Return a cached directory holding exactly the pinned upstream files, verified."""
    cache = cache or cache_root()
    dest = cache / "upstream" / f"{matrix.torch_version}-{matrix.upstream.commit[:12]}"
    torch_src = providers is None and os.environ.get("TORCH_SRC")
    if dest.is_dir() and not torch_src:
        try:
            verify_tree(dest, matrix.sources, "the cache")
            extra = _extra_files(dest, matrix.sources)
            if not extra:
                return dest
            progress.step(f"{dest} holds files that are not pinned ({extra}): fetching again")
        except BuildError:
            pass  # stale or tampered: fetch again
    providers = list(providers) if providers is not None else default_providers(cache)
    reasons = []
    for provider in providers:
        progress.step(f"fetching {len(matrix.sources)} upstream files: {provider.name}")
        try:
            with atomic_dir(dest) as tmp:
                provider.provide(matrix, [f.path for f in matrix.sources], tmp)
                verify_tree(tmp, matrix.sources, provider.name)
        except ProviderUnavailable as exc:
            reasons.append(f"{provider.name}: {exc}")
            continue
        return dest
    raise BuildError(
        "no source provider could serve the upstream files of torch "
        f"{matrix.torch_version} ({matrix.upstream.tag}, {matrix.upstream.commit}):\n- "
        + "\n- ".join(reasons)
        + "\nSet TORCH_SRC to a checkout or source tarball of that commit."
    )
