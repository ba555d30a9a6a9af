"""bench/host_memory.py: what runs without a GPU (options, the summary, /proc and cgroup
parsing, the chunked seeds, the dataloader's known sums, the record)."""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import common, host_memory
from bench.common import GiB

# ---------------------------------------------------------------- options


def test_parse_settings_rounds_to_pages_and_rejects_bad_sizes() -> None:
    s = host_memory.parse_settings(16, 8, 64, 40)
    assert s == host_memory.Settings(16 * GiB, 8 * GiB, 64 << 20, 40)
    assert host_memory.parse_settings(0.5, 0.25, 1.5, 1).batch_bytes == 3 << 19
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(common.BenchError, match="--listing-gib must be a positive number"):
            host_memory.parse_settings(bad, 8, 64, 40)
    with pytest.raises(common.BenchError, match="--listing-budget-gib must be"):
        host_memory.parse_settings(16, 0, 64, 40)
    with pytest.raises(common.BenchError, match="4 KiB or more"):
        host_memory.parse_settings(16, 8, 0.001, 40)
    with pytest.raises(common.BenchError, match="at most 4096"):
        host_memory.parse_settings(16, 8, 5000, 40)
    with pytest.raises(common.BenchError, match="--batches must be at least 1"):
        host_memory.parse_settings(16, 8, 64, 0)


def test_selected_scenarios_expands_checkpoint_and_rejects_unknown_names() -> None:
    all_ = host_memory.selected_scenarios(None)
    assert all_ == [
        "listing1",
        "checkpoint-fits",
        "checkpoint-2x",
        "checkpoint-map-cuda",
        "dataloader",
    ]
    assert host_memory.selected_scenarios("dataloader, checkpoint-2x,dataloader") == [
        "dataloader",
        "checkpoint-2x",
    ]
    assert host_memory.selected_scenarios("checkpoint-fits,checkpoint") == [
        "checkpoint-fits",
        "checkpoint-2x",
        "checkpoint-map-cuda",
    ]
    with pytest.raises(common.BenchError, match="unknown 'listing2'"):
        host_memory.selected_scenarios("listing1,listing2")
    with pytest.raises(common.BenchError, match="name at least one"):
        host_memory.selected_scenarios(" , ")


def test_selected_modes_and_cases() -> None:
    assert host_memory.selected_modes(None) == ["stock", "um-before", "um", "um-move", "um-pin"]
    assert host_memory.selected_modes("um,stock,um") == ["um", "stock"]
    with pytest.raises(common.BenchError, match="modes are stock, um-before, um, um-move, um-pin"):
        host_memory.selected_modes("um-off")
    with pytest.raises(common.BenchError, match="modes are"):
        host_memory.selected_modes("")
    plan = host_memory.cases(["listing1", "dataloader", "checkpoint-map-cuda"], ["um", "um-move"])
    # um-move applies to listing 1 and the CPU-loaded checkpoints only
    assert plan == [
        ("listing1", "um"),
        ("listing1", "um-move"),
        ("dataloader", "um"),
        ("checkpoint-map-cuda", "um"),
    ]
    with pytest.raises(common.BenchError, match="no case to run"):
        host_memory.cases(["dataloader"], ["um-move"])


def test_record_name_per_scenario_selection() -> None:
    assert host_memory.record_name(host_memory.selected_scenarios(None)) == "host_memory"
    assert host_memory.record_name(["listing1"]) == "host_memory-listing1"
    chosen = host_memory.selected_scenarios("checkpoint,dataloader")
    assert host_memory.record_name(chosen) == "host_memory-checkpoint-dataloader"
    assert host_memory.record_name(["checkpoint-2x"]) == "host_memory-checkpoint-2x"


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--scenarios", "nope"], "unknown 'nope'"),
        (["--modes", "stock,fast"], "modes are"),
        (["--listing-gib", "-4"], "--listing-gib must be a positive number"),
        (["--batches", "0"], "--batches must be at least 1"),
        (["--rounds", "0"], "--rounds and --timeout must be at least 1"),
        (["--scenarios", "dataloader", "--modes", "um-move"], "no case to run"),
        (["--worker", "--mode", "fast", "--scenario", "listing1"], "worker mode 'fast'"),
    ],
)
def test_main_rejects_bad_input_before_running_anything(
    argv: list[str], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_worker(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a worker was started")

    monkeypatch.setattr(common, "run_worker", no_worker)
    with pytest.raises(common.BenchError, match=message):
        host_memory.main(argv)


def test_run_main_prints_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys, "argv", ["x", "--modes", "fast"])
    with pytest.raises(SystemExit) as e:
        common.run_main("host_memory", host_memory.main)
    assert e.value.code == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("bench.host_memory: --modes 'fast'") and "\n" not in err


# ---------------------------------------------------------------- /proc and cgroup


def test_status_bytes_reads_kib_lines() -> None:
    status = "Name:\tpython\nVmPeak:\t  999 kB\nVmRSS:\t  123456 kB\nRssAnon:\t 100 kB\n"
    assert host_memory.status_bytes(status, "VmRSS") == 123456 * 1024
    assert host_memory.status_bytes(status, "RssAnon") == 100 * 1024
    assert host_memory.status_bytes(status, "RssFile") is None
    meminfo = "MemTotal:       131072000 kB\nMemAvailable:   65536000 kB\n"
    assert host_memory.status_bytes(meminfo, "MemAvailable") == 65536000 * 1024
    assert host_memory.status_bytes("VmRSS: lots\n", "VmRSS") is None


def test_cgroup_peak_path_from_proc_self_cgroup() -> None:
    root = Path("/sys/fs/cgroup")
    v2 = "0::/user.slice/user-1000.slice/session-3.scope\n"
    assert host_memory.cgroup_peak_path(v2, root) == Path(
        "/sys/fs/cgroup/user.slice/user-1000.slice/session-3.scope/memory.peak"
    )
    # a container with its own cgroup namespace: the root of the mount is its cgroup
    assert host_memory.cgroup_peak_path("0::/\n", Path("/x")) == Path("/x/memory.peak")
    hybrid = "12:memory:/docker/abc\n1:name=systemd:/docker/abc\n0::/docker/abc\n"
    assert host_memory.cgroup_peak_path(hybrid, root) == Path(
        "/sys/fs/cgroup/docker/abc/memory.peak"
    )
    v1_only = "12:memory:/docker/abc\n11:cpu,cpuacct:/docker/abc\n"
    assert host_memory.cgroup_peak_path(v1_only, root) is None
    assert host_memory.cgroup_peak_path("", root) is None


def test_cgroup_peak_reads_and_is_none_when_absent(tmp_path: Path) -> None:
    assert host_memory.open_cgroup_peak(None) == (None, False)
    assert host_memory.open_cgroup_peak(tmp_path / "missing" / "memory.peak") == (None, False)
    assert host_memory.read_cgroup_peak(None) is None
    peak = tmp_path / "memory.peak"
    peak.write_text("4096\n")
    fd = os.open(peak, os.O_RDONLY)
    try:
        assert host_memory.read_cgroup_peak(fd) == 4096
        assert host_memory.read_cgroup_peak(fd) == 4096  # reads from the start each time
    finally:
        os.close(fd)
    peak.write_text("max\n")
    fd = os.open(peak, os.O_RDONLY)
    try:
        assert host_memory.read_cgroup_peak(fd) is None
    finally:
        os.close(fd)


# ---------------------------------------------------------------- chunked seeds (fake torch)


class _Gen:
    def __init__(self) -> None:
        self.rng = random.Random(0)

    def manual_seed(self, seed: int) -> _Gen:
        self.rng = random.Random(seed)
        return self


class _Tensor:
    """A 1-D float tensor over a shared list, slices are views (as torch's)."""

    def __init__(self, data: list[float], start: int = 0, stop: int | None = None) -> None:
        self.data, self.start = data, start
        self.stop = len(data) if stop is None else stop

    def __getitem__(self, s: slice) -> _Tensor:
        a, b, _ = s.indices(self.stop - self.start)
        return _Tensor(self.data, self.start + a, self.start + b)

    def uniform_(self, low: float, high: float, *, generator: _Gen) -> _Tensor:
        for i in range(self.start, self.stop):
            self.data[i] = low + (high - low) * generator.rng.random()
        return self

    def tolist(self) -> list[float]:
        return self.data[self.start : self.stop]


class _FakeTorch:
    float32 = "float32"
    Generator = _Gen

    @staticmethod
    def empty(n: int, dtype: str) -> _Tensor:
        assert dtype == "float32"
        return _Tensor([float("nan")] * n)


def test_chunk_plan_covers_the_tensor_once_with_one_seed_per_chunk() -> None:
    assert host_memory.chunk_plan(10, 4, 7) == [(0, 4, 7), (4, 8, 8), (8, 10, 9)]
    assert host_memory.chunk_plan(8, 4, 0) == [(0, 4, 0), (4, 8, 1)]
    assert host_memory.chunk_plan(0, 4, 0) == []
    plan = host_memory.chunk_plan(host_memory.CHUNK * 3 + 5, host_memory.CHUNK, 1)
    assert [b - a for a, b, _ in plan] == [host_memory.CHUNK] * 3 + [5]


def test_reference_chunks_regenerate_what_fill_chunks_generated() -> None:
    torch: Any = _FakeTorch()
    plan = host_memory.chunk_plan(11, 3, host_memory.SEED)
    x = torch.empty(11, dtype=torch.float32)
    host_memory.fill_chunks(torch, x, plan)
    values = x.tolist()
    assert all(0.0 <= v < 1.0 for v in values)
    for start, stop, seed in plan:
        assert host_memory.reference_chunk(torch, start, stop, seed).tolist() == values[start:stop]
    # each chunk has its own seed: no two chunks repeat each other
    assert values[0:3] != values[3:6]
    # a chunk regenerated out of order is the same (no state carried between chunks)
    last = plan[-1]
    assert host_memory.reference_chunk(torch, *last).tolist() == values[last[0] : last[1]]


# ---------------------------------------------------------------- dataloader, checkpoint


def test_batch_sum_matches_the_values_the_dataset_makes() -> None:
    period = host_memory.PERIOD
    for index in (0, 1, 6, 7, 13):
        for numel in (0, 1, 250, 251, 252, 1000, 4096):
            want = sum(k % period + index % 7 for k in range(numel))
            assert host_memory.batch_sum(index, numel) == want
    # a 64 MiB batch of 40: far below 2**53, so the GPU's float64 sum is exact
    numel = (64 << 20) // 4
    assert sum(host_memory.batch_sum(i, numel) for i in range(40)) < 2**53


def test_synthetic_batches_is_a_map_style_dataset_without_torch_at_import() -> None:
    ds = host_memory.SyntheticBatches(100, 3)
    assert len(ds) == 3
    with pytest.raises(IndexError):
        ds[3]


def test_gpt2_checkpoint_is_about_1_3_b_parameters() -> None:
    params = host_memory.gpt2_params(host_memory.GPT2)
    assert params == 1_313_626_112
    assert 2.4 < params * 2 / GiB < 2.5  # bf16, about 2.6 GB


def test_probe_names_first_middle_last() -> None:
    assert host_memory.probe_names(["a", "b", "c", "d", "e"]) == ["a", "c", "e"]
    assert host_memory.probe_names(["a", "b"]) == ["a", "b"]
    assert host_memory.probe_names(["a"]) == ["a"]
    assert host_memory.probe_names([]) == []


def test_reusable_checkpoint_needs_matching_facts(tmp_path: Path) -> None:
    path = tmp_path / host_memory.CHECKPOINT
    assert host_memory.reusable_checkpoint(path) is None
    path.write_bytes(b"x" * 100)
    facts = {"config": host_memory.GPT2, "bytes": 100, "checks": {"w": {}}}
    path.with_suffix(".json").write_text(json.dumps(facts))
    assert host_memory.reusable_checkpoint(path) == facts
    path.write_bytes(b"x" * 99)  # a different file
    assert host_memory.reusable_checkpoint(path) is None
    facts["bytes"] = 99
    facts["config"] = {**host_memory.GPT2, "n_layer": 2}  # another model
    path.with_suffix(".json").write_text(json.dumps(facts))
    assert host_memory.reusable_checkpoint(path) is None
    path.with_suffix(".json").write_text("{not json")
    assert host_memory.reusable_checkpoint(path) is None


# ---------------------------------------------------------------- safety


def test_skip_reason_host_ram_device_memory_and_the_managed_cap() -> None:
    size = 16 * GiB
    plenty = 200 * GiB
    assert host_memory.skip_reason("listing1", "stock", size, plenty, 80 * GiB, 0) is None
    why = host_memory.skip_reason("listing1", "um", size, 40 * GiB, 80 * GiB, 64 * GiB)
    assert why is not None and why.startswith("host RAM") and "51.2 GiB" in why
    why = host_memory.skip_reason("listing1", "stock", size, plenty, 10 * GiB, 0)
    assert why is not None and "stock needs 16.0 GiB" in why
    # um: x, y and y.to("cpu") are managed: 48 GiB against a 40 GiB cap
    why = host_memory.skip_reason("listing1", "um", size, plenty, 50 * GiB, 40 * GiB)
    assert why is not None and "48.0 GiB of managed memory" in why
    assert (
        host_memory.skip_reason("listing1", "um-before", size, plenty, 50 * GiB, 40 * GiB) is None
    )
    assert host_memory.skip_reason("listing1", "um-move", size, plenty, 50 * GiB, 40 * GiB) is None
    # unknown MemAvailable does not skip; the checkpoint needs twice its size under the cap
    ckpt = int(2.5 * GiB)
    assert host_memory.skip_reason("checkpoint-2x", "um", ckpt, None, 9 * GiB, 7 * GiB) is None
    assert host_memory.skip_reason("checkpoint-2x", "um", ckpt, None, 5 * GiB, 4 * GiB)


def test_managed_need_counts_what_each_mode_allocates_as_managed() -> None:
    size = 8 * GiB
    assert host_memory.managed_need("listing1", "stock", size) == 0
    assert host_memory.managed_need("listing1", "um-before", size) == size
    assert host_memory.managed_need("listing1", "um", size) == 3 * size
    # um-move: x, and one 256 MiB chunk of y and of the reference at a time to check it
    assert host_memory.managed_need("listing1", "um-move", size) == size + (512 << 20)
    assert host_memory.managed_need("checkpoint-fits", "um-move", size) == 2 * size
    assert host_memory.managed_need("dataloader", "um", 64 << 20) == 256 << 20


# ---------------------------------------------------------------- summary, table, record


def _sample(
    scenario: str, mode: str, peak: float, base: float, sec: float, **extra: Any
) -> dict[str, Any]:
    return {
        "scenario": scenario,
        "mode": mode,
        "peak_rss_bytes": int(peak * GiB),
        "base_rss_bytes": int(base * GiB),
        "cgroup_peak_bytes": None,
        "seconds": sec,
        "ok": True,
        **extra,
    }


def test_summary_rows_medians_and_ratios_to_stock() -> None:
    ck = {"checkpoint_bytes": 2 * GiB}
    plan = [
        ("listing1", "stock"),
        ("listing1", "um"),
        ("listing1", "um-move"),
        ("checkpoint-2x", "stock"),
        ("checkpoint-2x", "um-move"),
        ("dataloader", "stock"),
        ("dataloader", "um"),
    ]
    samples = [
        _sample("listing1", "stock", 34.0, 2.0, 20.0, tensor_bytes=16 * GiB),
        _sample("listing1", "stock", 36.0, 2.0, 22.0, tensor_bytes=16 * GiB),
        _sample("listing1", "um", 18.0, 2.0, 30.0, tensor_bytes=16 * GiB),
        {"scenario": "listing1", "mode": "um-move", "error": "Traceback\nBenchError: differs"},
        _sample(
            "checkpoint-2x",
            "stock",
            6.0,
            1.0,
            4.0,
            note="stock has no device budget: in memory",
            **ck,
        ),
        _sample("checkpoint-2x", "um-move", 3.0, 1.0, 2.0, **ck),
        {"scenario": "dataloader", "mode": "stock", "skipped": "host RAM: ..."},
        _sample(
            "dataloader", "um", 3.0, 2.5, 1.0, batch_bytes=64 << 20, children_peak_rss_bytes=GiB
        ),
    ]
    summary = host_memory.summarize(samples, plan)
    assert list(summary) == ["listing1", "checkpoint-2x", "dataloader"]
    stock = summary["listing1"]["stock"]
    assert stock["peak_rss_gib"] == 35.0 and stock["base_rss_gib"] == 2.0
    assert stock["delta_gib"] == 33.0 and stock["seconds"] == 21.0 and stock["runs"] == 2
    assert stock["tensor_gib"] == 16.0 and stock["ok"] is True
    assert stock["cgroup_peak_gib"] is None
    assert stock["peak_over_stock"] == 1.0
    um = summary["listing1"]["um"]
    assert um["peak_over_stock"] == round(18 / 35, 4)
    assert um["delta_over_stock"] == round(16 / 33, 4)
    assert um["seconds_over_stock"] == round(30 / 21, 4)
    assert summary["listing1"]["um-move"] == {"error": "BenchError: differs", "runs": 1}
    two = summary["checkpoint-2x"]
    assert two["stock"]["note"] == "stock has no device budget: in memory"
    assert two["stock"]["checkpoint_gib"] == 2.0 and two["stock"]["delta_over_checkpoint"] == 2.5
    assert two["um-move"]["delta_over_checkpoint"] == 1.0
    assert two["um-move"]["delta_over_stock"] == 0.4
    data = summary["dataloader"]
    assert data["stock"] == {"skipped": "host RAM: ...", "runs": 1}
    assert data["um"]["batch_gib"] == 0.0625 and data["um"]["children_peak_rss_gib"] == 1.0
    assert data["um"]["peak_over_stock"] is None  # no stock row to compare with
    json.dumps(summary)  # the record is JSON


def test_summary_marks_cases_that_did_not_run_and_partial_failures() -> None:
    plan = [("listing1", "stock"), ("listing1", "um")]
    samples = [
        _sample("listing1", "stock", 4.0, 1.0, 1.0, cgroup_peak_bytes=5 * GiB),
        {"scenario": "listing1", "mode": "stock", "error": "timed out after 600 s"},
    ]
    summary = host_memory.summarize(samples, plan)
    assert summary["listing1"]["stock"]["runs"] == 2
    assert summary["listing1"]["stock"]["errors"] == 1
    assert summary["listing1"]["stock"]["cgroup_peak_gib"] == 5.0
    assert summary["listing1"]["um"] == {"error": "not run", "runs": 0}
    text = host_memory.table(summary)
    assert "1 of 2 failed" in text and "ERROR: not run" in text


def test_table_and_describe() -> None:
    plan = [("checkpoint-fits", "stock"), ("checkpoint-fits", "um-move"), ("dataloader", "um")]
    samples = [
        _sample("checkpoint-fits", "stock", 6.0, 1.0, 4.0, checkpoint_bytes=2 * GiB),
        _sample("checkpoint-fits", "um-move", 2.0, 1.0, 2.0, checkpoint_bytes=2 * GiB),
        {"scenario": "dataloader", "mode": "um", "skipped": "managed cap: ..."},
    ]
    text = host_memory.table(host_memory.summarize(samples, plan))
    lines = text.splitlines()
    assert lines[0].split()[:5] == ["scenario", "mode", "seconds", "peak", "GiB"]
    move = next(line for line in lines if "um-move" in line)
    assert "2.000" in move and "0.333" in move and "0.200" in move and "0.500" in move
    assert "delta/checkpoint 0.50" in move
    assert "skipped: managed cap" in text
    assert "peak RSS 6.00 GiB, delta 5.00 GiB" in host_memory.describe(samples[0])
    assert host_memory.describe(samples[2]).endswith("skipped: managed cap: ...")
    err = {"scenario": "listing1", "mode": "um", "error": "Traceback\nValueError: host_alloc"}
    assert host_memory.describe(err).endswith("ERROR ValueError: host_alloc")


def test_record_carries_command_machine_engine_and_summary(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    argv = ["x", "--um-pythonpath", "/u", "--workdir", "/scratch/w", "--scenarios", "listing1"]
    monkeypatch.setattr(sys, "argv", argv)
    stock_machine = {"gpu": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "um_engine": None}
    um_machine = {**stock_machine, "um_engine": "libtorch_um.so"}
    samples: list[dict[str, Any]] = [
        {**_sample("listing1", "um-move", 3.0, 1.0, 2.0), "machine": um_machine},
        {"scenario": "listing1", "mode": "stock", "error": "gave no result"},
        {**_sample("listing1", "um", 3.0, 1.0, 2.0), "machine": um_machine},
    ]
    plan = [("listing1", m) for m in ("stock", "um", "um-move")]
    summary = host_memory.summarize(samples, plan)
    rec = host_memory.record(samples, {"rounds": 1}, summary)
    assert rec["command"] == (
        "python -m bench.host_memory --um-pythonpath UM --workdir WORKDIR --scenarios listing1"
    )
    assert rec["machine"] == um_machine  # no stock worker finished: a +um one describes it
    assert (rec["um_torch"], rec["um_engine"]) == ("2.11.0+cu130", "libtorch_um.so")
    assert all("machine" not in s for s in rec["samples"])
    path = common.write(host_memory.record_name(["listing1"]), rec, tmp_path)
    assert path.name.startswith("host_memory-listing1-h100-80gb-hbm3-")
    data = json.loads(path.read_text())
    assert data["summary"]["listing1"]["um"]["peak_rss_gib"] == 3.0
    assert set(data["summary"]["listing1"]) == {"stock", "um", "um-move"}
    with pytest.raises(common.BenchError, match="no worker got as far as CUDA"):
        host_memory.record([samples[1]], {}, summary)


def test_worker_reports_a_missing_torch_as_an_error(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails
    monkeypatch.setenv("PYTORCH_CUDA_UM_CONF", "")  # restored after the worker sets it
    s = host_memory.parse_settings(1, 0.5, 1, 1)
    host_memory.worker("listing1", "um", s, None)
    assert os.environ["PYTORCH_CUDA_UM_CONF"] == "host_alloc:managed"
    line = capsys.readouterr().out.strip()
    assert line.startswith(common.MARK)
    rec = json.loads(line[len(common.MARK) :])
    assert rec["scenario"] == "listing1" and rec["mode"] == "um"
    assert "ModuleNotFoundError" in rec["error"] and rec["peak_rss_bytes"] > 0


def test_every_um_mode_has_settings_and_every_scenario_known_modes() -> None:
    # Each +um worker sets PYTORCH_CUDA_UM_CONF from UM_CONF and checks every key of it
    # against get_config(): a mode without an entry, or an entry that is not key:value
    # pairs, would fail on the GPU host only.
    assert set(host_memory.UM_CONF) == set(host_memory.MODES) - {"stock"}
    for mode, conf in host_memory.UM_CONF.items():
        pairs = [item.partition(":") for item in conf.split(",")]
        assert all(key and sep and value for key, sep, value in pairs), mode
    for scenario, modes in host_memory.SCENARIOS.items():
        assert modes[0] == "stock" and set(modes) <= set(host_memory.MODES), scenario


def test_main_runs_every_case_in_a_worker_and_writes_the_record(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls: list[tuple[list[str], str | None]] = []
    made: list[Path] = []
    m = {"gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "um_engine": None}

    def fake(module: str, args: list[str], pythonpath: str | None, timeout: int) -> Any:
        assert module == "bench.host_memory" and timeout == 600
        calls.append((args, pythonpath))
        opts = dict(zip(args[::2], args[1::2], strict=False))
        if opts["--mode"] == "prepare":
            made.append(Path(opts["--checkpoint"]).parent)
            return {
                "mode": "prepare",
                "config": host_memory.GPT2,
                "bytes": 2 * GiB,
                "params": 1,
                "torch": "t",
                "transformers": "x",
                "checks": {},
            }
        if opts["--scenario"] == "checkpoint-2x" and opts["--mode"] == "um":
            return {"mode": "um", "error": "Traceback\nBenchError: parameter w differs"}
        sample = _sample(
            opts["--scenario"], opts["--mode"], 3.0, 1.0, 1.0, checkpoint_bytes=2 * GiB
        )
        return {**sample, "machine": {**m, "um_engine": None if opts["--mode"] == "stock" else "e"}}

    monkeypatch.setattr(common, "run_worker", fake)
    monkeypatch.setattr(sys, "argv", ["x"])
    argv = [
        "--scenarios",
        "checkpoint",
        "--modes",
        "stock,um",
        "--stock-pythonpath",
        "/s",
        "--um-pythonpath",
        "/u",
        "--out",
        str(tmp_path),
    ]
    assert host_memory.main(argv) == 1  # a worker failed its check
    assert calls[0][0][:4] == ["--mode", "prepare", "--scenario", "checkpoint"]
    assert calls[0][1] == "/s"  # the checkpoint is written with the stock torch
    runs = [(a[1], a[3], p) for a, p in calls[1:]]
    assert runs == [
        ("stock", "checkpoint-fits", "/s"),
        ("um", "checkpoint-fits", "/u"),
        ("stock", "checkpoint-2x", "/s"),
        ("um", "checkpoint-2x", "/u"),
        ("stock", "checkpoint-map-cuda", "/s"),
        ("um", "checkpoint-map-cuda", "/u"),
    ]
    assert all("--checkpoint" in a for a, _ in calls[1:])
    assert made and not made[0].exists()  # the temporary workdir is gone
    (path,) = tmp_path.glob("host_memory-checkpoint-h200-*.json")
    rec = json.loads(path.read_text())
    assert rec["summary"]["checkpoint-2x"]["um"]["error"] == "BenchError: parameter w differs"
    assert rec["summary"]["checkpoint-fits"]["um"]["delta_over_checkpoint"] == 1.0
    assert rec["settings"]["checkpoint"]["bytes"] == 2 * GiB and rec["um_engine"] == "e"
    out = capsys.readouterr().out
    assert "1 worker(s) failed" in out and "summary: {" in out
