"""The text of ``torch.cuda.um.summary()``: the engine's counters read for a person.

Note [The summary says what the counters say]
``stats()`` and ``predict_stats()`` hold some ninety counters; a job that runs slower past
its budget than expected is explained by a handful of them: how much of the managed
memory lives in host RAM, how many bytes crossed the link and by which route, whether
``predict`` brought the saves, the optimizer state and the weights back ahead of use. The
summary groups those, in sizes a person reads, and adds a line under "notes" only where a
counter records an event the user can act on or should know of (an allocation refused by
``max_managed``, a forward that read every weight in place for want of device memory, ...).
Each note names the counter it comes from, so that it can be followed in ``stats()`` and
the docs; none is a guess about the cause.

Pure Python over the dictionaries that ``stats()``, ``predict_stats()`` and
``get_config()`` return, no torch import, so that it is tested on synthetic counters
without a GPU (tests/unit/test_um_report.py).
"""

from __future__ import annotations

import textwrap
from collections.abc import Callable, Mapping

GiB = 1 << 30
WIDTH = 100  # of a line of the summary
LABEL = 13  # of a row's label column


def size(n: float) -> str:
    """Bytes as a person reads them: 0 B, 512 B, 3.0 MiB, 1.25 GiB."""
    units = (("TiB", 1 << 40, 2), ("GiB", GiB, 2), ("MiB", 1 << 20, 1), ("KiB", 1 << 10, 1))
    for unit, scale, digits in units:
        if abs(n) >= scale:
            return f"{n / scale:.{digits}f} {unit}"
    return f"{int(n)} B"


def _setting_size(text: str | None) -> str:
    """A size setting as get_config() writes it (bytes, a percentage or none)."""
    if text is None:
        return "?"
    return size(int(text)) if text.isdigit() else text


def _share(part: int, whole: int) -> str:
    return f"{100 * part / whole:.0f} %" if whole else "-"


def summary_text(
    device: int,
    engine: Mapping[str, int],
    predict: Mapping[str, int],
    config: Mapping[str, str],
    hooks_on: bool,
) -> str:
    """The summary of ``device``: ``engine`` is ``stats(device)``, ``predict`` is
    ``predict_stats()``, ``config`` is ``get_config()``, ``hooks_on`` whether the module
    hooks are installed now."""
    e = engine.get
    lines = [f"torch.cuda.um summary, device {device}"]

    def row(label: str, text: str) -> None:
        lines.extend(_wrap(text, f"  {label:<{LABEL}}", " " * (2 + LABEL)))

    on = bool(e("um.enabled", 0))
    policy = "lru" if e("um.policy_lru", 0) else "static"
    if hooks_on:
        hooks = "module hooks on (some device is past 90 % of its budget)"
    elif config.get("hooks") != "True":
        hooks = "module hooks off (hooks:False)"
    elif policy != "lru":
        hooks = "module hooks off (policy static)"
    else:
        hooks = "module hooks off (no device is past 90 % of its budget)"
    row(
        "engine",
        ("on" if on else "off: new segments are plain cudaMalloc")
        + f"; policy {policy}; predict {'on' if config.get('predict') == 'True' else 'off'}; "
        + hooks,
    )
    budget = e("um.device_budget_bytes", 0)
    total = e("um.device_total_bytes", 0)
    row(
        "budget",
        (
            f"{size(budget)} of the device's {size(total)}"
            if budget
            else "not resolved yet: the device has not been used"
        )
        + f" (device_budget {_setting_size(config.get('device_budget'))})",
    )
    row(
        "managed",
        f"{size(e('um.total_managed_bytes', 0))} in the process, peak "
        f"{size(e('um.peak_managed_bytes', 0))}, cap max_managed "
        f"{_setting_size(config.get('max_managed'))}",
    )
    managed = e("um.managed_bytes", 0)
    row(
        "placed",
        f"{size(managed)} in {e('um.managed_segments', 0)} segments on this device: "
        f"{size(e('um.device_placed_bytes', 0))} on the device, "
        f"{size(e('um.host_placed_bytes', 0))} in host RAM, "
        f"{size(e('um.unplaced_bytes', 0))} not yet placed",
    )
    row(
        "moved",
        f"evicted {size(e('um.evict_bytes', 0))}, discarded {size(e('um.discard_bytes', 0))} "
        f"(dead: no copy), brought back on use {size(e('um.touch_prefetch_bytes', 0))}, "
        f"dead blocks placed again without a copy {size(e('um.reuse_bytes', 0))}, "
        f"read-only copies "
        f"{size(e('um.duplicate_bytes', 0))} (process-wide, since start)",
    )
    samples = e("um.event_samples", 0)
    if samples:  # Note [Timing the event path], Engine.cpp
        row(
            "events",
            f"{e('um.block_events', 0)} allocator block events, "
            f"{e('um.event_sample_ns', 0) / samples:.0f} ns each in the engine "
            f"(mean of {samples} timed, one in 8 a thread; process-wide)",
        )
    _predict_rows(predict, row)
    forgotten = predict.get("predict.ddp_forgotten", 0)
    if forgotten:  # Note [DDP's buckets between steps], torch/cuda/_um_ddp.py
        row(
            "DDP buckets",
            f"{forgotten} given up between a step and the next backward "
            f"({size(predict.get('predict.ddp_forgotten_bytes', 0))} in all), "
            f"{predict.get('predict.ddp_released', 0)} of them released to the allocator; "
            f"{predict.get('predict.ddp_touched', 0)} brought back before the backward wrote "
            f"them; {size(e('um.forgotten_discard_bytes', 0))} of the others left the device "
            "without a copy",
        )
    notes = _notes(engine, predict, config)
    if notes:
        lines.append("  notes")
        for n in notes:
            lines.extend(_wrap(n, "    - ", "      "))
    return "\n".join(lines)


def _wrap(text: str, first: str, rest: str) -> list[str]:
    """``text`` in lines of at most WIDTH, the first after ``first``, the others after
    ``rest``."""
    return textwrap.wrap(
        text, WIDTH, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False
    )


def _predict_rows(p: Mapping[str, int], add: Callable[[str, str], None]) -> None:
    if not p:
        add("predict", "nothing ran past a budget under it yet")
        return
    g = p.get
    forwards = g("predict.forwards", 0)
    if forwards:
        uses = g("predict.hits", 0) + g("predict.late", 0) + g("predict.misses", 0)
        add(
            "activations",
            f"{forwards} forwards offloaded {size(g('predict.offloaded_bytes', 0) / forwards)} "
            f"of saves each by copy; of {uses} uses, {_share(g('predict.hits', 0), uses)} found "
            f"their bytes back, {_share(g('predict.late', 0), uses)} waited for them, "
            f"{_share(g('predict.misses', 0), uses)} copied them back at the use",
        )
    steps = g("predict.optimizer_steps", 0)
    skipped = g("predict.optimizer_skipped", 0) + g("predict.optimizer_no_room", 0)
    if steps or skipped:
        each = size(g("predict.optimizer_staged_bytes", 0) / steps) if steps else "-"
        add(
            "optimizer",
            f"{steps} steps staged, {each} of state each; {skipped} steps past the budget "
            "ran as usual",
        )
    streamed = g("predict.stream_forwards", 0)
    if streamed:
        add(
            "weights",
            f"{streamed} forwards without autograd read "
            f"{size(g('predict.stream_streamed_bytes', 0) / streamed)} of parameters each by "
            f"copy; {g('predict.stream_records', 0)} orders of calls recorded, "
            f"{g('predict.stream_departures', 0)} forwards left theirs",
        )


# A note for each of these counters that is not 0, in this order: (counter, text), where
# {n} is the counter's value and {max_managed}, {host_headroom} and {predict_lookahead}
# are those settings. The note ends with the counter's name.
NOTES = (
    (
        "um.cap_refusals",
        "{n} allocations were refused with OutOfMemoryError: max_managed ({max_managed}) "
        "would have been passed",
    ),
    (
        "um.headroom_refusals",
        "{n} allocations were refused to keep host_headroom ({host_headroom}) of host RAM free",
    ),
    (
        "um.executor_failures",
        "{n} of the engine's CUDA calls failed: advice or moves were lost, no data",
    ),
    (
        "predict.failures",
        "{n} saved activations stayed on the device because page-locked host memory was refused",
    ),
    ("predict.host_limited", "{n} forwards offloaded fewer saves to keep host_headroom free"),
    (
        "predict.lookahead_stops",
        "{n} times a save could not be brought back ahead of its use for want of lookahead "
        "(predict_lookahead {predict_lookahead})",
    ),
    (
        "predict.optimizer_skipped",
        "{n} optimizer steps past the budget were not staged: the optimizer or its settings "
        "are not ones the staging covers (Note [Optimizer state staging])",
    ),
    (
        "predict.optimizer_touch_failures",
        "{n} optimizer steps could not report their gradients as used",
    ),
    (
        "predict.stream_ring_failures",
        "{n} forwards read every weight in place for want of device memory for the ring of copies",
    ),
    (
        "predict.stream_send_failures",
        "{n} times the engine refused to send parameters to host RAM for streaming; their "
        "copies read them wherever they were",
    ),
)


def _notes(
    engine: Mapping[str, int], predict: Mapping[str, int], config: Mapping[str, str]
) -> list[str]:
    """One line for each counter that records something to act on or to know of."""
    settings = {
        k: _setting_size(config.get(k))
        for k in ("max_managed", "host_headroom", "predict_lookahead")
    }
    counters = {**engine, **predict}
    out = [
        f"{text.format(n=counters[name], **settings)} ({name})"
        for name, text in NOTES
        if counters.get(name, 0)
    ]
    placed = engine.get("um.host_placed_bytes", 0)
    if placed and not engine.get("um.policy_lru", 0):
        out.append(
            f"{size(placed)} stay in host RAM and are read there over the link at every "
            "use: policy static moves nothing (um.host_placed_bytes)"
        )
    return out
