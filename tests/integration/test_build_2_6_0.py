"""The real torch 2.6.0+um build, end to end, and the wheel installed into a fresh venv.

Cold, this downloads the official wheel (767 MB), the CUDA header packages, the Debian
source tarball, and, for the venv, torch's dependencies (~3 GB of nvidia-*-cu12). All of
it is cached under ${XDG_CACHE_HOME:-~/.cache} (torch-um/ and pip's cache). Deselect
locally with ``-m 'not integration'`` (``make test-unit``).
"""

from __future__ import annotations

import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from build_scripts import abi, matrix, pipeline
from build_scripts.changes import overlay_python_files
from build_scripts.fsutil import sha256_file
from build_scripts.paths import REPO_ROOT

from .conftest import (
    Build,
    Install,
    check_make_build,
    official_wheel_for,
    pip_check,
    probe,
    run_python,
    wheel_difference,
)

pytestmark = pytest.mark.integration
VERSION = "2.6.0"


@pytest.fixture(scope="module")
def built(build_wheel: Build) -> pipeline.BuildResult:
    return build_wheel(VERSION)


def test_abi_gate_and_unified_memory(built: pipeline.BuildResult) -> None:
    m = matrix.load(VERSION)
    official = abi.read_elf(built.official_library)
    rebuilt = abi.read_elf(built.rebuilt_library)
    abi.check_gate(
        official,
        rebuilt,
        needed_may_add=m.overlay.needed_may_add,
        needed_may_drop=m.overlay.needed_may_drop,
    )
    assert rebuilt.soname == "libc10_cuda.so" and rebuilt.rpath == official.rpath
    assert abi.imports_symbol(rebuilt, "cudaMallocManaged")
    with zipfile.ZipFile(built.wheel) as zf:
        assert zf.read("torch/lib/libc10_cuda.so") == built.rebuilt_library.read_bytes()


def test_make_build_prints_the_wheel(built: pipeline.BuildResult) -> None:
    check_make_build(built, f"TORCH_VERSION={VERSION}")


@pytest.fixture(scope="module")
def venv(install_wheel: Install, built: pipeline.BuildResult) -> Path:
    return install_wheel(built)


def test_only_the_rebuilt_library_and_the_api_differ_from_the_official_wheel(
    built: pipeline.BuildResult,
) -> None:
    """libc10_cuda.so is replaced by the rebuilt one, torch/cuda/um.py (and the overlay's
    other Python modules) is added, and
    torch/cuda/__init__.py gains exactly the import of patch 0004; nothing else changes."""
    official = official_wheel_for(VERSION)
    added, changed = wheel_difference(official, built.wheel)
    assert added == set(overlay_python_files(REPO_ROOT / "c10_overlay"))
    assert "torch/cuda/um.py" in added
    assert changed == {"torch/lib/libc10_cuda.so", "torch/cuda/__init__.py", "torch/version.py"}
    with zipfile.ZipFile(official) as a, zipfile.ZipFile(built.wheel) as b:
        assert b.read("torch/lib/libc10_cuda.so") == built.rebuilt_library.read_bytes()
        before = a.read("torch/cuda/__init__.py").decode().splitlines()
        after = b.read("torch/cuda/__init__.py").decode().splitlines()
    new_lines = [line for line in after if line not in before]
    assert new_lines == ["from . import um  # torch-um: unified-memory API (torch.cuda.um)"]
    assert [line for line in before if line not in after] == []


PROBE = """
import json, os, torch
lib = os.path.join(os.path.dirname(torch.__file__), "lib", "libc10_cuda.so")
print(json.dumps({
    "version": torch.__version__,
    "cuda": torch.version.cuda,
    "available": torch.cuda.is_available(),
    "lib": lib,
    "sum": float(torch.arange(10.0).sum()),
}))
"""


def test_import_torch_in_fresh_venv(venv: Path, built: pipeline.BuildResult) -> None:
    got = probe(venv, PROBE)
    assert got["version"] == "2.6.0+um"
    assert got["cuda"] == "12.4"
    assert got["sum"] == 45.0
    assert sha256_file(Path(got["lib"])) == sha256_file(built.rebuilt_library)
    pip_check(venv)


def test_cuda_is_not_available_without_gpu(venv: Path) -> None:
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("this machine has an NVIDIA device")
    proc = run_python(venv, "import torch; print(torch.cuda.is_available())")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == "False"


@pytest.mark.gpu
def test_small_allocation_on_gpu(venv: Path) -> None:
    """1 MiB through the caching allocator (far below any device's free memory)."""
    code = (
        "import torch; x = torch.ones(1 << 18, device='cuda'); torch.cuda.synchronize();"
        "print(float(x.sum()), torch.cuda.memory_allocated() > 0)"
    )
    proc = subprocess.run([str(venv), "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["262144.0", "True"]
