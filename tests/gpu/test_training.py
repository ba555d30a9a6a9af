"""ResNet-50 and a small GPT-style transformer train with UM on and off.

Same seed, same data: the losses agree within floating-point tolerance. The
data fits on the GPU, so the steady-state step time with UM must be within 2 %
of stock (blocks alternate on/off, off/on, on/off, ...: each side goes first in every
other pair, after one block of each that is not timed, so that neither side alone pays
for a cold machine; the best block of each is compared,
among the blocks that ran at full CPU speed: the GPU hosts' CPUs slow down by
1.5-2x at times, and these small models' steps are bound by the host, so a block
in the slow state is no measure of the allocator. A CPU canary before and after
each block tells them apart; where the CPU's speed left no block of one side to
compare, up to three more pairs run).
The workloads are bench/workloads.py's; bench/step_time.py times them against stock
torch, each in a process of its own, and records the numbers under bench/results/.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from typing import Any

import pytest

from tests.gpu.conftest import Limits, release_cache

torch = pytest.importorskip("torch")

from bench.common import at_full_speed, cpu_canary  # noqa: E402
from bench.workloads import Workload, gpt, resnet50, train_steps  # noqa: E402

LOSS_STEPS = 6
WARMUP = 5
TIMED = 15
MAX_RATIO = 1.02
PAIRS = 3  # on/off pairs of blocks
EXTRA_PAIRS = 3  # more, while no block of one side ran at full CPU speed


def _train(
    um: Any, enabled: bool, make: Callable[[], Workload], steps: int, timed_from: int
) -> tuple[list[float], list[float]]:
    um.configure(enabled=enabled)
    release_cache(torch)
    torch.manual_seed(0)
    # Segments that outlive release_cache (partly used by tensors held elsewhere) keep
    # the kind of memory they were made with; only segments made from here on must
    # follow the mode.
    earlier = {seg["address"] for seg in torch.cuda.memory_snapshot()}
    workload = make()
    losses, times = train_steps(workload, steps)
    times = times[timed_from:]
    # The data fits: the module hooks (Note [Use signals] in um.py) must be off, or every
    # module call pays for them. An earlier test past its budget may leave them on for at
    # most one poll of the pressure watcher (0.1 s), inside the warm-up steps.
    assert not um._hooks_installed, "the module hooks are on while the data fits"
    params = list(workload[0].parameters())
    segments = [
        (seg["address"], seg["address"] + seg["total_size"])
        for seg in torch.cuda.memory_snapshot()
        if seg["address"] not in earlier
    ]
    in_new = [p for p in params if any(lo <= p.data_ptr() < hi for lo, hi in segments)]
    wrong = [p for p in in_new if um.is_managed(p) != enabled]
    share = sum(p.numel() for p in in_new) / sum(p.numel() for p in params)
    assert share > 0.9, f"only {share:.0%} of the parameters are in segments made by this run"
    assert not wrong, (
        f"{len(wrong)} parameters in new segments are {'not ' if enabled else ''}managed "
        f"with UM {'on' if enabled else 'off'}"
    )
    return losses, times


def _compare(name: str, um: Any, make: Callable[[], Workload]) -> None:
    saved = torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    steps = WARMUP + TIMED
    # per block: its median step (ms) and the slower of the CPU canaries around it (s)
    blocks: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    losses: dict[bool, list[float]] = {}

    def fast(enabled: bool) -> list[float]:
        fastest = min(c for runs in blocks.values() for _, c in runs)
        return at_full_speed(blocks[enabled], fastest)

    try:
        # Not timed: the first blocks of a process on a cold machine ran up to 10 % slower
        # than the rest (bench/README.md, prediction step 41), whichever side they were.
        for enabled in (True, False):
            losses[enabled] = _train(um, enabled, make, steps, WARMUP)[0]
        pairs = 0
        while pairs < PAIRS or (pairs < PAIRS + EXTRA_PAIRS and not (fast(True) and fast(False))):
            for enabled in (True, False) if pairs % 2 == 0 else (False, True):
                before = cpu_canary()
                _, times = _train(um, enabled, make, steps, WARMUP)
                canary = max(before, cpu_canary())
                blocks[enabled].append((statistics.median(times), canary))
            pairs += 1
    finally:
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved
    on, off = losses[True][:LOSS_STEPS], losses[False][:LOSS_STEPS]
    print(f"[{name}] losses UM on  {[f'{v:.6f}' for v in on]}")
    print(f"[{name}] losses UM off {[f'{v:.6f}' for v in off]}")
    assert on == pytest.approx(off, rel=1e-3, abs=1e-4)
    assert on[-1] < on[0], "loss did not go down"
    # Each side's fastest block over every block. A slower CPU only makes a block slower,
    # so any block's time is at least what the side takes at full speed and the minimum
    # over all of them is the nearest to it; the pairs above run until each side has a
    # block whose canaries say full speed, so neither minimum comes only from slow blocks.
    # Keeping only the canaries' picks instead left one block a side: the canaries run
    # around a block, not in it, and on 2026-11-28 (h72) they rejected UM's 16.21 and
    # 16.51 ms blocks, kept its 17.76 against stock's 17.37, and failed a pair whose
    # minima were 16.21 ms both.
    on_t, off_t = [t for t, _ in blocks[True]], [t for t, _ in blocks[False]]
    full = fast(True) and fast(False)
    compared = "every block" + ("" if full else f"; no full CPU speed on one side in {pairs} pairs")
    ratio = min(on_t) / min(off_t)
    detail = (
        f"{compared}; blocks (ms, canary s): UM {[(round(t, 2), round(c, 4)) for t, c in blocks[True]]},"
        f" stock {[(round(t, 2), round(c, 4)) for t, c in blocks[False]]}"
    )
    print(
        f"[{name}] steady-state step time UM {min(on_t):.2f} ms, stock {min(off_t):.2f} ms, "
        f"UM/stock {ratio:.3f} ({detail})"
    )
    assert ratio <= MAX_RATIO, f"UM/stock step time {ratio:.3f} > {MAX_RATIO} ({detail})"


def test_resnet50(torch_mod: Any, um: Any, limits: Limits) -> None:
    pytest.importorskip("torchvision")
    _compare("resnet50", um, resnet50)


def test_small_gpt(torch_mod: Any, um: Any, limits: Limits) -> None:
    _compare("gpt", um, gpt)
