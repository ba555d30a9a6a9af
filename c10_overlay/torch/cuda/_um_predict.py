"""Saved activations past the budget leave the device by copy and come back ahead of use.

Note [Saved-activation offload]
A training step that does not fit under the device budget overflows mostly with the
activations its forward saves for the backward. Under the plain residency policy they
leave by migration: the evictor prefetches their pages to the CPU, which runs at 10-24
GB/s on the H200 host (design notes, section 9), and the compute stream waits for it
(bench/README.md, prediction steps 6-8). A copy engine moves the same bytes at the
link's 52-55 GB/s each way. So, with ``predict:True`` and once the module hooks are on
(Note [Use signals], um.py), the outermost module's forward runs under saved-tensor
hooks (``torch.autograd.graph``'s default hooks, pushed for that forward only) that:

- pack: offload the earliest saves of the forward, those the backward reads last, up
  to a target in bytes (``_um_plan.OffloadTarget``: grown by the bytes the engine had
  to evict up to the kept saves' window's end, net of the room left at its tightest
  point; shrunk by most of that room where it is the more; Note [The kept saves'
  window]; learnt as the bytes a forward may keep, so that it holds for forwards of
  other sizes: Note [A target for each size of forward], _um_plan.py). A save
  that leaves is copied whole (its storage, once per storage and version) on a side
  stream into page-locked host memory; autograd keeps the host copy, and the device
  block goes back to the allocator when the forward drops the tensor (``record_stream``
  keeps it until the copy has read it). The host waits for the oldest copy once more
  than COPY_WINDOW bytes are in flight, so that the forward cannot outrun the link and
  fill the device with blocks still being copied (``Offloader._throttle``). Page-locked
  memory beyond what ``host_headroom`` leaves of host RAM is not taken: the forward
  offloads less. Parameters, small saves (< 1 MiB), tensors that are not plain strided
  CUDA tensors, and saves made during a capture or a backward stay.
- unpack: the backward reads the saves in about the reverse order of saving, so each
  unpack brings the next ones back on another side stream, ahead of their use, as far
  as the lookahead (``predict_lookahead``, doubled from 256 MiB on each late use) and
  the room under the budget allow (``_um_plan.PrefetchQueue``), into blocks of the
  compute stream's pool, from the backward's first read of a save that left on (not
  while the saves that stayed are read: Note [The kept saves' window]). A save not
  brought back in time is copied at its use, on the compute stream.

Note [The kept saves' window]
The saves that stay on the device live from their forward to the backward's reads of
them, which come first: the backward reads the last saves first, and those are the ones
kept. So the device is fullest not at the forward's end but some way into the backward,
once the loss's and the last layers' gradients are added to every kept save and the
parameters. Learning from the forward's end alone, the target left the backward to evict
for that: on the 1.28 B model, 484 MB in every step's backward, all of it while the kept
saves were read, brought back by touch at migration speed (bench/README.md, step 47,
``timeline_probe --unpacks``). So a forward's end opens a window that closes at the
backward's first read of a save that left (from then on the kept saves are gone and the
prefetch works within the room), or at the backward's end (``queue_callback``, the first
read of the backward asks for it), or at the next forward's start if no backward came (a
forward called on the window's graph, a loss module on the model's output, joins it
instead: Note [A chain of forwards before one backward], _um_plan.py). While it is open
each read of a kept save of at least MIN_BYTES reads the room under the budget; when it
closes the target learns from the least room seen and the evictions since the forward's
start (``Offloader._learn``), and the buffers the next forward will take are made from
then on. Measured (step 47): the backward's evictions 484 MB -> 0-15 MB a step and the
backward 0.29-0.31 -> 0.25-0.26 s, but the target settled 1.32 GB higher (the prefetch
holds the kept phase's room near the margin), the forward took longer by as much, and
the step stayed 0.595-0.602 s.

While the window is open, reads of kept saves bring nothing back. A save brought back
then takes room the kept saves' peak does not have to spare, so the forward must offload
a byte more for it: about 41 ms per GB over the link twice, against at most 21 ms per GB
of link time the kept phase would otherwise leave idle (bench/README.md, step 48). And
the bytes brought back ahead are not elastic: once there, the engine evicts other data
rather than wait for them (counting them as room was tried in step 47: the kept phase
evicted 484 MB again). Measured (step 48, the profiler's trace): with the pump as
before, the backward's first kept read pumped the whole lookahead, 1 GiB, before its
node's kernel (30 ms with the compute stream idle) and the kept phase then ran 30 ms with
the link idle; with nothing brought back in the window, the target fell from 7.99 to
6.9 GB and the step from 0.607 to 0.558 s. Bringing back, in the window, only what the
last backward's kept phase left free from each read on was tried too (step 48, not
kept): the kept phase is bound by the autograd thread, and each copy back issued there
costs that thread about 2 ms, so the backward gained nothing.

Note [The cache the first forward left]
The first forward past the budget offloads nothing (its evictions are the target's first
measurement), so its step keeps every save on the device and sizes the caching
allocator's cache for that: 21.2 GB reserved for the 1.28 B model under an 8 GiB budget
(bench/README.md, step 48). The cache keeps those segments for the rest of the run,
and past the budget most of their free blocks' chunks are discarded. Blocks are
handed out by size and address, not by where their pages are, so steps after that took
blocks over discarded chunks for 7-8 GB a step and made room for them by discarding
other dead chunks: about 60 discard calls a backward, 40-45 ms of the driver, during
which the autograd thread's CUDA calls wait. So the first forward to offload gives the
cache back first (``torch.cuda.empty_cache``: free segments only, once per process,
counter ``predict.trims``), and the cache forms again around the offloaded pattern.
It is a step's first forward that trims, once its own target is past 0; never a chained
one (Note [A chain of forwards before one backward]), which starts with the step's saves
alive. Where the hooks come on during the model's first forward (Note [Hooks that come
on during a forward]), the loss module's forward is the first one seen and its target the
first past 0. Trimming at its next forward freed nothing (the model's saves held the
segments); trimming at the next step's start, with the model's own target still 0, let
that step offload nothing and size the cache again for every save. Either way 21.5-22 GB
stayed reserved for the run, against 13.9 GB with the loss inside the model, and each
step discarded and placed again 6-9 GB and read 2-3 GB of saves before they were back
(bench/README.md, step 51).

Note [Host buffers made ahead]
The page-locked buffers come from torch's host allocator, which caches them: a forward
that offloads no more than the one before takes them back at no cost, but one that
offloads more asks the driver for page-locked memory inside the forward, on its thread.
On the H200 host that ran at about 1.6 GB/s: the third step of the 1.28 B model's
training, the first to offload its 7 GB, took 5-12 s against 0.6 s after
(bench/README.md, step 46). So once the target for the next forward is known (its
window closes), ``buffers_to_warm`` (_um_plan.py) lists the buffers the next forward will take
that this one did not (its saves repeat), within the host RAM ``host_headroom`` leaves,
and WARM_THREADS threads make them and free them at once into the allocator's cache,
while the backward and the optimizer step run. The next forward first waits for them
(so that no buffer is made twice), then takes them from the cache. A buffer not made
(refused, or a save the pattern did not foresee) is made by the forward as before.
The threads set no device: torch's host allocator makes page-locked memory under a
CUDA context that already exists, whichever device is current on the calling thread,
so a DDP rank's threads make no context on another GPU. Measured (step 46): the third
step 7.36 -> 1.49 s, but the next forward waited 3.6 s for the buffers made ahead for
it; four threads made them at about 2 GB/s, barely faster than one (the driver's
page-locking runs mostly one at a time), so steps 1-2 took 8.2 s against 10.4. With
torch's registration route (Note [Page-locked buffers by registration], _um_pinned.py)
they are made at about 11 GB/s: steps 1-2 took 3.2 s against 8.1 (step 47).

Correctness does not depend on any prediction: a wrong target or order only moves
bytes at another time. The unpacked tensor is a view, with the saved tensor's size,
stride and offset, of a device copy of its whole storage, made after the forward
wrote it (the copy is ordered after the compute stream's work at the save) and kept
for as long as autograd keeps the save (``retain_graph`` reuses it). Autograd's
version counter check still guards in-place changes; a change that bypasses it
(``.data``) is seen by stock torch in the backward and not here.

Not applied on a torch without ``torch._C._autograd._top_saved_tensors_default_hooks``
(2.6 has none): there it could not tell whether the program pushed saved-tensor hooks of its
own, which must not be overridden.

Thread safety: pack runs on the forward's thread, unpack on autograd's; the shared
state (target, queues, counters) is under one lock. Default hooks are per thread: a
forward on a thread that did not enter through a module runs without them.
"""

from __future__ import annotations

import collections
import threading
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.cuda import _um_plan as plan
from torch.cuda._um_streams import side_stream, wait_stream
from torch.utils import _pytree as pytree

MIN_BYTES = 1 << 20  # smaller saves are not worth a copy each way
COPY_WINDOW = 512 << 20  # bytes of copies to the host in flight (Offloader._throttle)
WARM_THREADS = 4  # threads that make page-locked buffers ahead (Offloader._warm)


class _Stored(plan.Entry):  # type: ignore[misc]  # Any to mypy: the lint venv has no torch
    """One storage that left the device: its host copy and its device copy, once back."""

    def __init__(
        self,
        nbytes: int,
        host: torch.Tensor,
        saved: torch.cuda.Event,
        device: torch.device,
        queue: plan.PrefetchQueue,
        source: Any,
    ) -> None:
        super().__init__(nbytes)
        self.host = host
        self.saved = saved  # the copy to the host has finished
        self.device = device
        self.queue = queue
        self.source: Any = source  # weak reference to the device storage, during the forward
        self.gpu: torch.Tensor | None = None
        self.back: torch.cuda.Event | None = None  # the copy back, when issued ahead


class _Packed:
    """What autograd keeps of one save that left: the storage and the view into it."""

    __slots__ = ("dtype", "offset", "size", "stored", "stride")

    def __init__(self, stored: _Stored, t: torch.Tensor) -> None:
        self.stored = stored
        self.dtype = t.dtype
        self.offset = t.storage_offset()
        self.size = t.size()
        self.stride = t.stride()


class _Forward:
    """The state of the outermost forward under way on one thread."""

    def __init__(
        self,
        target: int,
        queue: plan.PrefetchQueue,
        params: set[int],
        device: int,
        evicted: int,
        sizer: Callable[[int], int] | None = None,
        owner: plan.OffloadTarget | None = None,
        chained: bool = False,
    ) -> None:
        self.plan = plan.ForwardPlan(target, sizer)
        self.owner = owner  # the outermost module's target (None: the offloader's latest)
        # called on autograd history while a window was open: Note [A chain of forwards
        # before one backward] (_um_plan.py)
        self.chained = chained
        self.queue = queue
        self.params = params
        # a program's forward (Note [A program's forward between two backwards],
        # _um_program.py): no module tells its parameters, so leaves' saves stay (_of_a_leaf)
        self.program = False
        self.device = device
        self.evicted = evicted
        self.decided: dict[tuple[int, int], _Stored | None] = {}  # None: kept on the device
        self.copying: collections.deque[tuple[torch.cuda.Event, int]] = collections.deque()
        self.copying_bytes = 0
        self.saves: list[tuple[int, bool]] = []  # candidates in order: (bytes, left)


class _Pending:
    """A program forward begun and not yet planned (Note [A program's forward is planned at
    its first save])."""

    program = True


_PENDING: Any = _Pending()


class _Part:
    """A forward's share of a window: what its target learns from, and the saves the next
    forward like it will make (Note [Host buffers made ahead])."""

    def __init__(self, fwd: _Forward, target: plan.OffloadTarget) -> None:
        self.learn = plan.ChainPart(target, fwd.plan.seen, fwd.plan.first, fwd.plan.target)
        self.offloaded = fwd.plan.offloaded
        self.saves = fwd.saves


class _Window:
    """The time a forward's kept saves live on the device, from the forward's end to the
    backward's first read of a save that left (or its end): Note [The kept saves' window].
    The forwards of a chain share one (Note [A chain of forwards before one backward],
    _um_plan.py): one part each, in the order they ran."""

    def __init__(self, fwd: _Forward, room: int, target: plan.OffloadTarget) -> None:
        self.device = fwd.device
        self.evicted = fwd.evicted  # the engine's evicted bytes at the forward's start
        self.room = room  # the least free room seen in the window so far
        self.parts = [_Part(fwd, target)]
        self.callback = False  # the backward's end will close it

    def join(self, fwd: _Forward, room: int, target: plan.OffloadTarget) -> None:
        """``fwd``, chained to this window's forwards, ended with ``room`` free."""
        self.room = min(self.room, room)
        self.parts.append(_Part(fwd, target))


def _of_a_leaf(t: torch.Tensor) -> bool:
    """A leaf (a weight, an input) or a view of one: its storage lives on with the
    program, so a copy of it would free nothing (a program forward's saves, which no
    module's parameters tell apart)."""
    base = t._base
    return bool(t.is_leaf or (base is not None and base.is_leaf))


def _has_history(args: object) -> bool:
    """Whether a tensor among a forward's arguments (in tuples, lists, dicts and the
    containers torch's pytree knows, transformers' outputs among them) was made by
    operations autograd recorded."""
    try:
        leaves = pytree.tree_leaves(args)
    except Exception:  # a container pytree cannot flatten: the top level alone
        leaves = list(args) if isinstance(args, (tuple, list)) else [args]
    return any(isinstance(a, torch.Tensor) and a.grad_fn is not None for a in leaves)


Counters = Callable[[int], "tuple[int, int]"]  # device -> (evicted bytes so far, free room)


class Offloader(plan.OutermostForward):  # type: ignore[misc]  # of _Forward
    """The hooks of Note [Saved-activation offload]; one per process (um.py owns it)."""

    def __init__(
        self, counters: Counters, host_room: Callable[[], int], max_lookahead: int, margin: int
    ) -> None:
        from torch.multiprocessing.reductions import StorageWeakRef

        self._weak = StorageWeakRef
        self._counters = counters
        self._host_room = host_room
        self._lock = threading.Lock()
        super().__init__()
        # One target for each outermost module: a loss module called after the model
        # (criterion(model(x), y)) is an outermost forward of its own, whose saves say
        # nothing of what the model may keep. ``target``: the latest forward's module's.
        self._targets: weakref.WeakKeyDictionary[Any, plan.OffloadTarget] = (
            weakref.WeakKeyDictionary()
        )
        self.target = plan.OffloadTarget(margin=margin)
        self.max_lookahead = max_lookahead
        self.lookahead = 0
        self.margin = margin
        self.active = True
        self.offloaded_last = 0  # the most bytes a forward has offloaded (buffers cached)
        self.warmed = 0  # bytes of buffers made ahead for the next forward (Offloader._warm)
        self.register_route = False  # page-locked buffers by cudaHostRegister (um.py sets it)
        self.trimmed = False  # the allocator's cache given back once (Note [The cache ...])
        self._warming: threading.Thread | None = None
        self._window: _Window | None = None
        self._program: torch.nn.Module | None = None  # begin_program's target key
        self.programs = False  # predict_programs wanted now (um.py's watcher sets it)
        self._latest: weakref.ref[plan.PrefetchQueue] | None = None
        self.stats = dict.fromkeys(
            (
                "forwards",
                "offloaded_bytes",
                "offloaded_saves",
                "kept_bytes",
                "ahead_bytes",
                "hits",
                "late",
                "misses",
                "miss_bytes",
                "failures",
                "host_limited",
                "warmed_bytes",
                "room_stops",
                "lookahead_stops",
                "trims",
                "program_forwards",
                "warm_ns",
                "warm_wait_ns",
            ),
            0,
        )

    def set_margin(self, margin: int) -> None:
        """The room left unplanned, from now on (a new device budget)."""
        with self._lock:
            self.margin = self.target.margin = margin
            for target in self._targets.values():
                target.margin = margin

    def _target_of(self, module: torch.nn.Module) -> plan.OffloadTarget:
        """``module``'s target, made at its first forward (the lock is held)."""
        try:
            target = self._targets.get(module)
            if target is None:
                target = self._targets[module] = plan.OffloadTarget(margin=self.margin)
        except TypeError:  # a module that cannot be a weak key: the offloader's latest
            return self.target
        return target

    # ---- module hooks: the outermost forward (plan.OutermostForward's enter, exit) ---

    def _begin(self, module: torch.nn.Module, args: object = ()) -> _Forward | None:
        return self._open(module, args) if self._push_hooks() else None

    def _push_hooks(self) -> bool:
        """Pushes the offload's saved-tensor hooks for a forward that begins, where they
        apply (after closing a program forward left open); False where they do not."""
        self._close_program()
        if not torch.is_grad_enabled() or torch.cuda.is_current_stream_capturing():
            return False
        graph_task = getattr(torch._C, "_current_graph_task_id", lambda: -1)
        if graph_task() != -1:
            return False  # a forward run by a backward (checkpoint recomputation)
        ag = torch._C._autograd
        top = getattr(ag, "_top_saved_tensors_default_hooks", None)
        if top is None or top(False) is not None:
            # The program's own saved-tensor hooks (save_on_cpu, checkpoint) win; a torch
            # that cannot tell whether there are any (2.6 has no such call) gets none of ours.
            return False
        try:
            ag._push_saved_tensors_default_hooks(self.pack, self.unpack)
        except RuntimeError:
            return False  # saved-tensor hooks are disabled here
        return True

    def _open(self, module: torch.nn.Module, args: object = (), program: bool = False) -> _Forward:
        """The forward whose hooks were just pushed: its plan, from the target learnt so
        far, once the buffers made ahead for it are in the host allocator's cache. A
        program's forward has no call of its own (its saves may come from inside a module
        call it does not own: a compiled model's)."""
        own = [*module.parameters(), *module.buffers()]
        params = {t.untyped_storage().data_ptr() for t in own}
        # The engine's counters are per device: the module's, which need not be the
        # current device (a DDP rank that never called torch.cuda.set_device).
        device = next((t.device.index for t in own if t.is_cuda), None)
        if device is None:
            device = torch.cuda.current_device()
        # A forward on the open window's graph joins its chain; any other closes it: a
        # forward whose backward never came, or has not come yet.
        chained = (
            self._window is not None
            and not program
            and (_has_history(args) or _has_history(self.call_kwargs()))
        )
        if not chained:
            self._learn(self._window)
        waited = time.perf_counter_ns()
        self._join_warming()  # its buffers are in the host allocator's cache after this
        waited = time.perf_counter_ns() - waited
        with self._lock:
            self.stats["warm_wait_ns"] += waited
            queue = plan.PrefetchQueue(self.max_lookahead, self.lookahead)
            if not chained:  # a chain's saves that left are mostly its first forward's
                self._latest = weakref.ref(queue)
            # Page-locked buffers are host RAM the kernel cannot reclaim: a forward
            # that would need more of it than host_headroom leaves offloads less (the
            # host allocator keeps the last forward's buffers, and those made ahead for
            # this one, for it).
            host_cap = self.offloaded_last + self.warmed + self._host_room()
            self.warmed = 0
            owner = self.target = self._target_of(module)
            target = self._sized(owner.bytes, host_cap)  # as if like its last forward
            # a step's first forward, once it offloads (Note [The cache the first forward left])
            trim = target > 0 and not (chained or self.trimmed)
            if trim:
                self.trimmed = True
                self.stats["trims"] += 1
        if trim:  # Note [The cache the first forward left]
            torch.cuda.empty_cache()

        def sizer(first: int) -> int:  # at the first candidate save, under the lock
            return self._sized(owner.for_forward(first), host_cap, count=True)

        evicted = self._counters(device)[0]
        fwd = _Forward(target, queue, params, device, evicted, sizer, owner, chained)
        fwd.program = program
        return fwd

    def _sized(self, target: int, host_cap: int, count: bool = False) -> int:
        """``target`` within the page-locked memory a forward may take (the lock is held)."""
        if target <= host_cap:
            return target
        if count:
            self.stats["host_limited"] += 1
        return max(0, host_cap)

    def _end(self, fwd: _Forward) -> None:
        if self._ours_on_top():
            torch._C._autograd._pop_saved_tensors_default_hooks()
        _, room = self._counters(fwd.device)
        with self._lock:
            for stored in fwd.decided.values():
                if stored is not None:
                    stored.source = None
            self.stats["forwards"] += 1
            self.stats["offloaded_bytes"] += fwd.plan.offloaded
            self.offloaded_last = max(self.offloaded_last, fwd.plan.offloaded)
            self.stats["kept_bytes"] += fwd.plan.seen - fwd.plan.offloaded
        target = fwd.owner or self.target
        with self._lock:
            window = self._window if fwd.chained else None
            if window is not None:
                window.join(fwd, room, target)
        if window is None:
            self._learn(self._window)  # an earlier forward's, whose backward has not come
            with self._lock:
                self._window = _Window(fwd, room, target)

    # ---- the kept saves' window (Note [The kept saves' window]) ------------------------

    def _watch(self, t: torch.Tensor) -> bool:
        """A read of a save that stayed on the device, by the backward (autograd's
        thread): the room is read while the window is open, and the backward's end is
        asked to close it. Whether the window is open."""
        window = self._window
        if window is None:
            return False
        with self._lock:
            first, window.callback = not window.callback, True
        if first:
            try:
                torch.autograd.Variable._execution_engine.queue_callback(
                    lambda: self._learn(window)
                )
            except RuntimeError:
                pass  # read outside a backward (grad_fn._saved_*): closed later instead
        if t.untyped_storage().nbytes() >= MIN_BYTES:
            room = self._counters(window.device)[1]
            with self._lock:
                window.room = min(window.room, room)
        return True

    def _learn(self, window: _Window | None) -> None:
        """Close ``window`` if it is still open: its forwards' targets learn from the
        evictions up to now and the least room seen in it (plan.learn_chain), and the
        buffers the next forward will take beyond this one's start being made (Note [Host
        buffers made ahead])."""
        if window is None:
            return
        evicted = self._counters(window.device)[0]
        with self._lock:
            if self._window is not window:
                return  # closed already
            self._window = None
            plan.learn_chain([p.learn for p in window.parts], evicted - window.evicted, window.room)
            # Only a target past what left this time can want new buffers: the host's
            # room is read (the engine reads /proc) in that case alone.
            warm: list[int] = []
            host: int | None = None
            for part in window.parts:
                target = part.learn.target.bytes
                if target > part.offloaded:
                    host = self._host_room() if host is None else host
                    warm += plan.buffers_to_warm(part.saves, target, host - sum(warm))
        if warm:
            self._start_warming(warm)

    # ---- page-locked buffers made ahead (Note [Host buffers made ahead]) ---------------

    def _start_warming(self, sizes: list[int]) -> None:
        self._join_warming()
        self._warming = threading.Thread(
            target=self._warm, args=(sizes,), name="torch.cuda.um warm", daemon=False
        )
        self._warming.start()

    def _join_warming(self) -> None:
        warming, self._warming = self._warming, None
        if warming is not None:
            warming.join()

    def _warm(self, sizes: list[int]) -> None:
        """Make page-locked buffers of ``sizes`` on WARM_THREADS threads and free them:
        the host allocator caches them for the next forward's copies. A refusal stops
        a thread; the forward then takes what is missing itself, as before."""
        made = [0] * WARM_THREADS
        began = time.perf_counter_ns()

        def make(k: int) -> None:
            held = []
            try:
                for n in sizes[k::WARM_THREADS]:
                    held.append(torch.empty(n, dtype=torch.uint8, pin_memory=True))
                    made[k] += n
            except RuntimeError:
                pass  # page-locked memory refused: the forward meets it itself
            del held  # back to the host allocator's cache, unused

        helpers = [threading.Thread(target=make, args=(k,)) for k in range(1, WARM_THREADS)]
        for h in helpers:
            h.start()
        make(0)
        for h in helpers:
            h.join()
        with self._lock:
            self.warmed += sum(made)
            self.stats["warmed_bytes"] += sum(made)
            self.stats["warm_ns"] += time.perf_counter_ns() - began

    def _abandon(self, fwd: _Forward) -> None:
        """The hooks came off during ``fwd``'s forward: its saved-tensor hooks are taken off
        this thread, if they are still the innermost (the program's own are never popped)."""
        if self._ours_on_top():
            torch._C._autograd._pop_saved_tensors_default_hooks()

    def _ours_on_top(self) -> bool:
        """Whether this thread's innermost saved-tensor hooks are this offload's."""
        top = getattr(torch._C._autograd, "_top_saved_tensors_default_hooks", None)
        hooks = top(False) if top is not None else None
        return hooks is not None and hooks[0] == self.pack

    # ---- a program's forward (Note [A program's forward between two backwards],
    # _um_program.py): begun as a backward returns, ended as the next is called --------

    def begin_program(self) -> None:
        """Begins this thread's program forward, unless a forward is under way on it or
        the offload is off; never raises (it runs as a backward returns). The hooks go on
        now; the forward's plan is made at its first save (_open_program)."""
        try:
            st = self._state()
            if st.depth or st.run is not None or not (self.active and self.programs):
                return
            if self._program is None:
                self._program = torch.nn.Module()  # the program's forwards' target key
            if self._push_hooks():
                st.run = _PENDING
                with self._lock:
                    self.stats["program_forwards"] += 1
        except Exception:  # a forward not offloaded costs speed only
            return

    def _open_program(self) -> _Forward | None:
        """Note [A program's forward is planned at its first save]
        A program forward begins as the backward before it returns, and what the program
        runs next is its own update (an optimizer step, or one written by hand) before the
        forward's first save. A module forward begins after that; its plan waits for the
        page-locked buffers made ahead for it (Note [Host buffers made ahead]), which the
        backward's end started and the update overlapped. Planned at its begin, a program
        forward waited for all of them: 0.39 s of train-plain's second step for 0.38 s of
        making (docs/notes/step-58-programs-on.md). So its plan is made at its first save,
        as the module forward's would be, after the update; until then the hooks are on
        and the thread's run is _PENDING. A program forward with no save (a forward under
        no_grad, or none before the next backward) is never planned."""
        key = self._program  # made by begin_program before any forward is pending
        if key is None:
            return None
        try:
            fwd = self._open(key, (), program=True)
        except Exception:  # the save stays; the next one tries again
            return None
        self._tls.run = fwd
        return fwd

    def end_program(self) -> None:
        """Ends this thread's program forward, if one is open (as a backward is called)."""
        try:
            if not self._state().depth:
                self._close_program()
        except Exception:
            return

    def _close_program(self) -> None:
        """Ends this thread's program forward left open, if any: also when a module's
        forward begins (the module hooks came on while it was open), whose own saved-tensor
        hooks would otherwise find the program's on top and take them for the program's
        own."""
        st = self._tls
        run = getattr(st, "run", None)
        if run is _PENDING:  # never planned: only its hooks to take off
            st.run = None
            if self._ours_on_top():
                torch._C._autograd._pop_saved_tensors_default_hooks()
        elif run is not None and run.program:
            st.run = None
            self._end(run)
        elif run is None and self._ours_on_top():
            # left by a forward that ended under the program's own hooks (a backward
            # called inside save_on_cpu), which _end does not pop
            torch._C._autograd._pop_saved_tensors_default_hooks()

    # ---- saved-tensor hooks ------------------------------------------------------------

    def pack(self, t: torch.Tensor) -> object:
        fwd = self.current()
        if fwd is _PENDING:
            fwd = self._open_program()
        if (
            fwd is None
            or not self.active
            or not t.is_cuda
            or t.layout != torch.strided
            or type(t) is not torch.Tensor
            or t.is_conj()
            or t.is_neg()
            or torch.cuda.is_current_stream_capturing()
        ):
            return t
        storage = t.untyped_storage()
        nbytes = storage.nbytes()
        ptr = storage.data_ptr()
        if nbytes < MIN_BYTES or ptr in fwd.params or (fwd.program and _of_a_leaf(t)):
            return t
        key = (ptr, t._version)
        with self._lock:
            if key in fwd.decided:
                stored = fwd.decided[key]
                if stored is None:
                    return t  # kept: the storage is alive, held by autograd
                if stored.source is not None and not stored.source.expired():
                    return _Packed(stored, t)
                # the storage that left was freed and its address reused: a new one
            if not fwd.plan.offload(nbytes):
                fwd.decided[key] = None
                fwd.saves.append((nbytes, False))
                return t
        try:
            stored = self._offload(t, storage, nbytes, fwd.queue)
        except RuntimeError as e:  # page-locked memory refused: the save stays
            with self._lock:
                fwd.plan.offloaded -= nbytes
                fwd.decided[key] = None
                fwd.saves.append((nbytes, False))
                self.stats["failures"] += 1
                if self.stats["failures"] == 1:
                    warnings.warn(
                        f"torch.cuda.um: a saved activation stays on the device: {e}", stacklevel=2
                    )
            return t
        with self._lock:
            self.stats["offloaded_saves"] += 1
            fwd.saves.append((nbytes, True))
            fwd.decided[key] = stored
            fwd.queue.add(weakref.ref(stored))
        self._throttle(fwd, stored)
        return _Packed(stored, t)

    def _throttle(self, fwd: _Forward, stored: _Stored) -> None:
        """Keep at most COPY_WINDOW bytes of copies to the host in flight: the host waits
        for the oldest. The caching allocator reuses a block only once the copy that
        reads it has finished, as seen from the host when the next block is asked for;
        without this, a forward that runs ahead of the link (its kernels produce saves
        far faster than 55 GB/s) finds no reusable block, takes new segments, and the
        engine makes room for them by eviction, the very migration this avoids."""
        fwd.copying.append((stored.saved, stored.nbytes))
        fwd.copying_bytes += stored.nbytes
        while fwd.copying_bytes > COPY_WINDOW and len(fwd.copying) > 1:
            event, nbytes = fwd.copying.popleft()
            event.synchronize()
            fwd.copying_bytes -= nbytes

    def _offload(
        self, t: torch.Tensor, storage: torch.UntypedStorage, nbytes: int, queue: plan.PrefetchQueue
    ) -> _Stored:
        device = t.device
        compute = torch.cuda.current_stream(device)
        side = side_stream(device.index or 0, "d2h")
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        whole = torch.empty(0, dtype=torch.uint8, device=device).set_(storage)
        wait_stream(side, compute)
        with torch.cuda.stream(side):
            host.copy_(whole, non_blocking=True)
            saved = torch.cuda.Event()
            saved.record(side)
        whole.record_stream(side)  # the block is not reused before the copy has read it
        return _Stored(nbytes, host, saved, device, queue, self._weak(storage))

    def _bring_back(self, stored: _Stored, stream: torch.cuda.Stream, ahead: bool) -> None:
        # The buffer comes from the compute stream's pool, made of the blocks the
        # backward frees as it goes; the side stream's own pool would hold none of
        # them, and the engine would make room for new blocks by discarding cached
        # ones and placing them again (bench/README.md, prediction step 11). The copy
        # waits for the compute stream's work so far: the block's last users.
        gpu = torch.empty(stored.nbytes, dtype=torch.uint8, device=stored.device)
        if ahead:
            wait_stream(stream, torch.cuda.current_stream(stored.device))
        with torch.cuda.stream(stream):
            stream.wait_event(stored.saved)
            gpu.copy_(stored.host, non_blocking=True)
            if ahead:
                stored.back = torch.cuda.Event()
                stored.back.record(stream)
                gpu.record_stream(stream)  # a save never used may be freed before its copy ends
        stored.gpu = gpu

    def room(self, index: int) -> int:
        """Free bytes under device ``index``'s budget past the margin: what may be
        brought in ahead of use."""
        return max(0, self._counters(index)[1] - self.margin)

    def _pump(self, queue: plan.PrefetchQueue, device: torch.device) -> None:
        """Bring back what the queue says fits now (the lock is held)."""
        if queue.cursor < 0:
            return
        index = device.index or 0
        for entry in queue.pump(lambda: self.room(index)):
            assert isinstance(entry, _Stored)
            self._bring_back(entry, side_stream(index, "h2d"), ahead=True)
            self.stats["ahead_bytes"] += entry.nbytes
        if queue.stopped:
            self.stats[f"{queue.stopped}_stops"] += 1

    def unpack(self, packed: object) -> torch.Tensor:
        if not isinstance(packed, _Packed):
            assert isinstance(packed, torch.Tensor)
            # Nothing comes back while the kept saves' window is open (see the Note)
            kept_phase = self._watch(packed)
            queue = self._latest() if self._latest is not None else None
            if queue is not None and queue.cursor >= 0 and packed.is_cuda and not kept_phase:
                with self._lock:
                    self._pump(queue, packed.device)
            return packed
        self._learn(self._window)  # the first save that left is read: the window ends
        stored = packed.stored
        device = stored.device
        compute = torch.cuda.current_stream(device)
        with self._lock:
            ready = stored.back is None or stored.back.query()
            kind = stored.queue.use(stored, ready)
            self.stats[{"hit": "hits", "late": "late", "miss": "misses"}[kind]] += 1
            if kind == "miss":
                self.stats["miss_bytes"] += stored.nbytes
                self._bring_back(stored, compute, ahead=False)
            self.lookahead = max(self.lookahead, stored.queue.lookahead)
            self._pump(stored.queue, device)
        gpu = stored.gpu
        assert gpu is not None
        if stored.back is not None:
            compute.wait_event(stored.back)
        out = torch.empty(0, dtype=packed.dtype, device=device)
        out.set_(gpu.untyped_storage(), packed.offset, packed.size, packed.stride)
        return out

    def counters(self) -> dict[str, int]:
        with self._lock:
            out = {f"predict.{k}": v for k, v in self.stats.items()}
            out["predict.target_bytes"] = max(
                [self.target.bytes, *(t.bytes for t in self._targets.values())]
            )
            out["predict.lookahead_bytes"] = self.lookahead
            out["predict.register_route"] = int(self.register_route)
        return out
