"""The decisions of the saved-activation offload (torch/cuda/_um_plan.py, Note
[Saved-activation offload] in torch/cuda/_um_predict.py) on synthetic training traces,
against a simulated device: a repeating pattern is learned (the forward stops evicting
and the backward finds its saves back before use), a changed pattern is learned again,
and no save is lost, brought back twice, or brought back past the free room. Also the
chunking of Note [Optimizer state staging] (torch/cuda/_um_optim.py): every parameter is
stepped once, in order."""

from __future__ import annotations

import random
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from .helpers import load_overlay_module

MiB = 1 << 20


plan = load_overlay_module("torch/cuda/_um_plan.py", "um_plan_under_test")


def learn(
    t: Any, evicted: int, room: int, saved: int, first: int = 0, target: int | None = None
) -> int:
    """One forward's window, as the offloader closes it: a chain of one part, the forward
    having run with ``target`` (default the target's bytes); the target after it."""
    was = t.bytes if target is None else target
    plan.learn_chain([plan.ChainPart(t, saved, first, was)], evicted, room)
    return int(t.bytes)


def test_target_starts_at_zero_and_moves_by_the_evictions_net_of_the_spare_room() -> None:
    t = plan.OffloadTarget(margin=100)
    assert t.bytes == 0  # the first forward is the plain policy
    assert learn(t, evicted=700, room=0, saved=1000) == 700
    assert learn(t, evicted=500, room=0, saved=1000) == 1000  # never past what was saved
    assert learn(t, evicted=0, room=500, saved=1000) == 700  # 3/4 of (500 - 100) less
    assert learn(t, evicted=300, room=300, saved=1000) == 800  # 300 evicted, 200 spare
    assert learn(t, evicted=100, room=400, saved=1000) == 650  # 300 spare, 100 evicted
    assert learn(t, evicted=0, room=80, saved=1000) == 650  # within the margin: kept
    assert learn(t, evicted=0, room=0, saved=300) == 300  # a smaller pattern caps it
    # A least room read a little past the margin does not hide hundreds evicted (step 49)
    t = plan.OffloadTarget(margin=16)
    assert learn(t, evicted=800, room=20, saved=723) == 723


def test_a_chain_learns_as_one_forward_and_lays_its_target_over_the_parts_in_order() -> None:
    """Note [A chain of forwards before one backward]: a model and a loss module after it
    learn one target, the model's saves (the chain's first) taking it first."""
    model, loss = plan.OffloadTarget(margin=100), plan.OffloadTarget(margin=100)

    def chain(evicted: int, room: int) -> tuple[int, int]:
        plan.learn_chain(
            [plan.ChainPart(model, 1600, 400, model.bytes), plan.ChainPart(loss, 100, 100, loss.bytes)],
            evicted, room,
        )  # fmt: skip
        return model.bytes, loss.bytes

    assert chain(evicted=600, room=0) == (600, 0)  # all of it the model's
    assert chain(evicted=1100, room=0) == (1600, 100)  # past the model's saves: the rest
    assert chain(evicted=0, room=500) == (1400, 0)  # shrinks by 3/4 of 400 from the end
    assert (model.sizes, loss.sizes, model.last, loss.last) == ({400: 1600}, {100: 100}, 400, 100)
    # One part alone is the one-forward rule, with its per-size table: 800 evicted less
    # 4 spare grows to the saves; 484 spare shrinks by 363; 300 evicted less 14 spare
    one = plan.OffloadTarget(margin=16)
    for evicted, room, want in ((800, 20, 723), (0, 500, 360), (300, 30, 646)):
        plan.learn_chain([plan.ChainPart(one, 723, 8, one.bytes)], evicted, room)
        assert one.bytes == want
    assert (one.sizes, one.last, one.forwards) == ({8: 723}, 8, 3)
    # A module met three times (a cell unrolled by the program): the mean of its shares
    cell = plan.OffloadTarget(margin=0)
    plan.learn_chain([plan.ChainPart(cell, 800, 800, 0)] * 3, evicted=1200, room=0)
    assert cell.bytes == (800 + 400 + 0) // 3
    plan.learn_chain([], evicted=5, room=0)  # nothing to learn: no error


def test_forward_plan_offloads_the_earliest_saves() -> None:
    p = plan.ForwardPlan(target=250)
    assert [p.offload(100) for _ in range(5)] == [True, True, True, False, False]
    assert (p.seen, p.offloaded) == (500, 300)


def test_buffers_to_warm_are_the_next_forwards_new_ones_within_the_host_room() -> None:
    """Note [Host buffers made ahead]: the saves the next forward's plan sends away that
    this forward kept, in order, within the host room; none when the target shrinks."""
    saves = [(100, True), (200, True), (300, False), (400, False), (500, False)]
    # the next target reaches into the fourth save: the third and fourth are new
    assert plan.buffers_to_warm(saves, target=650, room=10_000) == [300, 400]
    # the same decisions as ForwardPlan's, save by save
    p = plan.ForwardPlan(target=650)
    assert [p.offload(n) for n, _ in saves] == [True, True, True, True, False]
    assert plan.buffers_to_warm(saves, target=250, room=10_000) == []  # shrank: cached
    assert plan.buffers_to_warm(saves, target=10_000, room=10_000) == [300, 400, 500]
    assert plan.buffers_to_warm(saves, target=10_000, room=750) == [300, 400]  # room caps
    assert plan.buffers_to_warm(saves, target=10_000, room=299) == []
    # a save that failed to leave (recorded as kept) is warmed for the next forward
    assert plan.buffers_to_warm([(100, False), (100, True)], 1000, 1000) == [100]
    assert plan.buffers_to_warm([], 1000, 1000) == []


@dataclass
class Step:
    evicted: int
    room_end: int
    hits: int = 0
    late: int = 0
    misses: int = 0
    issued_before_use: int = 0
    offloaded: int = 0
    uses: int = 0
    peak: int = 0


@dataclass
class Device:
    """A GPU under a budget: parameters resident, a forward's saves resident unless they
    left, bytes brought back resident until used; copies back are ready one use after
    they were issued."""

    budget: int
    params: int
    margin: int
    target: Any = None
    lookahead: int = 0
    sized: bool = True  # the target for each size of forward (False: the last one's)
    log: list[Step] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.target = plan.OffloadTarget(margin=self.margin)

    def step(
        self, saves: list[int], order_jitter: int = 0, rng: random.Random | None = None
    ) -> Step:
        fwd = plan.ForwardPlan(self.target.bytes, self.target.for_forward if self.sized else None)
        queue = plan.PrefetchQueue(max_lookahead=1 << 30, lookahead=self.lookahead)
        entries: list[Any] = []  # strong references: autograd's packed saves
        kept: list[int] = []
        resident = self.params
        evicted = 0
        for i, n in enumerate(saves):
            if fwd.offload(n):
                e = plan.Entry(n)
                e.index = i
                entries.append(e)
                queue.add(weakref.ref(e))
                kept.append(0)
            else:
                kept.append(n)
                resident += n
                if resident > self.budget:  # the engine evicts the overflow
                    evicted += resident - self.budget
                    resident = self.budget
        room_end = max(0, self.budget - resident)
        learn(self.target, evicted, room_end, fwd.seen, fwd.first, fwd.target)
        s = Step(evicted=evicted, room_end=room_end, offloaded=fwd.offloaded)
        # Backward: saves read in reverse order (with some local reordering), each freed
        # after its use; saves that left come back through the queue.
        order = list(range(len(saves)))[::-1]
        if rng is not None and order_jitter:
            for k in range(0, len(order) - 1, 2):
                if rng.random() < 0.5:
                    order[k], order[k + 1] = order[k + 1], order[k]
        by_index: dict[int, Any] = {e.index: e for e in entries}
        back: dict[int, int] = {}  # index -> use count at which it was issued
        on_device = resident
        for use, i in enumerate(order):
            room = max(0, self.budget - on_device - self.margin)
            for e in queue.pump(lambda room=room: room):
                assert e.index not in back, "brought back twice"
                back[e.index] = use
                on_device += e.nbytes
                assert on_device <= self.budget, "brought back past the room"
            s.peak = max(s.peak, on_device)
            e = by_index.get(i)
            if e is None:
                on_device -= kept[i]  # read, then freed
                continue
            s.uses += 1
            ready = e.index in back and back[e.index] < use
            if e.index in back:
                s.issued_before_use += 1
            name = {"hit": "hits", "late": "late", "miss": "misses"}[queue.use(e, ready)]
            setattr(s, name, getattr(s, name) + 1)
            if name == "misses":
                on_device += e.nbytes
            on_device -= e.nbytes  # read, then freed
        assert s.uses == len(entries), "a save that left was never read back"
        assert all(e.used for e in entries)
        self.lookahead = max(self.lookahead, queue.lookahead)
        self.log.append(s)
        return s


def _layers(n: int, per_layer: list[int]) -> list[int]:
    return [size for _ in range(n) for size in per_layer]


def test_a_repeating_training_step_is_learned() -> None:
    # 24 layers of 5 saves (~300 MiB a layer, 7.2 GiB) over a 4 GiB budget with 1 GiB of
    # parameters: about 4.2 GiB must leave each forward.
    saves = _layers(24, [16 * MiB, 48 * MiB, 64 * MiB, 64 * MiB, 108 * MiB])
    dev = Device(budget=4096 * MiB, params=1024 * MiB, margin=256 * MiB)
    first = dev.step(saves)
    assert first.offloaded == 0 and first.evicted > 3000 * MiB  # the plain policy, measured
    for _ in range(7):
        dev.step(saves)
    settled = dev.log[-3:]
    for s in settled:
        assert s.evicted == 0, s  # nothing evicted by migration any more
        assert s.room_end <= 2 * dev.margin, s  # and not much more left than needed
        assert s.uses > 0 and s.misses == 0, s  # every save was brought back ahead of use
        assert s.hits >= s.uses - 1, s


def test_reordered_backward_still_finds_its_saves() -> None:
    rng = random.Random(7)
    saves = _layers(16, [32 * MiB, 64 * MiB, 96 * MiB])
    dev = Device(budget=2048 * MiB, params=512 * MiB, margin=128 * MiB)
    for _ in range(8):
        dev.step(saves, order_jitter=1, rng=rng)
    s = dev.log[-1]
    assert s.evicted == 0 and s.misses <= 1, s


def test_a_changed_pattern_is_learned_again() -> None:
    small = _layers(24, [16 * MiB, 64 * MiB, 64 * MiB])
    large = _layers(24, [32 * MiB, 128 * MiB, 128 * MiB])  # the batch doubled
    for sized in (True, False):
        dev = Device(budget=4096 * MiB, params=1024 * MiB, margin=256 * MiB, sized=sized)
        for _ in range(6):
            dev.step(small)
        assert dev.log[-1].evicted == 0
        changed = dev.step(large)
        if sized:  # scaled by the first save: the same bytes kept, twice the saves
            assert changed.evicted == 0 and changed.room_end <= 2 * dev.margin, changed
        else:  # the old target is too small: the plain policy covers it
            assert changed.evicted > 0
        for _ in range(6):
            dev.step(large)
        assert dev.log[-1].evicted == 0 and dev.log[-1].misses == 0
    for _ in range(6):
        dev.step(small)  # and back: the target shrinks again
    assert dev.log[-1].evicted == 0 and dev.log[-1].room_end <= 2 * dev.margin


def test_a_save_freed_before_the_backward_is_skipped() -> None:
    q = plan.PrefetchQueue(max_lookahead=1 << 30)
    alive = [plan.Entry(10), plan.Entry(20), plan.Entry(30)]
    for ref in [weakref.ref(e) for e in alive]:
        q.add(ref)
    del alive[2]  # its graph was freed (no backward)
    got = q.pump(lambda: 1000)
    assert [e.nbytes for e in got] == [20, 10]
    assert q.pump(lambda: 1000) == []


@pytest.mark.parametrize("room", [0, 15])
def test_the_queue_never_brings_back_past_the_room(room: int) -> None:
    q = plan.PrefetchQueue(max_lookahead=1 << 30)
    entries = [plan.Entry(10), plan.Entry(20)]
    for e in entries:
        q.add(weakref.ref(e))
    got = q.pump(lambda: room)
    assert sum(e.nbytes for e in got) <= room
    assert q.stopped == ("room" if room < 30 else "")
    # Not brought back: the use copies it then (a miss), and the lookahead widens.
    before = q.lookahead
    assert q.use(entries[1], ready=False) == ("miss" if room < 20 else "late")
    assert q.lookahead == min(q.max_lookahead, before * 2)


def test_the_queue_says_what_held_the_next_entry_back() -> None:
    q = plan.PrefetchQueue(max_lookahead=1 << 30, lookahead=25)
    entries = [plan.Entry(10), plan.Entry(10), plan.Entry(10)]
    for e in entries:
        q.add(weakref.ref(e))
    assert len(q.pump(lambda: 1000)) == 2 and q.stopped == "lookahead"
    assert q.use(entries[2], ready=True) == "hit"
    assert len(q.pump(lambda: 5)) == 0 and q.stopped == "room"
    assert len(q.pump(lambda: 1000)) == 1 and q.stopped == ""


def test_the_room_is_read_once_and_only_for_an_entry_within_the_lookahead() -> None:
    """Reading the room asks the engine (a C call per saved-tensor unpack in the
    backward): a pump held by the lookahead, or with nothing left, does not read it."""
    q = plan.PrefetchQueue(max_lookahead=1 << 30, lookahead=25)
    entries = [plan.Entry(10), plan.Entry(10), plan.Entry(10)]
    for e in entries:
        q.add(weakref.ref(e))
    reads: list[int] = []

    def room() -> int:
        reads.append(1)
        return 1000

    assert len(q.pump(room)) == 2 and q.stopped == "lookahead" and len(reads) == 1
    assert q.pump(room) == [] and q.stopped == "lookahead" and len(reads) == 1
    assert q.use(entries[2], ready=True) == "hit"
    assert len(q.pump(lambda: 5)) == 0 and q.stopped == "room"
    assert len(q.pump(room)) == 1 and len(reads) == 2
    assert q.pump(room) == [] and len(reads) == 2  # nothing left


def test_state_chunks_cover_every_parameter_once_in_order() -> None:
    assert plan.state_chunks([], 10) == []
    assert plan.state_chunks([4, 4, 4, 4], 8) == [[0, 1], [2, 3]]
    assert plan.state_chunks([4, 20, 4, 0, 4], 8) == [[0], [1], [2, 3, 4]]  # too big: alone
    rng = random.Random(3)
    for _ in range(200):
        sizes = [rng.choice([0, 1, 3, 8, 40]) for _ in range(rng.randrange(1, 30))]
        limit = rng.choice([1, 8, 16, 64])
        runs = plan.state_chunks(sizes, limit)
        assert [i for run in runs for i in run] == list(range(len(sizes)))
        for run in runs:
            assert len(run) == 1 or sum(sizes[i] for i in run) <= limit


# ---- Note [Weight streaming] (torch/cuda/_um_weights.py) ------------------------------


def _scan_calls(n: int, per: int = 100 * MiB) -> list[list[tuple[int, int]]]:
    """A forward's calls: one per layer, each reading its own weight."""
    return [[(i, per)] for i in range(n)]


def _plan(calls: list[list[tuple[int, int]]], target: int, largest: int = 10**15) -> Any:
    return plan.stream_plan(calls, target, plan.spread_order(calls), largest)


@dataclass
class CachedDevice:
    """A simulated device whose engine makes room from dead blocks first (the Llama's
    inference, bench/README.md step 37): the allocator's cache holds ``cache`` dead bytes
    the forward hands out again, and a forward's room is what the budget leaves beside its
    live bytes (the weights not streamed, the activations' ``peak`` and the ``ring``)."""

    calls: list[list[tuple[int, int]]]
    per: int
    peak: int
    ring: int
    budget: int
    cache: int

    def forward(self, target: int) -> tuple[int, int, int]:
        """-> (evicted, discarded, room beside the live bytes) in a forward at ``target``."""
        total = plan.unique_bytes(self.calls)
        streamed = sum(self.per for p in _plan(self.calls, target) if p)
        room = self.budget - (total - streamed + self.peak + self.ring)
        if room < 0:
            return -room, self.cache, room
        return 0, max(0, self.cache - room), room


def test_spread_order_starts_in_the_middle_and_halves() -> None:
    calls = _scan_calls(8)
    assert plan.spread_order(calls) == [4, 2, 6, 1, 5, 3, 7, 0]  # van der Corput
    # Calls too small to be hit come last, in forward order.
    tiny = [[(0, 1)], *_scan_calls(4)[1:], [(9, 1)]]
    order = plan.spread_order(tiny)
    assert sorted(order) == [0, 1, 2, 3, 4] and order[-2:] == [0, 4]
    assert plan.spread_order([[], []]) == []


def test_stream_plan_spreads_the_target_and_only_adds_calls_as_it_grows() -> None:
    calls = _scan_calls(16)
    assert _plan(calls, 0) == [[] for _ in calls]
    half = [bool(p) for p in _plan(calls, 800 * MiB)]
    assert sum(half) == 8 and not half[0]  # the first call never waits for its copy
    assert all(half[i : i + 3] != [True] * 3 for i in range(14))  # spread, not bunched
    assert _plan(calls, 10**12) == [[0]] * 16
    before: set[int] = set()
    for target in range(0, 1700 * MiB, 50 * MiB):  # nested: a call never changes sides back
        now = {i for i, p in enumerate(_plan(calls, target)) if p}
        assert before <= now
        before = now
    # A call larger than the buffers is never streamed.
    big = [*_scan_calls(3), [(5, 900 * MiB)]]
    assert _plan(big, 10**12, largest=500 * MiB)[3] == []
    # Larger as the ring holds it: two 1-byte parameters take two 512-byte parts, more
    # than a 512-byte ring, though their bytes fit (the copy would find no room).
    pair = [[(0, 1), (1, 1)]]
    assert plan.stream_plan(pair, 10, [0], 512) == [[0, 1]]
    assert plan.stream_plan(pair, 10, [0], 512, align=512) == [[]]
    assert plan.stream_plan(pair, 10, [0], 1024, align=512) == [[0, 1]]


def test_stream_plan_keeps_a_storage_that_several_calls_read() -> None:
    # A tied embedding: the first call and the last read storage 0; a block applied
    # twice: calls 3 and 4 read storage 7.
    calls = [[(0, 200 * MiB)], *_scan_calls(3)[1:], [(7, 100 * MiB)], [(7, 100 * MiB)],
             [(0, 200 * MiB), (9, 1 * MiB)]]  # fmt: skip
    picked = _plan(calls, 10**12)
    assert picked == [[], [0], [0], [], [], [1]]
    assert plan.unique_bytes(calls) == 501 * MiB


def test_ring_holds_four_of_the_largest_call_it_may_stream() -> None:
    def ring(calls: list[list[tuple[int, int]]], cap: int = 256 * MiB) -> int:
        return int(plan.ring_bytes(calls, 512, cap, 32 * MiB, 4))

    # The inference model of bench/README.md: a 32 MiB weight and a 16 KiB bias per MLP
    # call, so four of them (128 MiB and 64 KiB) instead of an eighth of a 2 GiB budget.
    layers = [[(2 * i, 32 * MiB), (2 * i + 1, 16384)] for i in range(6)]
    assert ring(layers) == 4 * (32 * MiB + 16384)
    # Parts are rounded up as they are in the ring: a 1-byte bias takes 512 bytes.
    assert ring([[(0, 5 * MiB), (1, 1)]]) == 32 * MiB  # at least the minimum
    assert ring([[(0, 20 * MiB), (1, 1)]]) == 4 * (20 * MiB + 512)
    assert ring(layers, cap=100 * MiB) == 100 * MiB  # at most the cap
    # A call larger than the cap never streams (stream_plan) and does not size the ring;
    # with no call under the cap the ring is the cap.
    assert ring([*layers, [(99, 300 * MiB)]]) == 4 * (32 * MiB + 16384)
    assert ring([[(99, 300 * MiB)]]) == 256 * MiB
    # A storage several calls read stays on the device (stream_plan): not counted.
    tied = [[(0, 60 * MiB)], [(1, 8 * MiB)], [(0, 60 * MiB), (2, 8 * MiB)]]
    assert ring(tied) == 32 * MiB
    assert ring([]) == 256 * MiB


def test_stream_target_grows_by_evictions_and_never_shrinks_back_into_them() -> None:
    t = plan.StreamTarget(margin=400)
    assert t.start(evicted=1500, total=4000) == 1500
    assert t.update(evicted=300, discarded=0, low_room=0, total=4000) == 1800  # grow
    assert t.update(evicted=0, discarded=50, low_room=5000, total=4000) == 1800  # discards
    assert t.update(evicted=0, discarded=0, low_room=700, total=4000) == 1800  # < 2 margins
    # Clean, much room: shrink by half the spare room, but not below floor + margin.
    assert t.update(evicted=0, discarded=0, low_room=1400, total=4000) == 1800
    assert t.floor == 1500
    t.bytes = 3000
    assert t.update(evicted=0, discarded=0, low_room=1400, total=4000) == 2500
    assert t.update(evicted=0, discarded=0, low_room=10**9, total=4000) == 1900
    assert t.update(evicted=10**9, discarded=0, low_room=0, total=4000) == 4000  # the total
    assert t.start(evicted=0, total=4000) == 0 and t.floor == 0  # a record that fits


def test_stream_target_grows_by_discards_up_to_the_live_overflow() -> None:
    """Note [Discards past the budget]: a forward whose overflow shows as dead blocks
    swapped, not evictions, grows the target to the live bytes past the budget plus the
    margin, and no further; not for discards within the margin, nor for an overflow
    larger than the record's streamable bytes (not this forward's to fix)."""
    t = plan.StreamTarget(margin=100)
    assert t.start(evicted=400, total=4000, over=700) == 400  # the record's evictions
    assert t.update(evicted=0, discarded=100, low_room=0, total=4000, over=700) == 400
    assert t.update(evicted=0, discarded=300, low_room=0, total=4000, over=700) == 700
    assert t.update(evicted=0, discarded=500, low_room=0, total=4000, over=700) == 800
    assert t.update(evicted=0, discarded=500, low_room=0, total=4000, over=700) == 800
    assert t.floor == 700 and t.discard_growths == 2  # the counter of um.predict_stats()
    # Discards gone and much room: it shrinks, but not below where they were + margin.
    assert t.update(evicted=0, discarded=0, low_room=5000, total=4000, over=700) == 800
    other = plan.StreamTarget(margin=100)
    other.start(evicted=0, total=4000, over=0)
    # Optimizer state live past the budget in an eval forward: more than the record holds.
    assert other.update(evicted=0, discarded=900, low_room=0, total=4000, over=6000) == 0
    assert other.update(evicted=0, discarded=900, low_room=0, total=4000) == 0  # no reading
    assert other.discard_growths == 0


def _simulated_scan(
    layers: int, per: int, peak: int, lookahead: int, budget: int
) -> tuple[int, Callable[[int], tuple[int, int]]]:
    """A device of ``budget`` bytes running forwards over ``layers`` weights of ``per``
    bytes plus an activation peak, the streamed ones read by copy through ``lookahead``
    bytes of buffers: the record's bytes, and a forward at a target -> (evicted, low room)."""
    calls = _scan_calls(layers, per)
    total = plan.unique_bytes(calls)

    def forward(target: int) -> tuple[int, int]:
        streamed = sum(per for p in _plan(calls, target) if p)
        need = total - streamed + peak + min(lookahead, streamed)
        return max(0, need - budget), max(0, budget - need)

    return total, forward


def test_streaming_a_simulated_scan_settles_without_evictions() -> None:
    """A device of ``budget`` bytes runs forwards over ``layers`` weights plus an
    activation peak; the streamed suffix is read by copy through ``lookahead`` bytes of
    buffers, the rest stays. The target must settle where the forward evicts nothing
    and most of the room the buffers leave is used."""
    per, peak, lookahead, margin, budget = 100 * MiB, 300 * MiB, 256 * MiB, 128 * MiB, 2 << 30
    total, forward = _simulated_scan(24, per, peak, lookahead, budget)
    t = plan.StreamTarget(margin=margin)
    t.start(evicted=forward(0)[0], total=total)
    history = []
    for _ in range(12):
        evicted, room = forward(t.bytes)
        history.append(evicted)
        t.update(evicted, 0, room, total)
    assert history[-4:] == [0, 0, 0, 0]
    _, room = forward(t.bytes)
    assert room <= 2 * margin + per  # not streaming far more than it must


def test_first_target_is_what_did_not_fit_not_the_scan_lru_cycled() -> None:
    t = plan.StreamTarget(margin=400)
    # The plain policy evicted more than the record holds (an LRU cycle over the scan);
    # 700 bytes were placed past the budget when it ended: start at those plus a margin.
    assert t.start(evicted=5000, total=4000, over=700) == 1100 and t.floor == 0
    assert t.start(evicted=900, total=4000, over=700) == 900  # evictions still bound it
    assert t.start(evicted=5000, total=4000, over=10**9) == 4000  # and the record does
    assert t.start(evicted=5000, total=4000) == 4000  # no reading of the placed bytes


def test_a_record_made_from_dead_blocks_starts_from_its_discards_too() -> None:
    """Note [A record made from dead blocks]: discards past the margin count as the
    record's evictions, under the discard rule's bound; not without ``over``, not at or
    under the margin, not when the overflow is more than the record streams."""
    t = plan.StreamTarget(margin=400)
    # The Llama's second-forward record (step 38): few evictions, many discards.
    assert t.start(evicted=300, total=4000, over=700, discarded=5000) == 1100
    assert t.start(evicted=300, total=4000, over=700, discarded=500) == 800
    assert t.start(evicted=300, total=4000, over=700, discarded=400) == 300  # the margin
    assert t.start(evicted=300, total=4000, discarded=5000) == 300  # no overflow read
    assert t.start(evicted=300, total=4000, over=5000, discarded=5000) == 300  # not its own
    assert t.floor == 0


@pytest.mark.parametrize("discards", [True, False])
def test_a_record_made_after_a_full_cache_settles_at_once(discards: bool) -> None:
    """The simulated device of the test below, with the record made by a forward after
    one that filled the allocator's cache (the hooks came on during the first forward):
    the plain policy made its room from ``cache`` dead bytes and evicted only the live
    bytes those did not cover. Counting the discards, the target starts where the
    forwards after it evict nothing and leave the margin beside the live bytes;
    without, the first forwards after it still evict."""
    per, peak, ring, margin, budget = 100 * MiB, 300 * MiB, 128 * MiB, 128 * MiB, 2 << 30
    cache = 1200 * MiB
    calls = _scan_calls(24, per)
    total = plan.unique_bytes(calls)
    over = total + peak + ring - budget
    forward = CachedDevice(calls, per, peak, ring, budget, cache).forward

    t = plan.StreamTarget(margin=margin)
    # The record's forward, under the plain policy: the cache gave most of its room.
    t.start(over - cache // 2 if over > cache // 2 else 0, total, over, cache if discards else 0)
    evicted, _, room = forward(t.bytes)
    if discards:
        assert t.bytes == min(over + margin, total)
        assert evicted == 0 and room >= margin  # settled from the first forward on
    else:
        assert evicted > 0  # the target still has to grow


@pytest.mark.parametrize("rule", [True, False])
def test_an_overflow_shown_as_discards_settles_where_the_live_bytes_fit(rule: bool) -> None:
    """Note [Discards past the budget], on a simulated device whose engine makes room
    from dead blocks first (the Llama's inference, bench/README.md step 37): the
    allocator's cache holds ``cache`` dead bytes the forward hands out again, and a
    forward's room is what the budget leaves beside its live bytes. Live bytes that do
    not fit evict only once the dead are gone, so a target grown by evictions alone
    stops where the live bytes just fit, and the cached blocks past that room are
    swapped every forward. With discards counted it settles with at least the margin
    beside the live bytes, and streams no more than the live overflow plus the margin
    (and a call's rounding)."""
    per, peak, ring, margin, budget = 100 * MiB, 300 * MiB, 128 * MiB, 128 * MiB, 2 << 30
    cache = 200 * MiB
    calls = _scan_calls(24, per)
    total = plan.unique_bytes(calls)
    over = total + peak + ring - budget  # live bytes past the budget, wherever placed
    forward = CachedDevice(calls, per, peak, ring, budget, cache).forward

    t = plan.StreamTarget(margin=margin)
    t.start(evicted=over // 2, total=total, over=over)  # the record saw part of it
    for _ in range(12):
        evicted, discarded, _ = forward(t.bytes)
        t.update(evicted, discarded, 0, total, over if rule else None)
    evicted, discarded, room = forward(t.bytes)
    assert evicted == 0  # either way, no live byte evicted in the end
    if rule:
        assert room >= margin and discarded <= cache - margin
        assert t.bytes <= over + margin + per
    else:
        assert 0 <= room < margin and discarded > margin  # swaps the rule would have seen


@pytest.mark.parametrize("bounded", [True, False])
def test_a_scan_that_cycled_through_lru_settles_near_what_does_not_fit(bounded: bool) -> None:
    """generate() past the budget (bench/README.md, prediction step 31): the record's
    first forward, under LRU, evicted every weight of the scan; the next forward still
    evicted a little (about the KV cache's size) before the forwards settled. Started from
    the evictions, the target stayed at every weight, as its floor; started from the
    bytes past the budget, it settles where the simulated forward evicts nothing, and
    streams little more than it must."""
    per, peak, lookahead, margin, budget = 100 * MiB, 300 * MiB, 128 * MiB, 128 * MiB, 2 << 30
    total, forward = _simulated_scan(24, per, peak, lookahead, budget)
    over = total + peak - budget
    t = plan.StreamTarget(margin=margin)
    t.start(evicted=total + peak, total=total, over=over if bounded else None)
    t.update(64 * MiB, 0, 0, total)  # the settling forward
    for _ in range(12):
        evicted, room = forward(t.bytes)
        t.update(evicted, 0, room, total)
    assert forward(t.bytes)[0] == 0
    if bounded:
        assert t.bytes <= over + lookahead + 2 * margin + per
    else:
        assert t.bytes == total  # as measured: every weight, every forward


@pytest.mark.parametrize("seed", range(20))
def test_stream_plan_copies_only_storages_one_call_reads(seed: int) -> None:
    rng = random.Random(seed)
    keys = list(range(12))
    calls = [
        [(k, (k + 1) * MiB) for k in rng.sample(keys, rng.randint(0, 3))]
        for _ in range(rng.randint(1, 15))
    ]
    target = rng.randint(0, 80) * MiB
    picked = _plan(calls, target)
    readers: dict[int, int] = {}
    for call in calls:
        for key, _ in call:
            readers[key] = readers.get(key, 0) + 1
    copied_bytes = 0
    for call, p in zip(calls, picked, strict=True):
        copied = {call[k][0] for k in p}
        assert all(readers[key] == 1 for key in copied)
        if p:  # a call taken copies every storage it alone reads
            assert copied == {key for key, _ in call if readers[key] == 1}
        copied_bytes += sum(call[k][1] for k in p)
    # Never past the target by more than one call's bytes; short of it only when every
    # call with storages of its own is taken.
    assert copied_bytes <= target + max((sum(n for _, n in c) for c in calls), default=0)
    assert copied_bytes >= target or picked == _plan(calls, 10**15)


@pytest.mark.parametrize("seed", range(10))
def test_ring_parts_never_overlap_and_go_back_in_any_order(seed: int) -> None:
    rng = random.Random(seed)
    ring = plan.RingParts(size=64 * 512, align=512)
    held: list[tuple[int, int]] = []
    taken = 0
    for _ in range(400):
        if held and (rng.random() < 0.45 or len(held) > 6):
            # Oldest first, as the calls run; now and then a later one (a forward cut short).
            span = held.pop(0 if rng.random() < 0.9 else rng.randrange(len(held)))
            ring.give_back(span)
            continue
        nbytes = rng.randint(1, 20 * 512)
        start = ring.take(nbytes)
        if start is None:
            assert held, "an empty ring refused a part that fits it"
            continue
        span = (start, start + -(-nbytes // 512) * 512)
        assert start % 512 == 0 and 0 <= start and span[1] <= ring.size
        assert all(span[1] <= lo or hi <= span[0] for lo, hi in held)
        held.append(span)
        taken += 1
    assert taken > 100
    assert ring.take(ring.size + 1) is None


@pytest.mark.parametrize("seed", range(10))
def test_ring_parts_name_every_reader_a_new_copy_must_wait_for(seed: int) -> None:
    """Readers are calls on one stream, so a token (their order) covers every earlier
    one: each part taken must wait for a token at least as late as the last reader of
    any of its bytes since the last forget."""
    rng = random.Random(seed)
    align = 512
    ring = plan.RingParts(size=32 * align, align=align)
    held: list[tuple[int, int]] = []
    last_reader = [0] * 32  # per granule: the token of its last reader (0: none)
    token = 0
    for _ in range(600):
        if rng.random() < 0.02:
            ring.forget()
            last_reader = [0] * 32
        if held and (rng.random() < 0.5 or len(held) > 5):
            span = held.pop(0 if rng.random() < 0.9 else rng.randrange(len(held)))
            token += 1
            ring.give_back(span, token)
            for g in range(span[0] // align, span[1] // align):
                last_reader[g] = token
            continue
        nbytes = rng.randint(1, 9 * align)
        start = ring.take(nbytes)
        if start is None:
            continue
        span = (start, start + -(-nbytes // align) * align)
        waits = ring.readers(span)
        needed = max(last_reader[g] for g in range(span[0] // align, span[1] // align))
        assert max(waits, default=0) >= needed
        held.append(span)
    assert token > 100
    assert len(ring.released) <= 32  # forgotten once covered: it does not grow


def test_ring_parts_wrap_around_in_order() -> None:
    ring = plan.RingParts(size=4096, align=1024)
    a, b, c = ring.take(1024), ring.take(2048), ring.take(1024)
    assert (a, b, c) == (0, 1024, 3072)
    assert ring.take(1) is None  # full
    ring.give_back((0, 1024))
    assert ring.take(1024) == 0  # wraps into the oldest part's room
    assert ring.take(1024) is None
    ring.give_back((1024, 3072))
    assert ring.take(2048) == 1024


_Hooks: Any = plan.OutermostForward  # loaded from its file: Any to mypy


class _Recorder(_Hooks):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple[str, str]] = []

    def _begin(self, module: Any, args: object) -> list[Any] | None:
        self.log.append(("begin", module))
        return None if module == "skip" else [module]

    def _inner(self, run: Any, module: Any) -> None:
        self.log.append(("inner", module))

    def _leave(self, run: Any, module: Any) -> None:
        self.log.append(("leave", module))

    def _end(self, run: Any) -> None:
        self.log.append(("end", run[0]))

    def _abandon(self, run: Any) -> None:
        self.log.append(("abandon", run[0]))


def test_outermost_forward_follows_nesting_and_ignores_what_began_before_it() -> None:
    h = _Recorder()
    h.exit("late", None, None)  # installed while a forward was under way: ignored
    h.enter("root", None)
    h.enter("a", None)
    assert h.current() == ["root"]
    h.exit("a", None, None)
    h.exit("root", None, None)
    assert h.current() is None
    assert h.log == [("begin", "root"), ("inner", "a"), ("leave", "a"), ("leave", "root"),
                     ("end", "root")]  # fmt: skip
    h.log.clear()
    h.enter("skip", None)  # _begin returned None: nothing else is called
    h.enter("a", None)
    h.exit("a", None, None)
    h.exit("skip", None, None)
    assert h.log == [("begin", "skip")]
    h.log.clear()
    h.active = False
    h.enter("root", None)
    h.exit("root", None, None)
    assert h.log == []


def test_hooks_taken_off_mid_forward_leave_no_stale_run() -> None:
    h = _Recorder()
    h.enter("root", None)
    h.enter("a", None)  # its forward hook never runs: the hooks come off during the call
    h.abandon_runs()
    assert h.current() is None  # before this thread's next hook call, too
    assert h.log[-1] == ("inner", "a")
    # Back on for the next forward: it starts at depth 0, after the old run was abandoned
    # on this thread, once.
    h.enter("root", None)
    h.enter("b", None)
    h.exit("b", None, None)
    h.exit("root", None, None)
    assert h.log[2:] == [("abandon", "root"), ("begin", "root"), ("inner", "b"), ("leave", "b"),
                         ("leave", "root"), ("end", "root")]  # fmt: skip
    h.abandon_runs()  # between forwards: nothing to abandon
    h.enter("root", None)
    h.exit("root", None, None)
    assert h.log[-3:] == [("begin", "root"), ("leave", "root"), ("end", "root")]


def test_outermost_forward_keeps_each_threads_forward_apart() -> None:
    import threading

    h = _Recorder()
    h.enter("main", None)
    seen: list[Any] = []

    def other() -> None:
        seen.append(h.current())
        h.enter("other", None)
        seen.append(h.current())
        h.exit("other", None, None)

    t = threading.Thread(target=other)
    t.start()
    t.join()
    assert seen == [None, ["other"]]
    assert h.current() == ["main"]
    h.exit("main", None, None)


def _module_call(h: Any, name: str, inner: tuple[Any, ...] = (), hooked: bool = True) -> None:
    """A module call as torch makes it: its hooks run inside this frame (the stand-in for
    torch.nn.Module._call_impl), its children's calls further down. ``hooked``: False for
    a call made before the hooks were installed, whose pre-hook never ran."""
    if hooked:
        h.enter(name, None)
    for child in inner:
        _module_call(h, *child) if isinstance(child, tuple) else _module_call(h, child)
    if hooked:
        h.exit(name, None, None)


def test_modules_of_a_forward_begun_before_the_hooks_begin_no_run() -> None:
    """Note [Hooks that come on during a forward]: the hooks come on inside the root's
    forward, after its first layer; the layers after it are not outermost forwards. The
    next forward of the root is, and runs as always."""
    h = _Recorder()
    h.call_code = _module_call.__code__
    _module_call(h, "root", ("l0", "l1", ("l2", ("attn",))), hooked=False)
    assert h.log == []  # no run began, so none is left for the next forward
    assert h.current() is None
    _module_call(h, "root", ("l0", "l1"))
    assert h.log == [("begin", "root"), ("inner", "l0"), ("leave", "l0"), ("inner", "l1"),
                     ("leave", "l1"), ("leave", "root"), ("end", "root")]  # fmt: skip
    # Without the code of the module call (before um.py sets it): each layer begins one.
    h = _Recorder()
    _module_call(h, "root", ("l0", "l1"), hooked=False)
    assert [e for e in h.log if e[0] == "begin"] == [("begin", "l0"), ("begin", "l1")]


def _cycle(sized: bool) -> Device:
    """Sequence lengths cycling 1024, 512, 768 (saves in proportion), step after step."""
    dev = Device(budget=4096 * MiB, params=1024 * MiB, margin=256 * MiB, sized=sized)
    lengths = [1024, 512, 768] * 6
    for n in lengths:
        dev.step(_layers(24, [16 * MiB * n // 512, 48 * MiB * n // 512, 64 * MiB * n // 512]))
    return dev


def test_a_target_for_each_size_of_forward() -> None:
    """Note [A target for each size of forward]: learnt as the bytes kept, the target
    fits each length of a cycle once each has been seen; learnt as the bytes offloaded
    by the forward before, the longest length evicts at every turn of the cycle."""
    settled = _cycle(sized=True).log[-6:]
    for s in settled:
        assert s.evicted == 0 and s.misses == 0, s
        assert s.room_end <= 2 * 256 * MiB, s  # and not much more left than needed
    last_only = _cycle(sized=False).log[-6:]
    assert sum(s.evicted > 0 for s in last_only) >= 2, last_only


def test_a_target_scales_to_a_size_not_seen_yet() -> None:
    t = plan.OffloadTarget(margin=0)
    assert t.for_forward(100) == 0  # nothing learnt: the first forward offloads nothing
    learn(t, evicted=700, room=0, saved=1000, first=100, target=0)  # kept 300 of 1000
    assert (t.bytes, t.for_forward(100)) == (700, 700)
    assert t.for_forward(50) == 200  # half the saves, the same 300 kept
    assert t.for_forward(20) == 0  # fits
    learn(t, evicted=0, room=0, saved=480, first=50, target=200)  # 480 saved, not 500
    assert t.for_forward(50) == 200 and t.for_forward(100) == 720  # kept 280 now
    for k in range(1, plan.OffloadTarget.MAX_SIZES + 5):
        learn(t, evicted=0, room=0, saved=1000 + k, first=1000 + k)
    assert len(t.sizes) == plan.OffloadTarget.MAX_SIZES and 100 not in t.sizes


def test_budget_margin_is_a_sixteenth_of_the_budget_at_least_16_mib() -> None:
    assert plan.budget_margin(8 << 30) == 512 * MiB
    assert plan.budget_margin(256 * MiB) == 16 * MiB
    assert plan.budget_margin(0) == 16 * MiB
