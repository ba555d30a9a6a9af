"""The residency engine's decision logic on the CPU: tests/engine/residency_test.cpp
drives c10_overlay's Residency with event traces (random, a repeated training loop, a
changing pattern, capture, static policy) against a simulated GPU and checks the
invariants after every step. Built with the host's C++ compiler, sanitizers on."""

from __future__ import annotations

import json
import lzma
import random
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
    assert done.stdout.count("\nok   ") + done.stdout.startswith("ok   ") == 39
    assert "79 cases" in done.stdout


def test_event_cost_program_builds_and_times_three_sizes(tmp_path: Path) -> None:
    """bench/probes/engine_event_cost.cpp (bench/README.md, steps 31 and 42) follows the ledger's
    API: it builds against it and times each block size, hot and cold, sanitizers on."""
    exe = build_engine_test(
        tmp_path / "engine_event_cost",
        [ROOT / "bench" / "probes" / "engine_event_cost.cpp", SOURCES[1]],
        "-fsanitize=address,undefined",
        "-fno-sanitize-recover=all",
    )
    done = subprocess.run([str(exe), "1000"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert [line.rsplit(":", 1)[0] for line in lines] == [
        f"{way}: block of {n} bytes" for way in ("hot ", "cold") for n in (512, 4 << 20, 16 << 20)
    ]
    assert all(float(line.split()[-4]) > 0 for line in lines)
    bad = subprocess.run([str(exe), "9"], capture_output=True, text=True, timeout=30)
    assert bad.returncode == 2 and "PAIRS" in bad.stderr


LEDGER_REPLAY = [ROOT / "bench" / "probes" / "ledger_replay.cpp", *SOURCES[1:]]
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
    """bench/probes/ledger_replay.cpp replays a trace under the ledger's dead order and
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
    assert set(rows) == {"lru", "belady", "resident-block"}
    lru, belady, block = rows["lru"], rows["belady"], rows["resident-block"]
    assert lru["allocs"] == belady["allocs"] == 10 * 12  # the last half of the steps
    # LRU: all twelve chunks come back in each step; Belady keeps seven in place.
    assert lru["reuse_bytes"] == lru["discard_bytes"] == 10 * 12 * MIB2
    assert 0 < belady["reuse_bytes"] <= lru["reuse_bytes"] / 2
    assert lru["evict_bytes"] == belady["evict_bytes"] == 0  # nothing live ever leaves
    # Every block is one chunk, so a free one on the device can always be handed out
    # instead (Note [Pricing the block choice]): nothing is placed again.
    assert block["allocs"] == lru["allocs"] and block["block_swaps"] > 0
    assert block["reuse_bytes"] == block["discard_bytes"] == block["evict_bytes"] == 0

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


def _allocator_trace(seed: int, ops: int = 600) -> str:
    """A caching allocator's blocks over three 16-chunk segments against an 8-chunk
    budget: best fit, split, and merged with free neighbours at some frees; blocks of
    1-6 chunks and some of 1 MiB (not chunk aligned), freed in random order, some
    touched. Blocks of a size come back often (the choice has candidates), and blocks
    are handed out over parts of earlier ones and across two of them."""
    rng = random.Random(seed)
    mib = 1 << 20
    bases = [(1 << 36) + k * (1 << 30) for k in range(3)]
    lines = [_record("S", b, 16 * MIB2, flag=1) for b in bases]
    free = [(b, 16 * MIB2) for b in bases]  # (start, length), merged when adjacent
    live: list[tuple[int, int]] = []
    for _ in range(ops):
        if live and (len(live) > 8 or rng.random() < 0.45):
            addr, size = live.pop(rng.randrange(len(live)))
            lines.append(_record("F", addr, size))
            free.append((addr, size))
            free.sort()
            if rng.random() < 0.3:  # merged with its free neighbours, at times only
                merged: list[tuple[int, int]] = []
                for a, n in free:
                    if merged and merged[-1][0] + merged[-1][1] == a:
                        merged[-1] = (merged[-1][0], merged[-1][1] + n)
                    else:
                        merged.append((a, n))
                free = merged
            continue
        size = mib if rng.random() < 0.1 else rng.choice((1, 2, 2, 4, 6)) * MIB2
        fits = [f for f in free if f[1] >= size]
        if not fits:
            continue
        a, n = min(fits, key=lambda f: (f[1], f[0]))
        free.remove((a, n))
        if n > size:
            free.append((a + size, n - size))
            free.sort()
        live.append((a, size))
        lines.append(_record("A", a, size))
        if rng.random() < 0.3:
            t = rng.choice(live)
            lines.append(_record("T", t[0], t[1]))
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def sanitized_replay(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_engine_test(
        tmp_path_factory.mktemp("replay") / "ledger_replay", LEDGER_REPLAY,
        "-fsanitize=address,undefined", "-fno-sanitize-recover=all",
    )


@pytest.mark.parametrize("seed", range(6))
def test_ledger_replay_moves_blocks_without_losing_one(
    sanitized_replay: Path, tmp_path: Path, seed: int
) -> None:
    """The residency-aware block choice (Note [Pricing the block choice]) on an
    allocator's splits and merges: the ledger stays consistent (the tool checks it, and
    that every way of replaying ends with the same live bytes; a piece of a moved block
    left unsplit fails that in four of these six traces), and blocks do move."""
    exe = sanitized_replay
    trace = tmp_path / "trace.1"
    trace.write_text(_allocator_trace(seed))
    done = subprocess.run(
        [str(exe), str(trace), "--from", "0"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    rows = [json.loads(row) for row in done.stdout.splitlines()]
    assert [r["order"] for r in rows] == ["lru", "belady", "resident-block"]
    assert rows[2]["block_swaps"] > 0


def test_ledger_replay_stops_pricing_blocks_when_a_moved_one_leaves(tmp_path: Path) -> None:
    """A segment released while a block moved out of it (or into it) would leave the
    replay's addresses and the run's apart: the tool says so and prices nothing more."""
    exe = build_engine_test(tmp_path / "ledger_replay", LEDGER_REPLAY)
    one, two, n = 1 << 36, 1 << 37, 8 * MIB2  # two segments, one 8-chunk block each
    lines = [_record("S", one, n, flag=1), _record("S", two, n, flag=1)]
    lines += [_record("A", one, n), _record("F", one, n)]  # on the device, then dead
    lines += [_record("A", two, n), _record("F", two, n)]  # its room: one's discarded
    lines += [_record("A", one, n), _record("F", one, n)]  # two's block taken instead
    lines += [_record("R", one)]
    trace = tmp_path / "trace.1"
    trace.write_text("\n".join(lines) + "\n")
    done = subprocess.run([str(exe), str(trace)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert "resident-block: record 9 releases a segment a moved block is in" in done.stderr
    assert [json.loads(row)["order"] for row in done.stdout.splitlines()] == ["lru", "belady"]


RECORDED = ROOT / "docs" / "notes" / "results" / "ledger-replay-h200-2026-11-27-step37.json"


def test_recorded_gpu_traces_replay_to_the_runs_counters(tmp_path: Path) -> None:
    """The ledger traces of bench/README.md's step 36 (a Llama's training and two inference
    workers on the H200) replay, with sanitizers on, to the bytes each run's engine
    counted, and neither Belady's order nor the residency-aware block choice (step 37)
    moves more. A change to the ledger's decisions shows
    here: if it is meant, replay the traces with bench/probes/ledger_replay.cpp, say what moved in a
    lab note (docs/notes/), and update the expected rows of the JSON beside the traces."""
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
        lru, belady, block = map(json.loads, done.stdout.splitlines())
        for row in (lru, belady, block):
            row.pop("replay_s")  # this machine's seconds
        assert {k: lru[k] for k in keys} == expect["run_stats"], name
        assert lru["discard_bytes"] > 0 and belady["discard_bytes"] <= lru["discard_bytes"]
        assert block["discard_bytes"] <= lru["discard_bytes"], name
        assert [lru, belady, block] == expect["replay"]["0"], name
