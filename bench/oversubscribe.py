"""Listing 1 of Choi et al. (ACSOS-C 2021), scaled: a CPU tensor twice the device
budget is copied to the GPU, squared there, and copied back.

    python -m bench.oversubscribe --stock-pythonpath STOCK --um-pythonpath UM [--budget-gib 4]

Modes (--modes; default um, stock, stock-pinned, and um-prev with --prev-pythonpath),
each a worker process of its own, alternating over rounds:
  um            +um torch, device budget BUDGET: half the tensor must live in host RAM
  um-managed-host  the same with host_alloc:managed: the program's CPU tensors (the
                source, its reference square and the buffer copied out into) are managed
                memory placed in host RAM instead of ordinary pageable memory (the
                program makes a one-element CUDA tensor first: the setting applies once
                the process has made a managed segment)
  um-prev-managed-host  um-managed-host on the previous engine (asked for with
                um-managed-host when --prev-pythonpath is given)
  stock         stock torch, the whole tensor on the GPU (it fits there physically):
                what the same program costs when the GPU is big enough
  stock-pinned  stock torch from page-locked host memory: the PCIe floor of the copies
Per worker the program runs twice: ``first`` (fresh segments, first touch of every
page) and ``again`` (the allocator's cached segments reused). Printed: seconds and
GB/s of each phase, and the ratios of ``um`` to ``stock`` and to ``stock-pinned``.
The total-managed cap is 80 % of the free memory each worker reads at start, and
the managed memory a mode makes must fit under it: the tensor and its square, and in
um-managed-host the three CPU tensors too.
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench.common import (
    BenchError,
    GiB,
    emit,
    machine,
    run_main,
    run_rounds,
    safe_cap,
    save,
    um_module,
)

# um-prev: with --prev-pythonpath only
MODES = ("um", "um-prev", "um-managed-host", "um-prev-managed-host", "stock", "stock-pinned")
PREV_MODES = {"um-prev": "um", "um-prev-managed-host": "um-managed-host"}  # the same program
UM_MODES = ("um", "um-managed-host")  # the engine under test, set against each base
# um-managed-host makes 5x the tensor of managed memory (the cap may not hold it): asked for
DEFAULT_MODES = ("um", "stock", "stock-pinned")
PHASES = ("copy_in", "square", "copy_out")
# the engine's byte counters kept a phase (um modes): where each phase's bytes went
COUNTERS = (
    "prefetch_bytes",
    "touch_prefetch_bytes",
    "reuse_bytes",
    "place_bytes",
    "map_host_bytes",
    "evict_bytes",
    "discard_bytes",
    "executor_ns",
    "evictor_ns",
    "kernel_copy_bytes",
    "kernel_copy_cpu_bytes",
    "pageable_cpu_bytes",
    "pageable_staged_bytes",
)
RUNS = ("first", "again")


def worker(mode: str, budget: int) -> None:
    import torch

    um = um_module(torch, "stock" if mode.startswith("stock") else mode)
    free, _, cap = safe_cap(torch)
    size = 2 * budget
    managed_host = mode.endswith("managed-host")
    if um is not None:
        managed = (5 if managed_host else 2) * size
        if managed > cap:
            raise BenchError(
                f"mode {mode}: its managed memory ({managed / GiB:.1f} GiB) exceeds the managed "
                f"cap ({cap / GiB:.1f} GiB = 80 % of free memory): pass a smaller --budget-gib"
            )
        um.configure(enabled=True, max_managed=cap, device_budget=budget)
        if managed_host:
            # host_alloc:managed applies once the process has made a managed segment
            # (README, settings): the one line this mode adds to the program.
            torch.ones(1, device="cuda")
            um.configure(host_alloc="managed")
    pinned = mode == "stock-pinned"
    x_cpu = torch.empty(size // 4, dtype=torch.float32).uniform_(-4, 4)
    if pinned:
        x_cpu = x_cpu.pin_memory()
    y_host = torch.empty(x_cpu.shape, dtype=x_cpu.dtype, pin_memory=pinned)
    ref = x_cpu.square()
    if managed_host and not all(um.is_managed(t) for t in (x_cpu, y_host, ref)):
        raise BenchError(f"mode {mode}: host_alloc:managed left a CPU tensor in ordinary memory")

    def now() -> float:
        torch.cuda.synchronize()
        return time.perf_counter()

    def counters() -> dict[str, int]:
        s = um.stats() if um is not None else {}
        return {k: int(s.get("um." + k, 0)) for k in COUNTERS}

    runs: dict[str, dict[str, float]] = {}
    phase_counters: dict[str, dict[str, dict[str, int]]] = {}
    for run in RUNS:
        c0 = counters()
        t0 = now()
        x = x_cpu.to("cuda", non_blocking=pinned)
        t1 = now()
        c1 = counters()
        y = x * x
        t2 = now()
        c2 = counters()
        y_host.copy_(y, non_blocking=pinned)
        t3 = now()
        c3 = counters()
        phase_counters[run] = {
            phase: {k: b[k] - a[k] for k in COUNTERS}
            for phase, a, b in zip(PHASES, (c0, c1, c2), (c1, c2, c3), strict=True)
        }
        t_in, t_sq, t_out = t1 - t0, t2 - t1, t3 - t2
        placed = um.stats()["um.device_placed_bytes"] if um is not None else x.nbytes + y.nbytes
        if um is not None and not (um.is_managed(x) and um.is_managed(y)):
            raise BenchError("mode um: the tensors are not in managed memory")
        runs[run] = {"copy_in": t_in, "square": t_sq, "copy_out": t_out, "device_placed": placed}
        del x, y
    if not torch.equal(y_host, ref):
        raise BenchError(f"mode {mode}: the GPU square differs from the CPU square")
    emit(
        {
            "mode": mode,
            "bytes": size,
            "budget": budget,
            "runs": runs,
            "counters": phase_counters if um is not None else None,
            "free_at_start": free,
            "cap": cap,
            "machine": machine(torch),
        }
    )


def selected_modes(text: str, prev: bool) -> list[str]:
    """The modes of --modes in MODES' order, um-prev added where its torch is given."""
    asked = {m.strip() for m in text.split(",") if m.strip()}
    unknown = sorted(asked - set(MODES))
    if unknown:
        known = ", ".join(MODES)
        raise BenchError(f"--modes: unknown {', '.join(unknown)}; the modes are {known}")
    if prev:
        asked |= {p for p, mine in PREV_MODES.items() if mine in asked}
    elif asked & set(PREV_MODES):
        raise BenchError(
            f"--modes: {', '.join(sorted(asked & set(PREV_MODES)))} needs --prev-pythonpath "
            "(the previous engine's torch)"
        )
    if "um" not in asked or not asked & {"stock", "stock-pinned"}:
        raise BenchError("--modes: um and stock or stock-pinned are required (the record's base)")
    return [m for m in MODES if m in asked]


def summarize(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Per mode, run and phase: the median seconds over rounds and the GB/s it means;
    per run and phase: um/stock and um/stock-pinned."""
    size = samples[0]["bytes"]
    table: dict[str, Any] = {}
    for mode in MODES:
        rows = [s for s in samples if s["mode"] == mode]
        if not rows:
            continue
        table[mode] = {
            run: {
                phase: {
                    "seconds": (sec := statistics.median(r["runs"][run][phase] for r in rows)),
                    "GB/s": size / sec / 1e9,
                }
                for phase in PHASES
            }
            for run in RUNS
        }
    ratios = {}
    for mine in UM_MODES:
        for base in ("um", "um-prev", "um-prev-managed-host", "stock", "stock-pinned"):
            if mine != base and mine in table and base in table:
                ratios[f"{mine}/{base}"] = {
                    run: {
                        p: table[mine][run][p]["seconds"] / table[base][run][p]["seconds"]
                        for p in PHASES
                    }
                    for run in RUNS
                }
    # Issue 8's form: the whole listing per mode, first run and again, and its ratio to
    # the pinned-copy floor (stock-pinned moves the same bytes at link speed).
    total = {
        run: {mode: sum(t[run][p]["seconds"] for p in PHASES) for mode, t in table.items()}
        for run in RUNS
    }
    floor = {run: total[run].get("stock-pinned") for run in RUNS}
    per_floor = {
        run: {m: sec / floor[run] for m, sec in total[run].items() if floor[run]} for run in RUNS
    }
    return {
        "seconds": table,
        "ratios": ratios,
        "first_s": total["first"],
        "again_s": total["again"],
        "per_pinned_floor": per_floor,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.oversubscribe", description=__doc__)
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--budget-gib", type=float, default=4.0, help="device budget; tensor = 2x")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--stock-pythonpath", default=None, help="PYTHONPATH of a stock torch")
    ap.add_argument("--um-pythonpath", default=None, help="PYTHONPATH of a +um torch")
    ap.add_argument(
        "--prev-pythonpath",
        default=None,
        help="PYTHONPATH of a +um torch with the previous engine: adds mode um-prev",
    )
    ap.add_argument(
        "--modes",
        default=",".join(DEFAULT_MODES),
        help="comma-separated, from " + ", ".join(MODES) + " (default %(default)s, and "
        "um-prev with --prev-pythonpath); um and a stock mode are required",
    )
    ap.add_argument("--out", default=None, help="results folder (default bench/results)")
    a = ap.parse_args(argv)
    budget = int(a.budget_gib * GiB) // 4096 * 4096
    if a.worker:
        worker(a.mode, budget)
        return 0
    paths = {
        "um": a.um_pythonpath,
        "um-managed-host": a.um_pythonpath,
        "stock": a.stock_pythonpath,
        "stock-pinned": a.stock_pythonpath,
    }
    modes = selected_modes(a.modes, a.prev_pythonpath is not None)
    if a.prev_pythonpath:
        paths.update(dict.fromkeys(PREV_MODES, a.prev_pythonpath))
    cases = [(mode, ["--budget-gib", str(a.budget_gib)]) for mode in modes]

    def describe(s: dict[str, Any]) -> str:
        first, again = s["runs"]["first"], s["runs"]["again"]
        return f"{s['mode']:12s} " + "  ".join(
            f"{p} {first[p]:.3f}/{again[p]:.3f} s" for p in PHASES
        )

    samples = run_rounds("bench.oversubscribe", cases, a.rounds, paths, describe)
    summary = summarize(samples)
    size = samples[0]["bytes"]
    print(f"\n{size / GiB:.1f} GiB tensor, device budget {budget / GiB:.1f} GiB (median of rounds)")
    print(f"{'mode':13s}{'run':7s}" + "".join(f"{p:>20s}" for p in PHASES))
    for mode, runs in summary["seconds"].items():
        for run, phases in runs.items():
            cells = "".join(
                f"{phases[p]['seconds']:9.3f} s {phases[p]['GB/s']:5.1f} GB/s" for p in PHASES
            )
            print(f"{mode:13s}{run:7s}{cells}")
    for name, runs in summary["ratios"].items():
        for run, phases in runs.items():
            print(f"{name:19s} {run:6s}" + "".join(f"{p} {phases[p]:6.2f}x  " for p in PHASES))
    save(
        "oversubscribe",
        samples,
        {"rounds": a.rounds, "budget_bytes": budget, "tensor_bytes": size},
        summary,
        a.out,
    )
    return 0


if __name__ == "__main__":
    run_main("oversubscribe", main)
