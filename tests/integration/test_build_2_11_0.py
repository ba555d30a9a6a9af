"""The real torch 2.11.0+um build (injection path, the first version verified on a GPU), end to end,
and the wheel installed into a fresh venv.

Cold, this downloads the official wheel (~900 MB), the CUDA 13 header packages and, for
the venv, torch's dependencies (GBs of nvidia-* and cuda-* CUDA 13 packages), all cached
under ${XDG_CACHE_HOME:-~/.cache}. The torch.cuda.um checks of this wheel are in
test_um_cpu_api.py (shared with 2.6.0).
"""

from __future__ import annotations

import difflib
import os
import shutil
import subprocess
import sys
import zipfile
from collections import Counter
from pathlib import Path

import pytest

from build_scripts import abi, c_api, inject_path, matrix, pipeline, series
from build_scripts.changes import overlay_python_files
from build_scripts.fsutil import sha256_file
from build_scripts.paths import REPO_ROOT, cache_root

from ..unit.helpers import sha
from .conftest import (
    Build,
    Hold,
    Install,
    check_make_build,
    official_wheel_for,
    pip_check,
    probe,
    wheel_difference,
)

pytestmark = pytest.mark.integration
VERSION = "2.11.0"
PATCHED = ("torch/__init__.py", "torch/cuda/__init__.py")
# The overlay's Python files (torch/cuda/um.py and the modules beside it) and the engine.
OVERLAY_PY = overlay_python_files(REPO_ROOT / "c10_overlay")
ADDED = (*OVERLAY_PY, "torch/lib/libtorch_um.so")


@pytest.fixture(scope="module")
def built(build_wheel: Build) -> pipeline.BuildResult:
    return build_wheel(VERSION)


@pytest.fixture(scope="module")
def venv(install_wheel: Install, built: pipeline.BuildResult) -> Path:
    return install_wheel(built)


@pytest.fixture(scope="module")
def official_wheel() -> Path:
    return official_wheel_for(VERSION)


def test_only_the_injection_files_differ_from_the_official_wheel(
    built: pipeline.BuildResult, official_wheel: Path
) -> None:
    """The official libraries (libc10_cuda.so included) are untouched; the wheel adds the
    engine and um.py, and changes the two patched files and version.py, nothing else."""
    added, changed = wheel_difference(official_wheel, built.wheel)
    assert added == set(ADDED)
    assert changed == {*PATCHED, "torch/version.py"}
    with zipfile.ZipFile(built.wheel) as b:
        assert b.read("torch/lib/libtorch_um.so") == built.rebuilt_library.read_bytes()
        for name, source in OVERLAY_PY.items():
            assert b.read(name) == source.read_bytes(), name


def _added_lines(patch_text: str, path: str) -> list[str]:
    """The ``+`` lines a patch adds to ``path``."""
    out: list[str] = []
    current = None
    for line in patch_text.splitlines():
        if line.startswith("+++ "):
            current = line[4:].removeprefix("b/")
        elif line.startswith("diff --git "):
            current = None
        elif current == path and line.startswith("+"):
            out.append(line[1:])
    return out


@pytest.mark.parametrize("path", PATCHED)
def test_patched_file_is_official_plus_the_series(
    built: pipeline.BuildResult, official_wheel: Path, tmp_path: Path, path: str
) -> None:
    m = matrix.load(VERSION)
    with zipfile.ZipFile(official_wheel) as a, zipfile.ZipFile(built.wheel) as b:
        for each in PATCHED:  # the series patches them all: write them all
            (tmp_path / each).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / each).write_bytes(a.read(each))
        original, shipped = a.read(path), b.read(path)
    assert sha(original) == {f.path: f.sha256 for f in m.sources}[path]
    # the series, applied with no fuzz or offset to the official files, gives the wheel's file
    names = series.read_series(m.series_file)
    series.apply_series(m.series_file.parent, names, tmp_path, strict=True)
    assert (tmp_path / path).read_bytes() == shipped
    # and the difference is only lines added, exactly the ones the series adds to this file
    diff = list(
        difflib.unified_diff(original.decode().splitlines(), shipped.decode().splitlines(), n=0)
    )
    removed = [d for d in diff[2:] if d.startswith("-")]
    added = [d[1:] for d in diff[2:] if d.startswith("+")]
    assert removed == []
    expected = [
        line
        for name in names
        for line in _added_lines((m.series_file.parent / name).read_text(), path)
    ]
    # (in file order, which need not be the series' order: compare as multisets)
    assert Counter(added) == Counter(expected) and expected


def test_engine_library_passes_the_injection_gate(built: pipeline.BuildResult) -> None:
    elf = abi.read_elf(built.rebuilt_library)
    official = abi.read_elf(built.official_library)
    assert built.official_library.name == "libc10_cuda.so"
    assert elf.soname == "libtorch_um.so"
    assert elf.rpath == official.rpath and elf.rpath
    assert "libcudart.so.13" in elf.needed
    versions = abi.exported_versions(built.rebuilt_library)
    for name in (
        "cudaMalloc",
        "cudaFree",
        "cudaStreamBeginCapture",
        "cudaStreamEndCapture",
        "cudaIpcGetMemHandle",
        "cudaMemcpyAsync",
    ):
        assert versions.get(name) == "libcudart.so.13", (name, versions.get(name))
    assert not any(v == "libcudart.so.13" for n, v in versions.items() if n.startswith("torch_um"))
    functions = c_api.function_names()  # the headers decide (tests/unit/test_c_api.py)
    assert len(functions) >= 12
    missing = [name for name in functions if name not in elf.exported]
    assert missing == []
    assert abi.imports_symbol(elf, "cudaMallocManaged")
    assert not abi.imports_symbol(elf, "cudaMalloc")  # it defines it
    inject_path.check_gate(elf, "libtorch_um.so", official.rpath, "libcudart.so.13", functions)


def test_make_build_with_this_version(built: pipeline.BuildResult) -> None:
    check_make_build(built, f"TORCH_VERSION={VERSION}")


PROBE = """
import json, os, torch
lib = os.path.join(os.path.dirname(torch.__file__), "lib")
print(json.dumps({
    "version": torch.__version__,
    "cuda": torch.version.cuda,
    "engine": os.path.join(lib, "libtorch_um.so"),
    "c10_cuda": os.path.join(lib, "libc10_cuda.so"),
    "sum": float(torch.arange(10.0).sum()),
}))
"""


def test_import_torch_in_fresh_venv(venv: Path, built: pipeline.BuildResult) -> None:
    got = probe(venv, PROBE)
    assert got["version"] == "2.11.0+um"
    assert got["cuda"] == "13.0"
    assert got["sum"] == 45.0
    assert sha256_file(Path(got["engine"])) == sha256_file(built.rebuilt_library)
    assert sha256_file(Path(got["c10_cuda"])) == sha256_file(built.official_library)
    pip_check(venv)


# A library with the file name of one torch preloads, announcing that it was loaded.
PLANTED = r"""
#include <cstdio>
#include <cstdlib>
__attribute__((constructor)) static void planted() {
  if (const char* out = std::getenv("UM_PLANTED_MARKER")) {
    if (FILE* f = std::fopen(out, "w")) { std::fputs("loaded\n", f); std::fclose(f); }
  }
}
"""


@pytest.fixture(scope="module")
def stock_venv(venv: Path, official_wheel: Path, held_dirs: Hold) -> Path:
    """Stock torch 2.11.0 (the official wheel) in a venv of its own that takes every other
    package from the +um venv (a .pth file; its nvidia/ folder linked where the official
    libraries' RPATH expects it). Kept in the cache, remade when the wheel changes, never
    while another test run uses it (Note [Shared test venvs], shared_dir.py)."""
    root = cache_root() / "test-venv" / "cp311-2.11.0-stock"
    py = root / "bin" / "python"
    marker = root / ".installed-wheel"

    def ready() -> bool:
        return py.exists() and marker.exists() and marker.read_text() == official_wheel.name

    def make() -> None:
        if not py.exists():
            subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
        site = Path(
            subprocess.check_output(
                [str(py), "-c", "import site; print(site.getsitepackages()[0])"], text=True
            ).strip()
        )
        um_site = Path(
            subprocess.check_output(
                [str(venv), "-c", "import site; print(site.getsitepackages()[0])"], text=True
            ).strip()
        )
        marker.unlink(missing_ok=True)  # a half-done install is never taken as done
        shutil.rmtree(site / "torch", ignore_errors=True)
        pip = [str(venv), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
        pip += ["--no-deps", "--no-compile", "--upgrade", "--target", str(site)]
        subprocess.run([*pip, str(official_wheel)], check=True)
        (site / "um-deps.pth").write_text(f"{um_site}\n")
        if not (site / "nvidia").exists():
            (site / "nvidia").symlink_to(um_site / "nvidia")
        marker.write_text(official_wheel.name)

    held_dirs(root, ready, make)
    return py


@pytest.mark.parametrize("where", ["current directory", "script directory"])
def test_cuda_libraries_load_only_from_the_installation(
    venv: Path, stock_venv: Path, tmp_path: Path, where: str
) -> None:
    """Upstream's loader searches sys.path, which starts with the current directory (python
    -c) or the script's: stock torch loads a library planted there on import; the +um wheel
    (patch 0003) does not."""
    planted_dir = tmp_path / "planted"
    lib = planted_dir / "nvidia" / "cu13" / "lib" / "libcublasLt.so.13"
    lib.parent.mkdir(parents=True)
    (tmp_path / "planted.cpp").write_text(PLANTED)
    cxx = os.environ.get("CXX") or "c++"
    subprocess.run(
        [cxx, "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "planted.cpp")], check=True
    )
    code = "import torch; print(torch.__version__)"
    if where == "script directory":
        (planted_dir / "script.py").write_text(code + "\n")
        args, cwd = [str(planted_dir / "script.py")], tmp_path
    else:
        args, cwd = ["-c", code], planted_dir
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYTORCH_", "TORCH_"))
    }
    loaded = {}
    for name, py in (("stock", stock_venv), ("um", venv)):
        marker = tmp_path / f"{name}.loaded"
        proc = subprocess.run(
            [str(py), "-W", "ignore", *args],
            cwd=cwd,
            env={**clean, "UM_PLANTED_MARKER": str(marker)},
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert proc.stdout.split()[-1] == ("2.11.0+cu130" if name == "stock" else "2.11.0+um")
        loaded[name] = marker.exists()
    assert loaded == {"stock": True, "um": False}
