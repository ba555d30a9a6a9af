"""bench/: what runs without a GPU (summaries, the record's command, the results file)."""

from __future__ import annotations

import gzip
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from bench import (
    common,
    models,
    oversubscribe,
    residency,
    step_time,
)
from bench.probes import divergence_probe, link_cpu_probe


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
    assert "um/um-prev" not in row
    # The previous engine's workers: its ratio to stock, and the new engine's to it.
    samples += [_step("gpt", "um-prev", 12.0), _step("gpt", "um-prev", 11.0)]
    row = step_time.summarize(samples)["gpt"]
    assert row["um-prev"] == {"best_ms": 11.0, "median_ms": 11.5}
    assert row["um-prev/stock"]["best_ms"] == pytest.approx(1.1)
    assert row["um/um-prev"]["best_ms"] == pytest.approx(10.2 / 11.0)
    assert row["um/um-prev"]["median_ms"] == pytest.approx(10.3 / 11.5)


def test_step_time_um_prev_needs_the_previous_engine() -> None:
    with pytest.raises(common.BenchError, match="--prev-pythonpath"):
        step_time.main(["--modes", "stock,um-prev"])


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
    assert summary["first_s"] == {"um": 14.0, "stock": 7.0, "stock-pinned": 3.5}
    assert summary["per_pinned_floor"]["again"]["um"] == pytest.approx(4.0)
    assert "um/um-prev" not in summary["ratios"]
    with_prev = oversubscribe.summarize([*samples, _over("um-prev", 8.0)])
    assert with_prev["ratios"]["um/um-prev"]["first"]["square"] == pytest.approx(0.5)
    assert not any(name.startswith("um-managed-host/") for name in with_prev["ratios"])
    # host_alloc:managed is set against the plain um mode and every base as well
    managed = oversubscribe.summarize([*samples, _over("um-managed-host", 3.0)])
    assert managed["ratios"]["um-managed-host/um"]["again"]["copy_in"] == pytest.approx(0.75)
    assert managed["ratios"]["um-managed-host/stock-pinned"]["first"]["square"] == 3.0
    assert managed["first_s"]["um-managed-host"] == pytest.approx(10.5)
    assert "um/um-managed-host" not in managed["ratios"]


def test_oversubscribe_modes_are_checked_before_any_worker_runs() -> None:
    assert oversubscribe.selected_modes("stock-pinned,um", prev=False) == ["um", "stock-pinned"]
    assert oversubscribe.selected_modes("um,um-managed-host,stock", prev=True) == [
        "um",
        "um-prev",
        "um-managed-host",
        "um-prev-managed-host",
        "stock",
    ]
    assert "um-prev-managed-host" not in oversubscribe.selected_modes("um,stock", prev=True)
    for text, why in (
        ("um,stock,sideways", "unknown sideways"),
        ("um,um-prev,stock", "um-prev needs --prev-pythonpath"),
        ("um,um-prev-managed-host,stock", "um-prev-managed-host needs --prev-pythonpath"),
        ("um-managed-host,stock", "um and stock or stock-pinned are required"),
        ("um", "um and stock or stock-pinned are required"),
    ):
        with pytest.raises(common.BenchError, match=why):
            oversubscribe.selected_modes(text, prev=False)
    with pytest.raises(common.BenchError, match="unknown sideways"):
        oversubscribe.main(["--modes", "um,sideways"])


def test_command_line_hides_paths(monkeypatch: pytest.MonkeyPatch) -> None:
    argv = ["x", "--stock-pythonpath", "/a/b", "--um-pythonpath", "/c", "--rounds", "2"]
    monkeypatch.setattr(sys, "argv", argv)
    cmd = common.command_line("bench.step_time")
    assert cmd == "python -m bench.step_time --stock-pythonpath STOCK --um-pythonpath UM --rounds 2"
    monkeypatch.setattr(sys, "argv", ["x", "--prev-pythonpath", "/tmp/s/prev", "train"])
    assert common.command_line("bench.residency").endswith("--prev-pythonpath PREV train")


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


GIB = 1 << 30


def _res(mode: str, median_s: float, **extra: object) -> dict[str, Any]:
    return {"mode": mode, "median_s": median_s, "first_step_s": 2 * median_s, **extra}


def _link(h2d: float, d2h: float) -> dict[str, Any]:
    return {"mode": "link", "h2d_bytes_per_s": h2d, "d2h_bytes_per_s": d2h}


def test_residency_parse_size() -> None:
    assert residency.parse_size("8GiB") == 8 * GIB
    assert residency.parse_size("1.5G") == 3 * GIB // 2
    assert residency.parse_size("512MB") == 512 << 20
    assert residency.parse_size(str(2 * GIB)) == 2 * GIB
    for bad in ("lots", "0GiB", "-1G", "8iB", ""):
        with pytest.raises(common.BenchError, match="not a size"):
            residency.parse_size(bad)


def test_residency_floor_train_is_full_duplex_bound_by_the_slower_direction() -> None:
    # peak 20 GiB, budget 8 GiB: 12 GiB out and back each step, both directions at once
    floor = residency.floor_seconds("train", 0.1, 20 * GIB, 8 * GIB, 60e9, 48e9)
    assert floor == pytest.approx(12 * GIB / 48e9)
    # compute-bound when the overflow moves faster than the in-memory step
    assert residency.floor_seconds("train", 5.0, 20 * GIB, 8 * GIB, 60e9, 48e9) == 5.0
    # it fits: the floor is the in-memory time
    assert residency.floor_seconds("train", 0.1, 4 * GIB, 8 * GIB, 60e9, 48e9) == 0.1
    assert residency.floor_seconds("train", None, 20 * GIB, 8 * GIB, 60e9, 48e9) is None
    assert residency.floor_seconds("train", 0.1, 20 * GIB, 8 * GIB, 0.0, 0.0) is None


def test_residency_floor_train_counts_both_directions_on_a_shared_link() -> None:
    # 12 GiB out and back; the directions share 52 GB/s: 24 GiB queue behind each other
    floor = residency.floor_seconds("train", 0.1, 20 * GIB, 8 * GIB, 52e9, 52e9, 52e9)
    assert floor == pytest.approx(24 * GIB / 52e9)
    # a full-duplex link (both = h2d + d2h): the slower direction bounds it, as before
    floor = residency.floor_seconds("train", 0.1, 20 * GIB, 8 * GIB, 60e9, 48e9, 108e9)
    assert floor == pytest.approx(12 * GIB / 48e9)
    # inference moves one way: the shared rate does not enter
    floor = residency.floor_seconds("infer", 0.01, 5 * GIB, 2 * GIB, 50e9, 50e9, 50e9)
    assert floor == pytest.approx(3 * GIB / 50e9)


def test_residency_floor_infer_counts_host_to_device_once() -> None:
    floor = residency.floor_seconds("infer", 0.01, 5 * GIB, 2 * GIB, 50e9, 10e9)
    assert floor == pytest.approx(3 * GIB / 50e9)


def test_at_full_speed_keeps_the_times_whose_canary_was_fast() -> None:
    pairs = [(10.0, 1.0), (11.0, 1.25), (30.0, 1.26), (12.0, 2.0)]
    assert common.at_full_speed(pairs, fastest=1.0) == [10.0, 11.0]
    # the fastest canary of everything compared, not of these pairs alone
    assert common.at_full_speed(pairs, fastest=0.5) == []
    assert common.at_full_speed([], fastest=1.0) == []


def test_fit_probe_counts_the_events_of_timed_steps_only() -> None:
    from bench.probes import fit_probe

    counter = {"events": 500}  # the workload's setup made these before the first step
    synced: list[int] = []

    class Cuda:
        @staticmethod
        def synchronize() -> None:
            synced.append(counter["events"])

    class Torch:
        cuda = Cuda

    marks: list[float] = []

    def step() -> None:
        counter["events"] += 10 if len(synced) <= 2 * 2 else 7  # warm-up steps make more
        marks.extend(time.perf_counter() for _ in range(3))  # as sgd_stepper's marks do

    rows, per_step = fit_probe.step_times(
        Torch, step, steps=3, warmup=2, events=lambda: counter["events"], marks=marks
    )
    assert per_step == 7
    assert len(rows) == 3
    assert all(
        host >= 0 and cpu >= 0 and others >= 0 and wall >= host
        for host, cpu, others, wall, _ in rows
    )
    # three phases a step, which add up to no more than the step's host time
    assert all(len(ph) == 3 and 0 <= sum(ph) <= host + 1e-6 for host, _, _, _, ph in rows)
    assert len(synced) == 2 * 5  # idle before each step and done after it


def test_hooks_probe_by_route_splits_the_forwards_and_the_canaries_after_them() -> None:
    from bench.probes import hooks_probe

    first = {
        "routes": ["lean", "green", "green", "lean", "lean"],
        "wall_s": [0.040, 0.050, 0.052, 0.044, 0.042],
        "host_s": [0.030, 0.031, 0.032, 0.033, 0.034],
        "canary_s": [0.001, 0.002, 0.001, 0.001, 0.002],
    }
    got = hooks_probe.by_route(first, slow_canary=0.0015)
    assert list(got) == ["lean", "green"]
    assert got["lean"]["forwards"] == 3 and got["green"]["forwards"] == 2
    assert got["lean"]["wall_median_s"] == pytest.approx(0.042)
    assert got["green"]["host_median_s"] == pytest.approx(0.0315)
    # after lean (forwards 0, 3): canaries 0.002 (slow) and 0.002 (slow); the last has none
    assert (got["lean"]["slow_canary_after"], got["lean"]["of"]) == (2, 2)
    # after green (forwards 1, 2): 0.001 and 0.001
    assert (got["green"]["slow_canary_after"], got["green"]["of"]) == (0, 2)


def test_residency_floor_generate_counts_every_forward() -> None:
    # 0.5 GiB past the budget comes in for each of the step's NEW_TOKENS forwards
    n = residency.NEW_TOKENS
    floor = residency.floor_seconds("generate", 0.01, 5 * GIB // 2, 2 * GIB, 50e9, 10e9)
    assert floor == pytest.approx(n * GIB / 2 / 50e9)
    # the in-memory generation bounds it where the link would be faster
    assert residency.floor_seconds("generate", 5.0, 5 * GIB // 2, 2 * GIB, 50e9, 10e9) == 5.0


def test_residency_generate_agreement_is_the_share_of_tokens_that_differ() -> None:
    ref = {"mode": "stock", "tokens": [[1, 2, 3, 4], [1, 2, 3, 4]]}
    same = {"mode": "um", "tokens": [[1, 2, 3, 4], [1, 2, 3, 4]]}
    one_off = {"mode": "um", "tokens": [[1, 2, 3, 4], [1, 2, 9, 4]]}
    short = {"mode": "um", "tokens": [[1, 2], [1, 2, 3, 4]]}
    assert residency.agreement("generate", ref, same) == 0.0
    assert residency.agreement("generate", ref, one_off) == pytest.approx(0.25)
    assert residency.agreement("generate", ref, short) == pytest.approx(0.5)
    assert residency.differing_share([], []) == 0.0


def test_residency_summary_generate_has_tokens_per_second_and_its_floor() -> None:
    tokens = {"tokens": [[5] * 8]}
    samples = [
        _link(50e9, 40e9),
        _res("stock", 0.4, max_allocated_bytes=3 * GIB, **tokens),
        _res("um-predict", 0.8, tokens=[[5] * 7 + [6]]),
        _res("accelerate", 3.2, **tokens),
    ]
    summary, analysis = residency.summarize("generate", samples, 2 * GIB)
    assert list(summary["modes"]) == list(residency.MODES["generate"])
    floor = residency.NEW_TOKENS * GIB / 50e9
    assert summary["floor_s"] == pytest.approx(floor)
    rows = analysis["modes"]
    batch = residency.BATCH["generate"][0]
    assert rows["um-predict"]["tokens_per_s"] == pytest.approx(batch * residency.NEW_TOKENS / 0.8)
    assert rows["um-predict"]["per_peer"] == pytest.approx(0.25)
    assert rows["um-predict"]["agreement"] == pytest.approx(1 / 8)
    assert rows["um"]["tokens_per_s"] is None  # not run
    assert analysis["agreement_metric"].startswith("max share of generated tokens")
    text = residency.table("generate", summary, analysis)
    assert f"max(stock_s, {residency.NEW_TOKENS} * over / h2d)" in text
    per_step = batch * residency.NEW_TOKENS
    assert f"tokens/s: stock {per_step / 0.4:.0f}; um-predict {per_step / 0.8:.0f}" in text
    # infer and train print no rate
    stock = _res("stock", 0.4, max_allocated_bytes=3 * GIB, checksums=[1.0])
    infer = residency.table("infer", *residency.summarize("infer", [samples[0], stock], 2 * GIB))
    assert "tokens/s" not in infer


def test_residency_agreement() -> None:
    ref = {"mode": "stock", "losses": [10.0, 9.0, 8.0], "checksums": [100.0, 100.0]}
    um = {"mode": "um", "losses": [10.0, 9.25, 7.5], "checksums": [101.0, 99.0]}
    assert residency.agreement("train", ref, um) == pytest.approx(0.5)
    assert residency.agreement("infer", ref, um) == pytest.approx(0.01)
    assert residency.agreement("train", ref, {"mode": "um", "oom": True}) is None
    assert residency.agreement("train", None, um) is None


def test_residency_summary_train() -> None:
    losses = {"losses": [10.0, 9.0]}
    samples: list[dict[str, Any]] = [
        _link(50e9, 40e9),
        _res("stock", 0.1, max_allocated_bytes=20 * GIB, **losses),
        _res("um-static", 4.0, losses=[10.0, 9.5]),
        _res("um", 1.0, **losses),
        {"mode": "stock-fraction", "oom": True, "message": "CUDA out of memory"},
        {"mode": "fsdp2-offload-ckpt", "error": "Traceback ...\nRuntimeError: nccl"},
        _res("stock", 0.3, max_allocated_bytes=21 * GIB, losses=[10.0, 9.0]),
        _res("um", 2.0, **losses),
        _res("um-prev", 3.0, **losses),
    ]
    summary, analysis = residency.summarize("train", samples, 8 * GIB)
    assert set(summary) == {"floor_s", "modes"}
    assert list(summary["modes"]) == list(residency.MODES["train"])
    floor = 13 * GIB / 40e9  # the larger stock peak, the slower direction
    assert summary["floor_s"] == pytest.approx(floor)
    assert summary["modes"] == {
        "stock": pytest.approx(0.2),
        "um-nobudget": None,  # not run
        "um-static": 4.0,
        "um": 1.5,
        "um-prev": 3.0,
        "um-nohooks": None,  # not run
        "um-predict": None,  # not run
        "um-predict-stage-lean": None,  # not run
        "um-predict-stage-lean2": None,  # not run
        "fsdp2-offload-ckpt": None,  # error
        "stock-fraction": None,  # out of memory
    }
    rows = analysis["modes"]
    assert rows["um"]["per_um_static"] == pytest.approx(1.5 / 4.0)
    assert rows["um"]["per_um_prev"] == pytest.approx(0.5)
    assert rows["um-prev"]["per_um"] == pytest.approx(2.0)
    assert rows["um"]["per_peer"] is None  # the peer failed
    assert rows["um"]["per_floor"] == pytest.approx(1.5 / floor)
    assert rows["um"]["first_step_s"] == pytest.approx(3.0)
    assert rows["um"]["agreement"] == 0.0 and rows["um-static"]["agreement"] == 0.5
    assert rows["stock-fraction"]["oom"] == 1 and rows["stock-fraction"]["seconds"] is None
    assert rows["fsdp2-offload-ckpt"]["errors"] == ["Traceback ...\nRuntimeError: nccl"]
    assert rows["um-nobudget"]["runs"] == 0
    assert analysis["floor"]["over_budget_bytes"] == 13 * GIB
    text = residency.table("train", summary, analysis)
    assert "OOM in 1/1" in text and "RuntimeError: nccl" in text and "not run" in text
    assert "max(stock_s, over / min(h2d, d2h), 2 * over / both)" in text
    um_line = next(line for line in text.splitlines() if line.startswith("um "))
    assert "0.375" in um_line


def test_residency_summary_infer_without_stock_has_no_floor() -> None:
    samples = [_link(50e9, 40e9), _res("um", 0.5, checksums=[1.0]), _res("accelerate", 0.2)]
    summary, analysis = residency.summarize("infer", samples, 2 * GIB)
    assert summary == {
        "floor_s": None,
        "modes": {
            "stock": None,
            "um-static": None,
            "um": 0.5,
            "um-prev": None,
            "um-copies": None,
            "um-nohooks": None,
            "um-predict": None,
            "um-predict-advice": None,
            "accelerate": 0.2,
        },
    }
    assert analysis["modes"]["um"]["per_floor"] is None
    assert analysis["modes"]["um"]["agreement"] is None
    assert "-" in residency.table("infer", summary, analysis)


def test_residency_selected_modes() -> None:
    assert residency.selected_modes("infer", None) == [
        "stock",
        "um-static",
        "um",
        "um-copies",
        "um-nohooks",
        "um-predict",
        "um-predict-advice",
        "accelerate",
    ]
    assert residency.selected_modes("train", "um, stock") == ["um", "stock"]
    with pytest.raises(common.BenchError, match="train modes are"):
        residency.selected_modes("train", "accelerate")
    assert "um-prev" in residency.selected_modes("infer", None, prev=True)
    with pytest.raises(common.BenchError, match="--prev-pythonpath"):
        residency.selected_modes("train", "um,um-prev")


def test_residency_models_are_named_and_know_their_blocks() -> None:
    assert models.DEFAULT in models.MODELS and "llama-1.1b" in models.MODELS
    with pytest.raises(ValueError, match="unknown model 'gpt5'.*known: gpt2-1.28b, llama-1.1b"):
        models.spec("gpt5")
    llama = models.spec("llama-1.1b")
    layers = [object(), object()]
    fake = SimpleNamespace(model=SimpleNamespace(layers=layers))
    assert llama.blocks(fake) == layers and llama.block == "LlamaDecoderLayer"
    # Every model has its own cache file, named with the cache's format.
    paths = {models.cache_path(s) for s in models.MODELS.values()}
    assert len(paths) == len(models.MODELS)
    assert all(f".v{models.CACHE_FORMAT}." in p.name for p in paths)


def test_residency_passes_the_model_to_every_worker_and_the_record(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    seen: list[list[str]] = []

    def fake_run_all(workload: str, modes: list[str], worker_args: list[str], *rest: Any) -> Any:
        seen.append(worker_args)
        return [{**_link(50e9, 40e9), "machine": {"gpu": "NVIDIA H200"}}]

    monkeypatch.setattr(residency, "run_all", fake_run_all)
    residency.main(["infer", "--model", "llama-1.1b", "--modes", "stock", "--out", str(tmp_path)])
    assert seen[0][seen[0].index("--model") + 1] == "llama-1.1b"
    (written,) = tmp_path.glob("residency-infer-*.json")
    assert json.loads(written.read_text())["settings"]["model"] == "llama-1.1b"
    with pytest.raises(SystemExit):  # argparse names the choices
        residency.main(["infer", "--model", "gpt5"])


def test_residency_ranks_are_checked_before_any_worker_runs() -> None:
    with pytest.raises(common.BenchError, match="--ranks must be at least 1"):
        residency.main(["ddp", "--ranks", "0"])
    with pytest.raises(common.BenchError, match="processes of the ddp workload"):
        residency.main(["train", "--ranks", "2"])
    with pytest.raises(common.BenchError, match="um-predict-pair runs .* --ranks 2"):
        residency.main(["ddp", "--ranks", "1", "--modes", "um-predict,um-predict-pair"])


def test_residency_record_tolerates_failed_workers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "argv", ["x", "train", "--stock-pythonpath", "/s", "--rounds", "1"])
    stock_machine = {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "um_engine": None}
    um_machine = {**stock_machine, "um_engine": "libtorch_um.so"}
    samples: list[dict[str, Any]] = [
        {**_link(50e9, 40e9), "machine": stock_machine},
        {"mode": "stock", "error": "worker gave no result"},
        {**_res("um", 1.0, losses=[1.0]), "machine": um_machine},
    ]
    settings = {"budget_bytes": 8 * GIB, "workload": "train", "batch": [4, 1024]}
    rec = residency.record("train", samples, settings)
    assert rec["command"] == "python -m bench.residency train --stock-pythonpath STOCK --rounds 1"
    assert rec["machine"] == stock_machine and rec["um_engine"] == "libtorch_um.so"
    assert rec["summary"]["modes"]["um"] == 1.0 and rec["summary"]["floor_s"] is None
    assert all("machine" not in s for s in rec["samples"])
    path = common.write("residency-train", rec, tmp_path)
    assert path.name.startswith("residency-train-h200-")
    assert json.loads(path.read_text())["summary"] == rec["summary"]
    with pytest.raises(common.BenchError, match="no worker got as far as CUDA"):
        residency.record("train", [{"mode": "stock", "error": "boom"}], settings)


def test_residency_worker_reports_a_missing_torch_as_an_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails
    residency.worker("um", "train", 1, 0, 8 * GIB)
    line = capsys.readouterr().out.strip()
    assert line.startswith(common.MARK)
    rec = json.loads(line[len(common.MARK) :])
    assert rec["mode"] == "um" and "ModuleNotFoundError" in rec["error"]


def test_counter_change_diffs_counts_and_keeps_levels() -> None:
    before = {"um.evict_bytes": 10, "predict.hits": 3, "predict.lookahead_bytes": 256}
    after = {"um.evict_bytes": 25, "predict.hits": 3, "predict.lookahead_bytes": 1024}
    after["predict.target_bytes"] = 7
    assert common.counter_change(before, after) == {
        "um.evict_bytes": 15,
        "predict.hits": 0,
        "predict.lookahead_bytes": 1024,  # a level: as it is after, not 768
        "predict.target_bytes": 7,
    }


def test_residency_sets_each_mode_against_the_peer_round_by_round() -> None:
    losses = {"losses": [1.0]}
    samples = [
        _link(50e9, 50e9),
        _res("stock", 0.1, max_allocated_bytes=20 * GIB, round=1, **losses),
        _res("um-predict", 0.65, round=1, **losses),
        _res("fsdp2-offload-ckpt", 1.4, round=1, **losses),
        _res("um-predict", 0.64, round=2, **losses),
        _res("fsdp2-offload-ckpt", 1.2, round=2, **losses),
        _res("um-predict", 0.66, round=3, **losses),
        {"mode": "fsdp2-offload-ckpt", "round": 3, "error": "Traceback ..."},
        _res("um", 1.1, **losses),  # a record from before rounds were kept
    ]
    summary, analysis = residency.summarize("train", samples, 8 * GIB)
    rows = analysis["modes"]
    # within each round, against the peer's time of that round; round 3's peer failed
    assert rows["um-predict"]["per_peer_by_round"] == pytest.approx([0.65 / 1.4, 0.64 / 1.2])
    assert rows["um-predict"]["per_peer"] == pytest.approx(0.65 / 1.3)  # medians' ratio
    assert rows["um"]["per_peer_by_round"] is None
    assert rows["fsdp2-offload-ckpt"]["per_peer_by_round"] is None  # the peer itself
    text = residency.table("train", summary, analysis)
    assert "/peer round by round: stock 0.071; um-predict 0.464, 0.533" in text


def test_residency_ddp_uses_the_training_floor_and_losses() -> None:
    losses = {"losses": [10.0, 9.0]}
    samples = [
        _link(50e9, 40e9),
        _res("stock", 0.2, max_allocated_bytes=20 * GIB, **losses),
        _res("um", 1.0, losses=[10.0, 9.25]),
    ]
    summary, analysis = residency.summarize("ddp", samples, 12 * GIB)
    assert list(summary["modes"]) == list(residency.MODES["ddp"])
    assert summary["floor_s"] == pytest.approx(8 * GIB / 40e9)  # the slower direction
    assert analysis["modes"]["um"]["agreement"] == 0.25
    assert residency.selected_modes("ddp", None) == [
        "stock",
        "um-static",
        "um",
        "um-predict",
        "um-predict-1gpu",
        "um-predict-pair",
        "stock-fraction",
    ]
    assert "ranks_per_single" not in analysis["modes"]["um"]  # no one-GPU run in it


def test_residency_ddp_sets_each_rank_against_one_gpu_at_the_same_budget() -> None:
    def ranked(*medians: float, round: int = 1) -> dict[str, Any]:
        ranks = [{"median_s": m} for m in medians]
        return _res("um-predict", max(medians), ranks=ranks, losses=[1.0], round=round)

    samples = [
        _link(50e9, 50e9),
        _res("stock", 0.2, max_allocated_bytes=20 * GIB, losses=[1.0]),
        ranked(1.1, 1.3),
        ranked(1.0, 1.2, round=2),
        ranked(1.2, 9.0, round=3),
        _res("um-predict-1gpu", 1.0, losses=[1.0], round=1),
        _res("um-predict-1gpu", 0.5, losses=[1.0], round=2),
        _res("um-predict-1gpu", 2.0, losses=[1.0], round=4),
        {**ranked(1.05, 1.15), "mode": "um-predict-pair"},
        {"mode": "um", "oom": True},
    ]
    summary, analysis = residency.summarize("ddp", samples, 12 * GIB)
    assert summary["modes"]["um-predict-1gpu"] == 1.0
    # its tokens are not the ranks': its losses are not held against stock's
    assert analysis["modes"]["um-predict-1gpu"]["agreement"] is None
    assert analysis["modes"]["um-predict-pair"]["agreement"] is None  # no DDP: own tokens
    assert analysis["modes"]["um-predict-pair"]["ranks_per_single"] == pytest.approx([1.05, 1.15])
    assert analysis["modes"]["um-predict"]["agreement"] == 0.0
    # per rank, the median over the three workers of that rank's own median
    assert analysis["modes"]["um-predict"]["ranks_per_single"] == pytest.approx([1.1, 1.3])
    assert analysis["modes"]["um"]["ranks_per_single"] is None  # no rank finished
    # round by round: rounds 1 and 2 had both; round 3 had no one-GPU run, round 4 no DDP
    assert analysis["modes"]["um-predict"]["ranks_per_single_by_round"] == [
        pytest.approx([1.1, 1.3]),
        pytest.approx([2.0, 2.4]),
    ]
    assert analysis["modes"]["um"]["ranks_per_single_by_round"] is None
    text = residency.table("ddp", summary, analysis)
    assert "each rank / um-predict-1gpu (bar: at most 1.2): um-predict 1.100, 1.300" in text
    assert "of the same round: um-predict [1.100, 1.300], [2.000, 2.400]" in text
    train, _ = residency.summarize("train", samples, 12 * GIB)
    assert "um-predict-1gpu" not in train["modes"]  # a ddp mode only


def test_residency_ddp_merges_ranks_by_the_slower_one() -> None:
    a = {"mode": "um", "times_s": [3.0, 1.0, 2.0, 1.0], "peak_host_rss_bytes": 1, "machine": {}}
    b = {"mode": "um", "times_s": [2.0, 1.5, 1.0, 4.0], "peak_host_rss_bytes": 2, "machine": {}}
    merged = residency.merge_ranks([a, b], warmup=1)
    assert merged["times_s"] == [3.0, 1.5, 2.0, 4.0] and merged["first_step_s"] == 3.0
    assert merged["median_s"] == 2.0 and merged["peak_host_rss_bytes"] == 3
    assert [set(r) for r in merged["ranks"]] == [set(a) - {"machine"}] * 2
    oom = {"mode": "um", "oom": True, "message": "CUDA out of memory"}
    failed = residency.merge_ranks([a, oom], warmup=1)
    assert failed["oom"] and failed["rank"] == 1


def _bench_process(body: str) -> subprocess.Popen[str]:
    """A process that runs ``body`` (defining ``work``) under bench.common.run_main."""
    code = f"import os, time\nfrom bench.common import run_main\n{body}\nrun_main('t', work)\n"
    return subprocess.Popen(
        [sys.executable, "-c", code],
        cwd=common.REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_workers_past_their_time_say_where_they_hung(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(common, "STACKS_GRACE_S", 1)
    quick = _bench_process("def quick():\n    return 0\nwork = quick")
    stuck = _bench_process("def stuck_in_here():\n    time.sleep(120)\nwork = stuck_in_here")
    with pytest.raises(subprocess.TimeoutExpired) as caught:
        common.communicate_all([quick, stuck], timeout=3)
    assert quick.returncode == 0 and stuck.returncode is not None  # none left running
    text = common.timeout_text(caught.value)
    assert "--- process 1 ---" in text
    assert "stuck_in_here" in text  # faulthandler's dump of the hung one's main thread
    # one-line summaries show the last line
    assert common.last_line(text) == "timed out after 3 s (stacks above)"


def test_a_crashed_worker_prints_its_stack() -> None:
    proc = _bench_process("def aborts_here():\n    os.abort()\nwork = aborts_here")
    ((_, err),) = common.communicate_all([proc], timeout=60)
    assert proc.returncode != 0
    assert "Fatal Python error: Aborted" in err and "aborts_here" in err


def test_worker_result_reads_the_last_result_line() -> None:
    out = f'noise\n{common.MARK}{{"x": 1}}\n{common.MARK}{{"x": 2}}\ntrailer\n'
    assert common.worker_result(["py", "-m", "m"], 0, out) == {"x": 2}
    with pytest.raises(common.BenchError, match="gave no result \\(exit 3\\)"):
        common.worker_result(["py", "-m", "m"], 3, "Traceback ...", "boom")


def test_timeline_gaps_split_into_host_late_and_device_wait() -> None:
    from bench.probes import timeline_probe

    def kernel(ts: float, dur: float, corr: int, name: str = "sm90_gemm") -> dict[str, object]:
        args = {"stream": 7, "correlation": corr}
        return {"cat": "kernel", "ph": "X", "ts": ts, "dur": dur, "name": name, "args": args}

    def launch(ts: float, corr: int) -> dict[str, object]:
        args = {"correlation": corr}
        return {
            "cat": "cuda_runtime",
            "ph": "X",
            "ts": ts,
            "dur": 5.0,
            "name": "cudaLaunchKernel",
            "tid": 3,
            "args": args,
        }

    def call(ts: float, name: str, tid: int = 3) -> dict[str, object]:
        return {"cat": "cuda_runtime", "ph": "X", "ts": ts, "dur": 1.0, "name": name, "tid": tid}

    events = [
        kernel(0, 10, 1),
        launch(1500, 2),  # launched 1490 us into a 1990 us gap: mostly the host's
        kernel(2000, 10, 2, "vectorized_elementwise_kernel"),
        call(1700, "cudaStreamWaitEvent"),  # queued on the stream between the two launches
        call(1800, "cudaEventRecord"),  # orders nothing
        call(1900, "INVALID", tid=4),  # another thread's
        launch(2005, 3),  # launched at once, ran 3000 us later: waiting on the device
        kernel(5000, 10, 3, "multi_tensor_apply_kernel"),
        kernel(9000, 10, 4),  # outside the window
        {"cat": "gpu_memset", "ph": "X", "ts": 2100, "dur": 2500, "args": {"stream": 7}},
    ]
    out = timeline_probe.summarize(events, 0, 8000)
    assert out["kernels"] == 3
    assert out["families"] == {
        "elementwise": {"s": 0.0, "n": 1},
        "gemm": {"s": 0.0, "n": 1},
        "optimizer": {"s": 0.0, "n": 1},
    }
    stream = out["stream"]
    assert stream["idle_s"] == pytest.approx((1990 + 2990) / 1e6)
    assert stream["host_late_s"] == pytest.approx((1505 - 10 + 2010 - 2010) / 1e6)
    assert stream["device_wait_s"] == pytest.approx(stream["idle_s"] - stream["host_late_s"])
    assert stream["gaps_over_1ms"] == 2
    # the first gap's kernel before has no launch in the trace; the second's wait follows
    # the stream wait its thread queued between the launches
    assert stream["device_wait_after"] == {
        "cudaStreamWaitEvent": pytest.approx(2990 / 1e6, abs=1e-4),  # rounded to 0.1 ms
        "unknown launch": pytest.approx(495 / 1e6, abs=1e-4),
    }
    assert out["api_s"]["3:cudaLaunchKernel"] == 0.0
    # the waits, longest first, with the kernels on either side
    assert [w["after"] for w in stream["largest_device_waits"]] == [
        "cudaStreamWaitEvent",
        "unknown launch",
    ]
    assert stream["largest_device_waits"][0]["kernel_before"] == "vectorized_elementwise_kernel"
    assert stream["largest_device_waits"][0]["kernel"] == "multi_tensor_apply_kernel"
    assert stream["largest_device_waits"][0]["ms"] == pytest.approx(2.99)
    assert out["memsets_by_stream"] == {"7": {"n": 1, "busy_s": 0.0025, "largest_ms": [2.5]}}


def test_timeline_kernels_by_stream_and_their_overlap() -> None:
    from bench.probes import timeline_probe

    def kernel(ts: float, dur: float, stream: int) -> dict[str, object]:
        return {"cat": "kernel", "ph": "X", "ts": ts, "dur": dur, "name": "k", "args": {"stream": stream}}

    events = [
        kernel(0, 100, 7),  # compute
        kernel(50, 100, 7),  # overlaps the one before on its own stream: counted once
        kernel(0, 1000, 20),  # copy in
        kernel(500, 1000, 21),  # copy out: 500 us with the copy in, 0 with compute
        kernel(1900, 100, 21),
        kernel(3000, 10, 22),  # a fourth stream, not among the three busiest
    ]
    rows = timeline_probe.summarize(events, 0, 8000)["kernels_by_stream"]
    assert rows["7"] == {"n": 2, "busy_s": 0.00015}
    assert rows["20"] == {"n": 1, "busy_s": 0.001}
    assert rows["21"] == {"n": 2, "busy_s": 0.0011}
    assert rows["22"] == {"n": 1, "busy_s": 0.00001}
    assert rows["overlap_s"] == {"21&20": 0.0005, "21&7": 0.0, "20&7": 0.00015}


def test_timeline_unpack_parts_split_the_backward_at_the_first_save_that_left() -> None:
    from bench.probes import timeline_probe

    def read(left: bool, evicted: int, room: int) -> dict[str, object]:
        return {"left": left, "evicted": evicted, "room": room}

    rows = [
        read(False, 150, 40),  # the loss's backward evicted 50 before the first read
        read(False, 170, 10),
        read(True, 200, 90),  # the first save that left: 50 more while reading kept saves
        read(False, 200, 70),  # a small save that stayed, read among those brought back
        read(True, 260, 60),
    ]
    assert timeline_probe.unpack_parts(rows, 100) == {
        "kept_reads": 2,
        "left_reads": 3,
        "evicted_before_reads": 50,
        "evicted_while_kept": 50,
        "evicted_while_left": 60,
        "min_room_kept": 10,
        "min_room_left": 60,
    }
    assert timeline_probe.unpack_parts(rows[2:], 200)["evicted_while_kept"] == 0
    assert timeline_probe.unpack_parts([], 0)["min_room_left"] is None


def test_timeline_phase_bins_say_when_the_link_and_the_compute_stream_worked(
    tmp_path: Path,
) -> None:
    from bench.probes import timeline_probe

    def ev(cat: str, ts: float, dur: float, stream: int, name: str = "k", nbytes: int = 0) -> dict[str, Any]:
        args = {"stream": stream, "bytes": nbytes}
        return {"cat": cat, "ph": "X", "ts": ts, "dur": dur, "name": name, "args": args}

    def phase(ts: float, dur: float, name: str) -> dict[str, Any]:
        return {"cat": "user_annotation", "ph": "X", "ts": ts, "dur": dur, "name": f"um_probe_phase:{name}"}

    events = [
        phase(1000, 30_000, "backward"),
        ev("gpu_memcpy", 1000, 2000, 58, "Memcpy HtoD (Pinned -> Managed)", 2 * 10**8),
        ev("gpu_memcpy", 12_000, 100, 54, "Memcpy DtoH (Managed -> Pinned)", 10**8),
        ev("kernel", 11_500, 3000, 7),  # the compute stream starts in the second bin
        ev("kernel", 22_000, 1000, 7),
        ev("kernel", 25_000, 500, 46),  # a quieter stream is not counted
        ev("kernel", 40_000, 9000, 7),  # after the phase
        phase(50_000, 5000, "backward"),
    ]
    bins = timeline_probe.phase_bins(events, 1000, 31_000, 10_000)
    assert bins == {
        "bin_ms": 10.0,
        "first_kernel_ms": 10.5,
        "in_GB": [0.2, 0.0, 0.0],
        "out_GB": [0.0, 0.1, 0.0],
        "compute_ms": [0.0, 3.0, 1.0],
    }
    # a kept trace read back: its phases numbered in order, bins when asked
    trace = tmp_path / "t.json.gz"
    with gzip.open(trace, "wt") as f:
        json.dump({"traceEvents": events}, f)
    rows = [json.loads(line) for line in _run_probe(["--from-trace", str(trace), "--bins", "10"])]
    assert [(r["step"], r["phase"], r["s"]) for r in rows] == [(0, "backward", 0.03), (1, "backward", 0.005)]
    assert rows[0]["bins"] == bins
    assert "bins" not in json.loads(_run_probe(["--from-trace", str(trace)])[0])
    bad = tmp_path / "bad.json.gz"
    bad.write_text("not gzip")
    with pytest.raises(common.BenchError, match="cannot read .* as a trace kept by --trace"):
        timeline_probe.main(["--from-trace", str(bad)])
    with pytest.raises(common.BenchError, match="give --mode stock or --mode um"):
        timeline_probe.main([])
    with pytest.raises(common.BenchError, match="add --phases"):
        timeline_probe.main(["--mode", "um", "--bins", "10"])
    with pytest.raises(common.BenchError, match="takes milliseconds"):
        timeline_probe.main(["--from-trace", str(trace), "--bins", "-1"])


def _run_probe(argv: list[str]) -> list[str]:
    import contextlib
    import io

    from bench.probes import timeline_probe

    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert timeline_probe.main(argv) == 0
    return buf.getvalue().splitlines()


def test_error_text_keeps_no_path_of_the_machine() -> None:
    def fail_in(filename: str) -> None:
        exec(compile("raise ValueError('boom')", filename, "exec"))

    try:
        fail_in("/opt/x/.venv/lib/python3.12/site-packages/torch/nn/mod.py")
    except ValueError:
        text = common.error_text()
    assert '"site-packages/torch/nn/mod.py"' in text and "/opt/x" not in text
    assert str(common.REPO) not in text and 'File "tests/unit/test_bench.py"' in text
    try:
        fail_in("/tmp/torch-um-stage.ab12Cd/site/torch/cuda/um.py")
    except ValueError:
        text = common.error_text()
    assert '"stage/site/torch/cuda/um.py"' in text and "/tmp/" not in text
    assert text.rstrip().endswith("ValueError: boom")
    crash = f'  File "{common.REPO}/bench/residency.py", line 1\nRuntimeError: x\n'
    with pytest.raises(common.BenchError) as info:
        common.worker_result(["python", "-m", "bench.residency"], 1, crash)
    assert 'File "bench/residency.py"' in str(info.value) and str(common.REPO) not in str(
        info.value
    )


def test_divergence_probe_rejects_a_run_count_below_one() -> None:
    with pytest.raises(common.BenchError, match="--reps must be at least 1"):
        divergence_probe.main(["--reps", "0"])


def test_conf_is_laid_over_each_um_mode_but_the_previous_engines() -> None:
    assert residency.mode_conf("um-predict") == residency.UM_CONF["um-predict"]
    got = residency.mode_conf("um-predict", "predict_lookahead:4GiB")
    assert got == residency.UM_CONF["um-predict"] + ",predict_lookahead:4GiB"
    assert residency.mode_conf("um-prev", "predict_lookahead:4GiB") == residency.UM_CONF["um-prev"]


def test_hooks_probe_times_each_hook_in_place_and_keeps_what_it_returns() -> None:
    from bench.probes import hooks_probe

    seen: list[tuple[object, ...]] = []

    def pre(module: object, args: object) -> str:
        seen.append((module, args))
        return "kept"

    def post(module: object, args: object, output: object) -> None:
        seen.append((module, args, output))
        raise RuntimeError("a hook's own error")

    table: dict[int, Any] = {1: pre, 2: post}
    spent: dict[str, float] = {}
    hooks_probe._timed_hooks(table, "pre", spent)
    assert list(table) == [1, 2] and table[1] is not pre  # same keys, wrapped in place
    assert table[1]("m", ("x",)) == "kept"
    with pytest.raises(RuntimeError, match="own error"):
        table[2]("m", ("x",), "y")
    assert seen == [("m", ("x",)), ("m", ("x",), "y")]
    names = sorted(spent)
    assert len(names) == 2 and all(n.startswith("pre:") for n in names)
    # the failing hook was timed too
    assert any(n.endswith(".pre") for n in names) and any(n.endswith(".post") for n in names)


def test_populate_probe_splits_work_into_whole_pages_covering_the_range_once() -> None:
    import ctypes
    import itertools

    from bench.probes import populate_probe

    # cpu_memset: every byte written, over any number of threads and sizes that are not
    # multiples of a page or of the thread count.
    for size, threads in [(3 * 4096 + 5, 4), (100, 4), (1 << 20, 16), (5, 1)]:
        buf = (ctypes.c_ubyte * size)(*([7] * size))
        populate_probe.cpu_memset(ctypes.addressof(buf), size, threads)()
        assert set(buf) == {0}, (size, threads)

    # parallel_prefetch: parts on 2 MiB boundaries that tile the range exactly once.
    class Recorder:
        def __init__(self) -> None:
            self.calls: list[tuple[int, int, int]] = []

        def prefetch(self, ptr: int, n: int, where: int, stream: int = 0) -> None:
            self.calls.append((ptr, n, where))

    block = 2 << 20
    for size, threads in [(7 * block + 4096, 4), (block, 8), (33 * block, 16)]:
        rec = Recorder()
        populate_probe.parallel_prefetch(rec, 1 << 40, size, 2, threads)()  # type: ignore[arg-type]
        spans = sorted((p, n) for p, n, _ in rec.calls)
        assert all(w == 2 for _, _, w in rec.calls)
        assert spans[0][0] == 1 << 40 and all((p - (1 << 40)) % block == 0 for p, _ in spans)
        assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(spans))
        assert spans[-1][0] + spans[-1][1] == (1 << 40) + size
        assert len(spans) <= threads


def test_populate_probe_touches_one_byte_per_stride() -> None:
    import ctypes

    pytest.importorskip("numpy", reason="cpu_touch fills with numpy, which the GPU host has")
    from bench.probes import populate_probe

    # cpu_touch: the first byte of every stride, nothing else, over any split into threads.
    for size, threads, stride in [
        (3 * 4096 + 5, 4, 4096),
        (1 << 20, 16, 4096),
        (8 << 20, 1, 2 << 20),
    ]:
        buf = (ctypes.c_ubyte * size)(*([7] * size))
        populate_probe.cpu_touch(ctypes.addressof(buf), size, threads, stride)()
        zeros = [i for i, b in enumerate(buf) if b == 0]
        assert zeros == list(range(0, size, stride)), (size, threads, stride)


def test_populate_probe_populates_by_madvise() -> None:
    import ctypes
    import errno
    import mmap

    from bench import host_memory
    from bench.probes import populate_probe

    # madvise_populate: the pages of an untouched anonymous mapping are made (VmRSS grows by
    # the range), or the kernel's refusal comes back as one OSError.
    size = 32 << 20
    m = mmap.mmap(-1, size)
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    before = host_memory.rss_bytes()
    try:
        populate_probe.madvise_populate(addr, size, 4)()
    except OSError as e:
        assert e.errno == errno.EINVAL and "MADV_POPULATE_WRITE" in str(e)
    else:
        assert host_memory.rss_bytes() - before >= 0.9 * size
    with pytest.raises(OSError, match="MADV_POPULATE_WRITE"):
        populate_probe.madvise_populate(addr + 1, 4096, 1)()  # not page-aligned: EINVAL


def test_populate_probe_reads_bandwidth_and_placement() -> None:
    from bench.probes import populate_probe

    span = populate_probe.Span(1 << 30, 4 << 20)
    iface = span.__cuda_array_interface__
    assert iface["shape"] == ((4 << 20) // 4,) and iface["data"] == (1 << 30, False)
    assert populate_probe.gbps(2 * 10**9, 0.5) == 4.0
    assert populate_probe.gbps(1, None) is None
    gib = 1 << 30
    assert populate_probe.placement(gib, 0.0005) == "gpu"  # HBM: 2 TB/s
    assert populate_probe.placement(gib, 0.05) == "host"  # PCIe: 21 GB/s


def test_ranks_probe_compares_the_slowest_rank_with_one_alone() -> None:
    from bench.probes import ranks_probe

    gb = 10**9
    alone = {r: [1.0, 0.5, 2.0] for r in ranks_probe.ROUTES}  # median 1 s: 1 GB/s
    together = [
        {r: [1.0, 1.0, 1.0] for r in ranks_probe.ROUTES},
        {**{r: [1.0] * 3 for r in ranks_probe.ROUTES}, "evict": [4.0, 2.0, 2.0]},
    ]
    rows = {r["route"]: r for r in ranks_probe.compare(alone, together, gb)}
    assert list(rows) == list(ranks_probe.ROUTES)
    assert rows["h2d"]["alone_gb_s"] == 1.0 and rows["h2d"]["together_over_alone"] == 1.0
    assert rows["evict"]["together_gb_s"] == [1.0, 0.5]
    assert rows["evict"]["together_over_alone"] == 0.5  # the slower rank bounds DDP


def test_overlap_probe_pieces_cover_the_bytes_once_and_stay_in_the_ring() -> None:
    from bench.probes import overlap_probe

    for total, chunk, ring in [(100, 32, 64), (1 << 30, 32 << 20, 128 << 20), (5, 8, 8)]:
        pieces = overlap_probe.chunks(total, chunk, ring)
        assert sum(n for _, _, n in pieces) == total
        assert [s for s, _, _ in pieces] == list(range(0, total, chunk))
        assert all(0 <= r and r + n <= ring and n <= chunk for _, r, n in pieces)


def test_ranks_probe_asks_every_worker_and_reports_one_that_stopped() -> None:
    import contextlib
    import subprocess
    import sys
    from collections.abc import Iterator

    from bench.probes import ranks_probe

    echo = (
        "import sys\nprint('ready', flush=True)\n"
        "for l in sys.stdin:\n print('got ' + l.strip(), flush=True)"
    )
    quits = "print('ready', flush=True)"  # answers nothing after set-up

    @contextlib.contextmanager
    def workers(*codes: str) -> Iterator[list[subprocess.Popen[str]]]:
        procs = [
            subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, text=True)
            for code in codes
        ]  # fmt: skip
        try:
            yield procs
        finally:
            for p in procs:
                assert p.stdin is not None
                with contextlib.suppress(BrokenPipeError):
                    p.stdin.close()
                p.wait(timeout=30)

    with workers(echo, echo) as procs:
        assert ranks_probe._ask(procs, None, expect="ready") == ["ready\n", "ready\n"]
        assert ranks_probe._ask(procs, "setup h2d") == ["got setup h2d\n"] * 2
        # a worker that answers something else than the word the step waits for
        with pytest.raises(SystemExit, match="answered 'got setup d2h' to setup d2h"):
            ranks_probe._ask(procs, "setup d2h", expect="set")
    with workers(echo, quits) as procs:
        ranks_probe._ask(procs, None)
        procs[1].wait(timeout=30)  # gone before it is asked: a broken pipe, not a traceback
        with pytest.raises(SystemExit, match="a worker stopped at h2d"):
            ranks_probe._ask(procs, "h2d")


def test_residency_full_speed_compares_modes_at_one_cpu_state() -> None:
    # Each worker: 1 warm-up step, then timed steps; a canary of 2 ms is the CPU at half
    # speed (bench/README.md, step 25). um met the slow CPU in most steps, um-prev in none.
    def worker(mode: str, times: list[float], canaries: list[float]) -> dict[str, Any]:
        s = _res(mode, statistics.median(times[1:]), warmup=1, times_s=times)
        s.update(max_allocated_bytes=GIB, checksums=[1.0])  # under the budget: floor = stock
        s["cpu"] = {"canary_s": canaries}
        return s

    samples = [
        _link(50e9, 40e9),
        worker("stock", [9.0, 0.024, 0.024, 0.025], [0.001, 0.001, 0.001, 0.002]),
        worker("um-prev", [9.0, 0.040, 0.041, 0.040], [0.0005, 0.0011, 0.0012, 0.0011]),
        worker("um", [9.0, 0.037, 0.048, 0.050], [0.001, 0.0012, 0.002, 0.0021]),
        {"mode": "accelerate", "error": "Traceback"},
        _res("um-static", 1.0, checksums=[1.0]),  # an older record: no canary
    ]
    fs = residency.full_speed(samples, floor=0.024)
    assert fs is not None
    assert fs["canary_limit_s"] == pytest.approx(1.25e-3)  # the warm-up's canary is not counted
    assert fs["modes"]["um"] == {
        "seconds": 0.037,
        "steps": 1,
        "of_steps": 3,
        "per_floor": pytest.approx(0.037 / 0.024),
    }
    assert fs["modes"]["um-prev"]["seconds"] == pytest.approx(0.040)
    assert fs["modes"]["um-prev"]["steps"] == 3
    assert fs["modes"]["stock"]["steps"] == 2
    assert set(fs["modes"]) == {"stock", "um-prev", "um"}
    assert residency.full_speed([_res("um", 1.0)], floor=None) is None
    # A record without its warm-up count is left out, unless the run's is given.
    old = worker("um", [9.0, 0.037], [0.001, 0.001])
    del old["warmup"]
    assert residency.full_speed([old], floor=None) is None
    given = residency.full_speed([old], floor=None, warmup=1)
    assert given is not None and given["modes"]["um"]["steps"] == 1
    text = residency.table("infer", *residency.summarize("infer", samples, 2 * GIB))
    assert "at full CPU speed (canary <= 1.25 ms): stock 0.0240 s (2/3 steps, 1.00x floor)" in text


def test_residency_step_clock_keeps_one_entry_per_step() -> None:
    clock = residency._StepClock(host=True)
    for _ in range(3):
        clock.start()
        clock.host_done()
        clock.stop()
    assert len(clock.times) == 3
    assert {k: len(v) for k, v in clock.cpu.items()} == dict.fromkeys(
        ("canary_s", "thread_cpu_s", "process_cpu_s", "host_s"), 3
    )
    assert all(h <= t for h, t in zip(clock.cpu["host_s"], clock.times, strict=True))
    assert "host_s" not in residency._StepClock().cpu  # training: no host_s


def test_link_cpu_probe_reads_steal_and_sorts_canaries_into_phases() -> None:
    """bench.probes.link_cpu_probe: /proc/stat's steal share, and each phase's canaries against the
    fastest idle one (a slow load phase shows; readings outside every phase are not counted)."""
    stat = "cpu  100 0 50 800 0 0 0 50 0 0\ncpu0 10 0 5 80 0 0 0 5 0 0\nintr 1 2\n"
    later = "cpu  200 0 100 1500 0 0 0 200 0 0\ncpu0 20 0 10 160 0 0 0 10 0 0\n"
    before, after = link_cpu_probe.cpu_times(stat), link_cpu_probe.cpu_times(later)
    assert set(before) == {"cpu", "cpu0"}
    assert link_cpu_probe.steal_share(before["cpu"], after["cpu"]) == pytest.approx(150 / 1000)
    assert link_cpu_probe.steal_share(before["cpu0"], before["cpu0"]) == 0.0
    phases = [
        {"name": "idle", "start": 0.0, "end": 1.0},
        {"name": "dma-h2d", "start": 1.0, "end": 2.0},
        {"name": "idle", "start": 2.0, "end": 3.0},
    ]
    readings = [(0.2, 0.0010), (0.6, 0.0011), (1.2, 0.0020), (1.5, 0.0021), (1.9, 0.0011)]
    readings += [(2.5, 0.0012), (7.0, 0.0001)]  # the last after every phase: not counted
    rows = link_cpu_probe.summarise(readings, phases)
    assert [r["canaries"] for r in rows] == [2, 3, 1]
    assert rows[1]["canary_median_ms"] == pytest.approx(2.0)
    assert rows[1]["slow_share"] == pytest.approx(2 / 3, abs=1e-3)  # over 1.25 x the idle 1.0 ms
    assert rows[0]["slow_share"] == rows[2]["slow_share"] == 0.0
    assert "start" not in rows[0]
    with pytest.raises(common.BenchError, match="idle phase"):
        link_cpu_probe.summarise([(1.5, 0.001)], phases)


def test_cuda_advise_host_prefers_host_ram_and_lets_the_gpu_read_it_there() -> None:
    """bench.probes.evict_routes.Cuda.advise_host, the placement the probes give the weight
    streamer's memory: PreferredLocation host, then AccessedBy the GPU, over the range."""
    from bench.probes import evict_routes as er

    calls: list[tuple[int, int, int, int]] = []

    class Runtime:
        def cudaMemAdvise(self, ptr: int, n: int, advice: int, loc: er.Location) -> int:
            calls.append((ptr, n, advice, loc.type))
            return 0

    cuda = object.__new__(er.Cuda)
    cuda.rt = Runtime()  # type: ignore[assignment]  # a stand-in for libcudart
    cuda.advise_host(4096, 1 << 20)
    assert calls == [
        (4096, 1 << 20, er.PREFERRED, er.HOST),
        (4096, 1 << 20, er.ACCESSED_BY, er.DEVICE),
    ]


def test_residency_record_is_kept_after_each_worker_until_the_run_ends(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    machine = {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "um_engine": "libtorch_um.so"}
    seen: list[dict[str, Any] | None] = []

    def fake_worker(module: str, args: list[str], *rest: Any) -> dict[str, Any]:
        mode = args[args.index("--mode") + 1]
        if mode == residency.LINK:
            return {**_link(50e9, 40e9), "machine": machine}
        kept = list(tmp_path.glob("residency-train-*.json"))  # the record so far, if any
        seen.append(json.loads(kept[0].read_text()) if kept else None)
        res = _res(mode, 1.0, losses=[1.0], max_allocated_bytes=2 * GIB)
        return {**res, "machine": machine}

    monkeypatch.setattr(residency, "run_worker_safely", fake_worker)
    residency.main(
        [
            "train",
            "--modes",
            "stock,um",
            "--rounds",
            "2",
            "--budget",
            "1GiB",
            "--out",
            str(tmp_path),
        ]
    )
    assert seen[0] is None  # nothing is written before a mode's worker has finished
    assert [r["partial"] for r in seen[1:] if r] == [
        {"workers": 1, "of": 4},
        {"workers": 2, "of": 4},
        {"workers": 3, "of": 4},
    ]
    assert seen[-1] is not None and seen[-1]["summary"]["modes"]["um"] == 1.0
    (final,) = tmp_path.glob("residency-train-*.json")
    done = json.loads(final.read_text())
    assert "partial" not in done and len(done["samples"]) == 5
    # Workers that all failed before CUDA leave no partial record behind.
    failed = tmp_path / "failed"
    residency.PartialRecord("train", {"budget_bytes": GIB}, 2, failed)(
        [{"mode": "stock", "error": "boom"}]
    )
    assert not failed.exists()


def test_repository_state_prefers_the_commit_it_is_told(monkeypatch: pytest.MonkeyPatch) -> None:
    """A GPU host's stale .git must not name the measured tree's commit."""
    monkeypatch.setenv("TORCH_UM_COMMIT", "0123abc")
    assert common.repository_state() == ("0123abc", None)
    monkeypatch.delenv("TORCH_UM_COMMIT")
    rev, modified = common.repository_state()
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=common.REPO, capture_output=True, text=True
    )
    if head.returncode != 0:
        pytest.skip("not a git checkout")
    assert rev == head.stdout.strip() and isinstance(modified, bool)


def test_copy_routes_both_ways_puts_each_direction_on_its_own_stream() -> None:
    import contextlib
    import types

    from bench.probes import copy_routes_probe

    calls: list[tuple[object, ...]] = []
    current = [0]

    class Stream:
        made = 0

        def __init__(self) -> None:
            Stream.made += 1
            self.cuda_stream = Stream.made

        def wait_stream(self, other: object) -> None:
            pass

    class Tensor:
        def __init__(self, name: str) -> None:
            self.name, self.nbytes = name, 1 << 20

        def copy_(self, src: Tensor, non_blocking: bool = False) -> None:
            calls.append(("copy", self.name, src.name, current[0]))

        def zero_(self) -> None:
            pass

        def fill_(self, value: int) -> None:
            pass

        def cpu(self) -> Tensor:
            return self

    @contextlib.contextmanager
    def on(stream: Stream) -> Any:
        before, current[0] = current[0], stream.cuda_stream
        yield
        current[0] = before

    class Copier:
        def copy(self, dst: Tensor, src: Tensor, stream: int, blocks: int) -> None:
            calls.append(("lean", dst.name, src.name, stream, blocks))

    cuda = types.SimpleNamespace(
        Stream=Stream,
        stream=on,
        current_stream=lambda: types.SimpleNamespace(wait_stream=lambda s: None),
        synchronize=lambda: None,
    )
    fake = types.SimpleNamespace(cuda=cuda, equal=lambda a, b: a is b)
    src, dst, dev, dev_src = (Tensor(n) for n in ("src", "dst", "dev", "dev_src"))
    rows = copy_routes_probe.both_ways_copies(
        fake, Copier(), {"pinned": (src, dst)}, dev, dev_src, 1
    )
    assert [r["route"] for r in rows] == ["memcpy"] + [
        f"lean{b} x 2" for b in copy_routes_probe.BOTH_WAYS_BLOCKS
    ]
    in_stream, out_stream = 1, 2  # the probe's two streams, made in that order
    assert calls[:2] == [("copy", "dev", "src", in_stream), ("copy", "dst", "dev_src", out_stream)]
    for k, b in enumerate(copy_routes_probe.BOTH_WAYS_BLOCKS):
        assert calls[2 + 2 * k : 4 + 2 * k] == [
            ("lean", "dev", "src", in_stream, b),
            ("lean", "dst", "dev_src", out_stream, b),
        ]
    # the data check compares what each copy wrote with its source: a fake whose tensors
    # are all distinct reads as wrong data
    assert all(r["equal"] is False for r in rows)


def test_pinned_alloc_probe_runs_every_route_and_thread_count(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench.probes import pinned_alloc_probe as probe

    asked: list[tuple[str, int]] = []

    def fake(
        module: str, args: list[str], pythonpath: object, timeout: int, base: dict[str, Any]
    ) -> dict[str, Any]:
        assert module == "bench.probes.pinned_alloc_probe" and pythonpath is None
        conf, threads = args[args.index("--conf") + 1], int(args[args.index("--threads") + 1])
        assert base == {"route": base["route"], "conf": conf, "threads": threads}
        asked.append((conf, threads))
        if conf.endswith(":16") and threads == 4:
            return {**base, "error": "worker gave no result (exit 1):\nRuntimeError: refused"}
        return {**base, "bytes": 8, "first_s": 4.0, "first_gbps": 2.0, "again_s": 0.001,
                "pinned": True, "intact": True, "machine": {"gpu": "NVIDIA H200"}}  # fmt: skip

    monkeypatch.setattr(probe, "run_worker_safely", fake)
    out = tmp_path / "pinned.json"
    status = probe.main(["--gib", "1", "--buffer-mib", "8", "--json", str(out)])
    assert status == 1  # one case failed
    assert asked == [(c, t) for c in probe.ROUTES.values() for t in probe.THREADS]
    record = json.loads(out.read_text())
    assert record["machine"] == {"gpu": "NVIDIA H200"} and record["buffer_bytes"] == 8 << 20
    assert [r["route"] for r in record["rows"]] == [r for r in probe.ROUTES for _ in probe.THREADS]
    assert all("machine" not in r for r in record["rows"])
    text = capsys.readouterr().out
    assert "2.0 GB/s first" in text and "error: RuntimeError: refused" in text
    with pytest.raises(common.BenchError, match="at least one buffer"):
        probe.main(["--gib", "0.001", "--buffer-mib", "8"])


def test_residency_lengths_are_checked_before_any_worker_runs() -> None:
    for bad, match in (
        (["infer", "--lengths", "512"], "sequence lengths of the train workload"),
        (["train", "--lengths", "512,x"], "comma-separated ints, got '512,x'"),
        (["train", "--lengths", "0,512"], "each length must be 1 to 1024"),
        (["train", "--lengths", "2048"], "each length must be 1 to 1024"),
    ):
        with pytest.raises(common.BenchError, match=match):
            residency.main(bad)
    assert residency.parse_lengths("1024,512,768", "train") == [1024, 512, 768]
    assert residency.parse_lengths(None, "train") is None
    with pytest.raises(common.BenchError, match="--steps 10: with --lengths, a multiple of the 3"):
        residency.main(["train", "--lengths", "1024,512,768"])
    with pytest.raises(common.BenchError, match="--phases and --lengths"):
        residency.main(["train", "--lengths", "1024,512,768", "--steps", "9", "--phases"])


def test_residency_loss_module_is_for_training_only() -> None:
    with pytest.raises(common.BenchError, match="--loss chooses how the train workload"):
        residency.main(["infer", "--loss", "module"])
    with pytest.raises(SystemExit):  # argparse: not one of the choices
        residency.main(["train", "--loss", "mse"])


def test_timeline_probe_loss_module_is_for_training_only() -> None:
    from bench.probes import timeline_probe

    with pytest.raises(common.BenchError, match="--loss chooses how the train workload"):
        timeline_probe.main(["--mode", "um", "--workload", "infer", "--loss", "module"])


class _Op(str):
    """A stand-in tensor that spells the operations made on it (no torch on CI's CPU)."""

    def __getitem__(self, key: Any) -> _Op:
        return _Op(f"{self}[{key!r}]")

    def float(self) -> _Op:
        return _Op(f"{self}.float()")

    def flatten(self, *dims: int) -> _Op:
        return _Op(f"{self}.flatten{dims}")


def test_train_loss_by_module_shifts_upcasts_and_hands_back_the_logits() -> None:
    class Out:
        def __init__(self, x: _Op, labels: _Op | None = None) -> None:
            self.logits = _Op(f"logits({x})")
            self.loss = None if labels is None else _Op(f"loss({x}, {labels})")

    x = _Op("x")
    loss, logits = residency.train_loss(Out, x, None)
    assert (loss, logits) == ("loss(x, x)", None)
    loss, logits = residency.train_loss(Out, x, lambda a, b: _Op(f"ce({a}, {b})"))
    shifted = "logits(x)[(slice(None, None, None), slice(None, -1, None))].float()"
    assert logits == shifted  # the float logits the loop holds
    labels = "x[(slice(None, None, None), slice(1, None, None))].flatten()"
    assert loss == f"ce({shifted}.flatten(0, 1), {labels})"


def test_phase_clock_keeps_the_runs_peaks_across_its_resets() -> None:
    class Cuda:  # torch.cuda's memory statistics, by hand
        def __init__(self) -> None:
            self.now, self.peak, self.reserved = 0, 0, 0

        def use(self, n: int) -> None:
            self.now = n
            self.peak = max(self.peak, n)
            self.reserved = max(self.reserved, n + 1)

        def synchronize(self) -> None:
            pass

        def memory_allocated(self) -> int:
            return self.now

        def memory_reserved(self) -> int:
            return self.reserved

        def max_memory_allocated(self) -> int:
            return self.peak

        def max_memory_reserved(self) -> int:
            return self.reserved

        def reset_peak_memory_stats(self) -> None:
            self.peak = self.now

    cuda = Cuda()
    clock = residency._PhaseClock(type("T", (), {"cuda": cuda}), None)
    clock.start()
    cuda.use(30)  # the forward's peak
    cuda.use(10)
    clock("forward")
    cuda.use(20)
    cuda.use(5)
    clock("backward")
    clock.keep_peaks()
    forward, backward = clock.steps[0]["forward"], clock.steps[0]["backward"]
    assert (forward["allocated_bytes"], forward["max_reserved_bytes"]) == (10, 31)
    assert backward["allocated_bytes"] == 5
    assert clock.peaks == (30, 31)  # the forward's peak, though reset after it


def test_residency_worker_line_names_the_cache_it_ended_with() -> None:
    sample = {"mode": "um-predict", "median_s": 0.5766, "first_step_s": 3.705}
    assert "cache" not in residency.describe(sample)  # records before step 51
    line = residency.describe({**sample, "end_reserved_bytes": 14_218_690_560})
    assert "0.5766 s/step (first 3.705 s), cache 14.22 GB at the end" in line


def test_residency_floor_of_a_cycle_of_lengths_is_the_mean_steps() -> None:
    """--lengths: each step's overflow is its own peak's; the floor is the mean timed
    step's (the warm-up left out), not the longest's."""
    peaks = [30 * GIB, 20 * GIB, 12 * GIB, 16 * GIB]  # warm-up, then 12, 4 and 8 over
    samples: list[dict[str, Any]] = [
        _link(50e9, 40e9),
        _res("stock", 0.1, max_allocated_bytes=30 * GIB, warmup=1,
             step_peak_allocated_bytes=peaks, losses=[1.0] * 4),
        _res("um", 0.5, losses=[1.0] * 4),
    ]  # fmt: skip
    summary, analysis = residency.summarize("train", samples, 8 * GIB)
    assert analysis["floor"]["over_budget_bytes"] == 8 * GIB
    assert analysis["floor"]["over_budget_of"] == "the mean timed step"
    assert summary["floor_s"] == pytest.approx(8 * GIB / 40e9)
    assert residency.cycle_over(samples[1:2], 8 * GIB) == 8 * GIB
    assert residency.cycle_over([_res("stock", 0.1)], 8 * GIB) is None
