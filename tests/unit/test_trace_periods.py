"""bench/probes/trace_periods.py on a synthetic ledger trace: a loop whose first periods use
other addresses than the steady ones, and an update that alternates two operators."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.probes import trace_periods as tp


def _trace(periods: list[list[list[int]]]) -> list[str]:
    """Each period a list of operators, each operator a list of range starts (1 MiB each);
    every operator opens with the signal's clock record, as the engine writes it."""
    lines = ["S 1000 134217728 0 0 1 0 1 6442450944 1 1 0"]
    for ops in periods:
        for ranges in ops:
            lines.append("K 7 9 0 0 0 0 1 0 0 1 0")
            lines += [f"T {a:x} 1048576 0 5 0 0 1 6442450944 1 1 0" for a in ranges]
            lines.append(f"P {ranges[0]:x} 1048576 0 0 0 0 1 12 0 1 0")
    return lines


STEADY = [[0x10, 0x20], [0x20, 0x30], [0x30, 0x40], [0x40, 0x10], [0x50], [0x60], [0x50], [0x60]]


def test_the_period_and_how_soon_addresses_settle() -> None:
    first = [[0x10, 0x21], [0x21, 0x31], [0x31, 0x41], [0x41, 0x10], *STEADY[4:]]
    second = [[0x10, 0x20], [0x20, 0x31], [0x31, 0x40], [0x40, 0x10], *STEADY[4:]]
    ops = tp.operators(_trace([first, second, STEADY, STEADY, STEADY]))
    assert len(ops) == 40 and ops[0] == ((0x10, 1 << 20), (0x21, 1 << 20))
    found = tp.period(ops)
    assert found is not None and found[0] == 8  # not 2, the update's alternation
    rows = tp.agreement(ops, 8)
    assert [r["operators"] for r in rows] == [8] * 5
    # The second period shares only the update's four operators with the first; the third
    # differs from the second in two operators; then all settle. New ranges: 0x20 and 0x40
    # in the second, 0x30 in the third.
    assert [r["same_as_a_period_earlier"] for r in rows] == [0, 4, 6, 8, 8]
    assert [r["new_ranges"] for r in rows] == [0, 2, 1, 0, 0]


def test_the_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "trace.123"
    path.write_text("\n".join(_trace([STEADY] * 3)) + "\n")
    out = tmp_path / "out.json"
    assert tp.main([str(path), "--json", str(out)]) == 0
    assert "period 8" in capsys.readouterr().out and out.exists()
    with pytest.raises(SystemExit, match="cannot read"):
        tp.main([str(tmp_path / "missing")])
    (tmp_path / "empty").write_text("")
    with pytest.raises(SystemExit, match="no repeating period"):
        tp.main([str(tmp_path / "empty")])
