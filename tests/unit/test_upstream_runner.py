"""tests/gpu/upstream_test_cuda.sh without a GPU: a stand-in interpreter answers its probes
and plays both pytest runs, so that the runner's checks, staging calls, the +um run's cap
(80 % of the free memory it read), the two junit reports and the record are exercised."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from .helpers import ROOT

RUNNER = ROOT / "tests" / "gpu" / "upstream_test_cuda.sh"

# $1... of each call the runner makes; pytest writes a report in which one test fails on +um
STAND_IN = r"""#!/usr/bin/env bash
case "$1" in
  tests/gpu/stage_torch.py) echo "staged $*" >> "$CALLS"; exit 0;;
  tests/gpu/upstream_compare.py) exec "$REAL_PY" "$@";;
  -m)
    shift 2
    for a in "$@"; do case "$a" in --junitxml=*) junit=${a#--junitxml=};; esac; done
    echo "pytest um_conf=${PYTORCH_CUDA_UM_CONF:-} pp=$PYTHONPATH files=$(ls | tr '\n' ' ')" >> "$CALLS"
    fail=""; [[ "$PYTHONPATH" == *"/site"* ]] && fail='<failure message="rose"/>'
    printf '<testsuites><testsuite name="pytest"><testcase classname="test_cuda.TestCuda" name="test_ok"/><testcase classname="test_cuda.TestCuda" name="test_graph">%s</testcase></testsuite></testsuites>' "$fail" > "$junit"
    exit 1;;
  -c)
    if [[ "$2" == *"json.dumps"* ]]; then
      um=false; [[ "$PYTHONPATH" == *"/site"* ]] && um=true
      echo "{\"torch\": \"2.11.0\", \"um\": $um}"; exit 0
    fi
    [[ "$2" == *"mem_get_info()[0]"* ]] && { echo 1000; exit 0; }
    exit 0;;
esac
exit 3
"""


@pytest.fixture
def setup(tmp_path: Path) -> dict[str, str]:
    upstream = tmp_path / "test_cuda-2.11.0.py"
    upstream.write_text("def test_x():\n    pass\n")
    digest = hashlib.sha256(upstream.read_bytes()).hexdigest()
    (tmp_path / "test_cuda-2.11.0.py.sha256").write_text(f"{digest}  test_cuda-2.11.0.py\n")
    (tmp_path / "test_cuda-2.11.0.py.source").write_text("pytorch/pytorch at abc\n")
    (tmp_path / "bundle" / "files").mkdir(parents=True)
    # A wheel upstream's helpers need, pinned in a deps list of the test's own.
    import zipfile

    with zipfile.ZipFile(tmp_path / "helper-1.0-py3-none-any.whl", "w") as z:
        z.writestr("helper/__init__.py", "")
    pin = hashlib.sha256((tmp_path / "helper-1.0-py3-none-any.whl").read_bytes()).hexdigest()
    (tmp_path / "deps.txt").write_text(f"# a comment\nhelper-1.0-py3-none-any.whl  {pin}\n")
    py = tmp_path / "python3"
    py.write_text(STAND_IN)
    py.chmod(0o755)
    env = dict(os.environ)
    env.update(
        PYTHON=str(py),
        REAL_PY=sys.executable,
        CALLS=str(tmp_path / "calls.txt"),
        UPSTREAM=str(upstream),
        BUNDLE=str(tmp_path / "bundle"),
        OUT=str(tmp_path / "out"),
        PYTHONPATH="",
        TMPDIR=str(tmp_path),
        UPSTREAM_DEPS=str(tmp_path / "deps.txt"),
    )
    return env


def _run(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(RUNNER), "2.11.0"], cwd=ROOT, env=env, capture_output=True, text=True,
        timeout=120,
    )


def test_both_runs_are_made_and_compared(setup: dict[str, str]) -> None:
    proc = _run(setup)
    assert proc.returncode == 1, proc.stdout + proc.stderr  # one test passed on stock only
    calls = Path(setup["CALLS"]).read_text().splitlines()
    stock, um = (c for c in calls if c.startswith("pytest"))
    assert "um_conf= " in stock and "/site" not in stock
    assert "um_conf=max_managed:800 " in um and "/site" in um  # 80 % of 1000 bytes free
    assert "conftest.py" in um and "test_cuda.py" in um  # the upstream file under its name
    out = Path(setup["OUT"])
    assert (out / "upstream-stock.xml").is_file() and (out / "upstream-um.xml").is_file()
    record = (out / "upstream-test_cuda-2.11.0.md").read_text()
    assert "- `test_cuda.TestCuda::test_graph`: failed" in record
    assert "pytorch/pytorch at abc" in record and "max_managed:800" in record
    assert all("/pylib" in c for c in (stock, um))  # the pinned helper wheel, unpacked


def test_a_helper_wheel_that_differs_from_its_pin_is_refused(setup: dict[str, str]) -> None:
    wheel = Path(setup["UPSTREAM"]).parent / "helper-1.0-py3-none-any.whl"
    wheel.write_bytes(wheel.read_bytes() + b"x")
    proc = _run(setup)
    assert proc.returncode == 2
    assert "helper-1.0-py3-none-any.whl has sha256" in proc.stderr and "pins" in proc.stderr
    assert not Path(setup["CALLS"]).exists()


def test_a_changed_upstream_file_is_refused(setup: dict[str, str]) -> None:
    Path(setup["UPSTREAM"]).write_text("changed\n")
    proc = _run(setup)
    assert proc.returncode == 2
    assert "its .sha256 file says" in proc.stderr
    assert not Path(setup["CALLS"]).exists()  # nothing staged, nothing run
