"""The learned lookahead on the CPU (Note [Learned lookahead], Lookahead.h):
tests/engine/lookahead_test.cpp feeds it loops of operator uses, repeated and changed,
against a simulated device, and checks what it predicts and how far. Built with the
host's C++ compiler, sanitizers on."""

from __future__ import annotations

import subprocess
from pathlib import Path

from .helpers import ROOT, build_engine_test

SOURCES = [
    ROOT / "tests" / "engine" / "lookahead_test.cpp",
    ROOT / "c10_overlay" / "c10" / "cuda" / "um" / "Lookahead.cpp",
]


def test_lookahead_predicts_the_next_uses_of_a_repeating_loop(tmp_path: Path) -> None:
    exe = build_engine_test(
        tmp_path / "lookahead_test",
        SOURCES,
        "-fsanitize=address,undefined",
        "-fno-sanitize-recover=all",
    )
    done = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "18 cases, 0 failures" in done.stdout
    assert done.stdout.count("ok  ") == 18
