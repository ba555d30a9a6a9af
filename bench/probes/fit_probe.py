"""What the +um torch costs the host when the data fits (issue 8's bar "at most 1.01 against
stock when the data fits"; bench/README.md, prediction step 31).

    python -m bench.probes.fit_probe --mode um    [--workload gpt|resnet50|gpt-tiny] [--pairs 3]
    python -m bench.probes.fit_probe --mode stock [--workload gpt] [--pairs 3] [--steps 20]

The GPU suite's time bar (tests/gpu/test_training.py) failed with every block in the CPU's
slow state: the small models' steps are bound by the host there, and the +um torch's steps
took 7 % (ResNet-50) and 19 % (the small GPT) longer than with UM off in the same process.
This probe takes a step apart, in blocks that alternate the states (``um``: on, off, off,
on, ...; ``stock``: an unmodified torch, the reference for both):

- ``alloc_small_us`` / ``alloc_large_us``: host microseconds of one ``torch.empty`` and its
  free (512 bytes, the small pool; 4 MiB, the large pool), the allocator's path with the
  engine's trace tracker and block events behind it;
- per training step, synchronised at its end so that each starts on an idle queue:
  ``host_ms`` until ``opt.step()`` returns, ``cpu_ms`` the main thread's CPU time in it
  (the backward's autograd thread not counted), ``other_cpu_ms`` the other threads' in
  the same time (the process's less the main thread's: mostly autograd's thread, which
  queues the backward; step 42 found the +um process's backward slower in a step bound by
  the host), ``wall_ms`` until the device is done,
  and ``phase_ms``: the host ms of the forward (with the loss), the backward (until
  ``backward()`` returns: the autograd thread's queueing) and the optimizer step;
- ``events_per_step`` (``um``): the engine's block events a timed step (``block_events``;
  step 31's recorded run also counted the workload's setup, about 1 % more);
- ``event_ns`` (``um``, state ``on``): host nanoseconds an event spends in the engine,
  lock waits included, from the engine's sample of one event in 8 over the block's
  training steps, warm-up included (Note [Timing the event path], Engine.cpp), and
  ``engine_ms_per_step``, that times ``events_per_step``: the share of a step's extra
  host time that is the engine's own;
- ``launch_us``: host microseconds to queue one small kernel (``x.add_(1)`` on 4 KiB
  allocated in this block, so managed memory when on): whether launches cost more
  in a process with managed memory;
- the CPU canary before and after the block (bench.common.cpu_canary);
- ``libraries``: the CUDA and torch libraries the process has mapped, by their real file
  names and sizes, to set a +um process's against stock's.

Under ``um`` the total-managed cap is 80 % of the free memory read at start
(bench.common.safe_cap, design notes section 4), and the data fits far below it. Prints a
table and one ``BENCH_RESULT`` JSON line.
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.common import cpu_canary, emit, safe_cap, um_module


def alloc_us(torch: Any, nbytes: int, n: int) -> float:
    """Host microseconds of one allocation of ``nbytes`` on the device and its free."""
    for _ in range(100):
        x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        del x
    t = time.perf_counter()
    for _ in range(n):
        x = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
        del x
    return (time.perf_counter() - t) / n * 1e6


def launch_us(torch: Any, n: int) -> float:
    """Host microseconds to queue one small kernel on a tensor of this block's memory."""
    x = torch.zeros(1024, device="cuda")
    for _ in range(100):
        x.add_(1.0)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(n):
        x.add_(1.0)
    host = (time.perf_counter() - t) / n * 1e6
    torch.cuda.synchronize()
    return host


def step_times(
    torch: Any,
    step: Callable[[], Any],
    steps: int,
    warmup: int,
    events: Callable[[], int],
    marks: list[float],
) -> tuple[list[tuple[float, float, float, float, list[float]]], float]:
    """(host ms, main-thread CPU ms, the other threads' CPU ms, wall ms, host ms of each
    phase) of each timed call of ``step`` (an sgd_stepper step that appends its phase ends
    to ``marks``), each after the device is idle, and the block events (``events()``, a
    counter) a timed step: the warm-up and whatever made ``step`` left out. The other
    threads are mostly autograd's, which runs the backward."""
    out: list[tuple[float, float, float, float, list[float]]] = []
    first = 0
    for i in range(warmup + steps):
        torch.cuda.synchronize()
        if i == warmup:
            first = events()
        marks.clear()
        t0, c0, p0 = time.perf_counter(), time.thread_time(), time.process_time()
        step()
        t1, c1, p1 = time.perf_counter(), time.thread_time(), time.process_time()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        if i >= warmup:
            ends = [t0, *marks]
            phases = [(b - a) * 1e3 for a, b in itertools.pairwise(ends)]
            others = max(0.0, (p1 - p0) - (c1 - c0))
            out.append(((t1 - t0) * 1e3, (c1 - c0) * 1e3, others * 1e3, (t2 - t0) * 1e3, phases))
    return out, (events() - first) / steps


def cuda_libraries() -> list[str]:
    """The file names of the CUDA and torch libraries this process has mapped, their real
    names (links followed) and sizes: two processes that differ in them run different library code
    (a cuBLAS of another version queues the same GEMM with other host work)."""
    import os

    names: set[str] = set()
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.split(maxsplit=5)[-1].strip() if line.count(" ") >= 5 else ""
                base = os.path.basename(path)
                if (
                    path.startswith("/")
                    and ".so" in base
                    and any(k in base for k in ("cu", "nccl", "nvrtc", "nvJit", "torch", "c10"))
                ):
                    real = os.path.realpath(path)
                    names.add(f"{os.path.basename(real)} {os.path.getsize(real)}")
    except OSError:
        return []
    return sorted(names)


def block(torch: Any, um: Any, state: str, make: Any, a: argparse.Namespace) -> dict[str, Any]:
    from bench.workloads import release_cache, sgd_stepper

    if um is not None:
        um.configure(enabled=state == "on")
    release_cache()

    def events() -> int:
        return int(um.stats()["um.block_events"]) if um is not None else 0

    def sampled() -> tuple[int, int]:
        if um is None:
            return 0, 0
        s = um.stats()
        return int(s.get("um.event_samples", 0)), int(s.get("um.event_sample_ns", 0))

    before = cpu_canary()
    events0 = events()
    small, large = alloc_us(torch, 512, a.allocs), alloc_us(torch, 4 << 20, a.allocs)
    events1 = events()
    launch = launch_us(torch, a.allocs)
    sampled0 = sampled()  # the steps' events only (warm-up included), not the allocations'
    marks: list[float] = []
    step = sgd_stepper(make(), mark=lambda: marks.append(time.perf_counter()))
    rows, per_step = step_times(torch, step, a.steps, a.warmup, events, marks)
    sampled1 = sampled()
    canary = max(before, cpu_canary())
    host = statistics.median(r[0] for r in rows)
    cpu = statistics.median(r[1] for r in rows)
    others = statistics.median(r[2] for r in rows)
    wall = statistics.median(r[3] for r in rows)
    phase_ms = [statistics.median(r[4][k] for r in rows) for k in range(3)]
    n_sampled = sampled1[0] - sampled0[0]
    event_ns = (sampled1[1] - sampled0[1]) / n_sampled if n_sampled else None
    return {
        "state": state,
        "canary_s": canary,
        "alloc_small_us": small,
        "alloc_large_us": large,
        "alloc_events": events1 - events0,
        "host_ms": host,
        "cpu_ms": cpu,
        "other_cpu_ms": others,
        "wall_ms": wall,
        "phase_ms": dict(zip(("forward", "backward", "optimizer"), phase_ms, strict=True)),
        "events_per_step": per_step,
        "event_ns": event_ns,
        "engine_ms_per_step": event_ns * per_step / 1e6 if event_ns is not None else None,
        "launch_us": launch,
        "steps": rows,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("stock", "um"), required=True)
    ap.add_argument("--workload", default="gpt", help="a bench.workloads.WORKLOADS name")
    ap.add_argument("--pairs", type=int, default=3, help="blocks of each state")
    ap.add_argument("--steps", type=int, default=20, help="timed steps a block")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--allocs", type=int, default=20000, help="allocations a size a block")
    a = ap.parse_args(argv)
    if min(a.pairs, a.steps, a.allocs) < 1 or a.warmup < 0:
        ap.error("--pairs, --steps and --allocs take a count of at least 1, --warmup of at least 0")
    import torch

    from bench import workloads

    if a.workload not in workloads.WORKLOADS:
        ap.error(f"--workload {a.workload!r}: one of {', '.join(workloads.WORKLOADS)}")
    um = um_module(torch, a.mode)
    free, _total, cap = safe_cap(torch)
    if um is not None:
        um.configure(max_managed=cap, predict=True)
    make = workloads.WORKLOADS[a.workload]
    order = ["stock"] * (2 * a.pairs)
    if um is not None:
        order = [
            s for i in range(a.pairs) for s in (("on", "off") if i % 2 == 0 else ("off", "on"))
        ]
    blocks = [block(torch, um, state, make, a) for state in order]
    print(
        f"{'state':6} {'canary ms':>9} {'alloc 512B us':>13} {'alloc 4MiB us':>13} "
        f"{'launch us':>9} {'host ms':>8} {'cpu ms':>7} {'others':>7} {'wall ms':>8} "
        f"{'events/step':>11} "
        f"{'event ns':>8} {'engine ms':>9} {'fwd/bwd/opt ms':>16}"
    )
    for b in blocks:
        ns, engine = b["event_ns"], b["engine_ms_per_step"]
        print(
            f"{b['state']:6} {b['canary_s'] * 1e3:9.2f} {b['alloc_small_us']:13.2f} "
            f"{b['alloc_large_us']:13.2f} {b['launch_us']:9.2f} {b['host_ms']:8.2f} "
            f"{b['cpu_ms']:7.2f} {b['other_cpu_ms']:7.2f} {b['wall_ms']:8.2f} "
            f"{b['events_per_step']:11.0f} "
            + (f"{ns:8.0f} {engine:9.3f}" if ns is not None else f"{'-':>8} {'-':>9}")
            + " {:5.2f}/{:5.2f}/{:4.2f}".format(*b["phase_ms"].values())
        )
    emit(
        {
            "probe": "fit_probe",
            "mode": a.mode,
            "workload": a.workload,
            "torch": torch.__version__,
            "cap_bytes": cap if um is not None else None,
            "free_bytes": free,
            "config": um.get_config() if um is not None else None,
            "blocks": blocks,
            "libraries": cuda_libraries(),
        }
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
