"""Programs that no module hook describes, past the device budget:
each step's time from the first, by stock torch in memory, the previous engine and this
one, with the PCIe floor measured in the same run.

    python -m bench.classes CLASS
        --stock-pythonpath STOCK --um-pythonpath UM [--prev-pythonpath PREV]
        [--rounds 1] [--steps 8] [--budget SIZE] [--modes a,b,...] [--out DIR]

``train-plain``: plain tensors, no ``nn.Module``, no ``torch.optim``: LAYERS weights of
WIDTH x WIDTH in bf16, a forward of (x @ W_i).relu() through them on a WIDTH x WIDTH
batch, autograd, and a momentum update written by hand. Peak about 10.4 GiB; budget
6 GiB by default.

``train-custom-opt``: the same layers as ``nn.Linear`` modules in an ``nn.Sequential``
trained by a Lion-style update written by hand (not a ``torch.optim`` class).

``pattern-change``: ``train-plain`` steps, then ``no_grad`` forwards on a batch of half
the rows, then training again: each step's time shows how the engine follows a pattern
that changes and comes back.

``train-ddp-default``: ``train-custom-opt``'s layers under ``DistributedDataParallel``
with its default arguments (world size 1, NCCL; gradients copied into its own buckets),
trained by ``torch.optim.SGD`` with momentum.

``train-compiled``: the same layers under ``torch.compile`` (default mode), trained by
``torch.optim.SGD`` with momentum; the first step includes the compilation.

``fit-small-ops``: ``train-plain``'s program at SMALL_WIDTH (1024): 24 weights of 2 MiB,
a few hundred small operators a step, launch-bound, far under any budget. What the +um
torch costs a program that fits (``um`` against ``stock``: the signal is not installed),
and what the operator signal costs an operator when it is (``um-signal``).

``train-encdec``: an encoder-decoder of about 1.07 B parameters, transformers'
``BartForConditionalGeneration`` (d_model 2048, 10 + 10 layers, FFN 6144, vocabulary
32000, bf16, dropout 0), built on the GPU from a fixed seed (nothing downloaded), on
16 x 1024 tokens in and out, trained by ``torch.optim.AdamW``.

Budgets by default: 6 GiB (the plain layers' classes), 8 GiB (``train-encdec``); the table
prints stock's peak beside the budget, so that a run can check it is about a third.

Modes:
  stock        stock torch, in memory, no limit (the floor's compute part and the outputs)
  um-prev      the previous engine (--prev-pythonpath) at the budget, its own defaults
  um           this engine at the budget, its defaults (the operator use signal on)
  um-nosignal  this engine at the budget with op_signal:False: what the signal adds
  um-ahead     this engine at the budget with op_lookahead:1GiB: what the lookahead adds
  um-cold      this engine at the budget with evict_warm_first:False: the learned order
               without preferring victims whose host pages exist (Note [First evictions])
  um-signal    this engine with the operator signal installed whatever the pressure (through
               its C API, as the pressure watcher installs it): the summary's
               ``signal_ns_per_op`` is its steady step less ``um``'s over the operators it saw
  um-nohooks   this engine at the budget with hooks:False: no module hook, so the operator
               signal drives whatever the program is made of (Note [Which signal drives the
               engine], um.py)
  um-programs  this engine at the budget with predict_programs:True (the default since step
               58): where the signal drives, saves leave by copy over the forward between two
               backwards (Note [A program's forward between two backwards],
               torch/cuda/_um_program.py)
  um-noprograms  the same with predict_programs:False: the engine before step 58's default
  um-ops       both: no module hook, and saves leave over the program's forward; what the
               operator signal alone does for a program built from modules (issue 55, item 3)
  um-stage     this engine at the budget with op_stage:True: state one burst of operators a
               period writes is staged by copy under its storage (Note [State one burst a
               period writes is staged by copy], Stage.h)
  um-ops-stage  um-ops with op_stage:True

Every UM worker caps total managed memory at 80 % of the free memory it reads at start
(bench.common.safe_cap). The floor: the larger of stock's step and the bytes past the
budget (stock's peak less the budget) out and back over the link measured in the run
(page-locked copies, the slower direction). The record: ``bench/results/<class>-<gpu>-
<date>.json`` with the ``summary`` block (floor, each mode's steady step, its ratio to the
floor, its second and third step over its steady step) and ``steps`` (every step's seconds,
per mode).
"""

from __future__ import annotations

import argparse
import importlib
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench import common

CLASSES = (
    "train-plain",
    "train-custom-opt",
    "pattern-change",
    "train-ddp-default",
    "train-compiled",
    "train-encdec",
    "fit-small-ops",
)
MODES = (
    "stock",
    "um-prev",
    "um",
    "um-nosignal",
    "um-ahead",
    "um-cold",
    "um-signal",
    "um-nohooks",
    "um-programs",
    "um-ops",
    "um-noprograms",
    "um-stage",
    "um-ops-stage",
)
SIGNAL = "um-signal"  # the observer installed by hand (worker)
PREV = "um-prev"
UM_CONF = {
    "um-prev": "",
    "um": "",
    "um-nosignal": "op_signal:False",
    "um-ahead": "op_lookahead:1GiB",
    "um-cold": "evict_warm_first:False",
    "um-stage": "op_stage:True",
    "um-ops-stage": "hooks:False,predict_programs:True,op_stage:True",
    "um-signal": "",
    "um-nohooks": "hooks:False",
    "um-programs": "predict_programs:True",
    "um-ops": "hooks:False,predict_programs:True",
    "um-noprograms": "predict_programs:False",
}
LAYERS = 24
WIDTH = 8192
SMALL_WIDTH = 1024  # fit-small-ops
DEFAULT_BUDGET = "6GiB"
CLASS_BUDGET = {"train-encdec": "8GiB"}  # the others: DEFAULT_BUDGET
SEED = 1234


def parse_size(text: str) -> int:
    from bench.residency import parse_size as parse

    return parse(text)


# ---- the programs (run in the worker) -----------------------------------------------


def plain_params(
    torch: Any, layers: int = LAYERS, width: int = WIDTH, seed: int = SEED
) -> tuple[list[Any], list[Any]]:
    """The plain program's weights (bf16, on the GPU, requiring grad) and their momenta."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    ws = []
    for _ in range(layers):
        w = torch.randn(width, width, generator=g, dtype=torch.float32) / width**0.5
        ws.append(w.to(device="cuda", dtype=torch.bfloat16).requires_grad_(True))
    ms = [torch.zeros_like(w) for w in ws]
    return ws, ms


def batch(torch: Any, rows: int, step: int, width: int = WIDTH) -> Any:
    """A step's input, made on the GPU (a CPU generator's 8192 x 8192 took 0.4 s of the
    step in the first run, more than the step's compute)."""
    g = torch.Generator(device="cuda").manual_seed(SEED + step)
    return torch.randn(rows, width, generator=g, device="cuda", dtype=torch.bfloat16)


def plain_step(torch: Any, ws: list[Any], ms: list[Any], x: Any, lr: float = 1e-3) -> float:
    """One training step of plain tensors: (x @ W).relu() through the weights, autograd,
    a momentum update written by hand. Returns the loss."""
    h = x
    for w in ws:
        h = (h @ w).relu()
    loss = h.float().pow(2).mean()
    loss.backward()
    with torch.no_grad():
        for w, m in zip(ws, ms, strict=True):
            m.mul_(0.9).add_(w.grad)
            w.sub_(m, alpha=lr)
            w.grad = None
    return float(loss.detach())


def _plain_forward(torch: Any, ws: list[Any], x: Any) -> float:
    with torch.no_grad():
        h = x
        for w in ws:
            h = (h @ w).relu()
        return float(h.float().sum())


def _custom_opt_model(
    torch: Any, layers: int = LAYERS, width: int = WIDTH, device: str = "cuda"
) -> Any:
    torch.manual_seed(SEED)
    mods = []
    for _ in range(layers):
        mods += [torch.nn.Linear(width, width, bias=False), torch.nn.ReLU()]
    model = torch.nn.Sequential(*mods).to(dtype=torch.bfloat16)
    return model.to(device)


def _ddp_default(torch: Any, model: Any, backend: str = "nccl") -> Any:
    """``model`` under DistributedDataParallel with its default arguments, in a process
    group of one rank (made here if there is none)."""
    import os
    import socket

    dist = torch.distributed
    if not dist.is_initialized():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(port))
        dist.init_process_group(backend, rank=0, world_size=1)
    return torch.nn.parallel.DistributedDataParallel(model)


ENCDEC = {  # transformers.BartConfig: about 1.07 B parameters
    "vocab_size": 32000,
    "d_model": 2048,
    "encoder_layers": 10,
    "decoder_layers": 10,
    "encoder_attention_heads": 16,
    "decoder_attention_heads": 16,
    "encoder_ffn_dim": 6144,
    "decoder_ffn_dim": 6144,
    "max_position_embeddings": 1024,
    "dropout": 0.0,
    "attention_dropout": 0.0,
    "activation_dropout": 0.0,
    "use_cache": False,
}
ENCDEC_BATCH = (16, 1024)  # sequences, tokens (in and out)


def _encdec_model(torch: Any, config: dict[str, Any] | None = None, device: str = "cuda") -> Any:
    """BartForConditionalGeneration from ENCDEC, made on `device` from SEED, in bf16 from
    the start (no float32 copy of a billion parameters counts in the peak)."""
    transformers = importlib.import_module("transformers")
    torch.manual_seed(SEED)
    cfg = transformers.BartConfig(**(config or ENCDEC))
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = transformers.BartForConditionalGeneration(cfg)
    finally:
        torch.set_default_dtype(default)
    return model


def _tokens(torch: Any, step: int, shape: tuple[int, int], vocab: int, device: str) -> Any:
    g = torch.Generator(device=device).manual_seed(SEED + step)
    return torch.randint(0, vocab, shape, generator=g, device=device)


def _optimized_steps(
    torch: Any,
    klass: str,
    device: str = "cuda",
    layers: int = LAYERS,
    width: int = WIDTH,
    rows: int = WIDTH,
    encdec: dict[str, Any] | None = None,
    encdec_batch: tuple[int, int] = ENCDEC_BATCH,
) -> Callable[[int], float]:
    """The training step of train-ddp-default, train-compiled or train-encdec: a function
    of the step's index that returns its loss. The sizes are parameters so that the
    programs can be tried small on a CPU."""
    if klass == "train-encdec":
        model = _encdec_model(torch, encdec, device)
        vocab = int((encdec or ENCDEC)["vocab_size"])
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5)

        def encdec_step(step: int) -> float:
            ids = _tokens(torch, 2 * step, encdec_batch, vocab, device)
            labels = _tokens(torch, 2 * step + 1, encdec_batch, vocab, device)
            loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return float(loss.detach())

        return encdec_step
    net = _custom_opt_model(torch, layers, width, device)
    opt = torch.optim.SGD(net.parameters(), lr=1e-4, momentum=0.9)
    if klass == "train-ddp-default":
        net = _ddp_default(torch, net, "nccl" if device == "cuda" else "gloo")
    elif klass == "train-compiled":
        net = torch.compile(net)
    else:
        raise ValueError(f"no optimized program for class {klass}")

    def step_fn(step: int) -> float:
        g = torch.Generator(device=device).manual_seed(SEED + step)
        x = torch.randn(rows, width, generator=g, device=device, dtype=torch.bfloat16)
        loss = net(x).float().pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    return step_fn


def _lion_step(torch: Any, params: list[Any], state: dict[int, Any]) -> None:
    """Lion (Chen et al. 2023), written out: the update is the sign of an interpolation
    of the momentum and the gradient; no torch.optim class is involved."""
    with torch.no_grad():
        for i, p in enumerate(params):
            m = state.setdefault(i, torch.zeros_like(p))
            update = (m * 0.9 + p.grad * 0.1).sign_()
            p.add_(update, alpha=-1e-4)
            m.mul_(0.99).add_(p.grad, alpha=0.01)
            p.grad = None


# The engine's counters recorded for each step (their growth in the step), so that a
# slow step can be told from a fast one by what moved.
STEP_COUNTERS = (
    "um.prefetch_bytes",
    "um.evict_bytes",
    "um.evict_first_bytes",
    "um.evict_ranges",
    "um.cancelled_bytes",
    "um.evictor_ns",
    "um.executor_ns",
    "um.reuse_bytes",
    "um.discard_bytes",
    "um.op_touch_bytes",
    "um.op_ahead_bytes",
    "um.op_calls",
    "um.op_matches",
    "um.op_paths",
    "um.op_mixed",
    "um.op_counterparts",
    "um.plan_victim_bytes",
    "um.fence_wait_ns",
    "um.op_signal_ns",
    "um.stage_in_bytes",
    "um.stage_out_bytes",
    "um.stage_failures",
    "um.stage_candidates",
    "um.stage_not_on_host",
    # the saved-activation offload's (torch.cuda.um.predict_stats)
    "predict.offloaded_bytes",
    "predict.ahead_bytes",
    "predict.misses",
    "predict.miss_bytes",
    "predict.warmed_bytes",
    "predict.warm_ns",
    "predict.warm_wait_ns",
    "predict.trims",
)


def _counters(um: Any) -> Callable[[], dict[str, int]]:
    """The engine's counters and, where the wheel has them, the offload's."""
    predict = getattr(um, "predict_stats", None)

    def read() -> dict[str, int]:
        return {**um.stats(), **(predict() if predict is not None else {})}

    return read


def run_program(
    torch: Any,
    klass: str,
    steps: int,
    rows: int,
    counters: Callable[[], dict[str, int]] | None = None,
    per_step: list[dict[str, int]] | None = None,
) -> tuple[list[float], list[float]]:
    """(each step's seconds, each step's output); the phases of pattern-change are
    steps // 2 training steps, steps // 4 forwards of half the rows, the rest training.
    With `counters` (um.stats), each step's growth of STEP_COUNTERS goes to `per_step`."""
    times: list[float] = []
    outs: list[float] = []

    def timed(fn: Any) -> None:
        torch.cuda.synchronize()
        before = counters() if counters is not None else {}
        t0 = time.perf_counter()
        out = fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
        outs.append(out)
        if counters is not None and per_step is not None:
            after = counters()
            per_step.append({k: after.get(k, 0) - before.get(k, 0) for k in STEP_COUNTERS})

    if klass == "train-custom-opt":
        model = _custom_opt_model(torch)
        params = list(model.parameters())
        state: dict[int, Any] = {}

        def custom(step: int) -> float:
            loss = model(batch(torch, rows, step)).float().pow(2).mean()
            loss.backward()
            _lion_step(torch, params, state)
            return float(loss.detach())

        for s in range(steps):
            timed(lambda s=s: custom(s))
        return times, outs
    if klass in ("train-ddp-default", "train-compiled", "train-encdec"):
        step_fn = _optimized_steps(torch, klass)
        for s in range(steps):
            timed(lambda s=s: step_fn(s))
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()  # train-ddp-default's group of one
        return times, outs
    if klass == "fit-small-ops":
        ws, ms = plain_params(torch, width=SMALL_WIDTH)
        for s in range(steps):
            timed(
                lambda s=s: plain_step(
                    torch, ws, ms, batch(torch, SMALL_WIDTH, s, width=SMALL_WIDTH)
                )
            )
        return times, outs
    ws, ms = plain_params(torch)
    if klass == "train-plain":
        for s in range(steps):
            timed(lambda s=s: plain_step(torch, ws, ms, batch(torch, rows, s)))
        return times, outs
    train1 = steps // 2
    infer = steps // 4
    for s in range(steps):
        if train1 <= s < train1 + infer:
            timed(lambda s=s: _plain_forward(torch, ws, batch(torch, rows // 2, s)))
        else:
            timed(lambda s=s: plain_step(torch, ws, ms, batch(torch, rows, s)))
    return times, outs


def worker(args: argparse.Namespace) -> dict[str, Any]:
    torch = importlib.import_module("torch")
    base: dict[str, Any] = {"mode": args.mode, "class": args.klass}
    if args.mode == "link":
        from bench.residency import _link_worker

        return {**base, **_link_worker(torch), "machine": common.machine(torch)}
    um = common.um_module(torch, args.mode)
    if um is not None:
        _free, _total, cap = common.safe_cap(torch)
        conf = f"max_managed:{cap},device_budget:{args.budget}"
        if UM_CONF[args.mode]:
            conf += "," + UM_CONF[args.mode]
        um.configure(conf)
        base["conf"] = um.get_config()
        if args.mode == SIGNAL:
            _install_signal(um)
    torch.cuda.reset_peak_memory_stats()
    before = um.stats() if um is not None else {}
    per_step: list[dict[str, int]] = []
    times, outs = run_program(
        torch, args.klass, args.steps, WIDTH, _counters(um) if um is not None else None, per_step
    )
    base.update(
        steps=times,
        outputs=outs,
        peak_allocated=int(torch.cuda.max_memory_allocated()),
        torch=torch.__version__,
    )
    if um is not None:
        after = um.stats()
        keys = [k for k in after if isinstance(after[k], int)]
        base["counters"] = {k: after[k] - before.get(k, 0) for k in keys}
        base["step_counters"] = per_step
        predict = getattr(um, "predict_stats", None)
        if predict is not None:
            base["predict"] = {k: v for k, v in predict().items() if v}
    return base


def _install_signal(um: Any) -> None:
    """The operator observer on, whatever the pressure: the C call the pressure watcher
    makes (torch.cuda.um._sync_op_signal), which leaves an observer it did not install
    alone while no device is near its budget."""
    import ctypes

    lib = um._lib
    if lib is None:
        raise RuntimeError("um-signal: torch.cuda.um has no engine library")
    err = ctypes.create_string_buffer(512)
    if int(lib.torch_um_op_signal(1, err, 512)) != 0:
        raise RuntimeError(f"um-signal: {err.value.decode(errors='replace')}")


def signal_cost(by_mode: dict[str, list[dict[str, Any]]]) -> dict[str, Any] | None:
    """The observer's cost an operator: um-signal's steady step less um's, over the
    operators um-signal's observer saw in a steady step (the median of its last half)."""

    def first_ok(mode: str) -> dict[str, Any] | None:
        return next((r for r in by_mode.get(mode, []) if "error" not in r), None)

    um_run, sig = first_ok("um"), first_ok(SIGNAL)
    if um_run is None or sig is None or not sig.get("step_counters"):
        return None
    calls = [c.get("um.op_calls", 0) for c in sig["step_counters"]]
    ops = statistics.median(calls[len(calls) // 2 :])
    st_um, st_sig = steady(um_run["steps"]), steady(sig["steps"])
    if not ops or st_um is None or st_sig is None:
        return None
    return {
        "ops_per_step": ops,
        "step_delta_s": st_sig - st_um,
        "ns_per_op": (st_sig - st_um) / ops * 1e9,
    }


# ---- the orchestrator ----------------------------------------------------------------


def steady(steps: list[float]) -> float | None:
    """The steady step: the median of the second half of the steps."""
    if not steps:
        return None
    return statistics.median(steps[len(steps) // 2 :])


def summarize(samples: list[dict[str, Any]], budget: int, klass: str) -> dict[str, Any]:
    link = next((s for s in samples if s.get("mode") == "link" and "error" not in s), None)
    by_mode: dict[str, list[dict[str, Any]]] = {}
    for s in samples:
        if s.get("mode") != "link":
            by_mode.setdefault(s["mode"], []).append(s)
    stock = next((s for s in by_mode.get("stock", []) if "error" not in s), None)
    floor = None
    if stock is not None and link is not None:
        over = max(0, stock["peak_allocated"] - budget)
        rate = min(link["h2d_bytes_per_s"], link["d2h_bytes_per_s"])
        stock_s = steady(stock["steps"])
        floor = max(stock_s or 0.0, 2 * over / rate)
    modes: dict[str, Any] = {}
    for mode, runs in by_mode.items():
        ok = [r for r in runs if "error" not in r]
        if not ok:
            modes[mode] = {"error": runs[0].get("error", "failed")}
            continue
        steps = ok[0]["steps"]
        st = steady(steps)
        entry: dict[str, Any] = {"steady_s": st, "first_s": steps[0]}
        if st and len(steps) >= 3:
            entry["second_over_steady"] = steps[1] / st
            entry["third_over_steady"] = steps[2] / st
        if floor and st:
            entry["over_floor"] = st / floor
        if stock is not None:
            ref = stock["outputs"]
            got = ok[0]["outputs"]
            entry["outputs_equal"] = ref == got
            entry["max_abs_output_diff"] = max(
                (abs(a - b) for a, b in zip(ref, got, strict=False)), default=None
            )
        modes[mode] = entry
    out: dict[str, Any] = {
        "class": klass,
        "budget_bytes": budget,
        "stock_peak_bytes": stock["peak_allocated"] if stock is not None else None,
        "floor_s": floor,
        "link": link,
        "modes": modes,
    }
    cost = signal_cost(by_mode)
    if cost is not None:
        out["signal"] = cost
    if stock is not None and "um" in modes and modes["um"].get("steady_s"):
        stock_s = steady(stock["steps"])
        if stock_s:
            out["um_over_stock"] = modes["um"]["steady_s"] / stock_s
    return out


def table(summary: dict[str, Any]) -> str:
    peak = summary.get("stock_peak_bytes")
    share = f", {summary['budget_bytes'] / peak:.0%} of stock's peak" if peak else ""
    lines = [
        f"{summary['class']}: floor {common.cell(summary['floor_s'], '.4f')} s; budget "
        f"{summary['budget_bytes'] / 2**30:.1f} GiB{share}",
        f"{'mode':14s}{'steady s':>10s}{'first s':>10s}{'x floor':>9s}{'2nd/st':>8s}"
        f"{'3rd/st':>8s}  outputs",
    ]
    for mode, e in summary["modes"].items():
        if "error" in e:
            lines.append(f"{mode:14s}  error: {common.last_line(str(e['error']))}")
            continue
        same = e.get("outputs_equal")
        lines.append(
            f"{mode:14s}{common.cell(e['steady_s'], '.4f'):>10s}"
            f"{common.cell(e['first_s'], '.3f'):>10s}"
            f"{common.cell(e.get('over_floor'), '.2f'):>9s}"
            f"{common.cell(e.get('second_over_steady'), '.2f'):>8s}"
            f"{common.cell(e.get('third_over_steady'), '.2f'):>8s}  "
            f"{'equal' if same else ('differ ' + str(e.get('max_abs_output_diff')))}"
        )
    if summary.get("um_over_stock") is not None:
        lines.append(f"um / stock, steady step: {summary['um_over_stock']:.3f}")
    sig = summary.get("signal")
    if sig is not None:
        lines.append(
            f"operator signal: {sig['ns_per_op']:.0f} ns an operator "
            f"({sig['ops_per_step']:.0f} operators a step, "
            f"{sig['step_delta_s'] * 1e3:+.2f} ms a step)"
        )
    return "\n".join(lines)


def describe(r: dict[str, Any]) -> str:
    """One line per finished worker."""
    line: dict[str, Any] = {k: r[k] for k in ("mode", "error") if r.get(k) is not None}
    if "steps" in r:
        line["steps"] = [round(t, 4) for t in r["steps"]]
    return json.dumps(line)


def main() -> int:
    p = argparse.ArgumentParser(prog="python -m bench.classes", description=__doc__.split("\n")[0])
    p.add_argument("klass", choices=CLASSES, metavar="class")
    p.add_argument("--stock-pythonpath", default=None)
    p.add_argument("--um-pythonpath", default=None)
    p.add_argument("--prev-pythonpath", default=None)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--budget", default=None, help="default: CLASS_BUDGET or DEFAULT_BUDGET")
    p.add_argument("--modes", default=None)
    p.add_argument("--out", default=None)
    p.add_argument("--mode", default=None, help=argparse.SUPPRESS)  # a worker's
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.budget is None:
        args.budget = CLASS_BUDGET.get(args.klass, DEFAULT_BUDGET)
    if args.worker:
        try:
            common.emit(worker(args))
        except Exception:  # the orchestrator reports it
            common.emit({"mode": args.mode, "error": common.error_text()})
        return 0
    if args.steps < 4:
        raise common.BenchError("--steps must be at least 4 (first, second, third, steady)")
    budget = parse_size(args.budget)
    modes = [m for m in (args.modes.split(",") if args.modes else MODES) if m]
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise common.BenchError(f"unknown mode(s) {', '.join(bad)}: choose from {', '.join(MODES)}")
    if PREV in modes and not args.prev_pythonpath:
        modes.remove(PREV)
    paths = {
        "stock": args.stock_pythonpath,
        "link": args.stock_pythonpath,
        PREV: args.prev_pythonpath,
        **{m: args.um_pythonpath for m in UM_CONF if m != PREV},
    }
    worker_args = [args.klass, "--steps", str(args.steps), "--budget", args.budget]
    cases = [(m, worker_args) for m in ("link", *modes)]
    samples = common.run_rounds("bench.classes", cases, args.rounds, paths, describe, timeout=900)
    summary = summarize(samples, budget, args.klass)
    print(table(summary))
    steps = {s["mode"]: s["steps"] for s in samples if "steps" in s}
    link = next((s for s in samples if s.get("mode") == "link" and "machine" in s), None)
    record = {
        "machine": link["machine"] if link else {"gpu": "unknown"},
        "summary": summary,
        "steps": steps,
        "samples": samples,
        "command": common.command_line("bench.classes"),
    }
    out = Path(args.out) if args.out else None
    path = common.write(args.klass, record, out)
    print(f"record: {path}")
    return 0
