"""The real torch 2.6.0+um build, end to end, and the wheel installed into a fresh venv.

Cold, this downloads the official wheel (767 MB), the CUDA header packages, the Debian
source tarball, and, for the venv, torch's dependencies (~3 GB of nvidia-*-cu12). All of
it is cached under ${XDG_CACHE_HOME:-~/.cache} (torch-um/ and pip's cache). Deselect
locally with ``-m 'not integration'`` (``make test-unit``).
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from build_scripts import abi, cli, matrix, pipeline, platform_tag, repack
from build_scripts.fsutil import sha256_file
from build_scripts.paths import REPO_ROOT, cache_root

pytestmark = pytest.mark.integration
VERSION = "2.6.0"


@pytest.fixture(scope="session")
def built() -> pipeline.BuildResult:
    for needed in ("c10_overlay/CMakeLists.txt", f"patches/{VERSION}/series"):
        assert (REPO_ROOT / needed).is_file(), f"{needed} is missing from the checkout"
    return pipeline.build(VERSION, "3.11")


def test_wheel_name_version_and_tags(built: pipeline.BuildResult) -> None:
    assert built.wheel.parent == REPO_ROOT / "dist"
    assert built.wheel.name == f"torch-{VERSION}+um-cp311-cp311-{built.platform_tag}.whl"
    with zipfile.ZipFile(built.wheel) as zf:
        di = f"torch-{VERSION}+um.dist-info"
        wheel_file = zf.read(f"{di}/WHEEL").decode()
        assert f"Tag: cp311-cp311-{built.platform_tag}\n" in wheel_file
        assert "linux_x86_64\n" not in wheel_file.replace(built.platform_tag, "")
        assert f"\nVersion: {VERSION}+um\n" in zf.read(f"{di}/METADATA").decode()
        version_py = zf.read("torch/version.py").decode()
        assert f"__version__ = '{VERSION}+um'" in version_py
        assert "git_version = '2236df1770800ffea5697b11b0bb0d910b2e59e1'" in version_py
        assert "cuda: Optional[str] = '12.4'" in version_py
        assert not any(n.startswith(f"torch-{VERSION}.dist-info/") for n in zf.namelist())


def test_platform_tag_is_honest(built: pipeline.BuildResult) -> None:
    rebuilt = abi.read_elf(built.rebuilt_library)
    expected = platform_tag.wheel_platform_tag("manylinux1_x86_64", rebuilt.version_needs)
    assert built.platform_tag == expected
    libc, ver = platform.libc_ver()
    if libc == "glibc" and ver == "2.36":  # Debian 12, gcc 12: GLIBC_2.34 is required
        assert "GLIBC_2.34" in rebuilt.version_needs
        assert built.platform_tag == "manylinux_2_34_x86_64"


def test_record_is_valid(built: pipeline.BuildResult) -> None:
    repack.validate(built.wheel)


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


def test_warm_rerun_reuses_everything(built: pipeline.BuildResult) -> None:
    started = time.monotonic()
    again = pipeline.build(VERSION, "3.11")
    assert again.reused and again.wheel == built.wheel
    assert time.monotonic() - started < 60


def test_make_build_prints_the_wheel(built: pipeline.BuildResult) -> None:
    proc = subprocess.run(
        ["make", "--no-print-directory", "build", f"TORCH_VERSION={VERSION}"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == str(built.wheel)


def test_series_check_applies_cleanly(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["series", "check", "--torch-version", VERSION]) == 0
    assert "apply cleanly to v2.6.0 with no fuzz or offset" in capsys.readouterr().out


@pytest.fixture(scope="session")
def venv(built: pipeline.BuildResult) -> Path:
    """A venv with the wheel and its dependencies; reused across runs (deps are ~3 GB),
    torch itself reinstalled whenever the wheel changed."""
    root = cache_root() / "test-venv" / "cp311"
    py = root / "bin" / "python"
    if not py.exists():
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
    pip = [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    marker = root / ".installed-wheel"
    digest = sha256_file(built.wheel)
    if not marker.exists() or marker.read_text() != digest:
        subprocess.run([*pip, "--force-reinstall", "--no-deps", str(built.wheel)], check=True)
        subprocess.run([*pip, str(built.wheel)], check=True)  # dependencies
        marker.write_text(digest)
    return py


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
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    proc = subprocess.run(
        [str(venv), "-c", PROBE], capture_output=True, text=True, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got["version"] == "2.6.0+um"
    assert got["cuda"] == "12.4"
    assert got["sum"] == 45.0
    assert sha256_file(Path(got["lib"])) == sha256_file(built.rebuilt_library)
    check = subprocess.run(
        [str(venv), "-m", "pip", "check"], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout


def test_cuda_is_not_available_without_gpu(venv: Path) -> None:
    if os.path.exists("/dev/nvidiactl"):
        pytest.skip("this machine has an NVIDIA device")
    proc = subprocess.run(
        [str(venv), "-c", "import torch; print(torch.cuda.is_available())"],
        capture_output=True,
        text=True,
        check=False,
    )
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
