"""Write the folder that run_on_device.sh runs on a GPU host (source path, torch 2.6.0).

    .venv/bin/python tests/gpu/source_path/bundle.py [--dest .device/source26]

Builds (or reuses from the cache) the source path's libc10_cuda.so exactly as `make build
TORCH_VERSION=2.6.0` does, compiles um_allocator_check.cpp against the official wheel's
headers, and copies the check with the four libraries it runs with (about 3 MB):
the rebuilt libc10_cuda.so, the official libc10.so and the CUDA runtime of the wheel's
CUDA version. The GPU host needs no torch 2.6 install.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

from build_scripts import matrix, official, source_path
from build_scripts.errors import BuildError
from build_scripts.paths import REPO_ROOT, cache_root
from build_scripts.toolchain import overlay_toolchain

HERE = Path(__file__).resolve().parent


def bundle(dest: Path, torch_version: str = "2.6.0", python: str = "3.11") -> Path:
    m = matrix.load(torch_version, REPO_ROOT / "patches")
    cache = cache_root()
    inputs = official.fetch_inputs(m, python, cache)
    changes = source_path.build(
        m, inputs, python, repo=REPO_ROOT, cache=cache, toolchain=overlay_toolchain()
    )
    torch_lib = changes.official_library.parent  # <unpacked wheel>/torch/lib
    include = torch_lib.parent / "include"
    if dest.exists():
        shutil.rmtree(dest)
    dest.mkdir(parents=True)
    cxx = shutil.which("c++") or "g++"
    cmd = [
        cxx,
        "-std=c++17",
        "-O1",
        f"-D_GLIBCXX_USE_CXX11_ABI={m.wheel.cxx11_abi}",
        f"-I{include}",
        *[f"-I{d}" for d in inputs.cuda_include],
        str(HERE / "um_allocator_check.cpp"),
        "-o",
        str(dest / "um_check"),
        str(changes.library),
        str(torch_lib / "libc10.so"),
        str(inputs.cudart),
        "-Wl,-rpath,$ORIGIN",
    ]
    subprocess.run(cmd, check=True)
    for lib in (changes.library, torch_lib / "libc10.so", inputs.cudart):
        shutil.copyfile(lib, dest / lib.name)
    print(f"GPU check bundle in {dest}: run tests/gpu/source_path/run_on_device.sh {dest}")
    return dest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dest", type=Path, default=REPO_ROOT / ".device" / "source26")
    args = ap.parse_args()
    try:
        bundle(args.dest)
    except (BuildError, subprocess.CalledProcessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
