"""The engine's Executor on the CPU: tests/engine/executor_test.cpp runs it from two
threads against the CUDA stand-ins of tests/engine/cuda_stub (eviction batches, bring-ins
of evicted pages, counters read meanwhile) and checks, from the stand-ins' log of every
move issued, that a bring-in follows the eviction of its pages or calls it off, and that
no eviction is issued twice or lost. Built with the host's C++ compiler, once with
ThreadSanitizer and once with AddressSanitizer and UBSan."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from .helpers import ROOT, build_engine_test

UM = ROOT / "c10_overlay" / "c10" / "cuda" / "um"
SOURCES = [
    ROOT / "tests" / "engine" / "executor_test.cpp",
    UM / "Executor.cpp",
    UM / "HostMemory.cpp",
    UM / "Residency.cpp",
]
SANITIZERS = {
    "thread": ["-fsanitize=thread"],
    "address": ["-fsanitize=address,undefined", "-fno-sanitize-recover=all"],
}


@pytest.mark.parametrize("sanitizer", sorted(SANITIZERS))
def test_executor_orders_moves_under_threads(tmp_path: Path, sanitizer: str) -> None:
    # The stand-ins' folder comes first: it shadows CudaCompat.h and the CUDA runtime.
    stub = f"-I{ROOT / 'tests' / 'engine' / 'cuda_stub'}"
    exe = build_engine_test(
        tmp_path / f"executor_{sanitizer}", SOURCES, stub, *SANITIZERS[sanitizer]
    )
    # The executor's per-device sides live as long as the process, on purpose.
    env = {**os.environ, "ASAN_OPTIONS": "detect_leaks=0"}
    done = subprocess.run([str(exe)], capture_output=True, text=True, timeout=300, env=env)
    if sanitizer == "thread" and "unexpected memory mapping" in done.stderr:
        pytest.skip("ThreadSanitizer cannot run under this kernel's address-space layout")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 failures" in done.stdout
    assert "ThreadSanitizer" not in done.stderr, done.stderr
