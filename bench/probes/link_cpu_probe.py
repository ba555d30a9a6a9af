"""Does the GPU's traffic over the link slow the host's CPU? (the slow state, issue 8)

    python -m bench.probes.link_cpu_probe [--gib 1] [--seconds 4] [--rounds 2] [--json FILE]

The GPU hosts' CPUs run at half to two thirds of their speed at times (bench/README.md,
step 25: a fixed piece of pure-Python work, the canary, takes 1.5-2.2 ms instead of 1.0-1.2).
Every host-bound number moves with it: the data-fits time bar, ``generate()``, inference in
the slow state. Step 32 saw the +um processes' canaries go slow from their first streamed
forward on while stock's, in the same run, stayed fast. This probe asks whether the link's
traffic itself does it, with stock torch and no engine.

A watcher process, pinned to the last CPU this process may use, runs
``bench.common.cpu_canary`` back to back and records each reading with its time. The main
process runs phases of ``--seconds`` each, an ``idle`` phase before every load, for
``--rounds`` rounds, and marks their times. The loads, each repeated until its phase ends:

- ``gpu``: matrix products on the GPU, nothing over the link;
- ``dma-h2d``, ``dma-d2h``: ``--gib`` copied between page-locked host memory and the GPU by
  a copy engine;
- ``sm-pinned``: the same bytes read from page-locked memory by a copy kernel's SMs
  (``torch._foreach_copy_`` from a device view of it: zero-copy reads);
- ``sm-managed``: the same from managed memory placed in host RAM (preferred location host,
  accessed by the GPU), as the weight streamer's copies read it;
- ``lean-managed``: the same by ``bench.probes.overlap_probe``'s copy kernel of two blocks, each
  thread with eight 16-byte loads in flight (the engine's lean kernel, Note [Lean copies]).

Per phase it prints the canary's median and 90th percentile, the share of readings slower
than ``bench.common.FULL_SPEED`` times the fastest idle one, the steal share of the
watcher's CPU and of all CPUs (/proc/stat: time the hypervisor ran something else), and the
GB/s the load moved. A load that slows the canary against the idle phases around it, in
every round, is the link's doing; slow readings in idle phases too are the machine's.
Managed memory: ``--gib``, refused above 80 % of the GPU's free memory.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.common import FULL_SPEED, BenchError, cpu_canary, run_main

GiB = 1 << 30
LOADS = ("gpu", "dma-h2d", "dma-d2h", "sm-pinned", "sm-managed", "lean-managed")
STEAL = 7  # the steal field of a /proc/stat cpu line, after its name (user nice system ...)


def cpu_times(stat_text: str) -> dict[str, list[int]]:
    """The /proc/stat cpu lines: name ("cpu" for all, "cpu3") -> its time fields."""
    out = {}
    for line in stat_text.splitlines():
        name, *fields = line.split()
        if name.startswith("cpu"):
            out[name] = [int(f) for f in fields]
    return out


def steal_share(before: list[int], after: list[int]) -> float:
    """The share of a CPU's time between two readings that the hypervisor stole."""
    spent = [a - b for a, b in zip(after[:8], before[:8], strict=True)]
    total = sum(spent)
    return spent[STEAL] / total if total > 0 else 0.0


def summarise(
    readings: list[tuple[float, float]], phases: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """Each phase (``name``, ``start``, ``end``) with the canary readings that ended inside
    it: count, median and 90th percentile (ms), and the share slower than FULL_SPEED times
    the fastest reading of any idle phase."""
    idle = [
        c for t, c in readings for p in phases if p["name"] == "idle" and p["start"] <= t < p["end"]
    ]
    if not idle:
        raise BenchError("no canary reading fell in an idle phase: is the watcher running?")
    limit = FULL_SPEED * min(idle)
    out = []
    for p in phases:
        got = sorted(c for t, c in readings if p["start"] <= t < p["end"])
        row = {k: v for k, v in p.items() if k not in ("start", "end")}
        row["canaries"] = len(got)
        if got:
            row["canary_median_ms"] = round(statistics.median(got) * 1e3, 3)
            row["canary_p90_ms"] = round(got[int(0.9 * (len(got) - 1))] * 1e3, 3)
            row["slow_share"] = round(sum(c > limit for c in got) / len(got), 3)
        out.append(row)
    return out


def _watch(cpu: int, stop: Any, out: Any) -> None:
    """The watcher: canaries back to back on ``cpu`` until ``stop`` is set."""
    os.sched_setaffinity(0, {cpu})
    readings = []
    while not stop.is_set():
        c = cpu_canary()
        readings.append((time.monotonic(), c))
    out.put(readings)


def _loads(torch: Any, nbytes: int) -> dict[str, Callable[[], int]]:
    """Each load as a function that queues one round of it and returns its bytes over the
    link (0 for ``gpu``); made here so that the memory is allocated once."""
    from bench.probes.evict_routes import HOST, Cuda
    from bench.probes.overlap_probe import LEAN_SOURCE
    from bench.probes.populate_probe import Span

    cuda = Cuda()
    if nbytes > 0.8 * cuda.free_bytes():
        raise BenchError(f"--gib: {nbytes / GiB:.1f} GiB is more than 80 % of free GPU memory")
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    pinned = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    pinned_view = torch.as_tensor(Span(pinned.data_ptr(), nbytes), device="cuda").view(torch.uint8)
    ptr = cuda.managed(nbytes)
    cuda.advise_host(ptr, nbytes)
    cuda.prefetch(ptr, nbytes, HOST)
    cuda.sync()
    managed = torch.as_tensor(Span(ptr, nbytes), device="cuda").view(torch.uint8)
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    lean = torch.cuda._compile_kernel(LEAN_SOURCE, "lean_copy")

    def gpu() -> int:
        for _ in range(8):
            a @ a
        return 0

    def lean_copy() -> int:
        lean(grid=(2, 1, 1), block=(1024, 1, 1), args=[dev, managed, nbytes // 16])
        return nbytes

    return {
        "gpu": gpu,
        "dma-h2d": lambda: (dev.copy_(pinned, non_blocking=True), nbytes)[1],
        "dma-d2h": lambda: (pinned.copy_(dev, non_blocking=True), nbytes)[1],
        "sm-pinned": lambda: (torch._foreach_copy_([dev], [pinned_view]), nbytes)[1],
        "sm-managed": lambda: (torch._foreach_copy_([dev], [managed]), nbytes)[1],
        "lean-managed": lean_copy,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0, help="bytes a load moves a round")
    ap.add_argument("--seconds", type=float, default=4.0, help="each phase")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--loads", default=",".join(LOADS), help=f"of {', '.join(LOADS)}")
    ap.add_argument("--json", help="write the phases here")
    a = ap.parse_args(argv)
    loads = [x.strip() for x in a.loads.split(",") if x.strip()]
    if not loads or not set(loads) <= set(LOADS):
        raise BenchError(f"--loads takes some of {', '.join(LOADS)}, got {a.loads!r}")
    if a.seconds <= 0 or a.rounds < 1 or a.gib <= 0:
        raise BenchError("--seconds and --gib must be positive and --rounds at least 1")
    import torch

    if not torch.cuda.is_available():
        raise BenchError("no CUDA device: this probe runs on the GPU host")
    nbytes = int(a.gib * GiB) // 16 * 16
    run = _loads(torch, nbytes)
    cpus = sorted(os.sched_getaffinity(0))
    watcher_cpu = cpus[-1]
    os.sched_setaffinity(0, set(cpus[:-1]) or {watcher_cpu})
    ctx = mp.get_context("spawn")
    stop, out = ctx.Event(), ctx.Queue()
    watcher = ctx.Process(target=_watch, args=(watcher_cpu, stop, out), daemon=True)
    watcher.start()
    time.sleep(1.0)  # the watcher's interpreter is up
    phases: list[dict[str, Any]] = []
    order = [name for _ in range(a.rounds) for load in loads for name in ("idle", load)]
    order.append("idle")
    for i, name in enumerate(order):
        print(f"phase {i + 1}/{len(order)}: {name}", flush=True)
        with open("/proc/stat") as f:
            before = cpu_times(f.read())
        start = time.monotonic()
        moved = 0
        while time.monotonic() - start < a.seconds:
            if name == "idle":
                time.sleep(0.05)
            else:
                moved += run[name]()
                torch.cuda.synchronize()
        end = time.monotonic()
        with open("/proc/stat") as f:
            after = cpu_times(f.read())
        phases.append(
            {
                "name": name,
                "start": start,
                "end": end,
                "gb_s": round(moved / (end - start) / 1e9, 2),
                "steal_watcher_cpu": round(
                    steal_share(before[f"cpu{watcher_cpu}"], after[f"cpu{watcher_cpu}"]), 4
                ),
                "steal_all": round(steal_share(before["cpu"], after["cpu"]), 4),
            }
        )
    stop.set()
    readings = out.get(timeout=30)
    watcher.join(timeout=10)
    rows = summarise(readings, phases)
    for r in rows:
        print(json.dumps(r), flush=True)
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"watcher_cpu": watcher_cpu, "bytes": nbytes, "phases": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    run_main("link_cpu_probe", main)
