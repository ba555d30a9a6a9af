"""bench.classes' pure parts (no torch): the steady step, the floor from the link measured in
the run, each mode's ratios and its outputs against stock's, and the printed table."""

from __future__ import annotations

from typing import Any

import pytest

from bench import classes

GiB = 1 << 30


def _samples() -> list[dict[str, Any]]:
    link = {"mode": "link", "h2d_bytes_per_s": 50e9, "d2h_bytes_per_s": 40e9}
    stock = {
        "mode": "stock",
        "steps": [0.3, 0.1, 0.1, 0.1],
        "outputs": [1.0, 2.0, 3.0, 4.0],
        "peak_allocated": 10 * GiB,
    }
    um = {
        "mode": "um",
        "steps": [2.0, 0.6, 0.5, 0.5],
        "outputs": [1.0, 2.0, 3.0, 4.5],
        "peak_allocated": 10 * GiB,
    }
    bad = {"mode": "um-prev", "error": "Traceback ...\nRuntimeError: boom"}
    return [link, stock, um, bad]


def test_steady_is_the_median_of_the_second_half() -> None:
    assert classes.steady([9.0, 9.0, 1.0, 3.0]) == 2.0
    assert classes.steady([]) is None


def test_summary_floor_ratios_and_outputs() -> None:
    s = classes.summarize(_samples(), 6 * GiB, "train-plain")
    # 4 GiB past the budget, out and back over the slower direction (40 GB/s).
    assert s["floor_s"] == pytest.approx(2 * 4 * GiB / 40e9)
    um = s["modes"]["um"]
    assert um["steady_s"] == 0.5 and um["first_s"] == 2.0
    assert um["second_over_steady"] == pytest.approx(1.2)
    assert um["third_over_steady"] == pytest.approx(1.0)
    assert um["over_floor"] == pytest.approx(0.5 / s["floor_s"])
    assert um["outputs_equal"] is False and um["max_abs_output_diff"] == pytest.approx(0.5)
    assert s["modes"]["stock"]["outputs_equal"] is True
    assert "boom" in s["modes"]["um-prev"]["error"]


def test_the_floor_is_stock_when_the_budget_holds_everything() -> None:
    s = classes.summarize(_samples(), 16 * GiB, "pattern-change")
    assert s["floor_s"] == 0.1


def test_table_names_every_mode_and_the_errors() -> None:
    text = classes.table(classes.summarize(_samples(), 6 * GiB, "train-plain"))
    assert "train-plain: floor" in text
    assert "um-prev" in text and "error: RuntimeError: boom" in text
    assert "differ 0.5" in text and "equal" in text


def test_the_table_gives_the_budget_as_a_share_of_stocks_peak() -> None:
    text = classes.table(classes.summarize(_samples(), 6 * GiB, "train-plain"))
    assert "budget 6.0 GiB, 60% of stock's peak" in text.splitlines()[0]


def test_the_signals_cost_an_operator_and_um_over_stock() -> None:
    samples = _samples()
    sig = {
        "mode": "um-signal",
        "steps": [2.0, 0.7, 0.6, 0.6, 0.6, 0.6],
        "outputs": [1.0, 2.0, 3.0, 4.0],
        "peak_allocated": 10 * GiB,
        # the observer's operators each step: 1000 in the last half
        "step_counters": [{"um.op_calls": n} for n in (5, 5, 5, 1000, 1000, 1000)],
    }
    s = classes.summarize([*samples, sig], 16 * GiB, "fit-small-ops")
    # 0.1 s more a step (0.6 against um's 0.5) over 1000 operators: 100 us an operator.
    assert s["signal"]["ops_per_step"] == 1000
    assert s["signal"]["ns_per_op"] == pytest.approx(1e5)
    assert s["um_over_stock"] == pytest.approx(5.0)
    text = classes.table(s)
    assert "operator signal: 100000 ns an operator" in text
    assert "um / stock, steady step: 5.000" in text


def test_no_signal_cost_without_its_counters() -> None:
    sig = {"mode": "um-signal", "steps": [1.0, 1.0, 1.0, 1.0], "outputs": [], "peak_allocated": 0}
    s = classes.summarize([*_samples(), sig], 16 * GiB, "fit-small-ops")
    assert "signal" not in s
