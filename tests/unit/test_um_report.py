"""torch.cuda.um.summary()'s text (torch/cuda/_um_report.py, Note [The summary says what
the counters say]) on synthetic counters: the sizes a person reads, each section from its
counters, and a note exactly where a counter records something to act on."""

from __future__ import annotations

import pytest

from .helpers import load_overlay_module

GiB = 1 << 30
MiB = 1 << 20


report = load_overlay_module("torch/cuda/_um_report.py", "um_report_under_test")


def _summary(*args: object) -> str:
    """The summary with its wrapped lines joined: what the assertions read."""
    text: str = report.summary_text(*args)
    assert all(len(line) <= report.WIDTH for line in text.splitlines()), text
    return " ".join(text.split())


CONFIG = {
    "enabled": "True",
    "max_managed": str(100 * GiB),
    "device_budget": str(8 * GiB),
    "host_headroom": str(4 * GiB),
    "policy": "lru",
    "hooks": "True",
    "predict": "True",
    "predict_lookahead": str(GiB),
}


def _engine(**over: int) -> dict[str, int]:
    base = {
        "um.enabled": 1,
        "um.policy_lru": 1,
        "um.device_budget_bytes": 8 * GiB,
        "um.device_total_bytes": 140 * GiB,
        "um.total_managed_bytes": 21 * GiB,
        "um.peak_managed_bytes": 22 * GiB,
        "um.managed_bytes": 21 * GiB,
        "um.managed_segments": 120,
        "um.device_placed_bytes": 8 * GiB,
        "um.host_placed_bytes": 13 * GiB,
        "um.evict_bytes": 40 * GiB,
        "um.discard_bytes": 10 * GiB,
    }
    return {**base, **over}


PREDICT = {
    "predict.forwards": 4,
    "predict.offloaded_bytes": 4 * 5 * GiB,
    "predict.hits": 90,
    "predict.late": 6,
    "predict.misses": 4,
    "predict.optimizer_steps": 4,
    "predict.optimizer_staged_bytes": 4 * 5 * GiB,
    "predict.stream_forwards": 0,
}


@pytest.mark.parametrize(
    ("n", "text"),
    [(0, "0 B"), (512, "512 B"), (3 * MiB, "3.0 MiB"), (int(1.25 * GiB), "1.25 GiB")],
)
def test_sizes_read_as_a_person_reads_them(n: int, text: str) -> None:
    assert report.size(n) == text


def test_sections_come_from_their_counters() -> None:
    text = _summary(0, _engine(), PREDICT, CONFIG, True)
    assert text.startswith("torch.cuda.um summary, device 0 engine on;")
    assert "on; policy lru; predict on; module hooks on" in text
    assert "8.00 GiB of the device's 140.00 GiB (device_budget 8.00 GiB)" in text
    assert "cap max_managed 100.00 GiB" in text
    assert (
        "21.00 GiB in 120 segments on this device: 8.00 GiB on the device, 13.00 GiB in host RAM"
        in text
    )
    assert "evicted 40.00 GiB, discarded 10.00 GiB" in text
    assert "4 forwards offloaded 5.00 GiB of saves each by copy" in text
    assert "of 100 uses, 90 % found their bytes back, 6 % waited for them, 4 % copied" in text
    assert "4 steps staged, 5.00 GiB of state each; 0 steps past the budget ran as usual" in text
    assert "weights" not in text  # no forward without autograd ran under it
    assert "notes" not in text  # nothing to act on


def test_without_predict_counters_and_before_the_device_is_used() -> None:
    engine = _engine(**{"um.device_budget_bytes": 0, "um.policy_lru": 0})
    config = {**CONFIG, "predict": "False", "policy": "static", "device_budget": "90%"}
    text = _summary(1, engine, {}, config, False)
    assert "policy static; predict off; module hooks off (policy static)" in text
    assert "not resolved yet: the device has not been used (device_budget 90%)" in text
    assert "nothing ran past a budget under it yet" in text


CASES = [
    ({"um.cap_refusals": 3}, {}, "3 allocations were refused with OutOfMemoryError"),
    ({"um.headroom_refusals": 2}, {}, "to keep host_headroom (4.00 GiB)"),
    ({"um.executor_failures": 5}, {}, "(um.executor_failures)"),
    ({"um.policy_lru": 0}, {}, "policy static moves nothing (um.host_placed_bytes)"),
    ({}, {"predict.failures": 7}, "page-locked host memory was refused"),
    ({}, {"predict.host_limited": 1}, "(predict.host_limited)"),
    ({}, {"predict.lookahead_stops": 9}, "predict_lookahead 1.00 GiB"),
    ({}, {"predict.optimizer_skipped": 2}, "(predict.optimizer_skipped)"),
    ({}, {"predict.optimizer_touch_failures": 1}, "(predict.optimizer_touch_failures)"),
    ({}, {"predict.stream_ring_failures": 4}, "for want of device memory for the ring"),
    ({}, {"predict.stream_send_failures": 1}, "(predict.stream_send_failures)"),
]


@pytest.mark.parametrize(("engine", "predict", "note"), CASES)
def test_a_note_exactly_where_its_counter_says(
    engine: dict[str, int], predict: dict[str, int], note: str
) -> None:
    quiet = _summary(0, _engine(), PREDICT, CONFIG, True)
    assert note not in quiet and "notes" not in quiet
    text = _summary(0, _engine(**engine), {**PREDICT, **predict}, CONFIG, True)
    notes = text.split(" notes - ", 1)[1].split(" - ")
    assert len(notes) == 1 and note in notes[0], text


def test_every_note_has_its_case() -> None:
    tested = {name for engine, predict, _ in CASES for name in (*engine, *predict)}
    assert {name for name, _ in report.NOTES} <= tested


def test_weights_streamed_per_forward() -> None:
    predict = {"predict.stream_forwards": 10, "predict.stream_streamed_bytes": 10 * 3 * MiB}
    predict.update({"predict.stream_records": 1, "predict.stream_departures": 0})
    text = _summary(0, _engine(), predict, CONFIG, True)
    assert "10 forwards without autograd read 3.0 MiB of parameters each by copy" in text
    assert "1 orders of calls recorded, 0 forwards left theirs" in text


def test_block_events_and_their_sampled_cost() -> None:
    """Note [Timing the event path]: a row once an event was timed, with the mean."""
    assert "block events" not in _summary(0, _engine(), PREDICT, CONFIG, True)
    engine = _engine(**{"um.block_events": 8000, "um.event_samples": 1000})
    engine["um.event_sample_ns"] = 450_000
    assert (
        "events 8000 allocator block events, 450 ns each in the engine (mean of 1000 timed, "
        "one in 8 a thread; process-wide)" in _summary(0, engine, PREDICT, CONFIG, True)
    )


def test_ddp_buckets_released_or_forgotten_and_what_left_without_a_copy() -> None:
    """Note [DDP's buckets between steps]: a row only once a bucket was given up."""
    assert "DDP buckets" not in _summary(0, _engine(), PREDICT, CONFIG, True)
    predict = {**PREDICT, "predict.ddp_forgotten": 146, "predict.ddp_touched": 146}
    predict["predict.ddp_released"] = 140
    predict["predict.ddp_forgotten_bytes"] = 5 * GiB
    engine = _engine(**{"um.forgotten_discard_bytes": 4 * GiB})
    text = _summary(0, engine, predict, CONFIG, True)
    assert (
        "DDP buckets 146 given up between a step and the next backward (5.00 GiB in all), "
        "140 of them released to the allocator; 146 brought back before the backward wrote "
        "them; 4.00 GiB of the others left the device without a copy" in text
    )
