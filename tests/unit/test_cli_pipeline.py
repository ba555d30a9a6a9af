from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from build_scripts import cli, matrix, pipeline
from build_scripts.paths import REPO_ROOT


def test_unknown_version_is_an_error_line_and_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["build", "--torch-version", "0.0.1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: unknown TORCH_VERSION '0.0.1': supported versions are ")
    assert "Traceback" not in err


def test_module_entry_point_prints_no_traceback() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "build_scripts", "build", "--torch-version", "0.0.1"],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.startswith("error: unknown TORCH_VERSION")
    assert "Traceback" not in proc.stderr


def test_versions_command(capsys: pytest.CaptureFixture[str]) -> None:
    """One line a version: the version, a tab, its GPU record or none; the default marked."""
    assert cli.main(["versions"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [ln.split("\t")[0] for ln in lines] == matrix.supported_versions()
    default = matrix.default_version()
    record = matrix.load(default).gpu_verified
    assert f"{default}\tgpu_verified: {record} (default)" in lines
    unverified = [v for v in matrix.supported_versions() if not matrix.load(v).gpu_verified]
    assert unverified  # 2.7.1 at least
    for v in unverified:
        assert f"{v}\tnot verified on a GPU" in lines
    assert sum("(default)" in ln for ln in lines) == 1


def test_validate_command_on_bad_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "torch-1.0-cp311-cp311-linux_x86_64.whl"
    bad.write_bytes(b"not a zip")
    assert cli.main(["validate", str(bad)]) == 2
    assert "is not a readable wheel" in capsys.readouterr().err


def test_overlay_python_files_map_into_torch(tmp_path: Path) -> None:
    (tmp_path / "torch" / "cuda" / "__pycache__").mkdir(parents=True)
    (tmp_path / "torch" / "cuda" / "um.py").write_text("x = 1\n")
    (tmp_path / "torch" / "cuda" / "__pycache__" / "um.cpython-311.pyc").write_bytes(b"")
    files = pipeline.overlay_python_files(tmp_path)
    assert list(files) == ["torch/cuda/um.py"]
    assert pipeline.overlay_python_files(tmp_path / "nothing") == {}
