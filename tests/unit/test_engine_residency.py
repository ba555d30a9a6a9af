"""The residency engine's decision logic on the CPU: tests/engine/residency_test.cpp
drives c10_overlay's Residency with event traces (random, a repeated training loop, a
changing pattern, capture, static policy) against a simulated GPU and checks the
invariants after every step. Built with the host's C++ compiler, sanitizers on."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from .helpers import ROOT, build_engine_test

SOURCES = [
    ROOT / "tests" / "engine" / "residency_test.cpp",
    ROOT / "c10_overlay" / "c10" / "cuda" / "um" / "Residency.cpp",
]


@pytest.fixture(scope="module")
def residency_test(tmp_path_factory: pytest.TempPathFactory) -> Path:
    exe = tmp_path_factory.mktemp("engine") / "residency_test"
    return build_engine_test(
        exe, SOURCES, "-fsanitize=address,undefined", "-fno-sanitize-recover=all"
    )


def test_residency_invariants_hold_on_every_trace(residency_test: Path) -> None:
    done = subprocess.run([str(residency_test)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 failures" in done.stdout
    # Every named case ran and passed, and the random traces ran too.
    assert done.stdout.count("\nok   ") + done.stdout.startswith("ok   ") == 18
    assert "58 cases" in done.stdout


def test_event_cost_program_builds_and_times_three_sizes(tmp_path: Path) -> None:
    """bench/engine_event_cost.cpp (bench/README.md, step 31) follows the ledger's API:
    it builds against it and times each block size, sanitizers on."""
    exe = build_engine_test(
        tmp_path / "engine_event_cost",
        [ROOT / "bench" / "engine_event_cost.cpp", SOURCES[1]],
        "-fsanitize=address,undefined",
        "-fno-sanitize-recover=all",
    )
    done = subprocess.run([str(exe), "1000"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        f"block of {n} bytes" for n in (512, 4 << 20, 16 << 20)
    ]
    assert all(float(line.split()[-4]) > 0 for line in lines)
    bad = subprocess.run([str(exe), "0"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "PAIRS" in bad.stderr
