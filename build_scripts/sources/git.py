"""The upstream git repository at the pinned commit, file by file over HTTPS.

Only the pinned files are fetched (raw file by commit), with a short timeout: where the
repository host is unreachable, this provider steps aside within seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from build_scripts.fetch import Fetcher, FetchError, urllib_fetch
from build_scripts.matrix import VersionMatrix
from build_scripts.sources.base import ProviderUnavailable

_GITHUB = "https://github.com/"
_RAW = "https://raw.githubusercontent.com/"


def raw_url_base(repository: str, commit: str) -> str:
    """``https://github.com/o/r`` -> ``https://raw.githubusercontent.com/o/r/<commit>/``."""
    repo = repository.removesuffix(".git").rstrip("/")
    if repo.startswith(_GITHUB):
        return f"{_RAW}{repo[len(_GITHUB) :]}/{commit}/"
    return f"{repo}/raw/{commit}/"  # GitLab/Gitea-style hosts


class GitRawProvider:
    def __init__(
        self,
        *,
        fetcher: Fetcher = urllib_fetch,
        timeout: float = 5.0,
        base_url: str | None = None,
    ) -> None:
        self.fetcher = fetcher
        self.timeout = timeout
        self.base_url = base_url

    @property
    def name(self) -> str:
        return "upstream git (raw files by commit)"

    def provide(self, matrix: VersionMatrix, paths: Sequence[str], dest: Path) -> None:
        base = self.base_url or raw_url_base(matrix.upstream.repository, matrix.upstream.commit)
        for rel in paths:
            try:
                self.fetcher(base + rel, dest / rel, self.timeout)
            except FetchError as exc:
                raise ProviderUnavailable(str(exc)) from None
