"""How a torch version's allocator is reached: the integration paths and their registry.

The engine of ``c10_overlay/`` is one; the ways to reach the caching allocator are two
(docs/design.md, "One engine, two integration paths"). A version's ``upstream.yaml`` names
its path with ``integration:``; :func:`for_version` is the one place that turns that name
into the object that builds it, for the pipeline (``pipeline.py``), the CLI (``series``,
``bundle``, ``version add``) and the tests alike.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from build_scripts.changes import WheelChanges
from build_scripts.matrix import Integration, VersionMatrix
from build_scripts.official import OfficialInputs
from build_scripts.toolchain import Toolchain


@dataclass(frozen=True)
class WheelEdit:
    """What a path does to the official wheel, before the pipeline adds the overlay's
    Python files and rewrites ``torch/version.py`` and the dist-info."""

    replaced: tuple[str, ...]  # official files whose content changes
    added: tuple[str, ...]  # files the official wheel does not have


class IntegrationPath(Protocol):
    """One way to reach the caching allocator (steps 3-6 of the pipeline)."""

    @property
    def name(self) -> Integration: ...

    def build(
        self,
        m: VersionMatrix,
        official: OfficialInputs,
        python: str,
        *,
        repo: Path,
        cache: Path,
        toolchain: Toolchain,
    ) -> WheelChanges:
        """Build the library and the patched files for the official wheel ``official``."""
        ...

    def series_base(self, m: VersionMatrix, cache: Path) -> Path:
        """The verified tree the version's patch series applies to (``series check`` and
        ``series refresh`` use it, the build applies the series to the same files)."""
        ...

    def wheel_edit(self, m: VersionMatrix) -> WheelEdit:
        """The paths inside the wheel that :meth:`build` replaces or adds."""
        ...


def registry() -> Mapping[Integration, IntegrationPath]:
    """Every integration path, by the name ``upstream.yaml`` gives it."""
    from build_scripts import inject_path, source_path

    paths: tuple[IntegrationPath, ...] = (source_path.PATH, inject_path.PATH)
    return {p.name: p for p in paths}


def for_version(m: VersionMatrix) -> IntegrationPath:
    return registry()[m.integration]
