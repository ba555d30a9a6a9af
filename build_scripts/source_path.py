"""The source path: torch versions whose exact upstream C++ source is reachable (2.6.0).

``libc10_cuda.so`` is rebuilt from the upstream ``c10/cuda`` files with
``patches/<version>/series`` applied, plus the engine of ``c10_overlay/``, against the
official wheel's own headers, and replaces the official library in the wheel.

 3. sources        the pinned upstream c10/cuda files (TORCH_SRC, git, Debian), verified
 4. series         patches/<version>/series applied with no fuzz into a scratch copy
 5. overlay_build  CMake + Ninja on c10_overlay/ (UM_MODE=source) -> libc10_cuda.so
 6. abi            the gate: same exported c10 symbols, SONAME, NEEDED, RPATH; imports
                   cudaMallocManaged

Python files of the wheel that the series patches (``torch/...`` entries of ``sources``)
are shipped patched, after checking that the wheel's copies are the pinned upstream ones.
"""

from __future__ import annotations

from pathlib import Path

from build_scripts import abi, matrix, overlay_build, progress, series, sources
from build_scripts.changes import WheelChanges
from build_scripts.errors import BuildError
from build_scripts.integration import WheelEdit
from build_scripts.matrix import Integration
from build_scripts.official import OfficialInputs, headers_and_libraries, work_dir
from build_scripts.official import wheel_files as official_files
from build_scripts.toolchain import Toolchain


class SourcePath:
    """``integration: source`` (IntegrationPath)."""

    @property
    def name(self) -> Integration:
        return "source"

    def wheel_edit(self, m: matrix.VersionMatrix) -> WheelEdit:
        shipped = tuple(f.path for f in m.sources if f.path.startswith("torch/"))
        return WheelEdit(replaced=(m.overlay.library, *shipped), added=())

    def series_base(self, m: matrix.VersionMatrix, cache: Path) -> Path:
        """The pinned upstream files (TORCH_SRC, git, Debian), verified."""
        return sources.fetch_upstream(m, cache=cache)

    def build(
        self,
        m: matrix.VersionMatrix,
        official: OfficialInputs,
        python: str,
        *,
        repo: Path,
        cache: Path,
        toolchain: Toolchain,
    ) -> WheelChanges:
        return build(m, official, python, repo=repo, cache=cache, toolchain=toolchain)


def build(
    m: matrix.VersionMatrix,
    official: OfficialInputs,
    python: str,
    *,
    repo: Path,
    cache: Path,
    toolchain: Toolchain,
) -> WheelChanges:
    # The official headers, libc10.so to link against, and the library to replace.
    unpacked = headers_and_libraries(m, official, cache)

    # 3. Exact upstream sources, verified file by file.
    upstream = sources.fetch_upstream(m, cache=cache)

    # 4. The patch series, applied with no fuzz into a scratch copy.
    patched = series.patched_tree(upstream, m.series_file, work_dir(cache, "patched", m, official))

    # 5. The overlay library, built against the official headers and libc10.so.
    official_lib = unpacked / m.overlay.library
    original = abi.read_elf(official_lib)
    library = overlay_build.build_for_version(
        m,
        official,
        unpacked,
        rpath=original.rpath or "",
        upstream_c10_cuda=patched / "c10" / "cuda",
        python=python,
        repo=repo,
        cache=cache,
        toolchain=toolchain,
    )

    # 6. ABI gate: same exported c10 symbols, SONAME, NEEDED and RPATH; uses UM.
    rebuilt = abi.read_elf(library)
    for note in abi.check_gate(
        original,
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
    # Python files the series patches ship patched; the wheel's own copies must be the
    # pinned upstream ones, so nothing else in them changes.
    files = {m.overlay.library: library}
    shipped = [f for f in m.sources if f.path.startswith("torch/")]
    if shipped:
        official_files(m, official, shipped, cache)
        files.update({f.path: patched / f.path for f in shipped})
    return WheelChanges(library, rebuilt, official_lib, files)


PATH = SourcePath()
