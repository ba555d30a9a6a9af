"""Training step time: torch +um (UM on, UM off) against stock torch, data that fits.

    python -m bench.step_time --stock-pythonpath STOCK --um-pythonpath UM [--rounds 3]
        [--prev-pythonpath PREV] [--modes stock,um-off,um,um-prev,upstream-uvm]

Each (round, model, mode) is a worker process of its own: ``stock`` imports the
torch found through STOCK (an unmodified torch), ``um`` and ``um-off`` the +um torch
found through UM, with the engine on (its total-managed cap at 80 % of the free
memory the worker reads at start) or off, and ``um-prev`` (run when --prev-pythonpath is
given) the same with the previous engine: a +um torch staged from an earlier commit's
bundle. The mode order rotates every round. Per
worker: WARMUP steps, then STEPS timed with CUDA events; its median is one sample.
Printed: the best and the median sample of each mode and their ratios to stock.

``upstream-uvm`` (not run unless named in ``--modes``): the stock torch with upstream's own
private route to managed memory, ``torch.cuda._use_uvm()`` (torch 2.14 and later: a MemPool
whose pluggable allocator calls cudaMallocManaged through cuda-python, advised to the
device, with no prefetch, budget or cap), around building the model and training it, with
``torch.autograd.set_multithreading_enabled(False)`` so that backward's allocations also go
there. It has no cap, so it runs only these workloads, which fit well within free memory
(the worker checks that peak allocation stays under half of it). Each worker also records
its first step's time, ``torch.cuda.memory_stats()`` and, with ``--compile``, whether
``torch.compile`` of the model compiles and runs one forward and backward in that mode.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
from typing import Any

from bench.common import (
    BenchError,
    emit,
    machine,
    run_main,
    run_rounds,
    safe_cap,
    save,
    um_module,
)

MODES = ("stock", "um-off", "um", "um-prev", "upstream-uvm")
DEFAULT_MODES = ("stock", "um-off", "um")  # and um-prev with --prev-pythonpath
PREV = "um-prev"  # runs on --prev-pythonpath
#: memory_stats() keys a record keeps (the full dict has hundreds)
STATS_KEYS = (
    "allocated_bytes.all.peak",
    "reserved_bytes.all.peak",
    "segment.all.peak",
    "num_alloc_retries",
    "num_ooms",
)


def worker(mode: str, model: str, steps: int, warmup: int, compile_: bool = False) -> None:
    import torch

    from bench.workloads import WORKLOADS, train_steps

    um = um_module(torch, {"upstream-uvm": "stock", PREV: "um"}.get(mode, mode))
    free, _, cap = safe_cap(torch)
    engine_on = mode in ("um", PREV)
    if um is not None:
        um.configure(enabled=engine_on, max_managed=cap)
    scope: Any = contextlib.nullcontext()
    if mode == "upstream-uvm":
        use_uvm = getattr(torch.cuda, "_use_uvm", None)
        if use_uvm is None:
            raise BenchError(
                f"mode upstream-uvm needs torch.cuda._use_uvm (torch 2.14 or later); "
                f"{torch.__file__} is torch {torch.__version__}"
            )
        torch.autograd.set_multithreading_enabled(False)
        scope = use_uvm()
    torch.manual_seed(0)
    compiled: dict[str, Any] = {}
    with scope:
        workload = WORKLOADS[model]()
        losses, all_times = train_steps(workload, warmup + steps)
        if compile_:
            try:
                net, batch, target = workload
                cnet = torch.compile(net)
                out = cnet(batch)
                torch.nn.functional.cross_entropy(
                    out.reshape(-1, out.shape[-1]), target.reshape(-1)
                ).backward()
                torch.cuda.synchronize()
                compiled = {"ok": True}
            except Exception as e:  # recorded, not fatal
                compiled = {"ok": False, "error": f"{type(e).__name__}: {str(e)[:300]}"}
    peak = torch.cuda.max_memory_allocated()
    if mode == "upstream-uvm" and peak > free // 2:
        raise BenchError(f"upstream-uvm peaked at {peak} bytes, over half of free memory {free}")
    um_stats = um.stats() if um is not None else {}
    managed = um_stats.get("um.managed_bytes", 0)
    if engine_on != (managed > 0):
        raise BenchError(f"mode {mode}: {managed} managed bytes after training")
    # The engine's sampled block-event cost (one event in 8; an older engine lacks it).
    sampled = um_stats.get("um.event_samples", 0)
    stats = torch.cuda.memory_stats()
    emit(
        {
            "mode": mode,
            "model": model,
            "median_ms": statistics.median(all_times[warmup:]),
            "times_ms": all_times[warmup:],
            "first_step_ms": all_times[0],
            "losses": losses,
            "managed_bytes": managed,
            "event_sample_ns_mean": um_stats["um.event_sample_ns"] / sampled if sampled else None,
            "max_allocated_bytes": peak,
            "memory_stats": {k: stats.get(k) for k in STATS_KEYS},
            "compile": compiled or None,
            "free_at_start": free,
            "cap": cap,
            "machine": machine(torch),
        }
    )


def summarize(samples: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per model and mode: best and median of the per-worker medians, ratios to stock."""
    out: dict[str, dict[str, Any]] = {}
    for model in dict.fromkeys(s["model"] for s in samples):
        per_mode = {
            mode: [s["median_ms"] for s in samples if s["model"] == model and s["mode"] == mode]
            for mode in MODES
        }
        row: dict[str, Any] = {}
        for mode, values in per_mode.items():
            if values:
                row[mode] = {"best_ms": min(values), "median_ms": statistics.median(values)}
        for mode in ("um-off", "um", PREV, "upstream-uvm"):
            if mode in row and "stock" in row:
                row[f"{mode}/stock"] = {
                    k: row[mode][k] / row["stock"][k] for k in ("best_ms", "median_ms")
                }
        if "um" in row and PREV in row:
            row[f"um/{PREV}"] = {k: row["um"][k] / row[PREV][k] for k in ("best_ms", "median_ms")}
        out[model] = row
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.step_time", description=__doc__)
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--models", default="resnet50,gpt,gpt-tiny")
    ap.add_argument(
        "--modes",
        default=None,
        help=f"comma-separated, of {', '.join(MODES)} (default {','.join(DEFAULT_MODES)},"
        f" and {PREV} with --prev-pythonpath)",
    )
    ap.add_argument("--compile", action="store_true", help="also try torch.compile per worker")
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per worker")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--stock-pythonpath", default=None, help="PYTHONPATH of a stock torch")
    ap.add_argument("--um-pythonpath", default=None, help="PYTHONPATH of a +um torch")
    ap.add_argument(
        "--prev-pythonpath", default=None, help="PYTHONPATH of the previous engine (um-prev)"
    )
    ap.add_argument("--out", default=None, help="results folder (default bench/results)")
    a = ap.parse_args(argv)
    if a.worker:
        worker(a.mode, a.model, a.steps, a.warmup, a.compile)
        return 0
    default = [*DEFAULT_MODES, *([PREV] if a.prev_pythonpath else [])]
    text = a.modes if a.modes is not None else ",".join(default)
    modes = [m.strip() for m in text.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        raise BenchError(f"--modes {text!r}: modes are {', '.join(MODES)}")
    if PREV in modes and a.prev_pythonpath is None:
        raise BenchError(
            f"mode {PREV} runs the previous engine: give --prev-pythonpath, a +um torch "
            "staged from an earlier commit's bundle"
        )
    if a.warmup < 1:
        raise BenchError("--warmup must be at least 1 (the first step is recorded apart)")
    extra = ["--compile"] if a.compile else []
    cases = [
        (mode, ["--model", model, "--steps", str(a.steps), "--warmup", str(a.warmup), *extra])
        for model in a.models.split(",")
        for mode in modes
    ]
    paths = {
        "stock": a.stock_pythonpath,
        "um-off": a.um_pythonpath,
        "um": a.um_pythonpath,
        PREV: a.prev_pythonpath,
        "upstream-uvm": a.stock_pythonpath,
    }
    samples = run_rounds(
        "bench.step_time",
        cases,
        a.rounds,
        paths,
        lambda s: (
            f"{s['model']:9s} {s['mode']:12s} {s['median_ms']:8.2f} ms"
            f" (first {s['first_step_ms']:.1f} ms, compile {s['compile']})"
        ),
    )
    summary = summarize(samples)
    print("\nmodel      mode          best ms  median ms  best/stock  median/stock")
    for model, row in summary.items():
        for mode in MODES:
            if mode in row:
                ms, ratio = row[mode], row.get(f"{mode}/stock", {"best_ms": 1, "median_ms": 1})
                print(
                    f"{model:10s} {mode:12s} {ms['best_ms']:8.2f} {ms['median_ms']:10.2f}"
                    f" {ratio['best_ms']:11.3f} {ratio['median_ms']:13.3f}"
                )
        if f"um/{PREV}" in row:
            r = row[f"um/{PREV}"]
            print(f"{model:10s} um/{PREV}: best {r['best_ms']:.3f}, median {r['median_ms']:.3f}")
    save(
        "step_time",
        samples,
        {"rounds": a.rounds, "steps": a.steps, "warmup": a.warmup, "modes": modes},
        summary,
        a.out,
    )
    return 0


if __name__ == "__main__":
    run_main("step_time", main)
