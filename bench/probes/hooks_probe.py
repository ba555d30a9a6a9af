"""Whether an inference forward past the budget is bound by the host or by the device, and
what the module hooks of the +um Python layer cost the host (issue 8, prediction step 15).

    python -m bench.probes.hooks_probe --mode um [--conf TEXT] [--forwards 6] [--profile]
    python -m bench.probes.hooks_probe --mode stock          # the same forward on stock torch

Runs bench.residency's infer workload (its model, ``--model``: the 1.28 B GPT-2 by
default; batch 8 x 512 under inference_mode; ``um`` at the 2 GiB budget, total-managed
cap at 80 % of free memory), warms up, then prints JSON lines:

- per forward, the host seconds until ``model(ids)`` returns and the wall seconds until
  the device is done: host well under wall means the device bounds the forward; host
  close to wall means the host does, or the host was held back (a full launch queue, a
  synchronous wait in the allocator); under ``um`` also each forward's change in the
  engine's counters (bench.residency.PHASE_COUNTERS and the predictor's, the nonzero
  ones: discards and placements of dead blocks, evictor and fence waits) and the caching
  allocator's reserved and allocated bytes after them (step 21 of bench/README.md read
  the dead-chunk churn from these); and the main thread's own CPU seconds, its context
  switches (voluntary: it blocked; involuntary: it was preempted) and the CPUs it ran
  on: host seconds well above CPU seconds mean the thread waited (a lock, the driver, the
  device), CPU seconds that grow mean it did more or ran slower (step 25);
- the host seconds a forward spends in each global module hook (each wrapped in a timer),
  and the module calls a forward makes;
- with ``--profile``, cProfile's 40 heaviest functions over two forwards, by own time;
- with ``--alternate-copies A,B`` (``um``), the weight streamer's copies alternate forward
  by forward (A B B A ...) between two routes: ``lean`` (its lean copy kernel, Note [Lean
  copies]), ``lean-gil`` (the same, launched without letting the GIL go), ``lean-split``
  (the same, in launches of at most ``--split-mib``: does a launch that ends sooner free
  the SMs the forward's GEMMs wait for? step 30) and ``green`` (foreach on a green
  context); ``routes`` names each forward's. Both routes are measured in one process, so
  in the same CPU state (bench/README.md step 29). A second line then gives per route the
  median wall, host and canary seconds, and how often the canary before the next forward
  read slow (over FULL_SPEED times the fastest) after a forward of that route.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import resource
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench import models
from bench.common import (
    FULL_SPEED,
    counter_change,
    cpu_canary,
    run_main,
    safe_cap,
    um_module,
)
from bench.residency import (
    DEFAULT_BUDGET,
    UM_CONF,
    _build_model,
    _tokens,
    engine_counters,
    parse_size,
)


def _timed_hooks(hooks: dict[int, Callable[..., Any]], tag: str, spent: dict[str, float]) -> None:
    """Wrap each hook of a global hook table, in place, in a timer adding to ``spent``."""
    for key in list(hooks):
        fn = hooks[key]
        name = f"{tag}:{getattr(fn, '__qualname__', repr(fn))}"

        def timed(*args: Any, _fn: Callable[..., Any] = fn, _name: str = name) -> Any:
            t = time.perf_counter()
            try:
                return _fn(*args)
            finally:
                spent[_name] = spent.get(_name, 0.0) + time.perf_counter() - t

        hooks[key] = timed


def _cpu() -> int:
    """The CPU this thread last ran on (field 39 of /proc/thread-self/stat), -1 if unknown."""
    try:
        with open("/proc/thread-self/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[36])
    except (OSError, IndexError, ValueError):
        return -1


def _threads_cpu() -> dict[str, float]:
    """CPU seconds so far of each thread of this process, by 'name/tid'."""
    tick = os.sysconf("SC_CLK_TCK")
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                head, tail = f.read().rsplit(")", 1)
        except OSError:
            continue
        fields = tail.split()
        out[f"{head.split('(', 1)[1]}/{tid}"] = (int(fields[11]) + int(fields[12])) / tick
    return out


def _thread_usage() -> tuple[float, int, int]:
    """This thread's CPU seconds and its voluntary and involuntary context switches."""
    r = resource.getrusage(getattr(resource, "RUSAGE_THREAD", resource.RUSAGE_SELF))
    return time.thread_time(), r.ru_nvcsw, r.ru_nivcsw


ROUTES = ("lean", "lean-gil", "lean-split", "green")


def _route_switch(torch: Any, um: Any, split: int) -> Callable[[str], str]:
    """A function that sets the weight streamer's copy route for the next forward, and
    returns its name: ``lean``, the lean kernel (Note [Lean copies]) launched through
    ``ctypes.CDLL``, which lets the GIL go for each launch, a parameter a launch;
    ``lean-gil``, the same through ``ctypes.PyDLL``, which keeps it; ``lean-split``, as
    ``lean`` in launches of at most ``split`` bytes; ``green``, foreach on a green
    context."""
    import ctypes

    from torch.cuda import _um_copy

    device = torch.cuda.current_device()
    lean = _um_copy.copier(device)
    if lean is None:
        raise SystemExit(f"no lean copy kernel to alternate with: {_um_copy.failures}")
    launches = {"lean": lean._launch, "lean-gil": ctypes.PyDLL("libcuda.so.1").cuLaunchKernel}
    launches["lean-gil"].restype = lean._launch.restype
    launches["lean-gil"].argtypes = lean._launch.argtypes
    launches["lean-split"] = lean._launch

    def use(route: str) -> str:
        if route in launches:
            _um_copy.failures.pop(device, None)
            _um_copy._copiers[device] = lean
            lean._launch = launches[route]
            _um_copy.LAUNCH_BYTES = split if route == "lean-split" else 0
        else:
            _um_copy._copiers.pop(device, None)
            _um_copy.failures[device] = "hooks_probe --alternate-copies"
        um._streamer.copy_lean = route in launches
        um._streamer._sides.clear()  # the stream and route are picked again
        return route

    return use


def by_route(first: dict[str, Any], slow_canary: float) -> dict[str, dict[str, Any]]:
    """Per copy route of an ``--alternate-copies`` run: the median wall, host and canary
    seconds of its forwards, and how often the CPU canary read before the next forward
    was slow (over ``slow_canary`` s) after a forward of this route (step 29 read 14 of
    15 after lean, 10 of 16 after foreach)."""
    routes, out = first["routes"], {}
    for route in dict.fromkeys(routes):
        idx = [i for i, r in enumerate(routes) if r == route]
        after = [first["canary_s"][i + 1] for i in idx if i + 1 < len(routes)]
        out[route] = {
            "forwards": len(idx),
            **{
                f"{key}_median_s": statistics.median(first[f"{key}_s"][i] for i in idx)
                for key in ("wall", "host", "canary")
            },
            "slow_canary_after": sum(c > slow_canary for c in after),
            "of": len(after),
        }
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("stock", "um"), required=True)
    ap.add_argument("--model", choices=tuple(models.MODELS), default=models.DEFAULT)
    ap.add_argument("--conf", default=UM_CONF["um-predict"], help="engine settings (um)")
    ap.add_argument("--budget", default=DEFAULT_BUDGET["infer"])
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--forwards", type=int, default=6)
    ap.add_argument("--profile", action="store_true", help="add cProfile's heaviest functions")
    ap.add_argument(
        "--alternate-copies",
        metavar="A,B",
        help=f"alternate the weight copies between two routes of {', '.join(ROUTES)} (um)",
    )
    ap.add_argument(
        "--split-mib", type=float, default=4.0, help="lean-split: MiB a launch copies at most"
    )
    a = ap.parse_args(argv)
    pair = a.alternate_copies.split(",") if a.alternate_copies else []
    if pair and (len(pair) != 2 or not set(pair) <= set(ROUTES)):
        raise SystemExit(f"--alternate-copies takes two of {', '.join(ROUTES)}, got {pair}")
    if a.split_mib * (1 << 20) < 16:
        raise SystemExit(f"--split-mib must be at least 16 bytes' worth, got {a.split_mib}")
    import torch
    from torch.nn.modules import module as nn_module

    um = um_module(torch, a.mode)
    free, _total, cap = safe_cap(torch)
    if um is not None:
        um.configure(a.conf, enabled=True, max_managed=cap, device_budget=parse_size(a.budget))
    model = _build_model(torch, "infer", a.model).to("cuda")
    ids = _tokens(torch, "infer").to("cuda")

    def forward() -> None:
        with torch.inference_mode():
            model(ids)

    for _ in range(a.warmup):
        forward()
    routes: list[str] = []
    split = int(a.split_mib * (1 << 20))
    use_route = _route_switch(torch, um, split) if pair and um is not None else None
    host, wall, changes = [], [], []
    cpu_s, switches, cpus, canary = [], [], [], []
    threads0, loop0 = _threads_cpu(), time.perf_counter()
    for i in range(a.forwards):
        if use_route is not None:
            routes.append(use_route(pair[0] if i % 4 in (0, 3) else pair[1]))
        torch.cuda.synchronize()
        canary.append(cpu_canary())
        before = engine_counters(um)
        u0, c0 = _thread_usage(), _cpu()
        t0 = time.perf_counter()
        forward()
        t1 = time.perf_counter()
        u1, c1 = _thread_usage(), _cpu()
        torch.cuda.synchronize()
        host.append(t1 - t0)
        wall.append(time.perf_counter() - t0)
        cpu_s.append(u1[0] - u0[0])
        switches.append((u1[1] - u0[1], u1[2] - u0[2]))
        cpus.append((c0, c1))
        change = counter_change(before, engine_counters(um))
        changes.append({k: v for k, v in change.items() if v})
    loop_s = time.perf_counter() - loop0
    threads1 = _threads_cpu()
    busy = {k: round((v - threads0.get(k, 0.0)) / loop_s, 3) for k, v in threads1.items()}
    first: dict[str, Any] = {
        "mode": a.mode,
        "conf": a.conf if um else None,
        "host_s": host,
        "wall_s": wall,
        "thread_cpu_s": cpu_s,
        "switches": switches,  # (voluntary, involuntary) a forward
        "cpus": cpus,  # the CPU at the start and at the end of each forward
        "affinity": sorted(os.sched_getaffinity(0)),
        "canary_s": canary,  # the same pure-Python work before each forward
        "routes": routes,  # with --alternate-copies: each forward's copy route
        "split_bytes": split if "lean-split" in pair else None,  # lean-split's launches
        # each thread's CPU seconds over the loop's seconds (1.0: a whole CPU), nonzero
        "thread_busy": {k: v for k, v in sorted(busy.items(), key=lambda kv: -kv[1]) if v},
    }
    if um is not None:
        first["counters_per_forward"] = changes
        first["reserved_bytes"] = torch.cuda.memory_reserved()
        first["allocated_bytes"] = torch.cuda.memory_allocated()
    print(json.dumps({**first, "free_at_start": free, "cap": cap if um else None}))
    if routes:
        slow = FULL_SPEED * min(canary)  # a canary above it: the CPU ran slow
        print(json.dumps({"slow_canary_s": slow, "by_route": by_route(first, slow)}))

    spent: dict[str, float] = {}
    _timed_hooks(nn_module._global_forward_pre_hooks, "pre", spent)
    _timed_hooks(nn_module._global_forward_hooks, "post", spent)
    calls = [0]

    def count(module: object, args: object) -> None:
        calls[0] += 1

    handle = nn_module.register_module_forward_pre_hook(count)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(a.forwards):
        forward()
        torch.cuda.synchronize()
    per = (time.perf_counter() - t0) / a.forwards
    handle.remove()
    hooks = {k: round(v / a.forwards, 5) for k, v in sorted(spent.items(), key=lambda kv: -kv[1])}
    timed = {"timed_forward_s": per, "module_calls": calls[0] / a.forwards}
    print(json.dumps({**timed, "hook_host_s": hooks}))
    if a.profile:
        prof = cProfile.Profile()
        torch.cuda.synchronize()
        prof.enable()
        forward()
        forward()
        prof.disable()
        torch.cuda.synchronize()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(40)
        print(out.getvalue())
    if um is not None:
        print(json.dumps(um.predict_stats()))
    return 0


if __name__ == "__main__":
    run_main("hooks_probe", main)
