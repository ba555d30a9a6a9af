"""Do small trainings past a tiny budget give the losses of the same training in memory,
bit for bit, run after run? (issue 8: the optimizer-staging GPU test's runs with staging
off left the in-memory losses now and then; this probe counts how often, per setting.)

    python -m bench.probes.divergence_probe [--reps 12] [--budget 256MiB] [--staging]
        [--settings predict:True predict:False hooks:False discard:False ...]

On a +um torch. Trains the staging test's model (six Linear(1536) + Tanh blocks, batch
4096, eight steps, StepLR) with SGD (momentum 0.9, Nesterov) and with for-loop AdamW, whose
steps the staging leaves alone unless ``--staging`` is given (a step pre-hook of the
program's own turns it off, as in the test's second run), under deterministic
algorithms: once in memory (budget 90 %), then ``--reps`` times per setting past
``--budget``, after each step sending the optimizer state to host RAM as a larger forward
would. Each setting is engine settings in ``PYTORCH_CUDA_UM_CONF`` syntax
(``key:value,...``) over the suite's defaults (policy lru, discard, hooks and predict on);
the engine checks them before any run. Prints per optimizer and setting how many runs
differ from the run in memory and at which step; the last line is the JSON record, with
the machine, the command and a ``summary``. Exit status 1 if any run differs. The
total-managed cap is 80 % of the free memory read at start (bench/common.py: safe_cap).
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from bench.common import BenchError, command_line, machine, run_main, safe_cap
from bench.residency import parse_size

DEFAULT_SETTINGS = ("predict:True", "predict:False", "hooks:False", "discard:False")
# the suite's engine defaults; a setting's keys come after these and win
BASE_CONF = "prefetch:True,policy:lru,discard:True,hooks:True,predict:True"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=12, help="runs per optimizer and setting")
    ap.add_argument("--budget", default="256MiB", help="device budget of the runs past it")
    ap.add_argument("--settings", nargs="+", default=list(DEFAULT_SETTINGS))
    ap.add_argument(
        "--staging",
        action="store_true",
        help="leave the optimizer state staging on (it runs where predict is on)",
    )
    a = ap.parse_args(argv)
    if a.reps < 1:
        raise BenchError(f"--reps must be at least 1, not {a.reps}")
    budget = parse_size(a.budget)
    import torch

    from bench.workloads import release_cache, staged_mlp_run

    um = getattr(torch.cuda, "um", None)
    if um is None:
        raise BenchError(f"{torch.__file__} is not a +um torch (no torch.cuda.um)")
    _free, _total, cap = safe_cap(torch)

    def reset(setting: str = "", budget: int | str = "90%") -> None:
        release_cache()
        um.configure(
            f"{BASE_CONF},{setting}",
            enabled=True, max_managed=cap, device_budget=budget, host_headroom="2GiB",
        )  # fmt: skip

    for text in a.settings:
        try:
            reset(text)
        except ValueError as e:
            raise BenchError(f"--settings {text!r}: {e}") from None

    optimizers: dict[str, Callable[[Any], Any]] = {
        "sgd-nesterov": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9, nesterov=True),
        "adamw-forloop": lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=False),
    }

    def run(make: Callable[[Any], Any], past_budget: bool) -> list[float]:
        # hooked (without --staging): staging off, the optimizer reads its state in host RAM
        return staged_mlp_run(make, um if past_budget else None, hooked=not a.staging)[0]

    torch.use_deterministic_algorithms(True, warn_only=True)
    record: dict[str, Any] = {
        "probe": "divergence", "command": command_line("bench.probes.divergence_probe"),
        "machine": machine(torch), "reps": a.reps, "budget": budget, "staging": a.staging,
        "rows": [],
    }  # fmt: skip
    t0 = time.perf_counter()
    try:
        for name, make in optimizers.items():
            reset()
            in_memory = run(make, past_budget=False)
            for text in a.settings:
                first: list[int] = []
                for _ in range(a.reps):
                    reset(text, budget)
                    got = run(make, past_budget=True)
                    if got != in_memory:
                        first.append(
                            next(
                                i
                                for i, (g, m) in enumerate(zip(got, in_memory, strict=True))
                                if g != m
                            )
                        )
                row = {
                    "optimizer": name,
                    "setting": text,
                    "differ": len(first),
                    "first_step": first,
                }
                record["rows"].append(row)
                print(
                    f"{name:14s} {text:32s} {len(first)}/{a.reps} differ {first}"
                    f"  ({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
    finally:
        torch.use_deterministic_algorithms(False)
        reset()
    record["summary"] = {
        "runs": sum(a.reps for _ in record["rows"]),
        "differ": sum(r["differ"] for r in record["rows"]),
    }
    print(json.dumps(record))
    return 1 if any(r["differ"] for r in record["rows"]) else 0


if __name__ == "__main__":
    run_main("divergence_probe", main)
