"""Compares two junit reports of upstream's test/test_cuda.py, stock torch against +um, test
by test, and writes the markdown record that tests/gpu/results/ keeps.

    python3 tests/gpu/upstream_compare.py --stock stock.xml --um um.xml --out record.md \\
        [--title ...] [--source ...] [--note LINE ...]

Exit status: 0 when no test that passed on stock failed, erred or went missing on +um;
1 when some did (they are listed first in the record); 2 when a report cannot be read.
Standard library only: it runs on the GPU host with whatever Python is there.
"""

from __future__ import annotations

import argparse
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PASSED, FAILED, ERROR, SKIPPED, MISSING = "passed", "failed", "error", "skipped", "missing"
OUTCOMES = (PASSED, FAILED, ERROR, SKIPPED)


class ReportError(Exception):
    """A junit report that cannot be read; the message says which and why."""


def outcomes(path: Path) -> dict[str, str]:
    """``classname::name`` -> passed, failed, error or skipped, for each test case."""
    try:
        root = ET.parse(path).getroot()
    except (OSError, ET.ParseError) as e:
        raise ReportError(f"cannot read the junit report {path}: {e}") from e
    out: dict[str, str] = {}
    for case in root.iter("testcase"):
        test = f"{case.get('classname', '')}::{case.get('name', '')}"
        tags = {child.tag for child in case}
        if "error" in tags:
            outcome = ERROR
        elif "failure" in tags:
            outcome = FAILED
        elif "skipped" in tags:
            outcome = SKIPPED
        else:
            outcome = PASSED
        # a test reported twice (an error in teardown after a pass) keeps its worst outcome
        if out.get(test) not in (ERROR, FAILED):
            out[test] = outcome
    return out


@dataclass(frozen=True)
class Comparison:
    stock: Mapping[str, str]
    um: Mapping[str, str]

    def outcome(self, side: Mapping[str, str], test: str) -> str:
        return side.get(test, MISSING)

    @property
    def tests(self) -> list[str]:
        return sorted(set(self.stock) | set(self.um))

    @property
    def regressions(self) -> list[str]:
        """Passed on stock, not passed on +um (failed, erred, skipped or missing)."""
        return [t for t in self.tests if self.stock.get(t) == PASSED and self.um.get(t) != PASSED]

    @property
    def differences(self) -> list[str]:
        return [t for t in self.tests if self.stock.get(t) != self.um.get(t)]

    def totals(self, side: Mapping[str, str]) -> Counter[str]:
        return Counter(side.values())

    @property
    def compared(self) -> bool:
        """Some test passed on stock: without one there is nothing to hold +um to."""
        return self.totals(self.stock)[PASSED] > 0


def record(c: Comparison, title: str, source: str, notes: Sequence[str]) -> str:
    """The markdown record of one comparison."""
    lines = [f"# {title}", ""]
    if source:
        lines += [f"Upstream test file: {source}", ""]
    lines += [f"- {n}" for n in notes]
    if notes:
        lines.append("")
    lines += ["| run | " + " | ".join(OUTCOMES) + " | total |", "|---" * (len(OUTCOMES) + 2) + "|"]
    for name, side in (("stock", c.stock), ("+um", c.um)):
        t = c.totals(side)
        lines.append(f"| {name} | " + " | ".join(str(t[o]) for o in OUTCOMES) + f" | {len(side)} |")
    lines.append("")
    regressions = c.regressions
    if not c.compared:
        lines.append("**Nothing to compare: no test passed on stock** (see the runs' logs).")
    elif regressions:
        lines += [f"**{len(regressions)} test(s) passed on stock and not on +um:**", ""]
        lines += [f"- `{t}`: {c.outcome(c.um, t)}" for t in regressions]
    else:
        lines.append("**Every test that passed on stock passed on +um.**")
    lines.append("")
    others = [t for t in c.differences if t not in regressions]
    lines += ["## Every other test whose outcome differs", ""]
    if others:
        lines += ["| test | stock | +um |", "|---|---|---|"]
        lines += [f"| `{t}` | {c.outcome(c.stock, t)} | {c.outcome(c.um, t)} |" for t in others]
    else:
        lines.append("None.")
    lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stock", type=Path, required=True, help="junit XML of the stock run")
    parser.add_argument("--um", type=Path, required=True, help="junit XML of the +um run")
    parser.add_argument("--out", type=Path, required=True, help="the markdown record to write")
    parser.add_argument("--title", default="Upstream test_cuda.py: stock against +um")
    parser.add_argument("--source", default="", help="which upstream file, at which commit")
    parser.add_argument("--note", action="append", default=[], help="a line for the record")
    args = parser.parse_args(argv)
    try:
        c = Comparison(outcomes(args.stock), outcomes(args.um))
    except ReportError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    args.out.write_text(record(c, args.title, args.source, args.note))
    print(
        f"{len(c.tests)} tests; stock {dict(c.totals(c.stock))}, +um {dict(c.totals(c.um))}; "
        f"{len(c.regressions)} passed on stock and not on +um; record: {args.out}"
    )
    for t in c.regressions:
        print(f"  regression: {t} ({c.outcome(c.um, t)})")
    if not c.compared:
        print("error: no test passed on stock: nothing was compared", file=sys.stderr)
        return 2
    return 1 if c.regressions else 0


if __name__ == "__main__":
    sys.exit(main())
