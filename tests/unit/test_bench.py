"""bench/: what runs without a GPU (summaries, the record's command, the results file)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from bench import common, oversubscribe, step_time


def _step(model: str, mode: str, ms: float) -> dict[str, object]:
    return {"model": model, "mode": mode, "median_ms": ms}


def test_step_time_summary_ratios() -> None:
    samples = [
        _step("gpt", "stock", 10.0),
        _step("gpt", "um", 10.4),
        _step("gpt", "um-off", 10.1),
        _step("gpt", "stock", 12.0),
        _step("gpt", "um", 10.2),
        _step("gpt", "um-off", 11.0),
    ]
    row = step_time.summarize(samples)["gpt"]
    assert row["stock"] == {"best_ms": 10.0, "median_ms": 11.0}
    assert row["um"] == {"best_ms": 10.2, "median_ms": pytest.approx(10.3)}
    assert row["um/stock"]["best_ms"] == pytest.approx(1.02)
    assert row["um-off/stock"]["median_ms"] == pytest.approx(10.55 / 11.0)


def _over(mode: str, scale: float) -> dict[str, object]:
    phases = {"copy_in": 1.0 * scale, "square": 0.5 * scale, "copy_out": 2.0 * scale}
    return {"mode": mode, "bytes": 4 * 10**9, "runs": {"first": phases, "again": phases}}


def test_oversubscribe_summary_ratios_and_bandwidth() -> None:
    samples = [_over("um", 4.0), _over("stock", 2.0), _over("stock-pinned", 1.0)]
    summary = oversubscribe.summarize(samples)
    assert summary["seconds"]["stock-pinned"]["first"]["copy_in"] == {
        "seconds": 1.0,
        "GB/s": 4.0,
    }
    assert summary["ratios"]["um/stock"]["again"]["square"] == pytest.approx(2.0)
    assert summary["ratios"]["um/stock-pinned"]["first"]["copy_out"] == pytest.approx(4.0)


def test_command_line_hides_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["x", "--stock-pythonpath", "/a/b", "--um-pythonpath", "/c", "--rounds", "2"]
    monkeypatch.setattr(sys, "argv", argv)
    cmd = common.command_line("bench.step_time")
    assert cmd == "python -m bench.step_time --stock-pythonpath STOCK --um-pythonpath UM --rounds 2"


def test_write_names_the_file_after_benchmark_gpu_and_date(tmp_path: Path) -> None:
    record = {"machine": {"gpu": "NVIDIA H200 NVL"}, "summary": {}}
    path = common.write("step_time", record, tmp_path)
    assert path.parent == tmp_path
    assert path.name.startswith("step_time-h200-nvl-") and path.suffix == ".json"
    data = json.loads(path.read_text())
    assert data["benchmark"] == "step_time" and data["summary"] == {}
    assert list(tmp_path.iterdir()) == [path]  # no temporary file left behind


def test_save_records_command_machine_engine_and_samples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["x", "--um-pythonpath", "/somewhere", "--rounds", "1"])
    stock_machine = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "um_engine": None}
    um_machine = {**stock_machine, "torch": "2.11.0+um", "um_engine": "libtorch_um.so"}
    samples = [
        {"mode": "um", "median_ms": 2.0, "machine": um_machine},
        {"mode": "stock", "median_ms": 1.0, "machine": stock_machine},
    ]
    path = common.save("step_time", samples, {"rounds": 1}, {"s": 1}, str(tmp_path))
    record = json.loads(path.read_text())
    assert path.name.startswith("step_time-h100-80gb-hbm3-")
    assert record["command"] == "python -m bench.step_time --um-pythonpath UM --rounds 1"
    assert record["machine"] == stock_machine
    assert (record["um_torch"], record["um_engine"]) == ("2.11.0+um", "libtorch_um.so")
    assert record["settings"] == {"rounds": 1} and record["summary"] == {"s": 1}
    assert record["samples"] == [
        {"mode": "um", "median_ms": 2.0},
        {"mode": "stock", "median_ms": 1.0},
    ]
