"""Decisions of the saved-activation offload (Note [Saved-activation offload] in
``torch/cuda/_um_predict.py``), of the optimizer state staging (Note [Optimizer
state staging] in ``torch/cuda/_um_optim.py``) and of the weight streaming (Note
[Weight streaming] in ``torch/cuda/_um_weights.py``), kept apart from the CUDA work so
that they can be tested on traces without a GPU: pure Python, no torch import.

Small parts, one job each:

- :class:`OffloadTarget` learns, one forward at a time, how many bytes of saved
  activations must leave the device so that the forward stays under the budget;
- :class:`ForwardPlan` applies the target inside one forward: the earliest saves
  leave, since the backward reads them last; :func:`buffers_to_warm` says which host
  buffers the next forward will need that this one did not take;
- :class:`PrefetchQueue` brings the saves that left back in the reverse order of
  saving, as far ahead of their use as the lookahead and the free room allow, and
  widens the lookahead when a use finds its bytes not yet there;
- :func:`state_chunks` cuts an optimizer's parameters into runs whose state fits the
  room one staged chunk may take;
- :class:`StreamTarget` learns, one forward without autograd at a time, how many bytes
  of parameters must be read by copy so that the forward stays under the budget;
- :func:`spread_order` and :func:`stream_plan` pick, spread over a recorded order of
  module calls, the parameters those bytes are;
- :class:`RingParts` hands out the parts of the streaming's ring of device memory;
- :class:`OutermostForward` is the module hooks' bookkeeping both the offload and the
  streaming share: which forward of a thread is the outermost one.

Not thread-safe, but for OutermostForward: each caller (``Offloader``, ``Stager``,
``Streamer``) holds its lock around every call.
"""

from __future__ import annotations

import bisect
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:  # this module runs without torch (its CPU tests)
    import torch

MiB = 1 << 20
# um.py's use signal for whole storages: the tensors are about to be used on their device
# (Note [Use signals]); the optimizer stager and the weight streamer are handed it.
Touch = Callable[[list["torch.Tensor"]], None]


def budget_margin(budget: int) -> int:
    """Room under a device budget that the offload and the weight streaming leave
    unplanned: a sixteenth of it, at least 16 MiB."""
    return max(16 * MiB, budget // 16)


@dataclass
class OffloadTarget:
    """Bytes of the next forward's saves to offload, learned from the forwards before.

    After each forward's window (Note [The kept saves' window], _um_predict.py: from
    the forward's end into the backward, while the saves that stayed are on the device)
    two readings weigh against each other: the evictions the engine made from the
    forward's start to the window's end (too little left by copy: the overflow the
    copies did not cover) and the room left at the window's tightest read, past
    ``margin`` (too much left). Where the evictions are more, the target grows by the
    difference; where the spare room is more, it shrinks by three quarters of the
    difference (less than all of it keeps it from oscillating). The room is read at the
    kept saves' reads only, so evictions between them (in the forward, say) leave the
    least room read above the true one: a spare room of a few MiB against hundreds of
    MiB evicted is no reason to offload nothing (bench/README.md, step 49: under a
    256 MiB budget, whose margin is 16 MiB, the least room read was 20 MiB in every
    window while 700-800 MiB were evicted, and the target stayed at 0).
    The target never exceeds the bytes the last forward saved. The first forward
    offloads nothing: it is the plain residency policy, and its evictions are the
    first measurement. A wrong target costs time, never data.

    Note [A target for each size of forward]
    What a forward may keep on the device is what the budget leaves beside the
    parameters, gradients and the backward's peak: about the same whatever the
    forward's size. What it must offload is its saves less that. So a target learnt
    from one forward holds for another of a different size (a new batch size, the
    next sequence length) as the bytes it kept, not the bytes it offloaded: the
    1.28 B model at 8 GiB learns 6.9, 3.85 and 0.77 GB to offload at 1024, 768 and
    512 tokens, and keeps 5.36 GB at each (bench/README.md, step 49). A target in
    bytes offloaded, learnt from the forward before, was wrong at every step of a
    loop whose lengths cycle: 3.7 GB for each 1024-token step (4-5 GB evicted, 1.03-
    1.19 s against 0.54) and for each 512-token one (0.45-0.55 s against 0.29-0.31).
    The forward's size is known from its first candidate save (the embedding's or
    first layer's output, in proportion to the tokens): ``for_forward`` takes the
    bytes the forwards with that first save saved last time (``sizes``, up to
    MAX_SIZES of them), else the last forward's scaled by the two first saves, less
    what the last forward kept. ``bytes`` is the target for a forward like the last.
    Each outermost module has a target of its own (``Offloader._target_of``): a loss
    module called after the model is an outermost forward too, and what its small forward
    kept says nothing of the model's; the two learn together, as one chain (``learn_chain``).
    """

    MAX_SIZES = 64  # forward sizes remembered (dynamic padding makes many)

    margin: int
    bytes: int = 0  # the target of a forward like the last one
    forwards: int = 0
    last: int = 0  # the last forward's first candidate save, in bytes
    sizes: dict[int, int] = field(default_factory=dict)  # first save -> bytes saved

    def for_forward(self, first: int) -> int:
        """The target of a forward whose first candidate save is ``first`` bytes."""
        ref = self.sizes.get(self.last)
        if ref is None:
            return self.bytes  # nothing learnt of sizes: the target as it stands
        saved = self.sizes.get(first)
        if saved is None:
            saved = ref * first // self.last if self.last > 0 else ref
        kept = max(0, ref - self.bytes)  # what the last forward kept on the device
        return max(0, saved - kept)

    def proposal(self, evicted: int, room: int, was: int) -> int:
        """The bytes a forward that ran with target ``was`` should have offloaded, by the
        evictions and the least room read (see above); not yet bounded by its saves. A
        window's forwards learn through ``learn_chain``, one forward as a chain of one."""
        short = max(0, evicted) - max(0, room - self.margin)
        return was + short if short > 0 else was + short * 3 // 4

    def record(self, saved: int, first: int, target: int) -> int:
        """A forward that saved ``saved`` bytes, the first ``first``, should offload
        ``target`` (bounded by ``saved``): the target for its like, returned."""
        self.forwards += 1
        self.bytes = max(0, min(target, saved))
        if first not in self.sizes and len(self.sizes) >= self.MAX_SIZES:
            del self.sizes[next(iter(self.sizes))]  # the oldest size
        self.sizes[first] = saved
        self.last = first
        return self.bytes


@dataclass
class ChainPart:
    """One forward of a chain (Note [A chain of forwards before one backward]): its
    module's target, the candidate bytes it saved, its first save, the target it ran with."""

    target: OffloadTarget
    saved: int
    first: int
    planned: int


def learn_chain(parts: list[ChainPart], evicted: int, room: int) -> None:
    """Note [A chain of forwards before one backward]
    A forward called on a tensor that carries autograd history while an earlier forward's
    window is open (Note [The kept saves' window], _um_predict.py) continues that
    forward's graph, and one backward will run through both: a loss module on the
    model's logits, a discriminator on a generator's output, a cell applied to its own
    output. Closing the first forward's window at the second's start, as a forward of
    the next batch does, would learn the model's target before its backward and the
    loss module's from the model's kept phase: the model's grew from the forward's
    evictions alone, and the small module, read first by the backward, took the rest.
    So a chain is one forward to the offload: one window from the first forward's end to
    the backward, its evictions and least room learnt once, against the sum of the
    targets the parts ran with; the chain's new target is then laid over the parts in the
    order they ran, as a forward's target is over its saves (the first saves leave first:
    the backward reads them last). A module met more than once in the chain (a cell
    unrolled by the program) gets the mean of its parts' shares, its one target serving
    each of its forwards. A forward with no history (the next batch) ends the chain.
    History is looked for in the call's arguments (``_um_predict._has_history``), the
    keyword ones read from the module call's frame (``OutermostForward.call_kwargs``:
    the global forward pre-hook is given the positional ones alone); where that frame
    is not known, a module given its input by keyword closes the window as a new batch
    would (slower, never wrong). So does a forward on data with no history between the
    chain's parts: a GAN's discriminator on real or detached samples closes the
    generator's window before the generator's backward."""
    if not parts:
        return
    total = parts[0].target.proposal(evicted, room, sum(p.planned for p in parts))
    left = max(0, min(total, sum(p.saved for p in parts)))
    shares: dict[int, tuple[ChainPart, int, int]] = {}  # id(target) -> last part, bytes, parts
    for part in parts:
        take = min(left, part.saved)
        left -= take
        _, given, count = shares.get(id(part.target), (part, 0, 0))
        shares[id(part.target)] = (part, given + take, count + 1)
    for last, given, count in shares.values():
        last.target.record(last.saved, last.first, given // count)


@dataclass
class ForwardPlan:
    """One forward's offload decisions: saves leave, in the order they are made, until
    ``target`` bytes of candidates have been seen. With ``sizer``, the target is
    ``sizer(first)`` once the first candidate, of ``first`` bytes, is seen (Note [A
    target for each size of forward])."""

    target: int
    sizer: Callable[[int], int] | None = None
    seen: int = 0  # candidate bytes saved so far in this forward
    offloaded: int = 0
    first: int = 0  # the first candidate's bytes (0: none yet)

    def offload(self, nbytes: int) -> bool:
        if not self.first:
            self.first = nbytes
            if self.sizer is not None:
                self.target = self.sizer(nbytes)
        leave = self.seen < self.target
        self.seen += nbytes
        if leave:
            self.offloaded += nbytes
        return leave


def buffers_to_warm(saves: list[tuple[int, bool]], target: int, room: int) -> list[int]:
    """Sizes of the host buffers that the next forward, offloading up to ``target``, will
    take and this one did not: ``saves`` is this forward's candidates in the order they
    were saved, each with whether it left. The next forward's decisions are
    ForwardPlan's over the same saves (the pattern repeats); the buffers of those that
    left this time are in the host allocator's cache again by then. At most ``room``
    bytes: the host RAM that page-locked memory may still take."""
    plan = ForwardPlan(target)
    warm: list[int] = []
    total = 0
    for nbytes, left in saves:
        if not plan.offload(nbytes):
            break  # every later save stays too
        if left:
            continue
        if total + nbytes > room:
            break
        warm.append(nbytes)
        total += nbytes
    return warm


class Entry:
    """A save that left the device: its size and where its copy back stands (the CUDA
    side subclasses it with the buffers and events)."""

    def __init__(self, nbytes: int) -> None:
        self.nbytes = nbytes
        self.issued = False  # copy back to the device issued (ahead of use, or at use)
        self.ahead = False  # issued by the queue, before its first use
        self.used = False


@dataclass
class PrefetchQueue:
    """The saves of one forward that left the device, brought back in reverse order.

    ``pump(room)`` returns the entries to bring back now: the next ones in reverse order
    of saving, while the bytes brought back ahead and not used yet stay within the
    lookahead and each fits in the room, the free device bytes under the budget that the
    function ``room`` gives (called once, and only when an entry is within the lookahead:
    most pumps stop at the lookahead, and reading the room asks the engine);
    ``stopped`` says which of the two held the next entry back, if one did. ``use``
    classifies a use: ``hit`` (brought back ahead and ready), ``late`` (brought back
    ahead, copy still running) or ``miss`` (not brought back: the caller copies it
    now); a late use or a miss doubles the lookahead, up to ``max_lookahead``.
    Entries are handed in by the caller as weak references (``ref()`` is None once the
    save is gone, e.g. the graph was freed without a backward); dead ones are skipped.
    """

    max_lookahead: int
    lookahead: int = 0
    entries: list[Callable[[], Entry | None]] = field(default_factory=list)
    cursor: int = -1  # next entry to bring back, counting down
    inflight: int = 0  # bytes brought back ahead, not used yet
    stopped: str = ""  # why the last pump stopped short: "room", "lookahead" or ""

    def __post_init__(self) -> None:
        if self.lookahead <= 0:
            self.lookahead = min(self.max_lookahead, 256 * MiB)

    def add(self, ref: Callable[[], Entry | None]) -> None:
        self.entries.append(ref)
        self.cursor = len(self.entries) - 1

    def pump(self, room: Callable[[], int]) -> list[Entry]:
        out: list[Entry] = []
        self.stopped = ""
        left: int | None = None
        while self.cursor >= 0:
            entry = self.entries[self.cursor]()
            if entry is None or entry.issued:
                self.cursor -= 1
                continue
            if self.inflight + entry.nbytes > self.lookahead and (self.inflight or out):
                self.stopped = "lookahead"  # a single larger entry still goes alone
                break
            if left is None:
                left = room()
            if entry.nbytes > left:
                self.stopped = "room"
                break
            left -= entry.nbytes
            entry.issued = entry.ahead = True
            self.inflight += entry.nbytes
            self.cursor -= 1
            out.append(entry)
        return out

    def use(self, entry: Entry, ready: bool) -> str:
        first = not entry.used
        entry.used = True
        if not entry.issued:
            entry.issued = True
            self._widen()
            return "miss"
        if entry.ahead and first:
            self.inflight = max(0, self.inflight - entry.nbytes)
        if ready or not first:
            return "hit"
        self._widen()
        return "late"

    def _widen(self) -> None:
        self.lookahead = min(self.max_lookahead, self.lookahead * 2)


def state_chunks(sizes: list[int], limit: int) -> list[list[int]]:
    """Consecutive runs of indices into ``sizes`` (state bytes per parameter, in the
    optimizer's order), each run's total at most ``limit``; a parameter whose state
    alone is larger than ``limit`` is a run of its own. Every index appears once, in
    order, so that a step over the runs one after another updates each parameter once."""
    runs: list[list[int]] = []
    run: list[int] = []
    total = 0
    for i, n in enumerate(sizes):
        if run and total + n > limit:
            runs.append(run)
            run, total = [], 0
        run.append(i)
        total += n
    if run:
        runs.append(run)
    return runs


@dataclass
class StreamTarget:
    """Bytes of parameters the next forward without autograd reads by copy.

    After each forward that followed its record: live bytes the engine evicted during it
    (past those the streamer sent to host RAM itself) mean too few bytes were streamed;
    the target grows by them, and never again shrinks to where it was. Dead blocks the
    engine discarded past ``margin`` grow it too, by those bytes, up to the live bytes
    past the budget at the forward's end plus the margin (``over``; Note [Discards past
    the budget]), and it never again shrinks to where it was. A forward without
    evictions, in which the engine did not discard dead blocks to make room either,
    shrinks it by half the least free room seen at a call past ``margin``, down to that
    floor plus the margin: room seen at calls counts dead blocks as free, though the
    allocator will reuse them. Measured on the H200 (bench/README.md, prediction step
    14): a target that followed that room down into evictions made the forward slower
    (0.055 s to 0.075 s). A new record starts from the evictions of the forward that
    made it, the plain policy's overflow, but at most the placed bytes past the budget
    at its end plus the margin (Note [The first target]); its discards past the margin
    count as evictions there, under the discard rule's bound (Note [A record made from
    dead blocks]). Never more than ``total``, the streamable bytes of the record.
    """

    margin: int
    bytes: int = 0
    floor: int = 0  # the largest target that still saw evictions
    discard_growths: int = 0  # updates that grew the target by discards

    def start(self, evicted: int, total: int, over: int | None = None, discarded: int = 0) -> int:
        # Note [The first target]
        # ~~~~~~~~~~~~~~~~~~~~~~~~
        # Under the plain LRU policy, a forward that reads more weights than fit reads
        # them as a cycle, and LRU evicts each one before the cycle comes back to it: the
        # forward's evictions are then the whole scan, not what did not fit. In
        # generate() (bench/README.md, prediction step 31) the prefill evicted 2626 MiB
        # of a 2434 MiB record with 0.55 GiB past the budget, so the target started at
        # every weight; 108 MiB evicted in the next forward (about the KV cache's size)
        # made that the floor, and every token copied 2.4 GB. Bounded by ``over``, the
        # placed bytes past the budget when the forward ended, it settled at 0.84 GB.
        # Evictions in the forwards after the first still grow the target.
        #
        # Note [A record made from dead blocks]
        # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
        # The record's forward runs under the plain policy, which makes room from dead
        # blocks before live ones; when a forward before it left the allocator's cache
        # full, its overflow shows as discards. The Llama's inference (bench/README.md,
        # prediction step 38): a record made at the first forward evicted 2.4 GB and
        # started at the bound, 835 MB, settling at 895 with nothing moving; one made at
        # the second (the hooks came on during the first) evicted 336 MB and discarded
        # 4.9 GB, started at 336, and took seven forwards of 0.7-4.9 GB of swaps, a
        # shrink and a regrowth to settle at 885, 10 ms a forward slower. So discards
        # past the margin count as evictions here, under the bound of Note [Discards
        # past the budget]: only with ``over`` read and no more than the record's
        # streamable bytes.
        self.floor = 0
        moved = evicted
        if over is not None and discarded > self.margin and over <= total:
            moved += discarded
        first = moved if over is None else min(moved, over + self.margin)
        self.bytes = max(0, min(first, total))
        return self.bytes

    def update(
        self, evicted: int, discarded: int, low_room: int, total: int, over: int | None = None
    ) -> int:
        if evicted > 0:
            self.floor = max(self.floor, self.bytes)
            target = self.bytes + evicted
        elif (
            over is not None
            and discarded > self.margin
            and self.bytes < over + self.margin
            and over <= total
        ):
            # Note [Discards past the budget]
            # ~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
            # The engine makes room from dead blocks before live ones (LRU takes the
            # dead first), so a forward whose live bytes do not fit may show its
            # overflow as dead blocks discarded and placed again, not as evictions: a
            # target that grows by evictions alone then stops short. The Llama's
            # inference (bench/README.md, prediction steps 36 and 37) settled at 600 MB
            # in some processes, discarding and placing again 0.53 GB of the
            # allocator's cached blocks a forward, and at 835 MB with 0.19 GB in others;
            # the ledger traces of both show the same cache and the same live peak,
            # 0.6 GiB past the budget. Each swap holds the allocating thread (it waits
            # for the evictor: 3-14 ms a forward in step 37's probes). So discards past
            # a margin grow the target by the bytes discarded, up to the live bytes
            # past the budget at the forward's end plus the margin (what must leave for
            # the live bytes to fit, start()'s bound), and it does not shrink back below
            # where they were. Only while those bytes are no more than the record's
            # streamable ones: an overflow larger than the forward's own weights (an
            # eval forward during training, its optimizer state live past the budget)
            # is not this forward's to fix by streaming. Steps 16 and 34 grew the
            # target by discards without this bound: to every weight of the GPT-2, and
            # to 1.33 GB of the Llama's, for nothing.
            self.floor = max(self.floor, self.bytes)
            target = min(self.bytes + discarded, over + self.margin)
            self.discard_growths += 1
        elif discarded == 0 and low_room > 2 * self.margin:
            shrunk = self.bytes - (low_room - self.margin) // 2
            target = max(shrunk, min(self.bytes, self.floor + self.margin))
        else:
            target = self.bytes
        self.bytes = max(0, min(target, total))
        return self.bytes


def spread_order(calls: list[list[tuple[int, int]]]) -> list[int]:
    """The recorded calls in the order they are streamed as the target grows: every
    prefix of it is spread evenly over the forward's bytes, so that a larger target adds
    calls and never trades one for another (a call that changes sides costs a move).

    ``calls``: per module call, in the order of the forward, its streamable parameters as
    (storage key, bytes); only storages that one call alone reads count (see
    :func:`stream_plan`). The calls are taken at the bytes the van der Corput points
    1/2, 1/4, 3/4, 1/8, ... of the forward fall in: the middle first, never the first
    call early, and the calls too small to be hit (biases, norms) last, in forward
    order."""
    own = _own_bytes(calls)
    total = sum(own)
    ends: list[int] = []
    for n in own:
        ends.append((ends[-1] if ends else 0) + n)
    order: list[int] = []
    taken = [False] * len(calls)
    wanted = sum(1 for n in own if n > 0)
    k = 1
    while len(order) < wanted and k < 8 * len(calls):
        x, f, j = 0.0, 0.5, k
        while j:
            x += f * (j & 1)
            j >>= 1
            f /= 2
        i = bisect.bisect_right(ends, x * total)
        if i < len(calls) and own[i] > 0 and not taken[i]:
            taken[i] = True
            order.append(i)
        k += 1
    order.extend(i for i in range(len(calls)) if own[i] > 0 and not taken[i])
    return order


def stream_plan(
    calls: list[list[tuple[int, int]]],
    target: int,
    order: list[int],
    largest: int,
    align: int = 1,
) -> list[list[int]]:
    """Which parameters each recorded module call reads by copy.

    ``calls`` as for :func:`spread_order`, ``order`` its result. Calls are taken in
    that order, skipping those whose own bytes, each parameter rounded up to ``align``
    as its part of the ring is (:func:`ring_bytes`), exceed ``largest`` (what the copy
    buffers hold), until their bytes reach ``target``. The link then works through the whole
    forward, each copy under the compute of the calls before it, with a lookahead of a
    few calls; a suffix of the forward would leave the link idle until the suffix and
    then hold the compute back. A storage that several calls read stays on the device
    and is read in place (a tied input embedding and output layer, a block applied
    twice): its copy would serve one call, or the calls would need it kept. Returns,
    per call, the indices into its list of the parameters it reads by copy (empty for
    the calls that read all theirs in place)."""
    out: list[list[int]] = [[] for _ in calls]
    if target <= 0:
        return out
    own = _own_bytes(calls)
    held = _own_bytes(calls, align)  # what each call takes of the ring
    chosen = [False] * len(calls)
    streamed = 0
    for i in order:
        if streamed >= target:
            break
        if held[i] <= largest:
            chosen[i] = True
            streamed += own[i]
    readers = _readers(calls)
    for i, call in enumerate(calls):
        if chosen[i]:
            out[i] = [k for k, (key, _) in enumerate(call) if len(readers[key]) == 1]
    return out


def _readers(calls: list[list[tuple[int, int]]]) -> dict[int, set[int]]:
    out: dict[int, set[int]] = {}
    for i, call in enumerate(calls):
        for key, _ in call:
            out.setdefault(key, set()).add(i)
    return out


def _own_bytes(calls: list[list[tuple[int, int]]], align: int = 1) -> list[int]:
    """Per call, the bytes of the storages no other call reads (each once, each rounded up
    to ``align``)."""
    readers = _readers(calls)
    own = [0] * len(calls)
    for i, call in enumerate(calls):
        for key, nbytes in dict(call).items():
            if len(readers[key]) == 1:
                own[i] += -(-nbytes // align) * align
    return own


def ring_bytes(
    calls: list[list[tuple[int, int]]], align: int, cap: int, minimum: int, depth: int
) -> int:
    """How large the ring of Note [Ring size] (torch/cuda/_um_weights.py) is for a record:
    ``depth`` copies of the largest call it may stream (a call's own parameters, each
    rounded up to ``align`` as its part of the ring is), at least ``minimum``, at most
    ``cap``; ``cap`` when no call fits under it. ``calls`` as for :func:`spread_order`."""
    largest = max((n for n in _own_bytes(calls, align) if n <= cap), default=0)
    if largest == 0:
        return cap
    return min(cap, max(minimum, depth * largest))


def unique_bytes(calls: list[list[tuple[int, int]]]) -> int:
    """Bytes of the distinct storages the calls read."""
    seen: dict[int, int] = {}
    for call in calls:
        for key, nbytes in call:
            seen[key] = nbytes
    return sum(seen.values())


class RingParts:
    """The parts of a ring of ``size`` bytes, handed out first in, first out (the
    weight streaming's copies, Note [Weight streaming]): ``take`` returns the start of a
    free part of ``nbytes`` (rounded up to ``align``) or None while the parts held are in
    the way (or it can never fit); ``give_back`` frees a part, normally the oldest. A
    part never overlaps one held.

    A part may be given back with a token (the event after the call that read it):
    ``readers`` then returns, for a part just taken, the tokens of every part given back
    since the last ``forget`` that overlaps it, which its copy waits for; those wholly
    inside it are forgotten (whoever takes their bytes again waits for this part's own
    token, given later)."""

    def __init__(self, size: int, align: int) -> None:
        self.size = size
        self.align = align
        self.held: list[tuple[int, int]] = []  # (start, end), oldest first
        self.head = 0  # where the next part starts
        self.released: list[tuple[int, int, object]] = []  # (start, end, token)

    def take(self, nbytes: int) -> int | None:
        n = -(-nbytes // self.align) * self.align
        if n > self.size:
            return None
        if not self.held:
            self.head = 0
        tail = self.held[0][0] if self.held else 0
        wrapped = bool(self.held) and self.head <= tail
        if not wrapped and self.head + n <= self.size:
            start = self.head
        elif not wrapped and n <= tail:
            start = 0  # wrap around
        elif wrapped and self.head + n <= tail:
            start = self.head
        else:
            return None
        self.held.append((start, start + n))
        self.head = start + n
        return start

    def give_back(self, span: tuple[int, int], token: object = None) -> None:
        self.held.remove(span)
        if token is not None:
            self.released.append((*span, token))

    def readers(self, span: tuple[int, int]) -> list[object]:
        start, end = span
        out, kept = [], []
        for lo, hi, token in self.released:
            if lo < end and start < hi:
                out.append(token)
                if start <= lo and hi <= end:
                    continue
            kept.append((lo, hi, token))
        self.released = kept
        return out

    def forget(self) -> None:
        """Every reader so far is waited for by other means."""
        self.released.clear()


Run = TypeVar("Run")


class OutermostForward(Generic[Run]):
    """Module hooks that follow each thread's outermost forward.

    ``enter`` (a global forward pre-hook) calls ``_begin(module, args)`` when no forward
    is under way on the thread, keeping what it returns as the thread's run (None: nothing
    to do in this forward), and ``_inner(run, module)`` for each module called inside it;
    ``exit`` (a global forward hook registered with ``always_call``, so that it runs when
    a forward raises too) calls ``_leave(run, module)`` for each and ``_end(run)`` when
    the outermost forward returns. Hooks installed while a forward is under way see its
    exits at depth 0 and ignore them. Thread-safe: the depth and the run are the thread's
    own. Subclasses set ``active``; while it is False no run begins.

    Hooks taken off while a forward is under way (the pressure watcher, configure()) miss
    its exits, so that thread's depth and run would be stale when they come back on:
    ``abandon_runs()``, called as they come off, makes each thread start afresh at its
    next hook call, after ``_abandon(run)`` on that thread for a run it left behind."""

    active = True
    # The code of the call that runs a module's hooks and forward (um.py sets it to
    # torch.nn.Module._call_impl's); None: every call at depth 0 begins a run.
    call_code: Any = None

    def __init__(self) -> None:
        self._tls = threading.local()
        self._epoch = 0  # abandon_runs() calls so far

    def abandon_runs(self) -> None:
        """The hooks are coming off: every run under way is abandoned (see above)."""
        self._epoch += 1

    def _state(self) -> Any:
        st = self._tls
        epoch = getattr(st, "epoch", None)
        if epoch != self._epoch:
            old = getattr(st, "run", None) if epoch is not None else None
            st.depth, st.run, st.epoch = 0, None, self._epoch
            if old is not None:
                self._abandon(old)
        return st

    def current(self) -> Run | None:
        """This thread's run, if a forward with one is under way."""
        st = self._tls
        if getattr(st, "epoch", None) != self._epoch:
            return None  # left behind by hooks that came off (abandon_runs)
        run: Run | None = getattr(st, "run", None)
        return run

    def enter(self, module: Any, args: object) -> None:
        st = self._state()
        depth = getattr(st, "depth", 0)
        st.depth = depth + 1
        if depth == 0:
            outermost = self.active and not self._inside_unseen_forward()
            st.run = self._begin(module, args) if outermost else None
            return
        run = getattr(st, "run", None)
        if run is not None:
            self._inner(run, module)

    def _inside_unseen_forward(self) -> bool:
        """Note [Hooks that come on during a forward]
        Hooks installed while a forward is under way (the pressure watcher puts them on
        when the budget is passed, often in the middle of the first forward) miss its
        start: each module it calls after that comes to ``enter`` at depth 0 and looked
        like an outermost forward. A Llama's first forward made 24 records that way, one
        per decoder layer left, and the whole model's record began a forward later
        (bench/README.md, prediction step 34). So a call at depth 0 whose own thread's
        stack holds a second module call (``call_code``: the frame that ran this hook,
        and one further up) is inside a forward begun before the hooks: it begins no
        run, and its inner calls and its exit pass as those of a run that does nothing.
        One walk up the stack per outermost forward, a few microseconds."""
        calls = self._module_calls()
        return next(calls, None) is not None and next(calls, None) is not None

    def call_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of the module call whose hooks run now: the global
        forward pre-hook is given the positional ones alone, and the call's frame (the
        nearest ``call_code`` frame) holds the rest in its ``kwargs``. Empty where no
        such frame is found."""
        frame = next(self._module_calls(), None)
        kwargs = frame.f_locals.get("kwargs") if frame is not None else None
        return kwargs if isinstance(kwargs, dict) else {}

    def _module_calls(self) -> Iterator[Any]:
        """The frames of the module calls (``call_code``) on this thread's stack,
        innermost first; none while ``call_code`` is unset."""
        code = self.call_code
        frame: Any = sys._getframe(1) if code is not None else None
        while frame is not None:
            if frame.f_code is code:
                yield frame
            frame = frame.f_back

    def exit(self, module: Any, args: object, output: object) -> None:
        st = self._state()
        depth = getattr(st, "depth", 0)
        if depth == 0:
            return  # installed while this forward was under way
        st.depth = depth - 1
        run = getattr(st, "run", None)
        if run is None:
            return
        self._leave(run, module)
        if depth == 1:
            st.run = None
            self._end(run)

    def _begin(self, module: Any, args: object) -> Run | None:
        """An outermost forward of ``module`` called with ``args`` (its positional
        arguments) begins; what it returns is the thread's run."""
        raise NotImplementedError

    def _inner(self, run: Run, module: Any) -> None:
        """A module called inside the outermost forward (default: nothing)."""

    def _leave(self, run: Run, module: Any) -> None:
        """A module of the forward returned (default: nothing)."""

    def _end(self, run: Run) -> None:
        raise NotImplementedError

    def _abandon(self, run: Run) -> None:
        """A run whose forward lost its hooks, on its own thread (default: nothing)."""
