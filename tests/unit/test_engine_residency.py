"""The residency engine's decision logic on the CPU: tests/engine/residency_test.cpp
drives c10_overlay's Residency with event traces (random, a repeated training loop, a
changing pattern, capture, static policy) against a simulated GPU and checks the
invariants after every step. Built with the host's C++ compiler, sanitizers on."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCES = [
    ROOT / "tests" / "engine" / "residency_test.cpp",
    ROOT / "c10_overlay" / "c10" / "cuda" / "um" / "Residency.cpp",
]


@pytest.fixture(scope="module")
def residency_test(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler (set CXX)")
    exe = tmp_path_factory.mktemp("engine") / "residency_test"
    cmd = [
        cxx,
        "-std=c++17",
        "-O1",
        "-g",
        "-Wall",
        "-Werror",
        "-fsanitize=address,undefined",
        "-fno-sanitize-recover=all",
        f"-I{ROOT / 'c10_overlay'}",
        *map(str, SOURCES),
        "-o",
        str(exe),
    ]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return exe


def test_residency_invariants_hold_on_every_trace(residency_test: Path) -> None:
    done = subprocess.run([str(residency_test)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 failures" in done.stdout
    # Every named case ran and passed, and the random traces ran too.
    assert done.stdout.count("\nok   ") + done.stdout.startswith("ok   ") == 13
    assert "53 cases" in done.stdout
