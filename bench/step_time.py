"""Training step time: torch +um (UM on, UM off) against stock torch, data that fits.

    python -m bench.step_time --stock-pythonpath STOCK --um-pythonpath UM [--rounds 3]

Each (round, model, mode) is a worker process of its own: ``stock`` imports the
torch found through STOCK (an unmodified torch), ``um`` and ``um-off`` the +um torch
found through UM, with the engine on (its total-managed cap at 80 % of the free
memory the worker reads at start) or off. The mode order rotates every round. Per
worker: WARMUP steps, then STEPS timed with CUDA events; its median is one sample.
Printed: the best and the median sample of each mode and their ratios to stock.
"""

from __future__ import annotations

import argparse
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

MODES = ("stock", "um-off", "um")


def worker(mode: str, model: str, steps: int, warmup: int) -> None:
    import torch

    from bench.workloads import WORKLOADS, train_steps

    um = um_module(torch, mode)
    free, _, cap = safe_cap(torch)
    if um is not None:
        um.configure(enabled=mode == "um", max_managed=cap)
    torch.manual_seed(0)
    losses, times = train_steps(WORKLOADS[model](), warmup + steps, warmup)
    managed = um.stats()["um.managed_bytes"] if um is not None else 0
    if (mode == "um") != (managed > 0):
        raise BenchError(f"mode {mode}: {managed} managed bytes after training")
    emit(
        {
            "mode": mode,
            "model": model,
            "median_ms": statistics.median(times),
            "times_ms": times,
            "losses": losses,
            "managed_bytes": managed,
            "max_allocated_bytes": torch.cuda.max_memory_allocated(),
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
        for mode in ("um-off", "um"):
            if mode in row and "stock" in row:
                row[f"{mode}/stock"] = {
                    k: row[mode][k] / row["stock"][k] for k in ("best_ms", "median_ms")
                }
        out[model] = row
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.step_time", description=__doc__)
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", choices=MODES, help=argparse.SUPPRESS)
    ap.add_argument("--models", default="resnet50,gpt")
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20, help="timed steps per worker")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--stock-pythonpath", default=None, help="PYTHONPATH of a stock torch")
    ap.add_argument("--um-pythonpath", default=None, help="PYTHONPATH of a +um torch")
    ap.add_argument("--out", default=None, help="results folder (default bench/results)")
    a = ap.parse_args(argv)
    if a.worker:
        worker(a.mode, a.model, a.steps, a.warmup)
        return 0
    cases = [
        (mode, ["--model", model, "--steps", str(a.steps), "--warmup", str(a.warmup)])
        for model in a.models.split(",")
        for mode in MODES
    ]
    paths = {"stock": a.stock_pythonpath, "um-off": a.um_pythonpath, "um": a.um_pythonpath}
    samples = run_rounds(
        "bench.step_time",
        cases,
        a.rounds,
        paths,
        lambda s: f"{s['model']:9s} {s['mode']:7s} {s['median_ms']:8.2f} ms",
    )
    summary = summarize(samples)
    print("\nmodel      mode     best ms  median ms  best/stock  median/stock")
    for model, row in summary.items():
        for mode in MODES:
            if mode in row:
                ms, ratio = row[mode], row.get(f"{mode}/stock", {"best_ms": 1, "median_ms": 1})
                print(
                    f"{model:10s} {mode:7s} {ms['best_ms']:8.2f} {ms['median_ms']:10.2f}"
                    f" {ratio['best_ms']:11.3f} {ratio['median_ms']:13.3f}"
                )
    save(
        "step_time",
        samples,
        {"rounds": a.rounds, "steps": a.steps, "warmup": a.warmup},
        summary,
        a.out,
    )
    return 0


if __name__ == "__main__":
    run_main("step_time", main)
