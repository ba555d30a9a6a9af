"""Parameters past the budget are read by copy in forwards without autograd.

Note [Weight streaming]
Inference reads every weight once per forward, layer after layer: a cyclic scan. Past
the budget, the residency policy keeps a prefix of the scan on the device (Note [Scans],
Residency.h) and migrates the rest in and out in every forward. The way out is a
prefetch to the CPU at 3-17 GB/s, and kernel launches stall while the evictor issues
it: a 1.28 B model's forward takes 0.13 s at a 2 GiB budget on the H200 host, where its
compute takes 0.024 s and the bytes past the budget cross the link in about 0.02 s
(bench/README.md, prediction steps 8 and 9). Read in place by the GEMMs, those bytes cost
more still (3 GB/s, step 9). A copy, by a copy engine or by a kernel, reads managed
memory in host RAM at 51-52 GB/s (bench/probes/stage_routes_probe.py), and a weight that is only
read needs no way back: that is what the offload tools do (accelerate's hooks copy a
layer's weights in just before it runs).

So, with ``predict:True`` and while the module hooks are on (Note [Use signals], um.py),
in a forward without autograd (``no_grad``, ``inference_mode``):

- the outermost forward records its calls of modules with streamable parameters (below),
  in order, keyed by the outermost module. The first forward of a record streams
  nothing: it runs under the plain policy, and the bytes the engine evicts during it are
  the first target (``_um_plan.StreamTarget``);
- a forward that repeats the record streams the parameters of calls spread evenly over
  it, as many bytes as the target (``_um_plan.spread_order``, ``stream_plan``: a larger
  target adds calls, never trades one for another). Parameters newly streamed are sent
  to host RAM through the engine (its ledger follows) and are not touched again; sent
  again if they come back into the plan after leaving it (Note [Sent again]). Each
  forward copies them, on a side stream, into a ring of device memory (Note [Ring
  size] below), as far ahead of their call as the ring has room. At the call's pre-hook
  the compute stream waits for the copy and the parameters' ``.data`` point into the ring;
  the call's forward hook points them back and gives its part of the ring to the copies
  after it. Spread, because the link then works through
  the whole forward, each copy under the compute of the calls before it. One ring, kept
  while the hooks are on, and not buffers from the allocator: buffers freed and taken
  again every call made the engine discard and place again 1.8-7.6 GB of dead blocks a
  forward (bench/README.md, prediction step 14). A storage that several calls
  read (tied input and output embeddings) stays on the device;
- after each such forward the target grows by the live bytes the engine still evicted
  (past those the streamer sent out itself); by the dead bytes it discarded, past a
  margin (a sixteenth of the budget), up to the live bytes past the budget plus the
  margin (Note [Discards past the budget], _um_plan.py); and shrinks, never back to
  where it saw either, by half the least free room seen at a call past the margin when
  the engine neither evicted nor discarded;
- a forward that departs from its record (other modules, another order, a parameter
  replaced) streams nothing from the departure on: the calls after it read their
  parameters where they are, under the plain policy, and the forward becomes the new
  record. A new batch size or sequence length does not change the record.

Correctness does not rest on the prediction. A copy is used only if the parameter still
has the storage and the version it was copied from. A call that writes a streamed
parameter in place (its version moves: a forward pre-hook of the program's that updates
it) gets its part of the ring copied back over the parameter. Outside the call, every
reader sees the parameter's own storage. The copies are ordered by events, not by the
whole compute stream:

- a part of the ring is copied into only after every call that read any of its bytes
  earlier in the forward has been queued: each call's forward hook records an event on
  the compute stream as it gives its part back, and the copy waits for the events of
  the parts it overlaps (``_um_plan.RingParts.readers``);
- the first copy of each forward, and the copy of a parameter whose version moved since
  its last copy, wait for the whole compute stream: after the forwards before (their
  reads of the ring) and after every write to the parameter queued so far (an optimizer
  step between forwards, a pre-hook that updates a later call's weight);
- a copy left unused is waited for by the compute stream before its part is reused.

Where the forward's time goes (bench/README.md, steps 14 and 15; the model above at a
2 GiB budget, 1.3 GB streamed a forward, 0.024 s in memory, accelerate 0.11-0.15 s): with
the whole compute stream before each copy, a copy waited until the device reached the
call that issued it, so copies and compute partly took turns (0.017 s of device waits,
0.058-0.070 s a forward). Events cut the waits for copies to 0.004-0.006 s and the
forward to 0.056 s, against 0.060 s in the same run. What is left (step 15's
timeline): the foreach copy kernels share the SMs with the forward's (its kernels take
0.030 s instead of 0.026 s; copies by cudaMemcpyAsync out of managed memory, which the
driver runs on SMs too, made the forward slower still; the copies now run on a few SMs:
Note [Copies on few SMs] in _um_streams.py, 0.051 -> 0.043 s a forward, step 23; on two,
by a kernel of the engine's own, the default since step 32: Note [Lean copies] in
_um_copy.py, steps 29 and 32); the
forward's kernels wait 0.005 s behind a memset, for a reason not known; and the engine
discards and places again 0.36 GB of the allocator's cached blocks a forward. Growing
the target until those discards stopped streamed every weight (2.4 GB a forward) and
made nothing faster; ordering dead chunks by their predicted reuse cut them to 0.14 GB
but not the memset wait (step 16). Where the copies read from matters more than how
(``python -m bench.probes.overlap_probe``, step 19): beside 1.3 GB of copies out of managed
memory in host RAM the forward's kernels take 43-50 ms instead of 25 ms, beside a copy
engine's DMA from page-locked memory 26 ms. Keeping streamed weights in page-locked
memory freed the kernels but left the forward bound by the host's launches, and slower
(step 19); not kept.

Note [The ring is used]
The ring is an ordinary block of the allocator, so of the engine's ledger, and only the
copies (kernels on a side stream) and the calls' kernels read and write it: no block
event and no module hook reports that use (um.py's pre-hook leaves the parameters that
point into the ring alone). So the residency policy saw it as live data nobody used and,
under pressure, evicted it to host RAM first; it never came back, and from then on every
copy wrote host RAM and every streamed call's GEMM read its weights there in place, at
3-10 GB/s. A Llama of 1.1 B at a 2 GiB budget took 0.15-0.40 s a forward that way
instead of 0.05 s, depending on whether the ring had been evicted during the first
forwards (bench/README.md, prediction step 34: the GEMMs of the streamed calls took
3-11 ms instead of 0.05-0.13 ms, the head's 41 ms instead of 0.7 ms). Each forward that
streams now touches the whole ring once as it begins (one range, on the compute stream,
before its first copy, which waits for that stream): it stays where the policy keeps
what is used, and comes back if it was sent out.

Note [Ring size]
The ring is device memory inside the budget, so every byte of it is a byte of weights
that must then be streamed too: the streamer's target grows by the room the ring takes.
What the ring has to hold is the copies that run ahead of the compute: one part being
read, the next ones being copied. So it holds ``RING_CALLS`` (4) of the largest call its
record may stream (each parameter's part rounded up as it is in the ring), at least
``MIN_LOOKAHEAD`` (32 MiB), at most an eighth of the budget and ``predict_lookahead``:
with copies that keep pace with the compute, a queue of three behind the part being read
keeps the link busy. At the 2 GiB budget of bench/README.md's inference model (largest
call 32 MiB) that is 128 MiB instead of an eighth's 256: the bytes copied a forward fell
from 1.33 to 1.21 GB, and the forwards run at full CPU speed from 0.040 to 0.037-0.038 s.
A ring capped at 64 MiB, which holds one such call (two need 64 MiB and 32 KiB), copied
0.14 GB less, discarded 0.10 GB more of the allocator's dead blocks, and was no faster at
full CPU speed (step 28). A ring that already holds a
record's calls, and is no larger than the cap, is kept: the records of several models
share the largest they want instead of each making its own every forward.

Thread safety: the hooks may run on any thread; each thread's forward is its own, and
the records, targets and counters are under a lock.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Callable

import torch
from torch.cuda import _um_copy
from torch.cuda import _um_plan as plan
from torch.cuda._um_streams import (
    auto_copy_sms,
    current_stream,
    few_sm_stream,
    green_failures,
    on_stream,
    side_stream,
    wait_stream,
)

MIN_LOOKAHEAD = 32 << 20
RING_CALLS = 4  # the ring holds this many of the largest streamable call (Note [Ring size])
ALIGN = 512  # bytes: where each parameter's part of the ring starts
ROOM_EVERY = 4  # streamed calls per sample of the free room
MAX_RECORDS = 8  # outermost modules with a record kept; the oldest goes first
MAX_VIEWS = 4096  # views of a ring kept for the next forwards

# (module, qualified name) of module types whose forward only reads its parameters.
READ_ONLY = frozenset(
    {
        ("torch.nn.modules.linear", "Linear"),
        ("torch.nn.modules.linear", "Bilinear"),
        ("torch.nn.modules.sparse", "Embedding"),
        ("torch.nn.modules.normalization", "LayerNorm"),
        ("torch.nn.modules.normalization", "RMSNorm"),
        ("torch.nn.modules.normalization", "GroupNorm"),
        ("torch.nn.modules.conv", "Conv1d"),
        ("torch.nn.modules.conv", "Conv2d"),
        ("torch.nn.modules.conv", "Conv3d"),
        ("transformers.pytorch_utils", "Conv1D"),
    }
)

# device -> (bytes evicted so far, bytes discarded so far, free room under the budget,
# placed bytes past the budget)
Counters = Callable[[int], "tuple[int, int, int, int]"]
SendToHost = Callable[[list[torch.Tensor]], None]


_read_only: dict[type, bool] = {}  # the classes seen, so that a call costs one lookup


def _read_only_type(module: torch.nn.Module) -> bool:
    cls = type(module)
    known = _read_only.get(cls)
    if known is None:
        known = _read_only[cls] = (cls.__module__, cls.__qualname__) in READ_ONLY
    return known


def _renorms(module: torch.nn.Module) -> bool:
    """Embedding(max_norm=...) renormalises the rows it reads, in place."""
    return module.__dict__.get("max_norm") is not None


def _streamable(module: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    if not _read_only_type(module) or _renorms(module):
        return []
    out = []
    for name, p in module._parameters.items():
        if (
            type(p) is torch.nn.Parameter
            and p.is_cuda
            and p.is_contiguous()
            and p.storage_offset() == 0
            and p.untyped_storage().nbytes() == p.nbytes
        ):
            out.append((name, p))
    return out


class _Call:
    """One recorded module call: the module (weakly) and its streamable parameters."""

    __slots__ = ("keys", "module", "names")

    def __init__(self, module: torch.nn.Module, params: list[tuple[str, torch.Tensor]]) -> None:
        self.module = weakref.ref(module)
        self.names = tuple(n for n, _ in params)
        # A streamable parameter starts its storage (_streamable): its data pointer is
        # the storage's, which is how repeats() and _issue() compare it.
        self.keys = tuple((p.data_ptr(), p.nbytes) for _, p in params)

    def repeats(self, module: torch.nn.Module) -> bool:
        """Whether calling ``module`` now repeats this call: the same module, with the
        same parameters in the same storages (checked at every call of a forward, so
        without making a _Call: step 15). A parameter the module has gained since is
        read where it is."""
        owner = self.module()
        if owner is None or owner is not module or _renorms(module):
            return False
        params = module._parameters
        for name, (ptr, nbytes) in zip(self.names, self.keys, strict=True):
            p = params.get(name)
            if (
                type(p) is not torch.nn.Parameter
                or p.data_ptr() != ptr
                or p.nbytes != nbytes
                or not p.is_contiguous()
            ):
                return False
        return True


class _Record:
    """The calls of one outermost module's forward, and what its forwards stream."""

    def __init__(self, root: torch.nn.Module, calls: list[_Call], target: plan.StreamTarget):
        self.root = weakref.ref(root)
        self.calls = calls
        self.sizes = [list(c.keys) for c in calls]
        self.order = plan.spread_order(self.sizes)
        self.total = plan.unique_bytes(self.sizes)
        self.target = target
        self.streamed: set[int] = set()  # storage keys sent to host RAM
        self.versions: dict[int, int] = {}  # storage key -> version at its last copy
        self._plan: tuple[int, int, list[list[int]]] | None = None
        self._ring: tuple[int, int] | None = None  # (cap, ring bytes)

    def ring_bytes(self, cap: int) -> int:
        """The ring this record's forwards want (Note [Ring size]), at most ``cap``."""
        if self._ring is None or self._ring[0] != cap:
            self._ring = (cap, plan.ring_bytes(self.sizes, ALIGN, cap, MIN_LOOKAHEAD, RING_CALLS))
        return self._ring[1]

    def plan(self, largest: int) -> list[list[int]]:
        """The calls' streamed parameters at the current target (kept until it moves)."""
        key = (self.target.bytes, largest)
        if self._plan is None or self._plan[:2] != key:
            picked = plan.stream_plan(self.sizes, self.target.bytes, self.order, largest, ALIGN)
            self._plan = (*key, picked)
            # Note [Sent again]
            # ~~~~~~~~~~~~~~~~~
            # A parameter the plan no longer streams (the target shrank) is read in
            # place, so the engine brings it back to the device: should the target grow
            # over it again, it must be sent to host RAM again. Once it was never sent
            # twice, and its copies went into the ring from the device while the
            # parameter stayed there, live and unused. The Llama's inference
            # (bench/README.md, prediction step 38): shrunk from 900 MB to 806 and grown
            # back, it kept 94 MB of such parameters on the device, and the engine made
            # room for them by discarding dead blocks, 0.17 GB placed again each forward.
            self.streamed &= {
                call.keys[k][0] for call, ks in zip(self.calls, picked, strict=True) for k in ks
            }
        return self._plan[2]


class _Ring:
    """Device memory the copies go into, in parts (``_um_plan.RingParts``): each call's
    parameters take the next part, and give it back once the call has been queued.
    Not thread-safe: one forward uses it at a time (Streamer takes it for the forward)."""

    def __init__(self, nbytes: int, device: int) -> None:
        with torch.inference_mode(False):  # parameters' .data may point into it
            self.memory = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{device}")
        self.size = nbytes
        self.parts = plan.RingParts(nbytes, ALIGN)
        # (start, dtype, shape) -> its view: a forward repeats its parts, and making a
        # view outside inference mode costs microseconds (bench/README.md, step 15).
        self._views: dict[tuple[int, torch.dtype, torch.Size], torch.Tensor] = {}
        # (call index, whether after its copy or after its reads) -> the event, kept: one
        # forward holds the ring at a time, and records each at most once, before anything
        # waits for it; making and destroying two a streamed call cost the host (step 32).
        self._events: dict[tuple[int, bool], torch.cuda.Event] = {}

    def event(self, call: int, after_copy: bool) -> torch.cuda.Event:
        """The event of call ``call`` of the forward holding the ring: recorded after its
        copy (``after_copy``) or after the call that read its part."""
        key = (call, after_copy)
        e = self._events.get(key)
        if e is None:
            e = self._events[key] = torch.cuda.Event()
        return e

    def view(self, start: int, like: torch.Tensor) -> torch.Tensor:
        """A tensor shaped like ``like`` over the ring from ``start``: a normal tensor,
        also in inference mode, so that a write through the parameter moves its version
        (Note [Weight streaming])."""
        key = (start, like.dtype, like.shape)
        v = self._views.get(key)
        if v is None:
            if len(self._views) >= MAX_VIEWS:
                self._views.clear()
            with torch.inference_mode(False):
                raw = self.memory[start : start + like.nbytes]
                v = self._views[key] = raw.view(like.dtype).view(like.shape)
        return v


class _Copy:
    """The copies issued for call ``index``: per parameter, name, the parameter, its
    version when copied, and its view of the ring; the ring's part and the event after
    them (the ring's own, ``_Ring.event``)."""

    __slots__ = ("done", "index", "params", "span")

    def __init__(
        self,
        index: int,
        params: list[tuple[str, torch.Tensor, int, torch.Tensor]],
        span: tuple[int, int],
        done: torch.cuda.Event,
    ) -> None:
        self.index = index
        self.params = params
        self.span = span
        self.done = done


class _Pass:
    """The outermost forward under way on one thread."""

    def __init__(
        self,
        root: torch.nn.Module,
        record: _Record | None,
        plan_: list[list[int]],
        ring: _Ring | None,
        device: int,
        counters: tuple[int, int, int, int],
        generation: int,
    ) -> None:
        self.root = root
        self.record = record
        self.plan = plan_
        self.ring = ring
        self.device = device
        self.evicted, self.discarded = counters[0], counters[1]  # the engine's, at the start
        self.sent = 0  # bytes the streamer sent to host RAM itself
        self.following = record is not None
        self.generation = generation  # Streamer.drop_rings() calls when it began
        self.calls: list[_Call] = []
        self.issued: dict[int, _Copy] = {}
        self.next_issue = 0
        # The ring had no room for call next_issue's copy, and no part has come back
        # since: the calls before it need not try again (a read-only call's pre-hook
        # did, some 100 times a forward: step 32).
        self.ring_full = False
        self.ordered = False  # whether a copy waited for the compute stream in this forward
        self.low_room: int | None = None
        self.streamed_calls = 0
        self.streamed_bytes = 0  # added to the streamer's stats once, as the run ends
        self.streamed_params = 0
        # id(module) -> stack of (the call's copy, its swaps: parameter, original data,
        # view of the ring, version after the swap)
        self.swapped: dict[
            int, list[tuple[_Copy, list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]]]]
        ] = {}
        self.buffers: set[int] = set()  # data pointers swapped in now


class Streamer(plan.OutermostForward):  # type: ignore[misc]  # of _Pass
    """The hooks of Note [Weight streaming]; one per process (um.py owns it)."""

    def __init__(
        self,
        counters: Counters,
        send_to_host: SendToHost,
        budget: int,
        max_lookahead: int,
        touch: plan.Touch,
    ) -> None:
        self._counters = counters
        self._send = send_to_host
        self._touch = touch
        self._lock = threading.Lock()
        super().__init__()
        self._records: dict[int, _Record] = {}  # id(root) -> record
        self._rings: dict[int, _Ring] = {}  # device -> its ring, while no forward has it
        self._generation = 0  # drop_rings() calls so far
        self.max_lookahead = max_lookahead
        self.set_budget(budget)
        self.copy_sms = -1  # predict_copy_sms: -1 auto, 0 any SM (Note [Copies on few SMs])
        self.copy_lean = True  # predict_copy_kernel: lean, the default (Note [Lean copies])
        # device -> ((sms, lean), stream, blocks of the lean copy kernel: 0 for foreach)
        self._sides: dict[int, tuple[tuple[int, bool], torch.cuda.Stream, int]] = {}
        self.active = True
        self.stats = dict.fromkeys(
            (
                "forwards",
                "records",
                "departures",
                "streamed_bytes",
                "streamed_params",
                "sent_bytes",
                "send_failures",
                "ring_failures",
                "unused_bytes",
                "stale",
                "write_backs",
                "pressured",
                "discard_growths",
                "target_bytes",
                "low_room_bytes",
                "copy_sms",
                "lean_copies",
            ),
            0,
        )

    def set_budget(self, budget: int) -> None:
        """The device budget: the ring's cap (Note [Ring size]) and the margin of the
        targets recorded from now on."""
        self.budget = budget
        self.margin = plan.budget_margin(budget)

    # ---- module hooks (plan.OutermostForward's enter and exit) ---------------------------

    def _inner(self, run: _Pass, module: torch.nn.Module) -> None:
        self._call(run, module)

    def _leave(self, run: _Pass, module: torch.nn.Module) -> None:
        self._restore(run, module)

    def swapped_in(self) -> set[int] | frozenset[int]:
        """The data pointers of the parameters that read the ring now: this thread's
        forward copied them in (um.py's use signal then leaves them alone: they are on
        the device already)."""
        run: _Pass | None = self.current()
        return run.buffers if run is not None else frozenset()

    def drop_rings(self) -> None:
        """Give the rings back to the allocator (um.py calls this when the hooks come off,
        and ``torch.cuda.empty_cache`` does); a forward under way keeps its own until it
        ends, then drops it, and the next forward that streams makes a new one."""
        with self._lock:
            self._rings.clear()
            self._generation += 1

    # ---- one forward -------------------------------------------------------------------

    def _ring_cap(self) -> int:
        """The largest ring (Note [Ring size])."""
        return min(self.max_lookahead, max(MIN_LOOKAHEAD, self.budget // 8))

    def _begin(self, root: torch.nn.Module, args: object = ()) -> _Pass | None:
        if (
            torch.is_grad_enabled()
            or torch.cuda.is_current_stream_capturing()
            or torch.compiler.is_compiling()
        ):
            return None
        device = next((p.device.index or 0 for p in root.parameters() if p.is_cuda), None)
        if device is None:
            return None
        counters = self._counters(device)
        ring: _Ring | None = None
        calls_plan: list[list[int]] = []
        with self._lock:
            record = self._records.pop(id(root), None)
            if record is not None and record.root() is root:
                self._records[id(root)] = record  # the most recently used goes last
            else:
                record = None
            generation = self._generation
            streams = record is not None and record.target.bytes > 0
            if streams:
                assert record is not None
                cap = self._ring_cap()
                size = record.ring_bytes(cap)
                # Taken for this forward (another thread's at the same time makes its own).
                ring = self._rings.pop(device, None)
        if streams:
            assert record is not None
            # A ring that holds this record's calls is kept (records of several models
            # then share the largest they want instead of making a new one each forward).
            if ring is None or not (size <= ring.size <= cap):
                try:
                    ring = _Ring(size, device)
                except RuntimeError:  # out of memory: this forward reads in place
                    ring = None
                    with self._lock:
                        self.stats["ring_failures"] += 1
            if ring is not None:
                with self._lock:
                    calls_plan = record.plan(ring.size)
        run = _Pass(root, record, calls_plan, ring, device, counters, generation)
        if ring is not None:
            self._send_new(run)
            self._touch([ring.memory])  # Note [The ring is used]: nothing else reports it
        self._call(run, root)
        return run

    def _send_new(self, run: _Pass) -> None:
        """Send the parameters newly streamed to host RAM, once."""
        assert run.record is not None
        fresh: list[torch.Tensor] = []
        keys: set[int] = set()
        for call, picked in zip(run.record.calls, run.plan, strict=True):
            module = call.module()
            if module is None or not picked:
                continue
            for k in picked:
                key = call.keys[k][0]
                p = module._parameters.get(call.names[k])
                if p is None or key in run.record.streamed or key in keys:
                    continue
                keys.add(key)
                fresh.append(p)
        if not fresh:
            return
        before = self._counters(run.device)[0]
        try:
            self._send(fresh)
        except RuntimeError:
            # The copies read the parameters wherever they are; the engine moves them
            # under its plain policy, and the target then grows by its evictions.
            with self._lock:
                self.stats["send_failures"] += 1
            return
        after = self._counters(run.device)[0]
        run.sent += max(0, after - before)
        run.record.streamed |= keys
        with self._lock:
            self.stats["sent_bytes"] += max(0, after - before)

    def _call(self, run: _Pass, module: torch.nn.Module) -> None:
        if not _read_only_type(module):
            return
        i = len(run.calls)
        if run.following:
            assert run.record is not None
            recorded = run.record.calls[i] if i < len(run.record.calls) else None
            if recorded is not None and recorded.repeats(module):
                run.calls.append(recorded)
                self._read_by_copy(run, module, i)
                return
        params = _streamable(module)
        if not params:
            return
        run.calls.append(_Call(module, params))
        if run.following:
            self._depart(run)

    def _read_by_copy(self, run: _Pass, module: torch.nn.Module, i: int) -> None:
        """Call ``i`` of the record: its parameters' copies, issued ahead, swapped in."""
        if run.ring is None:
            return
        self._issue(run, i)
        copy = run.issued.pop(i, None)
        if copy is None:
            return
        compute = current_stream(run.device)
        compute.wait_event(copy.done)
        swaps = []
        for name, p, version, buf in copy.params:
            if module._parameters.get(name) is not p or p._version != version:
                with self._lock:
                    self.stats["stale"] += 1
                continue
            original = p.data
            try:
                p.data = buf
            except RuntimeError:  # a tensor type .data cannot point elsewhere: read in place
                with self._lock:
                    self.stats["stale"] += 1
                continue
            swaps.append((p, original, buf, p._version))
            run.buffers.add(buf.data_ptr())
        # Given back by the forward hook, once the call is queued (or now: nothing swapped).
        run.swapped.setdefault(id(module), []).append((copy, swaps))
        for _, _, b, _ in swaps:
            run.streamed_bytes += b.nbytes
        run.streamed_params += len(swaps)
        run.streamed_calls += 1
        if run.streamed_calls % ROOM_EVERY == 1:  # a stats call each: not every call
            room = self._counters(run.device)[2]
            run.low_room = room if run.low_room is None else min(run.low_room, room)

    def _issue(self, run: _Pass, upto: int) -> None:
        """Copy in the parameters of the calls from ``upto`` on, in order, while the ring
        has room for them."""
        assert run.record is not None and run.ring is not None
        if upto > run.next_issue:
            run.next_issue = upto
            run.ring_full = False  # another call's copy: it may be smaller
        if run.ring_full:
            return
        compute = current_stream(run.device)
        while run.next_issue < len(run.plan):
            j = run.next_issue
            picked = run.plan[j]
            call = run.record.calls[j]
            module = call.module()
            if not picked or module is None:
                run.next_issue += 1
                continue
            params = [module._parameters.get(call.names[k]) for k in picked]
            if any(
                p is None or p.data_ptr() != call.keys[k][0]
                for p, k in zip(params, picked, strict=True)
            ):
                run.next_issue += 1  # replaced since the record: read where it is
                continue
            sizes = [-(-p.nbytes // ALIGN) * ALIGN for p in params]
            start = run.ring.parts.take(sum(sizes))
            if start is None:
                if run.ring.parts.held:
                    run.ring_full = True  # until a part comes back: then a hook goes on
                    return
                run.next_issue += 1  # larger than the ring: read where it is
                continue
            run.next_issue += 1
            views, at = [], start
            for p, n in zip(params, sizes, strict=True):
                views.append(run.ring.view(at, p))
                at += n
            copy = _Copy(
                j,
                [
                    (call.names[k], p, p._version, v)
                    for k, p, v in zip(picked, params, views, strict=True)
                ],
                (start, start + sum(sizes)),
                run.ring.event(j, True),
            )
            side, blocks = self._copy_stream(run.device)
            # After the calls that read this part of the ring before, and after every
            # write to its parameters queued so far (Note [Weight streaming]).
            versions = run.record.versions
            written = False
            for k, p in zip(picked, params, strict=True):
                key = call.keys[k][0]
                if versions.get(key) != p._version:
                    versions[key] = p._version
                    written = True
            if written or not run.ordered:
                wait_stream(side, compute)
                if not run.ordered:
                    run.ordered = True
                    run.ring.parts.forget()  # the forwards before: all queued before this
            for reader in run.ring.parts.readers(copy.span):
                side.wait_event(reader)
            with on_stream(side, run.device, compute):
                # Kernels, not a cudaMemcpyAsync per parameter: the driver runs those on
                # SMs too out of managed memory, and they slowed the forward more (steps
                # 15, 29).
                if blocks:
                    views, params = self._lean(run.device, side, blocks, views, params)
                if views:
                    torch._foreach_copy_(views, params)
            copy.done.record(side)
            run.issued[j] = copy

    def _lean(
        self,
        device: int,
        side: torch.cuda.Stream,
        blocks: int,
        views: list[torch.Tensor],
        params: list[torch.Tensor],
    ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Queue the copies the lean kernel can make (Note [Lean copies], _um_copy.py);
        the rest, for foreach."""
        rest_v, rest_p, done, failed = _um_copy.copy_pairs(
            device, views, params, int(side.cuda_stream), blocks
        )
        if failed is not None:
            self._sides.pop(device, None)  # the next call picks the stream again
            warnings.warn(
                f"torch.cuda.um: {failed}; the weight streamer copies by foreach from now on",
                stacklevel=2,
            )
        if done:
            with self._lock:
                self.stats["lean_copies"] += done
        return rest_v, rest_p

    def _copy_stream(self, device: int) -> tuple[torch.cuda.Stream, int]:
        """The stream the copies run on, and the blocks of the lean copy kernel (0:
        foreach). ``copy_sms`` auto or N: foreach on a green context's eighth of the SMs,
        or N (Note [Copies on few SMs], _um_streams.py), where it can be had, else a
        plain stream; with ``copy_lean``, the lean kernel on 2 or N SMs on a plain side
        stream (Note [Lean copies], _um_copy.py), foreach as above where it cannot be
        had. 0: foreach on a plain stream."""
        setting = self.copy_sms
        kept = self._sides.get(device)
        if kept is not None and kept[0] == (setting, self.copy_lean):
            return kept[1], kept[2]
        blocks = 0
        if setting != 0 and self.copy_lean and _um_copy.copier(device) is not None:
            blocks = setting if setting > 0 else _um_copy.BLOCKS
            stream, got = side_stream(device, "weights"), blocks
        else:
            want = setting if setting >= 0 else auto_copy_sms(device)
            stream, got = few_sm_stream(device, "weights", want)
            if setting > 0 and got == 0:  # asked for by name: say why it was not had
                why = green_failures.get((device, want), "unknown")
                lean_why = ""
                if self.copy_lean:
                    lean_why = f"no lean copy kernel: {_um_copy.failures.get(device, 'unknown')}; "
                warnings.warn(
                    f"torch.cuda.um: predict_copy_sms:{setting} could not be had on device "
                    f"{device} ({lean_why}no green context: {why}); "
                    "the weight streamer's copies may use every SM",
                    stacklevel=2,
                )
        self._sides[device] = ((setting, self.copy_lean), stream, blocks)
        with self._lock:
            self.stats["copy_sms"] = got  # the last device's; one device in practice
        return stream, blocks

    def _restore(self, run: _Pass, module: torch.nn.Module) -> None:
        stack = run.swapped.get(id(module))
        if not stack:
            return
        copy, swaps = stack.pop()
        if not stack:
            del run.swapped[id(module)]
        self._put_back(run, swaps)
        assert run.ring is not None
        read = run.ring.event(copy.index, False)
        read.record(current_stream(run.device))  # the call is queued: its reads come first
        run.ring.parts.give_back(copy.span, read)
        run.ring_full = False

    def _put_back(
        self,
        run: _Pass,
        swaps: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, int]],
    ) -> None:
        for p, original, buf, version in swaps:
            if p._version != version:  # written in place during the call: keep the write
                original.copy_(buf)
                with self._lock:
                    self.stats["write_backs"] += 1
            p.data = original
            run.buffers.discard(buf.data_ptr())

    def _abandon(self, run: _Pass) -> None:
        """The hooks came off during ``run``'s forward: its calls whose forward hook never
        ran get their parameters back, and the compute stream waits for the copies issued
        and not used (the ring goes back to the allocator with the run: drop_rings keeps
        it from the next forwards, and nothing may still be writing it then)."""
        self._unwind(run)

    def _depart(self, run: _Pass) -> None:
        run.following = False
        self._drop_unused(run)
        with self._lock:
            self.stats["departures"] += 1

    def _drop_unused(self, run: _Pass) -> None:
        if not run.issued:
            return
        assert run.ring is not None
        compute = current_stream(run.device)
        for copy in run.issued.values():
            compute.wait_event(copy.done)  # before its part of the ring is copied into again
            run.ring.parts.give_back(copy.span)
            run.ring_full = False
            with self._lock:
                self.stats["unused_bytes"] += copy.span[1] - copy.span[0]
        run.issued.clear()

    def _unwind(self, run: _Pass) -> None:
        """What the forward still holds goes back: its unused copies, waited for by the
        compute stream, and the parameters of calls whose forward hook never ran; its
        counts go to the stats."""
        if run.streamed_params:
            with self._lock:
                self.stats["streamed_bytes"] += run.streamed_bytes
                self.stats["streamed_params"] += run.streamed_params
            run.streamed_bytes = run.streamed_params = 0
        self._drop_unused(run)
        for stack in run.swapped.values():
            for copy, swaps in stack:
                self._put_back(run, swaps)
                assert run.ring is not None
                run.ring.parts.give_back(copy.span)
        run.swapped.clear()

    def _end(self, run: _Pass) -> None:
        self._unwind(run)
        if run.ring is not None:
            with self._lock:
                if run.generation == self._generation:
                    self._rings[run.device] = run.ring
        if not run.calls:
            return  # nothing streamable (an activation module called on its own)
        evicted_now, discarded_now, room, over = self._counters(run.device)
        evicted = max(0, evicted_now - run.evicted - run.sent)
        discarded = max(0, discarded_now - run.discarded)
        low = room if run.low_room is None else min(run.low_room, room)
        with self._lock:
            self.stats["forwards"] += 1
            record = run.record
            repeated = record is not None and run.following and len(run.calls) == len(record.calls)
            if repeated:
                assert record is not None
                if run.ring is not None or record.target.bytes == 0:  # not a failed ring
                    grown = record.target.discard_growths
                    record.target.update(evicted, discarded, low, record.total, over)
                    self.stats["discard_growths"] += record.target.discard_growths - grown
                if evicted:
                    self.stats["pressured"] += 1
            else:
                if record is not None and run.following:
                    self.stats["departures"] += 1  # fewer calls than recorded
                target = plan.StreamTarget(margin=self.margin)
                record = _Record(run.root, run.calls, target)
                target.start(evicted, record.total, over, discarded)
                self._records.pop(id(run.root), None)
                while len(self._records) >= MAX_RECORDS:
                    self._records.pop(next(iter(self._records)))
                self._records[id(run.root)] = record
                self.stats["records"] += 1
            self.stats["target_bytes"] = record.target.bytes
            self.stats["low_room_bytes"] = low

    def counters(self) -> dict[str, int]:
        with self._lock:
            return {f"predict.stream_{k}": v for k, v in self.stats.items()}
