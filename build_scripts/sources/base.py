"""What a source provider is."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

from build_scripts.matrix import VersionMatrix


class ProviderUnavailable(Exception):
    """This provider cannot serve the files here (not configured, unreachable, not found).

    The next provider is tried. Anything else (a wrong hash, a corrupt archive) is a
    BuildError and stops the build.
    """


class Provider(Protocol):
    @property
    def name(self) -> str: ...

    def provide(self, matrix: VersionMatrix, paths: Sequence[str], dest: Path) -> None:
        """Write each of ``paths`` (relative to the upstream root) under ``dest``."""
        ...
