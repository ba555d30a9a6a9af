"""The residency engine's decision logic on the CPU: tests/engine/residency_test.cpp
drives c10_overlay's Residency with event traces (random, a repeated training loop, a
changing pattern, capture, static policy) against a simulated GPU and checks the
invariants after every step. Built with the host's C++ compiler, sanitizers on."""

from __future__ import annotations

import json
import lzma
import subprocess
from pathlib import Path

import pytest

from .helpers import ROOT, build_engine_test

SOURCES = [
    ROOT / "tests" / "engine" / "residency_test.cpp",
    ROOT / "c10_overlay" / "c10" / "cuda" / "um" / "Residency.cpp",
    ROOT / "c10_overlay" / "c10" / "cuda" / "um" / "LedgerTrace.cpp",
]


@pytest.fixture(scope="module")
def residency_test(tmp_path_factory: pytest.TempPathFactory) -> Path:
    exe = tmp_path_factory.mktemp("engine") / "residency_test"
    return build_engine_test(
        exe, SOURCES, "-fsanitize=address,undefined", "-fno-sanitize-recover=all"
    )


def test_residency_invariants_hold_on_every_trace(residency_test: Path) -> None:
    done = subprocess.run([str(residency_test)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 failures" in done.stdout
    # Every named case ran and passed, and the random traces ran too.
    assert done.stdout.count("\nok   ") + done.stdout.startswith("ok   ") == 20
    assert "60 cases" in done.stdout


def test_event_cost_program_builds_and_times_three_sizes(tmp_path: Path) -> None:
    """bench/engine_event_cost.cpp (bench/README.md, step 31) follows the ledger's API:
    it builds against it and times each block size, sanitizers on."""
    exe = build_engine_test(
        tmp_path / "engine_event_cost",
        [ROOT / "bench" / "engine_event_cost.cpp", SOURCES[1]],
        "-fsanitize=address,undefined",
        "-fno-sanitize-recover=all",
    )
    done = subprocess.run([str(exe), "1000"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.split(":")[0] for line in lines] == [
        f"block of {n} bytes" for n in (512, 4 << 20, 16 << 20)
    ]
    assert all(float(line.split()[-4]) > 0 for line in lines)
    bad = subprocess.run([str(exe), "0"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "PAIRS" in bad.stderr


LEDGER_REPLAY = [ROOT / "bench" / "ledger_replay.cpp", *SOURCES[1:]]
MIB2 = 2 << 20


def _record(op: str, addr: int, size: int = 0, *, stream: int = 0x5, flag: int = 0) -> str:
    """One line of a ledger trace (Note [Ledger traces]): lru, an 8-chunk budget."""
    return f"{op} {addr:x} {size} 0 {stream:x} {flag} 0 1 {8 * MIB2} 1 1 0"


def _cyclic_trace(steps: int) -> str:
    """A step of twelve temporaries, each a one-chunk block handed out and freed
    before the next, from a cache of twelve chunks against a budget of eight: every
    step revives chunks that are not on the device (a cyclic pattern)."""
    base = 1 << 36
    lines = [_record("S", base, 12 * MIB2, flag=1)]
    for _ in range(steps):
        for i in range(12):
            lines += [_record("A", base + i * MIB2, MIB2), _record("F", base + i * MIB2, MIB2)]
    lines.append(_record("R", base))
    return "\n".join(lines) + "\n"


def test_ledger_replay_prices_the_dead_order_against_belady(tmp_path: Path) -> None:
    """bench/ledger_replay.cpp replays a trace under the ledger's dead order and
    Belady's: on a cycle larger than the room, least recently touched first replaces
    every revived chunk, and the choice that knows the future replaces fewer."""
    exe = build_engine_test(
        tmp_path / "ledger_replay", LEDGER_REPLAY, "-fsanitize=address,undefined",
        "-fno-sanitize-recover=all",
    )
    trace = tmp_path / "trace.1"
    trace.write_text(_cyclic_trace(20))
    done = subprocess.run([str(exe), str(trace)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
    rows = {row["order"]: row for row in map(json.loads, done.stdout.splitlines())}
    assert set(rows) == {"lru", "belady"}
    lru, belady = rows["lru"], rows["belady"]
    assert lru["allocs"] == belady["allocs"] == 10 * 12  # the last half of the steps
    # LRU: all twelve chunks come back in each step; Belady keeps seven in place.
    assert lru["reuse_bytes"] == lru["discard_bytes"] == 10 * 12 * MIB2
    assert 0 < belady["reuse_bytes"] <= lru["reuse_bytes"] / 2
    assert lru["evict_bytes"] == belady["evict_bytes"] == 0  # nothing live ever leaves

    everything = subprocess.run(
        [str(exe), str(trace), "--from", "0"], capture_output=True, text=True, timeout=60
    )
    assert json.loads(everything.stdout.splitlines()[0])["allocs"] == 20 * 12


def test_ledger_replay_names_a_bad_line_and_bad_arguments(tmp_path: Path) -> None:
    exe = build_engine_test(tmp_path / "ledger_replay", LEDGER_REPLAY)
    trace = tmp_path / "trace.1"
    trace.write_text(_cyclic_trace(1) + "A 10 twenty\n")
    bad = subprocess.run([str(exe), str(trace)], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1
    assert f"{trace}:27 is not a ledger record: A 10 twenty" in bad.stderr
    for args in ([], [str(trace), "--from", "1.5"], [str(trace), "--start", "0.1"]):
        wrong = subprocess.run([str(exe), *args], capture_output=True, text=True, timeout=60)
        assert wrong.returncode == 2 and "usage: ledger_replay" in wrong.stderr
    missing = subprocess.run(
        [str(exe), str(tmp_path / "none")], capture_output=True, text=True, timeout=60
    )
    assert missing.returncode == 2 and "cannot read" in missing.stderr


RECORDED = ROOT / "bench" / "results" / "ledger-replay-h200-2026-11-27-step36.json"


def test_recorded_gpu_traces_replay_to_the_runs_counters(tmp_path: Path) -> None:
    """The ledger traces of bench/README.md's step 36 (a Llama's training and two inference
    workers on the H200) replay, with sanitizers on, to the bytes each run's engine
    counted, and Belady's order never moves more. A change to the ledger's decisions shows
    here: if it is meant, replay the traces with bench/ledger_replay.cpp, say what moved in
    bench/README.md, and update the expected rows of the JSON beside the traces."""
    exe = build_engine_test(
        tmp_path / "ledger_replay", LEDGER_REPLAY, "-fsanitize=address,undefined",
        "-fno-sanitize-recover=all",
    )
    recorded = json.loads(RECORDED.read_text())["traces"]
    assert len(recorded) == 3
    keys = ("discard_bytes", "reuse_bytes", "evict_bytes", "touch_prefetch_bytes")
    for name, expect in recorded.items():
        trace = tmp_path / name.removesuffix(".xz")
        trace.write_bytes(lzma.decompress((RECORDED.parent / name).read_bytes()))
        done = subprocess.run(
            [str(exe), str(trace), "--from", "0"], capture_output=True, text=True, timeout=240
        )
        assert done.returncode == 0, done.stdout + done.stderr
        lru, belady = map(json.loads, done.stdout.splitlines())
        for row in (lru, belady):
            row.pop("replay_s")  # this machine's seconds
        assert {k: lru[k] for k in keys} == expect["run_stats"], name
        assert lru["discard_bytes"] > 0 and belady["discard_bytes"] <= lru["discard_bytes"]
        assert [lru, belady] == expect["replay"]["0"], name
