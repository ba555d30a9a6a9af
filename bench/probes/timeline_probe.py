"""Where a training step's GPU time goes past the budget: the kernels' own time against
stock's, and how long the compute stream sits idle (issue 8: is a step bound by transfers,
by kernels reading host RAM in place, or by a compute thread that cannot run ahead?).

    python -m bench.probes.timeline_probe --mode um [--workload train|infer] [--steps 3]
        [--budget B]
    python -m bench.probes.timeline_probe --mode stock                 # the same on stock torch

Runs bench.residency's train workload (its model, ``--model``: the 1.28 B GPT-2 by default;
AdamW, batch 4 x 1024) or its infer
workload (a forward of batch 8 x 512 under inference_mode) with the settings of its ``um``
mode (default budget 8 GiB / 2 GiB, total-managed cap at 80 % of free memory), warms up, then
records ``--steps`` steps with torch.profiler (CUDA activity). From the trace it prints one
JSON line per step: the step's wall seconds; the summed kernel seconds and, per kernel
family (GEMM, attention, elementwise, reduction/norm, optimizer foreach, other), seconds and
count; the busy and idle seconds of the stream that ran the most kernel time, its idle
gaps longer than 1 ms (count, seconds), and its device waits by the stream-ordered calls
(event waits, copies, prefetches) queued between the two kernels' launches; and per
stream, the copies' count, busy seconds, GB and GB/s while busy, and the kernels' count
and busy seconds, with the seconds in which the three busiest streams ran kernels two at
a time (did the staging's copy in and copy out overlap?).
With ``--phases`` each step is split at synchronisations into forward, backward and
optimizer, one line each, with the step's change in the engine's and the predictor's
counters. ``--loss module`` takes the loss by an ``nn.CrossEntropyLoss`` module on the
float logits the loop holds into the next step (``bench.residency train --loss module``).
With ``--unpacks`` (``predict:True`` in ``--conf``) each step's backward also gets one line
on the saves autograd read back: how many stayed on the device and how many had
left by copy, the bytes the engine evicted before the first read, while the backward read
saves that stayed, and while it read those that left, the least free room under the
budget in each part, and the parameters' and gradients' bytes in host RAM at the
backward's end (where its evictions come from). With ``--bins MS`` each phase also gets,
per MS milliseconds, the GB copied in and out and the compute stream's kernel time (when did
the link and the compute stream each work?); ``--from-trace FILE`` prints the phase rows
of a trace kept by ``--trace`` from a ``--phases`` run, without a GPU. Each step's row
also has the caching allocator's reserved bytes at its end. A kernel that reads or writes
host RAM in place runs longer than its stock twin; a stream waiting for a migration or for
the host sits idle.
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench import models
from bench.common import BenchError, counter_change, run_main, safe_cap, um_module
from bench.residency import (
    DEFAULT_BUDGET,
    UM_CONF,
    _build_model,
    _tokens,
    parse_size,
    train_loss,
)

FAMILIES = (
    ("gemm", re.compile(r"gemm|cutlass|sm90|nvjet|cublas", re.I)),
    ("attention", re.compile(r"flash|fmha|attention|sdpa", re.I)),
    ("optimizer", re.compile(r"multi_tensor|foreach", re.I)),
    ("reduction/norm", re.compile(r"reduce|norm|softmax|cross_entropy|nll", re.I)),
    ("elementwise", re.compile(r"elementwise|vectorized|unrolled|copy|fill", re.I)),
)


# CUDA calls that order work on a stream (what a launched kernel can queue behind); INVALID
# is how the profiler names calls it does not know, CUDA 13's batch prefetch and discard
# among them.
STREAM_ORDERED = re.compile(r"StreamWaitEvent|Memcpy|Memset|Prefetch|Discard|MemAdvise|INVALID")


def family(name: str) -> str:
    for fam, pattern in FAMILIES:
        if pattern.search(name):
            return fam
    return "other"


def summarize(events: list[dict[str, Any]], t0: float, t1: float) -> dict[str, Any]:
    """Within [t0, t1) (microseconds): kernel time by family; the busiest stream's idle
    gaps, each split into the part before its next kernel was launched on the host
    (``host_late_s``: the compute thread was elsewhere, in the engine or in Python) and the
    rest (``device_wait_s``: launched, but queued behind a migration or an event), the
    latter also by what the launching thread queued between the two kernels' launches
    (``device_wait_after``: the stream-ordered calls, STREAM_ORDERED, joined by "+", or
    "none"); and the host time of CUDA API calls, by thread and call."""

    def window(cats: tuple[str, ...]) -> list[dict[str, Any]]:
        return [
            e for e in events if e.get("cat") in cats and e.get("ph") == "X" and t0 <= e["ts"] < t1
        ]

    kernels = window(("kernel",))
    api = window(("cuda_runtime", "cuda_driver"))
    launches = {
        (e.get("args") or {}).get("correlation"): e
        for e in api
        if "correlation" in (e.get("args") or {})
    }
    by_family: dict[str, list[float]] = {}
    by_stream: dict[Any, list[tuple[float, float, float, dict[str, Any] | None, str]]] = {}
    for k in kernels:
        by_family.setdefault(family(k.get("name", "")), []).append(k["dur"])
        args = k.get("args") or {}
        call = launches.get(args.get("correlation"))
        launched = call["ts"] + call["dur"] if call else k["ts"]
        by_stream.setdefault(args.get("stream"), []).append(
            (k["ts"], k["ts"] + k["dur"], launched, call, str(k.get("name", "")))
        )
    calls: dict[str, float] = {}
    for e in api:
        key = f"{e.get('tid')}:{e.get('name')}"
        calls[key] = calls.get(key, 0.0) + e["dur"]
    out: dict[str, Any] = {
        "kernel_s": sum(k["dur"] for k in kernels) / 1e6,
        "kernels": len(kernels),
        "families": {
            f: {"s": round(sum(d) / 1e6, 4), "n": len(d)} for f, d in sorted(by_family.items())
        },
        "api_s": {
            k: round(v / 1e6, 4) for k, v in sorted(calls.items(), key=lambda kv: -kv[1])[:12]
        },
    }
    copies: dict[str, dict[str, float]] = {}
    for c in window(("gpu_memcpy",)):
        args = c.get("args") or {}
        row = copies.setdefault(str(args.get("stream")), {"n": 0, "busy_s": 0.0, "GB": 0.0})
        row["n"] += 1
        row["busy_s"] += c["dur"] / 1e6
        row["GB"] += float(args.get("bytes", 0)) / 1e9
    for row in copies.values():
        row["GB/s busy"] = round(row["GB"] / row["busy_s"], 1) if row["busy_s"] else 0.0
        row["busy_s"] = round(row["busy_s"], 4)
        row["GB"] = round(row["GB"], 3)
    out["copies_by_stream"] = copies
    out["kernels_by_stream"] = kernels_by_stream(by_stream)
    # Memsets run on a stream between kernels: one that takes long (managed pages it has
    # to populate) shows as an idle gap of that stream, "after cudaMemsetAsync".
    memsets: dict[str, list[float]] = {}  # stream -> each memset's microseconds
    for m in window(("gpu_memset",)):
        memsets.setdefault(str((m.get("args") or {}).get("stream")), []).append(m["dur"])
    out["memsets_by_stream"] = {
        k: {
            "n": len(v),
            "busy_s": round(sum(v) / 1e6, 4),
            "largest_ms": [round(x / 1000, 2) for x in sorted(v)[-3:]],
        }
        for k, v in memsets.items()
    }
    if by_stream:
        stream, spans = max(by_stream.items(), key=lambda kv: sum(s[1] - s[0] for s in kv[1]))
        spans.sort(key=lambda sp: sp[:3])
        busy = late = 0.0
        gaps: list[float] = []
        after: dict[str, float] = {}
        waits: list[tuple[float, str, str, str]] = []  # (us, queued between, before, kernel)
        end = spans[0][0]
        prev_call: dict[str, Any] | None = None
        prev_name = ""
        for a, b, launched, call, name in spans:
            if a > end:
                gaps.append(a - end)
                host = min(a - end, max(0.0, launched - end))
                late += host
                if a - end > host:
                    key = _queued_between(api, prev_call, call)
                    after[key] = after.get(key, 0.0) + (a - end - host)
                    waits.append((a - end - host, key, prev_name, name))
            busy += max(0.0, b - max(a, end))
            end = max(end, b)
            prev_call = call
            prev_name = name
        long_gaps = [g for g in gaps if g > 1000]
        out["stream"] = {
            "id": stream,
            "busy_s": busy / 1e6,
            "span_s": (end - spans[0][0]) / 1e6,
            "idle_s": sum(gaps) / 1e6,
            "host_late_s": late / 1e6,
            "device_wait_s": (sum(gaps) - late) / 1e6,
            "gaps_over_1ms": len(long_gaps),
            "gaps_over_1ms_s": sum(long_gaps) / 1e6,
            "largest_gaps_ms": [round(g / 1000, 1) for g in sorted(long_gaps)[-5:]],
            "device_wait_after": {
                k: round(v / 1e6, 4) for k, v in sorted(after.items(), key=lambda kv: -kv[1])[:8]
            },
            # The longest device waits, with the kernels on either side (their names are
            # cut to 80 characters): which work the stream waited between.
            "largest_device_waits": [
                {
                    "ms": round(us / 1000, 2),
                    "after": key,
                    "kernel_before": pre[:80],
                    "kernel": post[:80],
                }
                for us, key, pre, post in sorted(waits, key=lambda w: -w[0])[:5]
            ],
        }
    return out


def _union(spans: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The spans merged where they touch or overlap, in order."""
    merged: list[tuple[float, float]] = []
    for a, b in sorted(spans):
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _overlap(x: list[tuple[float, float]], y: list[tuple[float, float]]) -> float:
    """Microseconds in which both unions of spans are busy."""
    i = j = 0
    both = 0.0
    while i < len(x) and j < len(y):
        both += max(0.0, min(x[i][1], y[j][1]) - max(x[i][0], y[j][0]))
        if x[i][1] < y[j][1]:
            i += 1
        else:
            j += 1
    return both


def kernels_by_stream(by_stream: dict[Any, list[tuple[Any, ...]]]) -> dict[str, Any]:
    """Per stream: its kernels' count and busy seconds (their spans' union), and for the
    three busiest streams the seconds each pair of them ran kernels at once: whether a
    copy in and a copy out on two side streams overlapped, and with the compute stream."""
    unions = {str(k): _union([(sp[0], sp[1]) for sp in spans]) for k, spans in by_stream.items()}
    busy = {k: sum(b - a for a, b in u) for k, u in unions.items()}
    rows: dict[str, Any] = {
        k: {"n": len(by_stream[s]), "busy_s": round(busy[k] / 1e6, 6)}
        for s in by_stream
        for k in (str(s),)
    }
    top = sorted(busy, key=lambda k: -busy[k])[:3]
    rows["overlap_s"] = {
        f"{a}&{b}": round(_overlap(unions[a], unions[b]) / 1e6, 6)
        for n, a in enumerate(top)
        for b in top[n + 1 :]
    }
    return rows


def _queued_between(
    api: list[dict[str, Any]], prev: dict[str, Any] | None, call: dict[str, Any] | None
) -> str:
    """The stream-ordered calls that the thread launching ``call`` made after the launch
    ``prev`` (the kernel before on the stream) and before ``call``, as one key."""
    if call is None or prev is None:
        return "unknown launch"
    names = {
        e.get("name", "")
        for e in api
        if e.get("tid") == call.get("tid")
        and prev["ts"] < e["ts"] < call["ts"]
        and STREAM_ORDERED.search(e.get("name", ""))
    }
    return "+".join(sorted(names)) or "none"


def phase_bins(events: list[dict[str, Any]], t0: float, t1: float, width: float) -> dict[str, Any]:
    """[t0, t1) cut into bins of ``width`` microseconds: in each, the GB the copies to the
    device and to the host started there moved, and the milliseconds of kernels started
    there on the stream that ran the most kernel time (the compute stream), with the
    first of those kernels' start: when did the link and the compute stream each work?"""
    n = max(1, int((t1 - t0 + width - 1) // width))
    into, out, compute = [0.0] * n, [0.0] * n, [0.0] * n
    per_stream: dict[Any, list[tuple[float, float]]] = {}
    for e in events:
        if e.get("ph") != "X" or not t0 <= e["ts"] < t1:
            continue
        k = int((e["ts"] - t0) // width)
        if e.get("cat") == "gpu_memcpy":
            gb = float((e.get("args") or {}).get("bytes", 0)) / 1e9
            name = str(e.get("name", ""))
            if "HtoD" in name:
                into[k] += gb
            elif "DtoH" in name:
                out[k] += gb
        elif e.get("cat") == "kernel":
            per_stream.setdefault((e.get("args") or {}).get("stream"), []).append(
                (e["ts"], e["dur"])
            )
    first = None
    if per_stream:
        busiest = max(per_stream.values(), key=lambda ks: sum(d for _, d in ks))
        for ts, dur in busiest:
            compute[int((ts - t0) // width)] += dur / 1e3
        first = round((min(ts for ts, _ in busiest) - t0) / 1e3, 2)
    return {
        "bin_ms": width / 1e3,
        "first_kernel_ms": first,
        "in_GB": [round(x, 3) for x in into],
        "out_GB": [round(x, 3) for x in out],
        "compute_ms": [round(x, 2) for x in compute],
    }


def unpack_parts(rows: list[dict[str, Any]], start_evicted: int) -> dict[str, Any]:
    """One backward's saved-tensor reads (``rows`` in order: ``left``, whether the save had
    left by copy; ``evicted``, the engine's evicted bytes so far; ``room``, free room under
    the budget), split where the first save that left is read: what the engine evicted
    before the first read (the loss's backward), while reading saves kept on the device,
    and while reading those brought back."""
    first = next((i for i, r in enumerate(rows) if r["left"]), len(rows))
    kept, back = rows[:first], rows[first:]
    at = [start_evicted] + [r["evicted"] for r in rows]
    return {
        "kept_reads": len(kept),
        "left_reads": len(back),
        "evicted_before_reads": at[1] - at[0] if rows else 0,
        "evicted_while_kept": ((at[first + 1] if back else at[-1]) - at[1]) if kept else 0,
        "evicted_while_left": (at[-1] - at[first + 1]) if back else 0,
        "min_room_kept": min((r["room"] for r in kept), default=None),
        "min_room_left": min((r["room"] for r in back), default=None),
    }


def _read_trace(path: Path) -> list[dict[str, Any]]:
    try:
        with gzip.open(path, "rt") as f:
            events: list[dict[str, Any]] = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError) as e:
        raise BenchError(f"cannot read {path} as a trace kept by --trace: {e}") from None
    return events


def phase_rows(
    events: list[dict[str, Any]], step: tuple[int, float, float] | None, bins: float
) -> list[dict[str, Any]]:
    """One row per phase annotated by --phases (within ``step``'s span, numbered by it,
    or all of them, numbered in order, from a kept trace), with ``phase_bins`` if asked."""
    phases = sorted(
        (e["ts"], e["ts"] + e["dur"], e["name"].split(":", 1)[1])
        for e in events
        if str(e.get("name", "")).startswith("um_probe_phase:")
        and e.get("ph") == "X"
        and e.get("cat") == "user_annotation"
    )
    if step is None and not phases:
        raise BenchError("the trace has no phases: keep it from a run with --phases")
    rows = []
    seen: dict[str, int] = {}
    for p0, p1, name in phases:
        if step is not None and not step[1] <= p0 < step[2]:
            continue
        n = step[0] if step is not None else seen.get(name, 0)
        seen[name] = n + 1
        row = {"step": n, "phase": name, "s": round((p1 - p0) / 1e6, 4)}
        row.update(summarize(events, p0, p1))
        if bins:
            row["bins"] = phase_bins(events, p0, p1, bins * 1000)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("stock", "um"), help="run a workload (or --from-trace)")
    ap.add_argument("--workload", choices=("train", "infer"), default="train")
    ap.add_argument("--steps", type=int, default=3, help="profiled steps")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--budget", default=None, help="device budget (train 8GiB, infer 2GiB)")
    ap.add_argument("--conf", default=UM_CONF["um"], help="engine settings (um)")
    ap.add_argument("--phases", action="store_true", help="split train steps into phases")
    ap.add_argument("--model", choices=tuple(models.MODELS), default=models.DEFAULT)
    ap.add_argument(
        "--loss",
        choices=("model", "module"),
        default="model",
        help="train: the model's own loss, or an nn.CrossEntropyLoss module on its float "
        "logits, held by the loop into the next step (bench.residency's --loss)",
    )
    ap.add_argument("--trace", default=None, help="also keep the profiler's trace (.json.gz)")
    ap.add_argument(
        "--stack",
        action="store_true",
        help="record Python calls too (with_stack: slower host, for the trace's gaps)",
    )
    ap.add_argument(
        "--unpacks",
        action="store_true",
        help="with --phases and predict:True: where the backward's evictions happen",
    )
    ap.add_argument(
        "--bins",
        type=float,
        default=0.0,
        metavar="MS",
        help="with --phases: each phase's copies in and out and compute time per MS ms",
    )
    ap.add_argument(
        "--from-trace",
        default=None,
        metavar="FILE",
        help="read a trace kept by --trace (with --phases) instead of running: its phases",
    )
    a = ap.parse_args(argv)
    if a.bins < 0:
        raise BenchError(f"--bins takes milliseconds (0: off), not {a.bins}")
    if a.from_trace:
        for row in phase_rows(_read_trace(Path(a.from_trace)), None, a.bins):
            print(json.dumps(row), flush=True)
        return 0
    if a.mode is None:
        raise BenchError("give --mode stock or --mode um (or --from-trace FILE)")
    if a.loss != "model" and a.workload != "train":
        raise BenchError("--loss chooses how the train workload computes its loss")
    if a.bins and not a.phases:
        raise BenchError("--bins splits the phases: add --phases")
    if a.unpacks and (a.mode != "um" or not a.phases or "predict:True" not in a.conf):
        raise BenchError("--unpacks needs --mode um, --phases and predict:True in --conf")
    import torch

    um = um_module(torch, a.mode)
    free, _total, cap = safe_cap(torch)
    if um is not None:
        budget = parse_size(a.budget or DEFAULT_BUDGET[a.workload])
        um.configure(a.conf, enabled=True, max_managed=cap, device_budget=budget)
    model = _build_model(torch, a.workload, a.model).to("cuda")
    ids = _tokens(torch, a.workload).to("cuda")
    if a.workload == "train":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        criterion = torch.nn.CrossEntropyLoss() if a.loss == "module" else None
        logits: Any = None  # the loop's (--loss module), alive into the next step's forward

        @contextlib.contextmanager
        def phase(name: str) -> Iterator[None]:
            """With --phases: the phase alone on the GPU, annotated for the trace."""
            if not a.phases:
                yield
                return
            torch.cuda.synchronize()
            with torch.profiler.record_function(f"um_probe_phase:{name}"):
                yield
                torch.cuda.synchronize()

        def step() -> None:
            nonlocal logits
            opt.zero_grad(set_to_none=True)
            with phase("forward"):
                loss, logits = train_loss(model, ids, criterion)
            with phase("backward"):
                if reads is not None:
                    reads.append({"start": um._engine_counters(torch.cuda.current_device())[0]})
                loss.backward()
            if reads is not None:
                torch.cuda.synchronize()
                grads = [p.grad for p in model.parameters() if p.grad is not None]
                reads.append(
                    {
                        "params_host": um.placement(model).host,
                        "grads_host": um.placement(grads).host,
                    }
                )
            with phase("optimizer"):
                opt.step()

    else:

        def step() -> None:
            with torch.inference_mode():
                model(ids)

    reads: list[dict[str, Any]] | None = None
    for _ in range(a.warmup):
        step()
    torch.cuda.synchronize()
    if a.unpacks:
        recorded: list[dict[str, Any]] = []
        reads = recorded
        offloader = um._predictor()
        read = offloader.unpack

        def traced(packed: Any) -> Any:
            """The offloader's unpack, recorded (autograd's thread)."""
            left = not isinstance(packed, torch.Tensor)
            evicted, room = um._engine_counters(torch.cuda.current_device())
            recorded.append({"left": left, "evicted": evicted, "room": room})
            return read(packed)

        offloader.unpack = traced  # looked up at each forward's start
    marks: list[tuple[float, float]] = []
    reserved: list[int] = []  # the caching allocator's segments at each step's end
    counts: list[dict[str, int]] = []

    def counters() -> dict[str, int]:
        if um is None:
            return {}
        out = {k: int(v) for k, v in um.stats().items() if isinstance(v, int)}
        out.update(um.predict_stats())
        return out

    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts, with_stack=a.stack) as prof:
        for _ in range(a.steps):
            torch.cuda.synchronize()
            before = counters()
            with torch.profiler.record_function("um_probe_step"):
                t = time.perf_counter()
                step()
                torch.cuda.synchronize()
            marks.append((t, time.perf_counter()))
            after = counters()
            counts.append({k: v for k, v in counter_change(before, after).items() if v})
            reserved.append(torch.cuda.memory_reserved())
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(trace))
        text = trace.read_text()
        if a.trace:
            with gzip.open(a.trace, "wt") as f:
                f.write(text)
        events = json.loads(text)["traceEvents"]
    steps = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("name") == "um_probe_step"
        and e.get("ph") == "X"
        and e.get("cat") == "user_annotation"
    )
    if len(steps) != a.steps:
        raise BenchError(f"found {len(steps)} step annotations in the trace, expected {a.steps}")
    for i, ((t0, t1), (w0, w1)) in enumerate(zip(steps, marks, strict=True)):
        row = {
            "mode": a.mode,
            "workload": a.workload,
            "step": i,
            "wall_s": round(w1 - w0, 4),
            **summarize(events, t0, t1),
            "counters": counts[i],
            "reserved_bytes": reserved[i],
        }
        if um is not None:
            row["um_conf"] = a.conf
        print(json.dumps(row), flush=True)
        for part in phase_rows(events, (i, t0, t1), a.bins):
            print(json.dumps(part), flush=True)
    if reads is not None:
        # one backward: its start, its reads, then the placement at its end
        starts = [i for i, r in enumerate(reads) if "start" in r]
        for n, i in enumerate(starts):
            end = next(j for j in range(i + 1, len(reads)) if "params_host" in reads[j])
            part = unpack_parts(reads[i + 1 : end], reads[i]["start"])
            print(json.dumps({"step": n, "phase": "backward reads", **part, **reads[end]}))
    print(json.dumps({"mode": a.mode, "free_at_start": free, "cap": cap if um else None}))
    return 0


if __name__ == "__main__":
    run_main("timeline_probe", main)
