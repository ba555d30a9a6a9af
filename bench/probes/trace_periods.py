"""How soon does a loop's use of addresses repeat? (from a ledger trace; step 54)

The learned order (Notes [Learned lookahead], [Predicted next use]) predicts by address: a
period of the loop is predicted from the last only where each operator uses the ranges its
counterpart used a period earlier. This reads a ledger trace recorded with the operator
signal on (``TORCH_UM_LEDGER_TRACE=PATH``; the process writes ``PATH.<pid>``), takes each of
the signal's clock records (``K``) as the start of one operator and the touches after it as
that operator's ranges, finds the loop's period in operators (the one over which the trace
repeats furthest back from its end), and prints, for each period counted back from the end,
how many of its operators use exactly the ranges of the operator one period earlier, and how
many of its ranges the period before did not use at all.

    python3 bench/probes/trace_periods.py PATH.<pid> [--json FILE]

No GPU: it reads text.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Iterable
from typing import Any

Range = tuple[int, int]


def operators(lines: Iterable[str]) -> list[tuple[Range, ...]]:
    """Each operator's touched ranges, in order: a ``K`` record starts one, the ``T``
    records after it are its ranges (touches before the first ``K`` are not an operator's)."""
    ops: list[list[Range]] = []
    for line in lines:
        f = line.split()
        if not f:
            continue
        if f[0] == "K":
            ops.append([])
        elif f[0] == "T" and ops:
            ops[-1].append((int(f[1], 16), int(f[2])))
    return [tuple(o) for o in ops]


def period(ops: list[tuple[Range, ...]]) -> tuple[int, int] | None:
    """The loop's period in operators: the p over which the trace repeats furthest back
    from its end (operator i the same as operator i - p), at least one whole period; the
    shortest such p. A local repeat (an update alternating two operators) repeats only a
    few operators back; the loop's period, every step since the addresses settled.
    Returns (p, how many operators back it repeats)."""
    n = len(ops)
    best, best_run = None, 0
    for p in range(2, n // 2 + 1):
        run = 0
        while run < n - p and ops[n - 1 - run] == ops[n - 1 - run - p]:
            run += 1
        if run >= p and run > best_run:
            best, best_run = p, run
    return None if best is None else (best, best_run)


def agreement(ops: list[tuple[Range, ...]], p: int) -> list[dict[str, int]]:
    """Per period, counted back from the end (the first may be shorter): its operators,
    those that use the ranges of the operator one period earlier, and the ranges it uses
    that the period before it did not."""
    bounds = []
    end = len(ops)
    while end > 0:
        bounds.append((max(0, end - p), end))
        end -= p
    bounds.reverse()
    rows = []
    for k, (a, b) in enumerate(bounds):
        same = sum(1 for i in range(a, b) if i >= p and ops[i] == ops[i - p])
        new = 0
        if k > 0:
            pa, pb = bounds[k - 1]
            before = {r for i in range(pa, pb) for r in ops[i]}
            new = len({r for i in range(a, b) for r in ops[i]} - before)
        rows.append({"operators": b - a, "same_as_a_period_earlier": same, "new_ranges": new})
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("trace")
    ap.add_argument("--period", type=int, help="the period in operators, if known")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args(argv)
    try:
        with open(args.trace) as f:
            ops = operators(f)
    except OSError as e:
        raise SystemExit(f"trace_periods: cannot read {args.trace}: {e.strerror}") from None
    found = period(ops) if args.period is None else (args.period, 0)
    if found is None or found[0] < 1:
        raise SystemExit(
            f"trace_periods: no repeating period in {len(ops)} operators "
            "(was the trace recorded with the operator signal on, over several steps?)"
        )
    p, back = found
    out: dict[str, Any] = {
        "operators": len(ops),
        "period": p,
        "repeats_back": back,
        "periods": agreement(ops, p),
    }
    print(f"{len(ops)} operators, period {p}" + (f" (repeats {back} back)" if back else ""))
    for k, row in enumerate(out["periods"], 1):
        print(
            f"period {k}: {row['operators']} operators, {row['same_as_a_period_earlier']} "
            f"use the ranges of a period earlier, {row['new_ranges']} ranges new"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
