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
    assert done.stdout.count("\nok   ") + done.stdout.startswith("ok   ") == 16
    assert "56 cases" in done.stdout
