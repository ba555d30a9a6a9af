"""GPU suite of the injection path (torch 2.11 + libtorch_um.so).

Runs against a torch whose package is set up exactly as a ``+um`` wheel has it
(``tests/gpu/run_on_device.sh`` stages one from the host's torch). Skips
cleanly without torch or without a GPU; with ``TORCH_UM_GPU_REQUIRE=1`` (set by
the device script) a missing engine is a failure, not a skip.

Managed-memory safety rule (docs/design.md, "Safety rule for every GPU run"): free GPU memory is read
once at the start, and every test runs with the engine's total cap
(``max_managed``) at 80 % of it or less. Oversubscription is exercised against
a device budget far below free memory, never against physical memory.
"""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from bench import host_memory

GiB = 1 << 30
MiB = 1 << 20


def rss_bytes() -> int:
    """This process's resident memory (bench.host_memory's reading of VmRSS); a test that
    compares two readings must not pass on two zeros."""
    value = host_memory.rss_bytes()
    assert value > 0, "no VmRSS in /proc/self/status"
    return value


def cudart() -> ctypes.CDLL:
    """The CUDA runtime torch has loaded (found by soname), for what torch does not expose."""
    return ctypes.CDLL("libcudart.so.13")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for item in items:
        if str(item.fspath).startswith(here):
            item.add_marker(pytest.mark.gpu)


@dataclass(frozen=True)
class Limits:
    free_at_start: int
    total: int
    cap: int  # max_managed for every test: <= 80 % of free memory at start
    budget: int  # device budget for oversubscription tests


def _torch() -> Any:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU (torch.cuda.is_available() is False)")
    return torch


@pytest.fixture(scope="session")
def um() -> Any:
    """torch.cuda.um, after checking that the engine reaches the allocator."""
    torch = _torch()
    required = os.environ.get("TORCH_UM_GPU_REQUIRE") == "1"
    um = getattr(torch.cuda, "um", None)
    problem = None
    if um is None:
        problem = "torch.cuda.um is missing: this torch is not a +um build"
    elif not um.is_available():
        problem = "torch.cuda.um finds no unified-memory engine"
    elif um.injection_info().get("interposed") != 1:
        problem = f"cudaMalloc is not interposed: {um.injection_info()}"
    if problem:
        if required:
            pytest.fail(problem)
        pytest.skip(problem)
    return um


@pytest.fixture(scope="session")
def limits(um: Any) -> Limits:
    torch = _torch()
    torch.cuda.init()
    free, total = torch.cuda.mem_get_info()
    cap = int(free * 0.8)
    # Oversubscription budget: well below free memory, and small enough that
    # 2x budget (the Listing 1 tensor) plus its square stay under the cap.
    budget = min(4 * GiB, cap // 8)
    print(
        f"\n[um] GPU {torch.cuda.get_device_name()} total {total / GiB:.1f} GiB, "
        f"free at start {free / GiB:.1f} GiB, cap {cap / GiB:.1f} GiB, "
        f"oversubscription budget {budget / GiB:.1f} GiB"
    )
    return Limits(free_at_start=free, total=total, cap=cap, budget=budget)


def release_cache(torch: Any) -> None:
    """Free every cached segment (bench.workloads.release_cache, on the torch imported)."""
    from bench.workloads import release_cache as release

    release()


def _reset(torch: Any, um: Any, limits: Limits) -> None:
    release_cache(torch)
    um.configure(
        enabled=True,
        max_managed=limits.cap,
        device_budget="90%",
        host_headroom="2GiB",
        prefetch=True,
        policy="lru",
        discard=True,
        hooks=True,
        predict=True,
        predict_stage_kernel="foreach",
        read_copies=False,
        host_alloc="default",
        host_alloc_min="1MiB",
        host_copy_kernel=True,
        host_copy_cpu_share=0.35,
        pageable_copy_cpu=True,
        pin_in_place=False,
        op_signal=True,
        op_lookahead=0,
        op_stage=False,
        evict_warm_first=True,
        predict_programs=True,
    )
    torch.cuda.set_per_process_memory_fraction(1.0)


@pytest.fixture(autouse=True)
def _um_safety(request: pytest.FixtureRequest) -> Iterator[None]:
    if "limits" not in request.fixturenames and "um" not in request.fixturenames:
        yield
        return
    torch = _torch()
    um = request.getfixturevalue("um")
    limits = request.getfixturevalue("limits")
    _reset(torch, um, limits)
    assert int(um.get_config()["max_managed"]) <= limits.cap
    yield
    _reset(torch, um, limits)


@pytest.fixture
def torch_mod(um: Any) -> Any:
    return _torch()


def subprocess_env(limits: Limits, **extra: str) -> dict[str, str]:
    """Environment for a child Python process: capped like the tests."""
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    # Each child has its own cap; the parent's cache is emptied before, so
    # parent and child together stay under the 80 % rule.
    env["PYTORCH_CUDA_UM_CONF"] = f"max_managed:{min(limits.cap // 4, 8 * GiB)}"
    env.update(extra)
    return env


def run_child(
    code: str, env: dict[str, str], timeout: int = 180
) -> subprocess.CompletedProcess[str]:
    """Runs ``code`` in a fresh interpreter once this process's GPU work is done and its
    cache given back (the child reads free memory for its own cap), prints its output and
    asserts that it exited 0."""
    torch = _torch()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    out = proc.stdout + proc.stderr
    print(out)
    assert proc.returncode == 0, out
    return proc


def stream_fuzz(seed: int, steps: int, sizes: list[int]) -> None:
    """One thread's share of the multi-stream fuzz: allocate filled tensors on a stream of
    its own, sometimes use them on another stream (``record_stream``), free some, and check
    every value read back. Raises AssertionError on the first wrong value."""
    import random

    torch = _torch()
    rng = random.Random(seed)
    stream = torch.cuda.Stream()
    live: list[tuple[Any, float]] = []
    with torch.cuda.stream(stream):
        for _ in range(steps):
            if live and rng.random() < 0.45:
                t, value = live.pop(rng.randrange(len(live)))
                got = float(t.double().sum())
                assert got == value * t.numel(), (got, value, t.numel())
                continue
            n = rng.choice(sizes)
            value = float(rng.randrange(1, 100))
            t = torch.full((n,), value, device="cuda")
            if rng.random() < 0.3:
                other = torch.cuda.Stream()
                other.wait_stream(stream)
                with torch.cuda.stream(other):
                    t.mul_(1.0)
                t.record_stream(other)
            live.append((t, value))
        for t, value in live:
            assert float(t.double().sum()) == value * t.numel()


def run_threads(target: Any, count: int) -> list[BaseException]:
    """Runs target(i) on `count` threads; returns what they raised."""
    import threading

    errors: list[BaseException] = []

    def guarded(i: int) -> None:
        try:
            target(i)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=guarded, args=(i,)) for i in range(count)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return errors
