"""A model that does not fit under the device budget: a decoder-only transformer of about a
billion parameters in bf16, trained (``train``), run forward (``infer``) or made to generate
(``generate``) by stock torch, by torch +um with the residency engine, and by the peers that
fit the same budget by other means.

    python -m bench.residency {train,infer,generate,ddp} --stock-pythonpath STOCK
        --um-pythonpath UM
        [--prev-pythonpath PREV] [--rounds 2] [--steps 10] [--warmup 3] [--budget SIZE]
        [--modes a,b,...] [--model gpt2-1.28b|llama-1.1b] [--out DIR]

The model (``--model``, bench/models.py): by default ``gpt2-1.28b``,
``GPT2LMHeadModel(GPT2Config(n_layer=24, n_embd=2048, n_head=16, vocab_size=32000,
n_positions=1024))``; or ``llama-1.1b``, a Llama of TinyLlama's shape (``nn.Linear``
projections, grouped-query attention, gated MLP, RMSNorm, rotary positions, untied head), a
layout the engine was not tuned on. Dropout 0 and no KV cache in training, built in bf16 on
the CPU from a fixed seed (no weights are downloaded) and moved to the GPU, so that every
mode starts from the same weights and stock and +um losses and outputs can be compared.

``train`` (AdamW, batch 4 x 1024 random tokens, loss = model(ids, labels=ids).loss; default
budget 8 GiB; ``--lengths 1024,512,768``: the steps take the first L tokens in turn, a
pattern that changes every step; a run's seconds are then the median over its timed cycles
of a cycle's mean step, and the floor that of stock's mean timed step; ``--loss module``:
the loss is an ``nn.CrossEntropyLoss`` module called on the model's float logits, as
plain PyTorch loops write it, so two outermost modules run forwards each step), modes:
  stock               stock torch, in memory, no limit
  um-nobudget         +um, device_budget 100 %
  um-static           +um, policy static, device_budget BUDGET
  um                  +um, policy lru with the module hooks, predict off, device_budget BUDGET
  um-prev             as um, with the previous engine: a +um torch staged from an earlier
                      commit's bundle (--prev-pythonpath; run only when that is given), so
                      that a change is measured against the policy before it in one run
  um-nohooks          +um, policy lru driven by block events alone (hooks:False)
  um-predict          as um, with predict:True: saved activations past the budget leave by
                      copy and come back ahead of the backward (Note [Saved-activation
                      offload], torch/cuda/_um_predict.py), and AdamW's state is staged
                      on the device for the step (Note [Optimizer state staging],
                      torch/cuda/_um_optim.py); the record adds predict_stats
  um-predict-stage-lean  um-predict with the staging's copies by the lean kernel
                      (predict_stage_kernel:lean: a copy in and a copy out at once, 32
                      blocks each)
  um-predict-stage-lean2  the same on 2 blocks a launch (predict_copy_sms:2)
  fsdp2-offload-ckpt  stock torch, single-process FSDP2 (fully_shard per decoder layer and root,
                      CPUOffloadPolicy), HF gradient checkpointing, memory fraction BUDGET/total
  stock-fraction      stock torch at memory fraction BUDGET/total (expected: out of memory)
``infer`` (forward of batch 8 x 512 under torch.inference_mode; default budget 2 GiB), modes:
  stock, um-static, um, um-prev, and
  um-copies           +um, policy lru with read-only copies of the weights (read_copies:True,
                      off by default: see bench/README.md)
  um-predict          as um, with predict:True: parameters past the budget are read by copy
                      into device buffers ahead of their module (Note [Weight streaming],
                      torch/cuda/_um_weights.py); the record adds predict_stats
  um-predict-advice   um-predict with per-kind advice: the parameters read in place come
                      back as read-only copies (ReadMostly, read_copies:True)
  um-nohooks          +um, policy lru driven by block events alone (hooks:False)
  accelerate          stock torch, accelerate.dispatch_model(model, infer_auto_device_map(
                      model, max_memory={0: BUDGET, "cpu": "200GiB"},
                      no_split_module_classes=[its decoder layer])), the model built on the CPU

``generate`` (greedy ``model.generate()`` with a KV cache: a prompt of batch 4 x 128 and
NEW_TOKENS = 32 new tokens, so one prefill forward and 31 one-token forwards a step, every
one reading all the weights; default budget 2 GiB): the layer-by-layer inference a user
runs past the budget most often. Modes stock, um, um-prev, um-predict and accelerate, as
for ``infer``. The outputs compared with stock are the generated tokens; the table adds
each mode's tokens per second (batch x NEW_TOKENS over the step's seconds).

``ddp`` (2 GPUs, e.g. the device kind nvidia-h200-x2; default budget 12 GiB per rank, so that
both ranks' overflow fits the host's memory): the ``train`` workload under
DistributedDataParallel (NCCL, gradient_as_bucket_view), one process per GPU, each rank with
its own tokens and the budget (or memory fraction) on its own GPU; modes stock, um-static,
um, um-prev, um-predict, stock-fraction, and um-predict-1gpu: the ``train`` workload with
predict on one GPU, no DDP, at the same budget; and um-predict-pair: that one-GPU training
run twice at once, one process per GPU, no DDP (what two ranks share on the host without
DDP's own work). A step's time is the slower rank's; the record keeps every rank's fields
under ``ranks``, and with um-predict-1gpu in the run each mode's ``ranks_per_single``: every
rank's median step over the one-GPU run's (issue 8's bar: at most 1.2), and
``ranks_per_single_by_round``: the same within each round that ran both.

Each worker also keeps, per step, ``cpu``: the CPU-speed canary run just before the
step (bench/common.py: cpu_canary, about 1 ms at full speed; outside the timed part, but the
engine's threads go on working through it, so records made before it had 1-2 ms less of
that between steps) and the step's CPU seconds, of the main thread and of the whole process
(all threads); an inference worker also the host seconds until ``model(ids)`` returns
(``host_s``: close to the step's time when the host bounds the forward). The main thread's
CPU time is not a sign of a host-bound step here: the CUDA runtime spins while it waits for
the device, so waits count as CPU time too (bench/README.md, step 27); the canary says
whether the CPU ran at full speed.

With ``TORCH_UM_BENCH_TRACE_DIR`` set, each infer or generate worker runs two more steps
after its timed ones under torch.profiler and writes their trace there
(``<workload>-<mode>.json.gz``): where the time of the state the run reached goes.

Every mode is a worker process of its own, alternating over rounds (the order rotates each
round); a worker times WARMUP + STEPS steps, each between two torch.cuda.synchronize() calls,
and its median over the STEPS timed ones is one sample. A UM worker reads free GPU memory
first and sets the engine's total-managed cap to 80 % of it (bench/common.py: safe_cap), with
its budget and policy, before any CUDA allocation. A worker that runs out of memory records
``{"oom": true}``; any other failure, a crash or a timeout is an ``error`` sample; neither
stops the run. A UM worker's sample keeps the engine's counters per timed step
(``timed_counters``: the differences over the STEPS timed steps over STEPS, levels as they
end), each step's own moves and levels, warm-up steps included (``step_counters``: how the
run settled), and its totals over the whole run (``um_stats``).

The PCIe floor. A ``link`` worker (stock torch, plain cudaMalloc) measures page-locked copies
of 1 GiB, best of 3: ``h2d`` and ``d2h`` one way at a time, and ``both``, the bytes per second
of the two directions together when a copy each way runs at once on two streams. With ``peak``
the stock in-memory run's torch.cuda.max_memory_allocated() and ``over = max(0, peak - budget)``:

    train, ddp: floor_s = max(stock_s, over / min(h2d, d2h), 2 * over / both)
           (ddp: per rank, own link; over bytes leave the GPU and come back every step.
           On a full-duplex link ``both`` is h2d + d2h and the slower direction bounds
           it; on a link whose directions share one rate, the H200 host's, ``both`` is
           about h2d and the 2 x over bytes queue behind each other: bench/README.md,
           prediction step 12)
    infer: floor_s = max(stock_s, over / h2d)
           (over bytes come in once per forward)
    generate: floor_s = max(stock_s, NEW_TOKENS * over / h2d)
           (once per forward, NEW_TOKENS forwards a step)

The analysis also keeps ``floor_full_duplex_s``, the train formula without its last term (the
floor the records before step 12 give).

with ``stock_s`` the median seconds of the ``stock`` mode. Printed per mode: its median step
seconds (median over rounds of the per-worker medians; null when it ran out of memory), its
ratio to ``um-static``, to ``um-prev`` and to the floor, and its agreement with stock: the
largest absolute difference of the per-step losses (train) or the relative difference of the
logits checksum, float(logits.sum(dtype=float32)) of the fixed input (infer), or the largest
share of generated tokens that differ from stock's, step by step (generate). Then, for every
workload but ddp, each mode's step over the peer's within each round (``per_peer_by_round``:
the peer's own time varies between rounds, so a ratio of medians alone can mislead).

The record, ``<out>/residency-<workload>-<gpu>-<date>.json``: command, machine, the +um
torch and engine, settings, ``summary`` = ``{"floor_s": ..., "modes": {<mode>: median seconds
or null}}`` (every mode name of the workload; null also where a mode was not run or failed),
``analysis`` (the floor's inputs, the ratios, the agreement, OOMs and errors) and every sample.
It is written after every worker, with ``"partial": {"workers": done, "of": planned}`` until
the run ends: a run stopped past a time limit keeps every worker that finished.
"""

from __future__ import annotations

import argparse
import importlib
import itertools
import json
import os
import re
import resource
import socket
import statistics
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import models
from bench.common import (
    FULL_SPEED,
    LEVELS,
    BenchError,
    GiB,
    at_full_speed,
    cell,
    command_line,
    communicate_all,
    counter_change,
    cpu_canary,
    emit,
    error_text,
    last_line,
    machine,
    run_main,
    run_worker_safely,
    safe_cap,
    timeout_text,
    um_module,
    worker_command,
    worker_result,
    write,
)

MODES: dict[str, tuple[str, ...]] = {
    "train": (
        "stock",
        "um-nobudget",
        "um-static",
        "um",
        "um-prev",
        "um-nohooks",
        "um-predict",
        "um-predict-stage-lean",
        "um-predict-stage-lean2",
        "fsdp2-offload-ckpt",
        "stock-fraction",
    ),
    "infer": (
        "stock",
        "um-static",
        "um",
        "um-prev",
        "um-copies",
        "um-nohooks",
        "um-predict",
        "um-predict-advice",
        "accelerate",
    ),
    "generate": ("stock", "um", "um-prev", "um-predict", "accelerate"),
    "ddp": (
        "stock",
        "um-static",
        "um",
        "um-prev",
        "um-predict",
        "um-predict-1gpu",
        "um-predict-pair",
        "stock-fraction",
    ),
}
# ddp: the same training on one GPU, no DDP, at the same budget (issue 8's DDP bar: each
# rank within 1.2x of it).
SINGLE = "um-predict-1gpu"
# ddp: SINGLE in two processes at once, one per GPU, no DDP: what the ranks share on the host
# (CPU, memory, the driver) without DDP's buckets and all-reduce.
PAIR = "um-predict-pair"
ONE_GPU = (SINGLE, PAIR)  # ddp modes that train without DDP
UM_MODES = (
    "um-nobudget", "um-static", "um", "um-prev", "um-copies", "um-nohooks", "um-predict",
    "um-predict-advice", "um-predict-stage-lean", "um-predict-stage-lean2", SINGLE, PAIR,
)  # fmt: skip
PREV = "um-prev"  # runs on --prev-pythonpath
# The offload tool each workload is compared with (the issue's bar): /peer in the table.
PEER = {"train": "fsdp2-offload-ckpt", "infer": "accelerate", "generate": "accelerate"}
# The engine's settings per UM mode (um-nohooks: the residency policy driven by the
# allocator's block events alone, without torch.cuda.um's module hooks).
UM_CONF = {
    "um-nobudget": "",
    "um-static": "policy:static",
    "um": "policy:lru,hooks:True,predict:False",  # the residency policy before prediction
    PREV: "policy:lru,hooks:True",  # an earlier engine: its own defaults
    "um-nohooks": "policy:lru,hooks:False",
    "um-copies": "policy:lru,read_copies:True",
    "um-predict": "policy:lru,hooks:True,predict:True",
    "um-predict-advice": "policy:lru,hooks:True,predict:True,read_copies:True",
    "um-predict-stage-lean": "policy:lru,hooks:True,predict:True,predict_stage_kernel:lean",
    "um-predict-stage-lean2": (
        "policy:lru,hooks:True,predict:True,predict_stage_kernel:lean,predict_copy_sms:2"
    ),
}
UM_CONF[SINGLE] = UM_CONF[PAIR] = UM_CONF["um-predict"]
DEFAULT_BUDGET = {"train": "8GiB", "infer": "2GiB", "generate": "2GiB", "ddp": "12GiB"}
BATCH = {"train": (4, 1024), "infer": (8, 512), "generate": (4, 128), "ddp": (4, 1024)}
TRAINING = ("train", "ddp")  # workloads that train (losses, the full-duplex floor)
NEW_TOKENS = 32  # generate: tokens a step adds to each prompt, one forward each
FORWARDS = {"generate": NEW_TOKENS}  # forwards a step, each reading every weight (else 1)
OUTPUTS = {"train": "losses", "ddp": "losses", "infer": "checksums", "generate": "tokens"}
AGREEMENT = {
    "losses": "max abs loss difference per step",
    "checksums": "max relative difference of the logits checksum",
    "tokens": "max share of generated tokens that differ, per step",
}
FORMULA = {  # the floor's formula as printed (training's otherwise)
    "infer": "max(stock_s, over / h2d)",
    "generate": f"max(stock_s, {NEW_TOKENS} * over / h2d)",
}
WORLD = 2  # ddp: ranks, one GPU each
LINK = "link"  # the pinned-copy worker
LINK_BYTES = GiB
MODULE = "bench.residency"
UNITS = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": GiB, "t": 1 << 40}


# ---------------------------------------------------------------- pure parts (unit tested)


def mode_conf(mode: str, extra: str = "") -> str:
    """The engine settings of a UM mode, with --conf's laid over them (not over
    um-prev's: the previous engine may not know the keys)."""
    return UM_CONF[mode] if mode == PREV or not extra else f"{UM_CONF[mode]},{extra}"


def parse_size(text: str) -> int:
    """Bytes of ``8GiB``, ``1.5G``, ``512MB``, ``4096`` (binary units, like the engine's)."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([kmgt]?)(i?b)?\s*", text.lower())
    if m is None or float(m[1]) <= 0 or (m[3] and not m[2] and m[3] != "b"):
        raise BenchError(f"not a size: {text!r} (examples: 8GiB, 1.5G, 512MiB)")
    return int(float(m[1]) * UNITS[m[2]])


def floor_seconds(
    workload: str,
    stock_s: float | None,
    peak: int | None,
    budget: int,
    h2d: float,
    d2h: float,
    both: float | None = None,
) -> float | None:
    """The PCIe floor (module docstring); None without a stock in-memory time. ``both``
    None (a record without it): the full-duplex floor."""
    if stock_s is None or peak is None:
        return None
    over = max(0, peak - budget)
    link = min(h2d, d2h) if workload in TRAINING else h2d
    if link <= 0:
        return None
    floor = max(stock_s, FORWARDS.get(workload, 1) * over / link)
    if workload in TRAINING and both:
        floor = max(floor, 2 * over / both)
    return floor


def _ok(sample: dict[str, Any]) -> bool:
    return not sample.get("oom") and "error" not in sample


def mode_seconds(samples: list[dict[str, Any]], mode: str) -> float | None:
    """Median over the mode's workers of their median step seconds; None if none ran
    to the end (out of memory, error, or not run)."""
    values = [s["median_s"] for s in samples if s["mode"] == mode and _ok(s)]
    return statistics.median(values) if values else None


def agreement(workload: str, ref: dict[str, Any] | None, sample: dict[str, Any]) -> float | None:
    """How far a sample's outputs are from the stock reference: train, the largest absolute
    difference of the per-step losses; infer, the largest relative difference of the logits
    checksums; generate, the largest share of generated tokens that differ (all step by
    step)."""
    if ref is None or not _ok(sample):
        return None
    key = OUTPUTS[workload]
    pairs = list(zip(ref[key], sample[key], strict=False))
    if not pairs:
        return None
    if workload in TRAINING:
        return float(max(abs(a - b) for a, b in pairs))
    if key == "tokens":
        return max(differing_share(a, b) for a, b in pairs)
    return float(max(abs(b - a) / abs(a) if a else abs(b - a) for a, b in pairs))


def differing_share(ref: list[int], got: list[int]) -> float:
    """The share of positions at which two generations differ (a length that differs
    counts its missing positions as differing)."""
    n = max(len(ref), len(got))
    if n == 0:
        return 0.0
    same = sum(1 for a, b in zip(ref, got, strict=False) if a == b)
    return (n - same) / n


def per_round(samples: list[dict[str, Any]], mode: str, ref: str) -> list[float] | None:
    """The mode's median step over the ``ref`` mode's, round by round, for the rounds in
    which both finished: a peer whose time varies between rounds (FSDP2 on the H200 host,
    1.25-1.45 s) is then compared within each round, where both ran on the same machine
    state. None when no round has both (or the samples carry no round)."""

    def by_round(m: str) -> dict[int, float]:
        return {
            s["round"]: s["median_s"] for s in samples if s["mode"] == m and "round" in s and _ok(s)
        }

    mine, theirs = by_round(mode), by_round(ref)
    both = sorted(set(mine) & set(theirs))
    return [mine[r] / theirs[r] for r in both] or None


def ranks_per_single(runs: list[dict[str, Any]], single_s: float) -> list[float] | None:
    """ddp: per rank, the median over the mode's workers of that rank's own median step
    seconds, over the one-GPU run's (SINGLE); None without ranks."""
    per_rank = [s["ranks"] for s in runs if _ok(s) and s.get("ranks")]
    if not per_rank:
        return None
    return [
        statistics.median(ranks[r]["median_s"] for ranks in per_rank) / single_s
        for r in range(min(len(ranks) for ranks in per_rank))
    ]


def ranks_per_single_by_round(samples: list[dict[str, Any]], mode: str) -> list[list[float]] | None:
    """ddp: for each round in which both ran, every rank's median step over the one-GPU
    run's of the same round. The one-GPU run's time moves between workers by more than
    the bar's margin (bench/README.md, step 40): a ratio within a round sets a worker
    against its neighbour, not against a median over other rounds."""
    single = {s["round"]: s["median_s"] for s in samples if s["mode"] == SINGLE and _ok(s)}
    rounds = [
        [rank["median_s"] / single[s["round"]] for rank in s["ranks"]]
        for s in samples
        if s["mode"] == mode and _ok(s) and s.get("ranks") and s.get("round") in single
    ]
    return rounds or None


def full_speed(
    samples: list[dict[str, Any]], floor: float | None, warmup: int | None = None
) -> dict[str, Any] | None:
    """Per mode, the median of the timed steps whose CPU canary (run just before each
    step) was within FULL_SPEED of the fastest canary of the whole run: the machine's CPU
    runs at half to two thirds of its speed at times, in stock torch too (bench/README.md,
    step 25), and a host-bound step slows with it. Modes' plain medians mix both states
    in whatever share each process met; this compares them at one state. None without
    canaries. A sample without its ``warmup`` (records made before step 28 kept it for
    training only) is counted with ``warmup`` if given (the run's ``settings.warmup``),
    else left out."""
    steps: dict[str, list[tuple[float, float]]] = {}
    for s in samples:
        cpu = s.get("cpu") if _ok(s) else None
        if not cpu or not cpu.get("canary_s") or s.get("ranks"):
            continue  # a DDP record pairs rank 0's canaries with the slowest rank's times
        w = s.get("warmup", warmup)
        if w is None:
            continue
        pairs = list(zip(s["times_s"][w:], cpu["canary_s"][w:], strict=False))
        steps.setdefault(s["mode"], []).extend(pairs)
    if not steps:
        return None
    fastest = min(c for pairs in steps.values() for _, c in pairs)
    modes: dict[str, Any] = {}
    for mode, pairs in steps.items():
        fast = at_full_speed(pairs, fastest)
        sec = statistics.median(fast) if fast else None
        modes[mode] = {
            "seconds": sec,
            "steps": len(fast),
            "of_steps": len(pairs),
            "per_floor": sec / floor if sec is not None and floor else None,
        }
    return {"canary_limit_s": FULL_SPEED * fastest, "modes": modes}


def cycle_over(stock_runs: list[dict[str, Any]], budget: int) -> int | None:
    """Bytes past the budget of stock's mean timed step, where the steps' lengths change
    (--lengths: each step's own peak recorded); None otherwise."""
    overs = [
        max(0, peak - budget)
        for s in stock_runs
        if s.get("step_peak_allocated_bytes")
        for peak in s["step_peak_allocated_bytes"][s.get("warmup", 0) :]
    ]
    return sum(overs) // len(overs) if overs else None


def summarize(
    workload: str, samples: list[dict[str, Any]], budget: int
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(summary, analysis). summary = {"floor_s", "modes": {mode: median s or None}} over
    every mode of the workload; analysis: the floor's inputs, per mode the ratios to
    um-static, to um-prev, to um, to the workload's peer (PEER) and to the floor, the
    agreement with stock, and OOMs / errors."""
    modes = {m: mode_seconds(samples, m) for m in MODES[workload]}
    stock_runs = [s for s in samples if s["mode"] == "stock" and _ok(s)]
    ref = stock_runs[0] if stock_runs else None
    peak = max((s["max_allocated_bytes"] for s in stock_runs), default=None)
    links = [s for s in samples if s["mode"] == LINK and _ok(s)]
    h2d = max((s["h2d_bytes_per_s"] for s in links), default=0.0)
    d2h = max((s["d2h_bytes_per_s"] for s in links), default=0.0)
    both = max((s.get("both_bytes_per_s") or 0.0 for s in links), default=0.0) or None
    over = cycle_over(stock_runs, budget)
    # A cycle of lengths (--lengths): the overflow of the mean step, not of the longest
    at = budget + over if over is not None else peak
    floor = floor_seconds(workload, modes["stock"], at, budget, h2d, d2h, both)
    full_duplex = floor_seconds(workload, modes["stock"], at, budget, h2d, d2h)
    static = modes.get("um-static")
    prev = modes.get(PREV)
    plain = modes.get("um")  # the residency policy without prediction
    peer = modes.get(PEER.get(workload, ""))
    single = modes.get(SINGLE) if workload == "ddp" else None
    rows: dict[str, Any] = {}
    for mode, sec in modes.items():
        runs = [s for s in samples if s["mode"] == mode]
        diffs = [d for s in runs if (d := agreement(workload, ref, s)) is not None]
        if mode in ONE_GPU:
            diffs = []  # one GPU trains on other tokens than the ranks: nothing to compare
        firsts = [s["first_step_s"] for s in runs if _ok(s)]
        rows[mode] = {
            "seconds": sec,
            "first_step_s": statistics.median(firsts) if firsts else None,
            "per_um_static": sec / static if sec is not None and static else None,
            "per_um_prev": sec / prev if sec is not None and prev else None,
            "per_um": sec / plain if sec is not None and plain else None,
            "per_peer": sec / peer if sec is not None and peer else None,
            "per_peer_by_round": per_round(samples, mode, PEER[workload])
            if workload in PEER and mode != PEER[workload]
            else None,
            "per_floor": sec / floor if sec is not None and floor else None,
            "agreement": max(diffs) if diffs else None,
            "tokens_per_s": BATCH[workload][0] * NEW_TOKENS / sec
            if workload in FORWARDS and sec
            else None,
            "runs": len(runs),
            "oom": sum(1 for s in runs if s.get("oom")),
            "errors": [s["error"] for s in runs if "error" in s],
        }
        if single:
            rows[mode]["ranks_per_single"] = ranks_per_single(runs, single)
            rows[mode]["ranks_per_single_by_round"] = ranks_per_single_by_round(samples, mode)
    analysis = {
        "floor": {
            "stock_s": modes["stock"],
            "stock_peak_allocated_bytes": peak,
            "budget_bytes": budget,
            "over_budget_bytes": max(0, at - budget) if at is not None else None,
            "over_budget_of": "the mean timed step" if over is not None else "the peak",
            "h2d_bytes_per_s": h2d or None,
            "d2h_bytes_per_s": d2h or None,
            "both_bytes_per_s": both,
            "formula": FORMULA.get(workload, "max(stock_s, over / min(h2d, d2h), 2 * over / both)"),
            "floor_full_duplex_s": full_duplex,
        },
        "agreement_metric": AGREEMENT[OUTPUTS[workload]],
        "modes": rows,
        "full_speed": full_speed(samples, floor),
        "link_errors": [s["error"] for s in samples if s["mode"] == LINK and "error" in s],
    }
    return {"floor_s": floor, "modes": modes}, analysis


def table(workload: str, summary: dict[str, Any], analysis: dict[str, Any]) -> str:
    """The printed table: per mode, seconds, ratios, agreement, and OOM / error notes."""
    f = analysis["floor"]
    keys = ("h2d_bytes_per_s", "d2h_bytes_per_s", "both_bytes_per_s")
    gbs = [cell(f.get(k) and f[k] / 1e9, ".1f") for k in keys]
    lines = [
        f"{workload}: budget {f['budget_bytes'] / GiB:.2f} GiB, stock peak "
        f"{cell(f['stock_peak_allocated_bytes'] and f['stock_peak_allocated_bytes'] / GiB, '.2f')}"
        f" GiB, over budget {cell(f['over_budget_bytes'] and f['over_budget_bytes'] / GiB, '.2f')}"
        f" GiB, pinned h2d/d2h/both at once {gbs[0]}/{gbs[1]}/{gbs[2]} GB/s",
        f"PCIe floor = {f['formula']} = {cell(summary['floor_s'], '.4f')} s"
        f" (full duplex: {cell(f.get('floor_full_duplex_s'), '.4f')} s)",
        f"{'mode':20s}{'step s':>10s}{'first s':>10s}{'/um-static':>12s}{'/um-prev':>10s}"
        f"{'/um':>8s}{'/peer':>8s}{'/floor':>9s}"
        f"{'vs stock':>12s}  note",
    ]
    for mode, row in analysis["modes"].items():
        note = []
        if row["oom"]:
            note.append(f"OOM in {row['oom']}/{row['runs']}")
        if row["errors"]:
            note.append(f"{len(row['errors'])} error(s): " + last_line(row["errors"][0]))
        if not row["runs"]:
            note.append("not run")
        lines.append(
            f"{mode:20s}{cell(row['seconds'], '10.4f')}{cell(row['first_step_s'], '10.3f')}"
            f"{cell(row['per_um_static'], '12.3f')}{cell(row['per_um_prev'], '10.3f')}"
            f"{cell(row['per_um'], '8.3f')}{cell(row['per_peer'], '8.3f')}"
            f"{cell(row['per_floor'], '9.2f')}"
            f"{cell(row['agreement'], '12.3g')}  {'; '.join(note)}"
        )
    rates = [
        f"{mode} {row['tokens_per_s']:.0f}"
        for mode, row in analysis["modes"].items()
        if row.get("tokens_per_s")
    ]
    if rates:
        lines.append("tokens/s: " + "; ".join(rates))
    for key, label in (
        ("per_peer_by_round", "/peer round by round"),
        ("ranks_per_single", f"each rank / {SINGLE} (bar: at most 1.2)"),
    ):
        ratios = [
            f"{mode} " + ", ".join(f"{x:.3f}" for x in row[key])
            for mode, row in analysis["modes"].items()
            if row.get(key)
        ]
        if ratios:
            lines.append(f"{label}: " + "; ".join(ratios))
    by_round = [
        f"{mode} " + ", ".join("[" + ", ".join(f"{x:.3f}" for x in r) + "]" for r in rounds)
        for mode, row in analysis["modes"].items()
        if (rounds := row.get("ranks_per_single_by_round"))
    ]
    if by_round:
        lines.append(f"each rank / {SINGLE} of the same round: " + "; ".join(by_round))
    fs = analysis.get("full_speed")
    if fs:
        cells = [
            f"{mode} {cell(r['seconds'], '.4f')} s ({r['steps']}/{r['of_steps']} steps"
            + (f", {r['per_floor']:.2f}x floor)" if r["per_floor"] else ")")
            for mode, r in fs["modes"].items()
        ]
        lines.append(
            f"at full CPU speed (canary <= {fs['canary_limit_s'] * 1e3:.2f} ms): "
            + "; ".join(cells)
        )
    return "\n".join(lines)


def describe(s: dict[str, Any]) -> str:
    """One line per finished worker."""
    head = f"{s.get('mode', '?'):20s}"
    if s.get("oom"):
        return head + " out of memory"
    if "error" in s:
        return head + " ERROR " + last_line(s["error"])
    if s["mode"] == LINK:
        h2d, d2h = s["h2d_bytes_per_s"] / 1e9, s["d2h_bytes_per_s"] / 1e9
        both = (s.get("both_bytes_per_s") or 0.0) / 1e9
        return head + f" pinned h2d {h2d:.1f} GB/s, d2h {d2h:.1f} GB/s, both at once {both:.1f}"
    line = head + f" {s['median_s']:.4f} s/step (first {s['first_step_s']:.3f} s)"
    if "end_reserved_bytes" in s:  # the cache the steps keep (step 51)
        line += f", cache {s['end_reserved_bytes'] / 1e9:.2f} GB at the end"
    st = s.get("um_stats") or {}
    if st:
        gb = {
            k: st.get(f"um.{k}", 0) / 1e9
            for k in (
                "evict_bytes",
                "discard_bytes",
                "touch_prefetch_bytes",
                "reuse_bytes",
                "map_host_bytes",
                "cancelled_bytes",
            )
        }
        line += " | " + ", ".join(f"{k} {v:.1f} GB" for k, v in gb.items())
        line += f", executor {st.get('um.executor_ns', 0) / 1e9:.2f} s"
        line += f", failures {st.get('um.executor_failures', 0)}"
    timed = s.get("phases", [])[s.get("warmup", 0) :]
    if timed:
        line += " | phases " + ", ".join(
            f"{p} {statistics.median(step[p]['s'] for step in timed):.3f} s" for p in timed[0]
        )
    return line


def selected_modes(workload: str, text: str | None, prev: bool = False) -> list[str]:
    """The modes to run: all of the workload's (um-prev only with ``prev``, a previous
    engine to run it on), or the comma-separated ``text``."""
    if text is None:
        return [m for m in MODES[workload] if m != PREV or prev]
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in MODES[workload]]
    if bad or not modes:
        raise BenchError(f"--modes {text!r}: {workload} modes are {', '.join(MODES[workload])}")
    if PREV in modes and not prev:
        raise BenchError(
            f"mode {PREV} runs the previous engine: give --prev-pythonpath, a +um torch "
            "staged from an earlier commit's bundle (bench/run_on_device.sh: PREV_BUNDLE)"
        )
    return modes


# ---------------------------------------------------------------- workers (need a GPU)


def _oom_type(torch: Any) -> Any:
    return getattr(torch, "OutOfMemoryError", None) or torch.cuda.OutOfMemoryError


def _build_model(torch: Any, workload: str, model: str = models.DEFAULT) -> Any:
    """The model in bf16 on the CPU, the same weights in every mode (bench/models.py)."""
    built = models.build(torch, model)
    return built.train() if workload in TRAINING else built.eval()


def _tokens(torch: Any, workload: str, rank: int = 0) -> Any:
    batch, seq = BATCH[workload]
    gen = torch.Generator().manual_seed(1234 + rank)
    return torch.randint(0, 32000, (batch, seq), generator=gen)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _link_worker(torch: Any) -> dict[str, Any]:
    """Page-locked copies of 1 GiB, best of 3 (plain cudaMalloc: stock torch): each way
    alone, and both ways at once on two streams (``both``: the two directions' bytes
    together per second)."""
    um_module(torch, "stock")
    host = [torch.empty(LINK_BYTES, dtype=torch.uint8, pin_memory=True) for _ in range(2)]
    dev = [torch.empty(LINK_BYTES, dtype=torch.uint8, device="cuda") for _ in range(2)]
    side = torch.cuda.Stream()

    def both() -> None:
        dev[0].copy_(host[0], non_blocking=True)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            host[1].copy_(dev[1], non_blocking=True)
        torch.cuda.current_stream().wait_stream(side)

    routes = {
        "h2d": lambda: dev[0].copy_(host[0], non_blocking=True),
        "d2h": lambda: host[1].copy_(dev[1], non_blocking=True),
        "both": both,
    }
    best = dict.fromkeys(routes, float("inf"))
    for attempt in range(4):  # attempt 0 warms up
        for key, fn in routes.items():
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize()
            if attempt > 0:
                best[key] = min(best[key], time.perf_counter() - t0)
    return {
        "bytes": LINK_BYTES,
        "h2d_bytes_per_s": LINK_BYTES / best["h2d"],
        "d2h_bytes_per_s": LINK_BYTES / best["d2h"],
        "both_bytes_per_s": 2 * LINK_BYTES / best["both"],
    }


# Engine counters kept per phase with --phases (um.<key>, differences over the phase).
PHASE_COUNTERS = (
    "evict_bytes",
    "discard_bytes",
    "touch_prefetch_bytes",
    "reuse_bytes",
    "cancelled_bytes",
    "executor_ns",
    "evictor_ns",
    "evictor_wait_ns",
    "fence_waits",
    "fence_wait_ns",
    "fence_wait_issuing_ns",
    "forget_bytes",
    "forgotten_discard_bytes",
)


# What ``step_counters`` keeps of each step: the moves and the streamer's levels.
STEP_COUNTERS = (
    "evict_bytes",
    "discard_bytes",
    "reuse_bytes",
    "predict.stream_sent_bytes",
    "predict.stream_target_bytes",
    "predict.stream_low_room_bytes",
    "predict.target_bytes",
    "predict.workspace_clears",  # Note [Library workspaces]: the step that found a workspace
)


def engine_counters(um: Any) -> dict[str, int]:
    """The engine counters of PHASE_COUNTERS and the predictor's (none for stock)."""
    if um is None:
        return {}
    st = um.stats()
    out = {k: int(st.get(f"um.{k}", 0)) for k in PHASE_COUNTERS}
    if hasattr(um, "predict_stats"):  # um-predict: its counters too
        out.update((k, int(v)) for k, v in um.predict_stats().items())
    return out


class _StepClock:
    """Per step: its seconds (from ``start`` to ``stop``, which follows a synchronisation),
    and ``cpu`` (the module docstring's): the CPU canary run just before it, its main
    thread's and process's CPU seconds and, with ``host``, the host seconds until
    ``host_done``."""

    def __init__(self, host: bool = False) -> None:
        self.times: list[float] = []
        self.cpu: dict[str, list[float]] = {"canary_s": [], "thread_cpu_s": [], "process_cpu_s": []}
        if host:
            self.cpu["host_s"] = []
        self._t0 = self._c0 = self._p0 = 0.0

    def start(self) -> None:
        self.cpu["canary_s"].append(cpu_canary())
        self._c0, self._p0 = time.thread_time(), time.process_time()
        self._t0 = time.perf_counter()

    def host_done(self) -> None:
        self.cpu["host_s"].append(time.perf_counter() - self._t0)

    def stop(self) -> None:
        self.times.append(time.perf_counter() - self._t0)
        self.cpu["thread_cpu_s"].append(time.thread_time() - self._c0)
        self.cpu["process_cpu_s"].append(time.process_time() - self._p0)


def train_loss(model: Any, x: Any, criterion: Any) -> tuple[Any, Any]:
    """A training step's loss and the float logits the program holds (None with the loss
    inside the model). ``criterion`` None: the model's own loss (``labels=x``); a loss
    module: the shift and the float upcast the model's own loss makes, done outside it, and
    the logits returned so that the caller keeps them alive through the backward and into
    the next step's forward, as a loop that names them does (``--loss module``)."""
    if criterion is None:
        return model(x, labels=x).loss, None
    logits = model(x).logits[:, :-1].float()
    return criterion(logits.flatten(0, 1), x[:, 1:].flatten()), logits


class _PhaseClock:
    """Seconds and engine-counter differences per phase of a training step (--phases),
    and the caching allocator's bytes: reserved and allocated at the phase's end, and the
    most reserved in it (where the cache grows). It resets torch's peaks at each phase and
    keeps the run's own (``peaks``: most allocated, most reserved) for the record."""

    def __init__(self, torch: Any, um: Any) -> None:
        self.torch, self.um = torch, um
        self.steps: list[dict[str, Any]] = []
        self.peaks = (0, 0)

    def keep_peaks(self) -> None:
        """The run's peaks so far, before torch's are reset."""
        cuda = self.torch.cuda
        self.peaks = (
            max(self.peaks[0], int(cuda.max_memory_allocated())),
            max(self.peaks[1], int(cuda.max_memory_reserved())),
        )

    def _counters(self) -> dict[str, int]:
        return engine_counters(self.um)

    def start(self) -> None:
        self.t, self.c = time.perf_counter(), self._counters()
        self.keep_peaks()
        self.torch.cuda.reset_peak_memory_stats()
        self.steps.append({})

    def __call__(self, phase: str) -> None:
        cuda = self.torch.cuda
        cuda.synchronize()
        t, c = time.perf_counter(), self._counters()
        self.steps[-1][phase] = {
            "s": t - self.t,
            **counter_change(self.c, c),
            "reserved_bytes": int(cuda.memory_reserved()),
            "allocated_bytes": int(cuda.memory_allocated()),
            "max_reserved_bytes": int(cuda.max_memory_reserved()),
        }
        self.keep_peaks()
        cuda.reset_peak_memory_stats()
        self.t, self.c = t, c


def _inference_step(torch: Any, model: Any, ids: Any, workload: str, clock: _StepClock) -> Any:
    """One timed inference step, from a started ``clock`` to its stop: a forward (infer:
    returns the logits checksum) or a greedy generate() (returns its new tokens)."""
    if workload == "generate":
        # No end-of-text token (_build_model): every step adds NEW_TOKENS.
        out = model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=NEW_TOKENS,
            do_sample=False, use_cache=True, pad_token_id=0,
        )  # fmt: skip
        torch.cuda.synchronize()
        clock.stop()
        return out[:, ids.shape[1] :].flatten().tolist()
    logits = model(ids).logits
    clock.host_done()  # close to the step's time when the host bounds it
    torch.cuda.synchronize()
    clock.stop()
    # Summed in float32 without a float32 copy of the logits: that copy (0.8 GB here)
    # stayed in the allocator's cache and, under a 2 GiB budget, made the engine discard
    # and place part of it again every forward (step 21).
    return float(logits.sum(dtype=torch.float32))


def _profiled_steps(torch: Any, model: Any, ids: Any, workload: str, dest: Path) -> None:
    """Two inference steps under torch.profiler (CPU and CUDA activity), the trace
    written gzipped to ``dest`` (TORCH_UM_BENCH_TRACE_DIR)."""
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.inference_mode(), torch.profiler.profile(activities=acts) as prof:
        for _ in range(2):
            torch.cuda.synchronize()
            with torch.profiler.record_function("um_bench_step"):
                clock = _StepClock(host=True)
                clock.start()
                _inference_step(torch, model, ids, workload, clock)
    dest.parent.mkdir(parents=True, exist_ok=True)
    prof.export_chrome_trace(str(dest))  # torch gzips a path ending in .gz


def _run(
    torch: Any,
    mode: str,
    workload: str,
    steps: int,
    warmup: int,
    budget: int,
    rank: int = 0,
    phases: bool = False,
    extra_conf: str = "",
    world: int = WORLD,
    model_name: str = models.DEFAULT,
    lengths: list[int] | None = None,
    loss_module: bool = False,
) -> Any:
    """Set up the mode, run WARMUP + STEPS steps, return the worker's record fields
    (ddp: of one rank of ``world``, on GPU ``rank``). ``extra_conf``: engine settings over
    the mode's (--conf; not for um-prev, whose engine may not know them). ``lengths``
    (train): the steps' sequence lengths, in turn; ``loss_module`` (train): the loss by
    an ``nn.CrossEntropyLoss`` module after the model, not inside its forward."""
    um = um_module(torch, mode if mode in UM_MODES else "stock")
    torch.cuda.set_device(rank)
    free, total, cap = safe_cap(torch)  # before any CUDA allocation
    info: dict[str, Any] = {"free_at_start": free, "total": total, "cap": None}
    if um is not None:
        conf = mode_conf(mode, extra_conf)
        size: int | str = "100%" if mode == "um-nobudget" else budget
        um.configure(conf, enabled=True, max_managed=cap, device_budget=size)
        info["cap"] = cap
        info["um_config"] = um.get_config()
    if mode in ("stock-fraction", "fsdp2-offload-ckpt"):
        info["memory_fraction"] = budget / total
        torch.cuda.set_per_process_memory_fraction(budget / total, rank)
    dist: Any = None
    if workload == "ddp":
        dist = importlib.import_module("torch.distributed")
        dist.init_process_group(
            backend="nccl", rank=rank, world_size=world, device_id=torch.device("cuda", rank)
        )
    spec = models.spec(model_name)
    model = _build_model(torch, workload, model_name)
    ids_cpu = _tokens(torch, workload, rank)
    if mode == "fsdp2-offload-ckpt":
        os.environ.update(
            MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()), RANK="0", WORLD_SIZE="1"
        )
        dist = importlib.import_module("torch.distributed")
        fsdp = importlib.import_module("torch.distributed.fsdp")
        dist.init_process_group(backend="cpu:gloo,cuda:nccl", rank=0, world_size=1)
        for block in spec.blocks(model):
            fsdp.fully_shard(block, offload_policy=fsdp.CPUOffloadPolicy())
        fsdp.fully_shard(model, offload_policy=fsdp.CPUOffloadPolicy())
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    elif mode == "accelerate":
        accelerate = importlib.import_module("accelerate")
        device_map = accelerate.infer_auto_device_map(
            model, max_memory={0: budget, "cpu": "200GiB"}, no_split_module_classes=[spec.block]
        )
        model = accelerate.dispatch_model(model, device_map=device_map)
        info["device_map"] = {k: str(v) for k, v in device_map.items()}
    else:
        model = model.to("cuda")
    if workload == "ddp":  # fsdp2-offload-ckpt sets up torch.distributed too, for FSDP2
        ddp = importlib.import_module("torch.nn.parallel")
        model = ddp.DistributedDataParallel(model, device_ids=[rank], gradient_as_bucket_view=True)
    ids = ids_cpu.to("cuda")
    values: list[float] = []
    clock = _StepClock(host=workload == "infer")
    marks: list[dict[str, int]] = []  # the engine's counters before each step ({}: stock)
    if workload in TRAINING:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        # --phases: the device is synchronised after the forward and after the backward
        # too, and each phase's seconds and engine counters are kept (where a step's time
        # goes). Past the budget the extra synchronisations cost about 0.5 s a step (they
        # stop the phases from overlapping), so the timed medians of a run with phases are
        # not compared with one without.
        mark = _PhaseClock(torch, um) if phases else None
        cycle = lengths or [ids.shape[1]]
        criterion = torch.nn.CrossEntropyLoss() if loss_module else None
        peaks: list[int] = []  # with lengths: each step's peak allocated bytes (the floor)
        reserved = 0
        for i in range(warmup + steps):
            x = ids[:, : cycle[i % len(cycle)]]
            torch.cuda.synchronize()
            if lengths:
                torch.cuda.reset_peak_memory_stats()
            marks.append(engine_counters(um))
            clock.start()
            if mark:
                mark.start()
            opt.zero_grad(set_to_none=True)
            # the loop's float logits (--loss module) live on into the next step, as a
            # named local's do
            loss, _logits = train_loss(model, x, criterion)
            if mark:
                mark("forward")
            loss.backward()
            if mark:
                mark("backward")
            opt.step()
            if mark:
                mark("optimizer")
            torch.cuda.synchronize()
            clock.stop()
            if lengths:
                peaks.append(int(torch.cuda.max_memory_allocated()))
                reserved = max(reserved, int(torch.cuda.max_memory_reserved()))
            values.append(float(loss.detach().float()))
        if mark:
            info["phases"] = mark.steps
        if lengths:
            info["lengths"] = [cycle[i % len(cycle)] for i in range(warmup + steps)]
            info["step_peak_allocated_bytes"] = peaks
    else:
        with torch.inference_mode():
            for _ in range(warmup + steps):
                torch.cuda.synchronize()
                marks.append(engine_counters(um))
                clock.start()
                values.append(_inference_step(torch, model, ids, workload, clock))
    if um is not None:
        marks.append(engine_counters(um))  # after the last timed step, before any profiling
    trace_dir = os.environ.get("TORCH_UM_BENCH_TRACE_DIR")
    if trace_dir and workload not in TRAINING:
        # After the timed steps, two more under torch.profiler: where this very run's
        # forward time goes, in the state its steps left (bench.probes.timeline_probe starts
        # its own process, and the streamer's state depends on its history).
        _profiled_steps(torch, model, ids, workload, Path(trace_dir) / f"{workload}-{mode}.json.gz")
    times = clock.times
    info["cpu"] = clock.cpu
    info["warmup"] = warmup
    info.update(
        times_s=times,
        first_step_s=times[0],
        median_s=statistics.median(times[warmup:] or times),
        max_allocated_bytes=int(torch.cuda.max_memory_allocated()),
        max_reserved_bytes=int(torch.cuda.max_memory_reserved()),
        # the caching allocator's segments after the last step: the cache the steps keep
        # (past the budget, what it holds beyond the live data is discarded and placed again)
        end_reserved_bytes=int(torch.cuda.memory_reserved()),
    )
    if workload in TRAINING and mark:  # the phases reset torch's peaks: the run's own
        mark.keep_peaks()
        info["max_allocated_bytes"], info["max_reserved_bytes"] = mark.peaks
    if lengths:  # peaks reset each step; a step's seconds are its cycle's mean
        info["max_allocated_bytes"] = max(info["step_peak_allocated_bytes"])
        info["max_reserved_bytes"] = reserved
        n, timed = len(lengths), times[warmup:]
        cycles = [statistics.mean(timed[k : k + n]) for k in range(0, len(timed) - n + 1, n)]
        info["cycle_means_s"] = cycles
        info["median_s"] = statistics.median(cycles)
    info[OUTPUTS[workload]] = values
    if um is not None:
        # Each step's own (warm-up ones included): how the run settled, step by step.
        info["step_counters"] = [
            {k: v for k, v in counter_change(a, b).items() if k in STEP_COUNTERS and v}
            for a, b in itertools.pairwise(marks)
        ]
    if um is not None and steps > 0:
        # The engine's counters over the timed steps alone (the totals below include the
        # warm-up steps, where a run settles): per step, what a steady step moves.
        change = counter_change(marks[warmup], marks[-1])
        info["timed_counters"] = {
            k: v if k.endswith(LEVELS) else v / steps for k, v in change.items()
        }
    if um is not None:
        stats = um.stats()
        if stats.get("um.managed_bytes", 0) <= 0:
            raise BenchError(f"mode {mode}: no managed bytes after the run")
        info["um_stats"] = stats
        info["predict_stats"] = um.predict_stats() if hasattr(um, "predict_stats") else {}
        if hasattr(um, "summary"):  # an earlier engine's (um-prev) may lack it
            info["um_summary"] = um.summary()  # the same counters, read for a person
    if mode == "fsdp2-offload-ckpt" or dist is not None:
        importlib.import_module("torch.distributed").destroy_process_group()
    return info


def merge_ranks(ranks: list[dict[str, Any]], warmup: int) -> dict[str, Any]:
    """ddp: the ranks' records as one. The first rank that ran out of memory or failed
    decides it; otherwise each step takes the slower rank's time, and every rank's own
    fields (less ``machine``) stay under ``ranks`` (rank 0's, ``phases`` and
    ``timed_counters`` included, also at the top)."""
    for key in ("oom", "error"):
        for r, rec in enumerate(ranks):
            if key in rec:
                return {**rec, "rank": r, "ranks": ranks}
    times = [max(step) for step in zip(*(rec["times_s"] for rec in ranks), strict=True)]
    return {
        **ranks[0],
        "times_s": times,
        "first_step_s": times[0],
        "median_s": statistics.median(times[warmup:] or times),
        "peak_host_rss_bytes": sum(rec["peak_host_rss_bytes"] for rec in ranks),
        "ranks": [{k: v for k, v in rec.items() if k != "machine"} for rec in ranks],
    }


def _ddp_launch(
    mode: str,
    steps: int,
    warmup: int,
    budget: int,
    timeout: int,
    extra_conf: str = "",
    phases: bool = False,
    world: int = WORLD,
    model_name: str = models.DEFAULT,
) -> dict[str, Any]:
    """ddp: one process per rank (this worker's PYTHONPATH), run together, merged."""
    torch = importlib.import_module("torch")
    if torch.cuda.device_count() < world:  # counts devices without creating a context
        raise BenchError(
            f"ddp --ranks {world} needs {world} GPUs, this host has "
            f"{torch.cuda.device_count()} (device kind nvidia-h200-x2, or --ranks 1)"
        )
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    args = ["--mode", mode, "--steps", str(steps), "--warmup", str(warmup), "--budget", str(budget)]
    args += ["--conf", extra_conf] if extra_conf else []
    args += ["--phases"] if phases else []
    args += ["--ranks", str(world), "--model", model_name]
    cmds = [worker_command(MODULE, ["ddp", *args, "--rank", str(r)]) for r in range(world)]
    procs = [
        subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        for cmd in cmds
    ]
    try:
        outs = communicate_all(procs, timeout)  # all signalled and killed past it
    except subprocess.TimeoutExpired as e:
        raise BenchError(f"ddp ranks: {timeout_text(e)}") from None
    ranks = [
        worker_result(cmd, proc.returncode, out)
        for cmd, proc, (out, _) in zip(cmds, procs, outs, strict=True)
    ]
    return merge_ranks(ranks, warmup)


def worker(
    mode: str,
    workload: str,
    steps: int,
    warmup: int,
    budget: int,
    rank: int | None = None,
    phases: bool = False,
    extra_conf: str = "",
    world: int = WORLD,
    model_name: str = models.DEFAULT,
    lengths: list[int] | None = None,
    loss_module: bool = False,
) -> None:
    """One measurement; always emits one record (an OOM or an error included). ddp without
    a rank: launch the ``world`` ranks and emit their merged record."""
    base = {"mode": mode, "workload": workload, "budget": budget}
    torch: Any = None
    try:
        if workload == "ddp" and rank is None and mode not in (LINK, SINGLE):  # PAIR too
            merged = _ddp_launch(
                mode, steps, warmup, budget, 570, extra_conf=extra_conf, phases=phases,
                world=world, model_name=model_name,
            )  # fmt: skip
            emit({**base, **merged})
            return
        torch = importlib.import_module("torch")
        base["machine"] = machine(torch)
        if mode == LINK:
            fields = _link_worker(torch)
        else:
            run_as = "train" if mode in ONE_GPU else workload  # no DDP
            fields = _run(
                torch, mode, run_as, steps, warmup, budget, rank or 0,
                phases=phases, extra_conf=extra_conf, world=world, model_name=model_name,
                lengths=lengths, loss_module=loss_module,
            )  # fmt: skip
        fields["peak_host_rss_bytes"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        emit({**base, **fields})
    except Exception as e:  # the orchestrator reports every failure
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        if torch is not None and isinstance(e, _oom_type(torch)):
            emit({**base, "oom": True, "message": str(e)[:2000], "peak_host_rss_bytes": rss})
        else:
            emit({**base, "error": error_text(), "peak_host_rss_bytes": rss})


# ---------------------------------------------------------------- orchestrator


def run_all(
    workload: str,
    modes: list[str],
    worker_args: list[str],
    rounds: int,
    paths: dict[str, str | None],
    timeout: int,
    after: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """The link worker once, then every mode once per round, the order rotating;
    ``after`` sees the samples so far after each worker."""
    samples = [
        run_worker_safely(
            MODULE, ["--mode", LINK, workload], paths["stock"], timeout, {"mode": LINK}
        )
    ]
    print(describe(samples[0]), flush=True)
    for r in range(rounds):
        shift = r % len(modes)
        for mode in modes[shift:] + modes[:shift]:
            path = paths["prev"] if mode == PREV else paths["um" if mode in UM_MODES else "stock"]
            res = run_worker_safely(
                MODULE, ["--mode", mode, workload, *worker_args], path, timeout, {"mode": mode}
            )
            res.setdefault("mode", mode)
            res["round"] = r + 1  # per-round ratios to the peer (summarize)
            print(f"round {r + 1}/{rounds} {describe(res)}", flush=True)
            samples.append(res)
            if after is not None:
                after(samples)
    return samples


def record(
    workload: str, samples: list[dict[str, Any]], settings: dict[str, Any]
) -> dict[str, Any]:
    """What bench.common.write stores: like bench.common.save, but tolerant of modes that
    did not run or failed (their samples carry no machine)."""
    summary, analysis = summarize(workload, samples, settings["budget_bytes"])
    stock = [s for s in samples if "machine" in s and s["mode"] not in UM_MODES]
    # The engine under test describes the record; um-prev's is in its own samples.
    um = [s for s in samples if "machine" in s and s["mode"] in UM_MODES and s["mode"] != PREV]
    any_machine = [s for s in samples if "machine" in s]
    if not any_machine:
        raise BenchError("no worker got as far as CUDA:\n" + describe(samples[-1]))
    return {
        "command": command_line(MODULE),
        "machine": (stock or any_machine)[0]["machine"],
        "um_torch": um[0]["machine"]["torch"] if um else None,
        "um_engine": um[0]["machine"]["um_engine"] if um else None,
        "settings": settings,
        "summary": summary,
        "analysis": analysis,
        "samples": [{k: v for k, v in s.items() if k != "machine"} for s in samples],
    }


class PartialRecord:
    """Rewrites the run's record after every worker, marked ``"partial": {"workers": done,
    "of": planned}``, so that a run stopped past its time limit (a device call's limit,
    say) keeps every worker that finished, with its summary. The finished run's own
    record replaces it under the same name. Not thread-safe: the orchestrator's one
    thread calls it."""

    def __init__(
        self, workload: str, settings: dict[str, Any], planned: int, out: Path | None
    ) -> None:
        self.workload, self.settings, self.planned, self.out = workload, settings, planned, out
        self.path: Path | None = None

    def __call__(self, samples: list[dict[str, Any]]) -> None:
        try:
            rec = record(self.workload, samples, self.settings)
        except BenchError:
            return  # no worker reached CUDA yet: nothing worth keeping
        done = sum(1 for s in samples if s["mode"] != LINK)
        rec["partial"] = {"workers": done, "of": self.planned}
        path = write(f"residency-{self.workload}", rec, self.out)
        if self.path is None:
            print(f"(the record so far, rewritten after each worker: {path})", flush=True)
        self.path = path


def parse_lengths(text: str | None, workload: str) -> list[int] | None:
    """--lengths: positive ints up to the workload's sequence length, train only."""
    if text is None:
        return None
    if workload != "train":
        raise BenchError("--lengths sets the sequence lengths of the train workload")
    seq = BATCH[workload][1]
    try:
        lengths = [int(x) for x in text.split(",")]
    except ValueError:
        raise BenchError(f"--lengths takes comma-separated ints, got {text!r}") from None
    if not lengths or any(not 1 <= n <= seq for n in lengths):
        raise BenchError(f"--lengths: each length must be 1 to {seq}, got {text!r}")
    return lengths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__)
    ap.formatter_class = argparse.RawDescriptionHelpFormatter
    ap.add_argument("workload", choices=tuple(MODES))
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--mode", help=argparse.SUPPRESS)
    ap.add_argument("--rank", type=int, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--modes", default=None, help="comma-separated subset (default: all)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10, help="timed steps per worker")
    ap.add_argument(
        "--warmup",
        type=int,
        default=3,
        help="untimed steps before them (3: the offload's target and buffers settle in "
        "a training run's first three steps, bench/README.md step 46)",
    )
    ap.add_argument(
        "--budget",
        default=None,
        help="device budget (train 8GiB, infer and generate 2GiB, ddp 12GiB)",
    )
    ap.add_argument("--timeout", type=int, default=600, help="seconds per worker")
    ap.add_argument(
        "--phases",
        action="store_true",
        help="train, ddp: also time forward, backward and optimizer, with engine counters "
        "and the allocator's reserved and allocated bytes each",
    )
    ap.add_argument(
        "--ranks",
        type=int,
        default=None,
        help=f"ddp: processes, one GPU each (default {WORLD}; 1: DDP's reducer and buckets "
        "on one GPU, against the same training without DDP)",
    )
    ap.add_argument(
        "--conf",
        default="",
        help="engine settings (PYTORCH_CUDA_UM_CONF text) over every UM mode's but um-prev's",
    )
    ap.add_argument(
        "--model",
        choices=tuple(models.MODELS),
        default=models.DEFAULT,
        help="the model (bench/models.py; default %(default)s)",
    )
    ap.add_argument(
        "--lengths",
        default=None,
        help="train: comma-separated sequence lengths the steps take in turn (a pattern that "
        "changes every step), each at most the batch's; the floor is the mean step's",
    )
    ap.add_argument(
        "--loss",
        choices=("model", "module"),
        default="model",
        help="train: the loss inside the model's forward (model(ids, labels=ids).loss, the "
        "default) or by an nn.CrossEntropyLoss module called after it (module)",
    )
    ap.add_argument("--stock-pythonpath", default=None, help="PYTHONPATH of a stock torch")
    ap.add_argument("--um-pythonpath", default=None, help="PYTHONPATH of a +um torch")
    ap.add_argument(
        "--prev-pythonpath", default=None, help="PYTHONPATH of the previous engine (um-prev)"
    )
    ap.add_argument("--out", default=None, help="results folder (default bench/results)")
    a = ap.parse_args(argv)
    budget = parse_size(a.budget or DEFAULT_BUDGET[a.workload]) // 4096 * 4096
    lengths = parse_lengths(a.lengths, a.workload)
    if a.worker:
        worker(
            a.mode, a.workload, a.steps, a.warmup, budget, a.rank,
            phases=a.phases, extra_conf=a.conf, world=a.ranks or WORLD, model_name=a.model,
            lengths=lengths, loss_module=a.loss == "module",
        )  # fmt: skip
        return 0
    modes = selected_modes(a.workload, a.modes, prev=a.prev_pythonpath is not None)
    if a.rounds < 1 or a.steps < 1 or a.warmup < 0:
        raise BenchError("--rounds and --steps must be at least 1, --warmup at least 0")
    worker_args = ["--steps", str(a.steps), "--warmup", str(a.warmup), "--budget", str(budget)]
    worker_args += ["--model", a.model]
    if a.phases:
        if a.workload not in TRAINING:
            raise BenchError("--phases times the phases of a training step: workload train or ddp")
        worker_args.append("--phases")
    if a.conf:
        worker_args += ["--conf", a.conf]
    if lengths:
        if a.phases:
            raise BenchError(
                "--phases and --lengths: each resets torch's peak memory at its own marks; "
                "run them apart"
            )
        if a.steps % len(lengths):
            raise BenchError(
                f"--steps {a.steps}: with --lengths, a multiple of the {len(lengths)} lengths "
                "(a run's seconds are the median over its cycles of a cycle's mean step)"
            )
        worker_args += ["--lengths", ",".join(map(str, lengths))]
    if a.loss != "model":
        if a.workload != "train":
            raise BenchError("--loss chooses how the train workload computes its loss")
        worker_args += ["--loss", a.loss]
    if a.ranks is not None:
        if a.workload != "ddp":
            raise BenchError("--ranks sets the processes of the ddp workload")
        if a.ranks < 1:
            raise BenchError("--ranks must be at least 1")
        if a.ranks < 2 and PAIR in modes:
            raise BenchError(f"{PAIR} runs the one-GPU training on 2 GPUs at once: --ranks 2")
        worker_args += ["--ranks", str(a.ranks)]
    paths = {"stock": a.stock_pythonpath, "um": a.um_pythonpath, "prev": a.prev_pythonpath}
    settings = {
        "workload": a.workload,
        "model": a.model,
        "modes": modes,
        "rounds": a.rounds,
        "steps": a.steps,
        "warmup": a.warmup,
        "budget_bytes": budget,
        "batch": list(BATCH[a.workload]),
        "link_bytes": LINK_BYTES,
        "phases": a.phases,
        "conf": a.conf,
        "lengths": lengths,
        "loss": a.loss if a.workload == "train" else None,
        "ranks": (a.ranks or WORLD) if a.workload == "ddp" else None,
    }
    out = Path(a.out) if a.out else None
    keep = PartialRecord(a.workload, settings, a.rounds * len(modes), out)
    samples = run_all(a.workload, modes, worker_args, a.rounds, paths, a.timeout, keep)
    rec = record(a.workload, samples, settings)
    print("\n" + table(a.workload, rec["summary"], rec["analysis"]))
    print("summary: " + json.dumps(rec["summary"]))
    path = write(f"residency-{a.workload}", rec, out)
    print(f"\nwrote {path}")
    return 0


if __name__ == "__main__":
    run_main("residency", main)
