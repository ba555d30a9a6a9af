"""Build the overlay library (``c10_overlay/``) with CMake and Ninja.

The CMake contract (c10_overlay/CMakeLists.txt implements it)::

    cmake -S c10_overlay -B <builddir> -G Ninja -DCMAKE_BUILD_TYPE=Release
      -DUM_MODE=source
      -DUM_TORCH_INCLUDE=<unpacked wheel>/torch/include
      -DUM_TORCH_LIB=<unpacked wheel>/torch/lib          # holds libc10.so
      -DUM_UPSTREAM_C10_CUDA=<patched tree>/c10/cuda
      -DUM_CUDA_INCLUDE=<dir1>;<dir2>;...
      -DUM_CUDART_LIB=<.../libcudart.so.12>
      -DUM_CXX11_ABI=0|1
      -DUM_SONAME=libc10_cuda.so
      -DUM_RPATH=<RPATH of the official library>
      -DUM_CXX_STANDARD=17|20                          # what the wheel's TorchConfig.cmake says
    cmake --build <builddir>                           # -> <builddir>/libc10_cuda.so

The build directory lives in the cache, keyed by torch version, Python and the configure
arguments, so a rerun is incremental. CMake, Ninja and the compilers run in a process group
that dies with the build (``subproc.group``). The built library's state is recorded after
each build; a library changed since then is removed first, so Ninja links it again.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import zipfile
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from build_scripts import matrix, progress, subproc
from build_scripts.errors import BuildError
from build_scripts.fsutil import digest_of, file_record, matches_record, read_json, write_json
from build_scripts.official import OfficialInputs
from build_scripts.toolchain import Toolchain, overlay_toolchain

_NINJA_STATUS = re.compile(r"^\[(\d+)/(\d+)\] ")


@dataclass(frozen=True)
class OverlayInputs:
    source_dir: Path  # c10_overlay/
    torch_include: Path
    torch_lib: Path
    upstream_c10_cuda: Path | None  # the patched c10/cuda (source mode only)
    cuda_include: tuple[Path, ...]
    cudart_lib: Path
    cxx11_abi: int
    soname: str
    rpath: str
    mode: str = "source"
    cxx_standard: int = 17

    def cmake_defines(self) -> dict[str, str]:
        upstream = (
            {}
            if self.upstream_c10_cuda is None
            else {"UM_UPSTREAM_C10_CUDA": str(self.upstream_c10_cuda)}
        )
        return {
            "CMAKE_BUILD_TYPE": "Release",
            "UM_MODE": self.mode,
            "UM_TORCH_INCLUDE": str(self.torch_include),
            "UM_TORCH_LIB": str(self.torch_lib),
            **upstream,
            "UM_CUDA_INCLUDE": ";".join(str(p) for p in self.cuda_include),
            "UM_CUDART_LIB": str(self.cudart_lib),
            "UM_CXX11_ABI": str(self.cxx11_abi),
            "UM_SONAME": self.soname,
            "UM_RPATH": self.rpath,
            "UM_CXX_STANDARD": str(self.cxx_standard),
        }


def build_for_version(
    m: matrix.VersionMatrix,
    official: OfficialInputs,
    unpacked: Path,
    *,
    rpath: str,
    upstream_c10_cuda: Path | None,
    python: str,
    repo: Path,
    cache: Path,
    toolchain: Toolchain,
) -> Path:
    """Build ``c10_overlay/`` in the mode ``m.integration`` names, against the official
    wheel's headers and libraries unpacked at ``unpacked`` (both integration paths)."""
    inputs = OverlayInputs(
        source_dir=repo / "c10_overlay",
        torch_include=unpacked / "torch" / "include",
        torch_lib=unpacked / Path(m.overlay.link_library).parent,
        upstream_c10_cuda=upstream_c10_cuda,
        cuda_include=official.cuda_include,
        cudart_lib=official.cudart,
        cxx11_abi=m.wheel.cxx11_abi,
        soname=m.overlay.soname,
        rpath=rpath,
        mode=m.integration,
        cxx_standard=cxx_standard(official.wheel),
    )
    build_dir = build_dir_for(cache, m.torch_version, python, inputs, toolchain)
    return build(inputs, build_dir, toolchain=toolchain)


#: how a TorchConfig.cmake names its standard: a target property ``CXX_STANDARD 20`` (2.13,
#: 2.14), or from 2.15 a compile feature ``cxx_std_20`` with ``-std=c++20`` (``/std:c++20``)
#: as the fallback for compilers that report no features
_CXX_STANDARD = re.compile(
    r"^\s*CXX_STANDARD\s+(\d+)\s*$|\bcxx_std_(\d+)\b|[-/]std[=:](?:c|gnu)\+\+(\d+)\b", re.M
)
_TORCH_CONFIG = "torch/share/cmake/Torch/TorchConfig.cmake"


def cxx_standard(wheel: Path) -> int:
    """The C++ standard the official wheel's headers need: its TorchConfig.cmake's
    ``CXX_STANDARD`` or ``cxx_std_NN`` (17 up to torch 2.12, 20 from 2.13); 17 when it
    names none."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            text = zf.read(_TORCH_CONFIG).decode()
    except KeyError:
        return 17
    except (zipfile.BadZipFile, OSError) as exc:
        raise BuildError(f"cannot read {wheel}: {exc} (delete it to download it again)") from None
    found = {int(next(v for v in m if v)) for m in _CXX_STANDARD.findall(text)}
    if len(found) > 1:
        raise BuildError(f"{wheel.name}: {_TORCH_CONFIG} names several C++ standards {found}")
    return found.pop() if found else 17


def configure_command(tc: Toolchain, inputs: OverlayInputs, build_dir: Path) -> list[str]:
    cmd = [
        str(tc.cmake),
        "-S",
        str(inputs.source_dir),
        "-B",
        str(build_dir),
        "-G",
        "Ninja",
        f"-DCMAKE_MAKE_PROGRAM={tc.ninja}",
        f"-DCMAKE_CXX_COMPILER={tc.cxx}",
    ]
    cmd += [f"-D{k}={v}" for k, v in inputs.cmake_defines().items()]
    return cmd


def build_dir_for(
    cache: Path,
    torch_version: str,
    python: str,
    inputs: OverlayInputs,
    toolchain: Toolchain | None = None,
) -> Path:
    """One build folder per set of inputs and compiler: ninja never reuses objects that
    another compiler (a container's toolchain sharing the cache, say) produced."""
    compiler = compiler_identity(toolchain.cxx) if toolchain else ""
    key = digest_of(
        inputs.cmake_defines() | {"source": str(inputs.source_dir), "compiler": compiler}
    )
    return cache / "build" / f"{torch_version}-py{python}-{key}"


def compiler_identity(cxx: Path) -> str:
    """The compiler's resolved path and the first line of its ``--version``."""
    try:
        out = subprocess.run(
            [str(cxx), "--version"], capture_output=True, text=True, check=False
        ).stdout
    except OSError:
        out = ""
    first = out.splitlines()[0] if out else ""
    return f"{cxx.resolve()} {first}"


def build(inputs: OverlayInputs, build_dir: Path, *, toolchain: Toolchain | None = None) -> Path:
    """Configure (when needed) and build; return the built ``<build_dir>/<soname>``."""
    if not (inputs.source_dir / "CMakeLists.txt").is_file():
        raise BuildError(
            f"{inputs.source_dir}/CMakeLists.txt does not exist: the overlay sources are "
            "missing from this checkout"
        )
    tc = toolchain or overlay_toolchain()
    build_dir.mkdir(parents=True, exist_ok=True)
    log = build_dir / "um-build.log"
    log.write_text("")  # one log per run
    cmd = configure_command(tc, inputs, build_dir)
    stamp = build_dir / "um-configure.json"
    if not (build_dir / "build.ninja").is_file() or read_json(stamp) != cmd:
        progress.step(f"configuring the overlay build in {build_dir}")
        _run(cmd, log, "cmake configure of c10_overlay", build_dir)
        write_json(stamp, cmd)
    progress.step("building the overlay library")
    output = build_dir / inputs.soname
    record = build_dir / "um-output.json"
    built = read_json(record)
    if output.exists() and not matches_record(output, built):
        why = "changed since it was built" if built else "has no record of its build"
        progress.step(f"{output} {why}: linking it again")
        output.unlink()
    before = output.stat().st_mtime_ns if output.exists() else None
    _run(
        [str(tc.cmake), "--build", str(build_dir)],
        log,
        "overlay build",
        build_dir,
        ninja_progress=True,
    )
    if not output.is_file():
        raise BuildError(
            f"the overlay build finished but produced no {output}: c10_overlay/CMakeLists.txt "
            f"must build a library named {inputs.soname} in the build directory "
            f"(log: {log})"
        )
    write_json(record, file_record(output))
    if before is not None and output.stat().st_mtime_ns == before:
        progress.step(f"{inputs.soname} is up to date")
    return output


def _run(cmd: list[str], log: Path, what: str, cwd: Path, *, ninja_progress: bool = False) -> None:
    env = dict(os.environ, NINJA_STATUS="[%f/%t] ", LC_ALL="C")
    tail: deque[str] = deque(maxlen=40)
    with log.open("a") as logf, progress.bar(what, None, unit="step") as pbar:
        logf.write("$ " + " ".join(cmd) + "\n")
        if not shutil.which(cmd[0]):
            raise BuildError(f"cannot run {cmd[0]}: it is not an executable")
        with subproc.group(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=cwd
        ) as proc:
            assert proc.stdout is not None
            for line in proc.stdout:
                logf.write(line)
                tail.append(line.rstrip())
                m = _NINJA_STATUS.match(line) if ninja_progress else None
                if m:
                    pbar.total = int(m.group(2))
                    pbar.n = int(m.group(1))
                    pbar.refresh()
            rc = proc.wait()
    if rc != 0:
        raise BuildError(
            f"{what} failed (exit {rc}); last lines:\n" + "\n".join(tail) + f"\nfull log: {log}"
        )
