"""The injection path: torch versions whose C++ source is not reachable.

Why this path exists and what it can and cannot do: docs/design.md ("One engine, two
integration paths") and docs/injection.md.

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
 6. gate       SONAME, RPATH, the interposed symbols in the runtime's version node, and
               every function the C API headers declare (build_scripts/c_api.py)

Steps 1-2 and 7-8 are the pipeline's (pipeline.py); ``python -m build_scripts bundle``
(bundle.py) runs steps 2-6 for a GPU host.
"""

from __future__ import annotations

from pathlib import Path

from build_scripts import abi, c_api, matrix, overlay_build, progress, series
from build_scripts.changes import WheelChanges
from build_scripts.errors import BuildError
from build_scripts.integration import WheelEdit
from build_scripts.matrix import Integration
from build_scripts.official import OfficialInputs, headers_and_libraries, wheel_files, work_dir
from build_scripts.toolchain import Toolchain

#: what libtorch_um.so must export in the CUDA runtime's version node
INTERPOSED = (
    "cudaMalloc",
    "cudaFree",
    "cudaStreamBeginCapture",
    "cudaStreamEndCapture",
    "cudaIpcGetMemHandle",
    "cudaMemcpyAsync",
)


def check_gate(
    elf: abi.ElfInfo,
    soname: str,
    rpath: str | None,
    cudart_soname: str,
    c_api_functions: tuple[str, ...],
) -> None:
    """The built library is one that ``import torch`` can load and the allocator binds to,
    and it exports the whole C API (``c_api_functions``, as the headers declare it)."""
    problems = []
    if elf.soname != soname:
        problems.append(f"SONAME is {elf.soname!r}, expected {soname!r}")
    if (elf.rpath or "") != (rpath or ""):
        problems.append(f"RPATH is {elf.rpath!r}, expected the official {rpath!r}")
    versions = abi.exported_versions(elf.path)
    for name in INTERPOSED:
        if versions.get(name) != cudart_soname:
            have = versions.get(name)
            problems.append(
                f"{name} is {'not exported' if have is None else f'exported in version {have!r}'}, "
                f"expected {name}@@{cudart_soname}"
            )
    for name in c_api_functions:
        if name not in elf.exported:
            problems.append(f"C API function {name} is not exported")
    if not abi.imports_symbol(elf, "cudaMallocManaged"):
        problems.append("it does not import cudaMallocManaged (the engine is missing)")
    if problems:
        raise BuildError(f"{elf.path} fails the injection gate: " + "; ".join(problems))


class InjectPath:
    """``integration: inject`` (IntegrationPath)."""

    @property
    def name(self) -> Integration:
        return "inject"

    def wheel_edit(self, m: matrix.VersionMatrix) -> WheelEdit:
        return WheelEdit(replaced=tuple(f.path for f in m.sources), added=(m.overlay.library,))

    def series_base(self, m: matrix.VersionMatrix, cache: Path) -> Path:
        """The official wheel's files that the series patches (``sources``, pinned as found
        in the wheel), verified, from the first pinned wheel."""
        from build_scripts import official

        inputs = official.fetch_inputs(m, m.wheel.files[0].python, cache)
        return self.official_sources(m, inputs, cache)

    @staticmethod
    def official_sources(m: matrix.VersionMatrix, official: OfficialInputs, cache: Path) -> Path:
        return wheel_files(m, official, m.sources, cache)

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
        if m.integration != "inject":
            raise BuildError(
                f"torch {m.torch_version} uses the {m.integration!r} path, not 'inject'"
            )

        # 3. Headers, the libraries to link against, the Python files to patch.
        unpacked = headers_and_libraries(m, official, cache)
        originals = self.official_sources(m, official, cache)

        # 4. The Python patches, no fuzz.
        patched = series.patched_tree(
            originals, m.series_file, work_dir(cache, "patched", m, official)
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
        functions = c_api.function_names(repo / "c10_overlay", inject=True)
        check_gate(elf, m.overlay.soname, original.rpath, official.cudart.name, functions)
        progress.step(
            f"{library.name}: {', '.join(INTERPOSED)} interposed as @@{official.cudart.name}; "
            f"{len(functions)} C API functions exported"
        )

        files: dict[str, Path] = {m.overlay.library: library}
        for f in m.sources:
            files[f.path] = patched / f.path
        return WheelChanges(library, elf, official_lib, files)


PATH = InjectPath()
