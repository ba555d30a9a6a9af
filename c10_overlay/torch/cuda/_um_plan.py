"""Decisions of the saved-activation offload (Note [Saved-activation offload] in
``torch/cuda/_um_predict.py``) and of the optimizer state staging (Note [Optimizer
state staging] in ``torch/cuda/_um_optim.py``), kept apart from the CUDA work so that
they can be tested on traces without a GPU: pure Python, no torch import.

Four small parts, one job each:

- :class:`OffloadTarget` learns, one forward at a time, how many bytes of saved
  activations must leave the device so that the forward stays under the budget;
- :class:`ForwardPlan` applies the target inside one forward: the earliest saves
  leave, since the backward reads them last;
- :class:`PrefetchQueue` brings the saves that left back in the reverse order of
  saving, as far ahead of their use as the lookahead and the free room allow, and
  widens the lookahead when a use finds its bytes not yet there;
- :func:`state_chunks` cuts an optimizer's parameters into runs whose state fits the
  room one staged chunk may take.

Not thread-safe: the caller (``_um_predict.Offloader``) holds its lock around every call.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

MiB = 1 << 20


@dataclass
class OffloadTarget:
    """Bytes of the next forward's saves to offload, learned from the forwards before.

    After each forward: room left on the device at the forward's end (where the saves
    peak), past ``margin``, means too much left, so the target shrinks by three quarters
    of it (less than all of it keeps it from oscillating); otherwise evictions the
    engine made during the forward mean that too little left by copy, so the target
    grows by those bytes (the overflow the copies did not cover).
    The target never exceeds the bytes the last forward saved. The first forward
    offloads nothing: it is the plain residency policy, and its evictions are the
    first measurement. A pattern that changes (a new batch size, ``model.eval()``)
    moves the target by the same rule; a wrong target costs time, never data.
    """

    margin: int
    bytes: int = 0
    forwards: int = 0

    def update(self, evicted: int, room: int, saved: int) -> int:
        self.forwards += 1
        if room > self.margin:
            # Room to spare at the end, where the saves peak: evictions during this
            # forward (data left cold by an earlier phase) were not for want of room.
            target = self.bytes - (room - self.margin) * 3 // 4
        else:
            target = self.bytes + max(0, evicted)
        self.bytes = max(0, min(target, saved))
        return self.bytes


@dataclass
class ForwardPlan:
    """One forward's offload decisions: saves leave, in the order they are made, until
    ``target`` bytes of candidates have been seen."""

    target: int
    seen: int = 0  # candidate bytes saved so far in this forward
    offloaded: int = 0

    def offload(self, nbytes: int) -> bool:
        leave = self.seen < self.target
        self.seen += nbytes
        if leave:
            self.offloaded += nbytes
        return leave


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
    lookahead and each fits in ``room`` (free device bytes under the budget);
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

    def pump(self, room: int) -> list[Entry]:
        out: list[Entry] = []
        self.stopped = ""
        while self.cursor >= 0:
            entry = self.entries[self.cursor]()
            if entry is None or entry.issued:
                self.cursor -= 1
                continue
            if self.inflight + entry.nbytes > self.lookahead and (self.inflight or out):
                self.stopped = "lookahead"  # a single larger entry still goes alone
                break
            if entry.nbytes > room:
                self.stopped = "room"
                break
            room -= entry.nbytes
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
