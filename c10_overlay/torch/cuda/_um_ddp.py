"""DistributedDataParallel's gradient buckets between steps: released or forgotten, not moved.

Note [DDP's buckets between steps]
With ``gradient_as_bucket_view=True`` every ``.grad`` of a DDP module's parameters is a
view of one of the reducer's buckets: flat storages allocated once (rebuilt once, at
the second forward) and kept for the whole run. The backward writes every byte of them
(each gradient is copied, scaled, into its view as it arrives, and the views tile the
bucket), NCCL reduces them in place, and the optimizer step reads them. Then
``zero_grad()`` (``set_to_none=True``, its default) drops the views, and until the next
backward writes them again the buckets hold bytes nobody will read. Past the budget
they still take room under it: the forward evicts them by copy to make room for its
saved activations and the step brings them back by copy. For a 1.28 B model in bf16
that is 2.68 GB out and back per step, the most of what separated a DDP rank from one
GPU's training at the same budget (bench/README.md, prediction steps 27 and 31).

So, with ``predict_ddp_buckets:True`` (the default) under ``predict``, while the hooks
are on (Note [Use signals], um.py):

- the optimizer step's pre-hook reports the parameters it steps (``stepped``); for the
  parameters of a DDP module with bucket views, the storage each gradient views is kept,
  with the parameters whose gradients view it;
- at the DDP module's next forward with autograd (``enter``), a kept storage none of
  whose parameters has a gradient any more is released: resized to no bytes, so that
  its block goes back to the caching allocator and the forward's own allocations land
  on it, on the device, as they land on the freed gradients of a model without DDP. The
  reducer's bucket and views keep the storage object; only its memory goes;
- every parameter of the module carries a gradient hook, which autograd runs before it
  accumulates the gradient, and so before the reducer writes it into its view. The first
  of a released bucket's parameters to get a gradient resizes the storage back to its
  bytes, a fresh block from the allocator, one bucket at a time as the backward reaches
  it. A storage only this module still holds (the reducer rebuilt its buckets, once, at
  the second forward) is let go instead.

A storage that cannot be released safely (Note [Who else holds a bucket]) is forgotten
instead (``torch_um_forget``, Note [Forgotten content] in Residency.h): its chunks are the first
to leave the device, by discard, without a copy, and the first gradient hook touches it
back. Forgetting was the first way (prediction step 33); it leaves the bucket's block
allocated, so the forward's blocks come from elsewhere, and a DDP rank discarded and
placed again 9.0 GB a step against one GPU's 3.4 (bench/README.md, step 41). Releasing
makes the room of the buckets the room of the next forward (step 42).

What is given up is only what DDP overwrites itself: a gradient view kept past
``zero_grad(set_to_none=True)`` and read before the next backward reads undefined bytes,
where stock torch reads the old gradient until that backward overwrites it there too.
Neither released nor forgotten:

- a bucket any of whose parameters still has a gradient (``zero_grad(set_to_none=False)``,
  gradient accumulation under ``no_sync``): its bytes are live;
- modules with ``find_unused_parameters=True`` or ``static_graph=True``: the reducer zeroes
  the views of unused parameters, which get no gradient and so no hook before the write;
- ``gradient_as_bucket_view=False``: the buckets are never views, so never seen here;
- steps the optimizer hooks do not see (torch.compile'd steps, optimizers outside
  ``torch.optim``): nothing is kept, nothing given up.

When the hooks come off (the pressure went away, ``configure``), ``drop`` brings back
every bucket still released or forgotten, so that the next backward's writes always land
in memory of their own and are never discarded, and takes the gradient hooks off.

Thread safety: ``enter``, ``stepped``, the gradient hooks and ``drop`` may run on any
thread (a backward runs its hooks on autograd's threads); the state is under one lock,
released around calls into the engine that may block.
"""

from __future__ import annotations

import sys
import threading
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.weak import WeakIdKeyDictionary

Range = tuple[int, int, int]  # data_ptr, bytes, device index
Forget = Callable[[int, int], int]  # (data_ptr, bytes) -> bytes the engine marked
TouchRanges = Callable[[list[Range]], None]


class _Bucket:
    """A storage some of a DDP module's gradients viewed at a step."""

    __slots__ = ("grads", "params", "range", "released", "storage", "touched")

    def __init__(self, storage: torch.UntypedStorage, rng: Range) -> None:
        # held until forgotten; a released one, until it is brought back or let go
        self.storage: torch.UntypedStorage | None = storage
        self.range = rng
        self.params: list[weakref.ref[torch.Tensor]] = []
        self.grads: list[weakref.ref[torch.Tensor]] = []  # the params' at the step
        self.released = False
        self.touched = False


class _Module:
    """What is known of one DDP module: its parameters' hooks and its buckets."""

    __slots__ = ("eligible", "handles", "kept")

    def __init__(self, eligible: bool) -> None:
        self.eligible = eligible
        self.handles: list[Any] = []
        self.kept: dict[int, _Bucket] = {}  # data_ptr -> bucket, from the last step


def eligible(module: torch.nn.Module) -> bool:
    """A DDP module whose buckets this gives up: bucket views, no unused parameters
    (neither searched for nor known from a static graph)."""
    return (
        bool(getattr(module, "gradient_as_bucket_view", False))
        and not bool(getattr(module, "find_unused_parameters", True))
        and not bool(getattr(module, "static_graph", True))
    )


def holders(storage: torch.UntypedStorage) -> int:
    """How many tensors and storage objects share ``storage``'s memory (its use count)."""
    return int(torch._C._storage_Use_Count(storage._cdata))


def _held(ref: weakref.ref[torch.Tensor]) -> tuple[int, int]:
    """(Python references, C++ references) of the tensor ``ref`` names, not counting
    this call's own; (0, 0) once it is gone."""
    t = ref()
    if t is None:
        return 0, 0
    return sys.getrefcount(t), t._use_count()


def _unheld_baseline() -> tuple[int, int]:
    """What ``_held`` reads for a tensor that only C++ holds: measured, not assumed,
    since it depends on the interpreter and on torch's PyObject preservation."""
    t = torch.empty(0)
    ref = weakref.ref(t)
    view = t.view(0)  # holds t's TensorImpl from C++ (its base), as the reducer does
    del t
    got = _held(ref)
    del view
    return got


_BASELINE: tuple[int, int] | None = None
# Both counts reducer_only reads are private API; without them nothing is released.
_COUNTS = hasattr(torch._C, "_storage_Use_Count") and hasattr(torch.Tensor, "_use_count")


def reducer_only(storage: torch.UntypedStorage, grads: list[weakref.ref[torch.Tensor]]) -> bool:
    """Whether ``storage`` is held by the reducer and this module alone, so that releasing
    it leaves no tensor anyone can read. ``grads``: the bucket's parameters' gradients
    at the step (each the reducer's view of its parameter).

    Note [Who else holds a bucket]
    A released storage has no memory: a tensor still viewing it reads from address 0
    plus its offset, which kills the process (a segmentation fault on the CPU, an
    illegal address on the GPU), where forgetting it would only have left its bytes
    undefined. So a bucket is released only when every holder is accounted for:

    - the storage's use count is this module's storage object (1), the reducer's flat
      bucket tensor (1) and its two views of each parameter's gradient, in and out (2
      each), as torch 2.6 to 2.14's reducer has them. Any other tensor on the storage (a
      view of a gradient a program made, a reducer that holds the bucket otherwise) adds
      to it;
    - a parameter's ``.grad`` is the reducer's in-view itself, not a new tensor, so a
      gradient a program kept past ``zero_grad()`` (``g = p.grad``) adds no tensor to
      the storage. It shows in the gradient's own references instead, Python's or C++'s,
      which must be those of a tensor only C++ holds (``_unheld_baseline``).

    Where anything differs, or a count cannot be read (a torch without
    ``torch._C._storage_Use_Count`` or ``Tensor._use_count``), the bucket is forgotten
    instead: slower, never a crash."""
    global _BASELINE
    if not _COUNTS or holders(storage) != 2 + 2 * len(grads):
        return False
    if _BASELINE is None:
        _BASELINE = _unheld_baseline()
    return all(_held(ref) in ((0, 0), _BASELINE) for ref in grads)


class Buckets:
    """Note [DDP's buckets between steps]; one per process."""

    def __init__(self, forget: Forget, touch: TouchRanges) -> None:
        self._forget = forget
        self._touch = touch
        self._lock = threading.Lock()
        self._modules: WeakIdKeyDictionary = WeakIdKeyDictionary()  # DDP -> _Module
        self._owner: WeakIdKeyDictionary = WeakIdKeyDictionary()  # param -> _Module
        # id(param) -> its bucket, released or forgotten, until brought back
        self._pending: dict[int, _Bucket] = {}
        self.active = True
        self.stats = dict.fromkeys(
            ("forgotten", "forgotten_bytes", "released", "touched", "let_go"), 0
        )

    # -- the DDP module's forward -----------------------------------------------------

    def enter(self, module: torch.nn.Module) -> None:
        """A DDP module's forward with autograd starts: release (or forget) the buckets
        its last step left without a gradient."""
        if not self.active:
            return
        with self._lock:
            state = self._modules.get(module)
            if state is None:
                state = self._adopt(module)
            if not state.eligible or not state.kept:
                return
            kept, state.kept = state.kept, {}
            dead = []
            for bucket in kept.values():
                params = [ref() for ref in bucket.params]
                if all(p is None or p.grad is None for p in params):
                    dead.append(bucket)
        gone = 0
        for bucket in dead:  # outside the lock: the engine's lock is taken
            st = bucket.storage
            assert st is not None  # kept buckets hold theirs until here
            ptr, size, _ = bucket.range
            if st.resizable() and reducer_only(st, bucket.grads):
                st.resize_(0)  # its block goes back to the allocator
                bucket.released = True
                gone += size
            else:
                # The storage is still held here, so the range is still its own: never
                # memory the allocator has handed to someone else since.
                gone += max(0, self._forget(ptr, size))
        for bucket in kept.values():
            if not bucket.released:
                bucket.storage = None  # let the reducer free it if it rebuilds
        with self._lock:
            for bucket in dead:
                for ref in bucket.params:
                    p = ref()
                    if p is not None:
                        self._pending[id(p)] = bucket
            self.stats["forgotten"] += len(dead)
            self.stats["released"] += sum(b.released for b in dead)
            self.stats["forgotten_bytes"] += gone

    def _adopt(self, module: torch.nn.Module) -> _Module:
        """First sight of a DDP module (under the lock): hook its parameters."""
        state = _Module(eligible(module))
        self._modules[module] = state
        if not state.eligible:
            return state
        for p in module.parameters():
            if p.requires_grad:
                self._owner[p] = state
                state.handles.append(p.register_hook(self._grad_hook(id(p))))
        return state

    def _grad_hook(self, key: int) -> Callable[[torch.Tensor], None]:
        def before_accumulate(grad: torch.Tensor) -> None:
            if not self._pending:
                return
            with self._lock:
                bucket = self._pending.pop(key, None)
                if bucket is None or bucket.touched:
                    return
                bucket.touched = True
            self._bring_back([bucket])

        return before_accumulate

    def _bring_back(self, buckets: list[_Bucket]) -> None:
        """Before anything writes them: released buckets get memory again, forgotten
        ones are touched. A released storage only this module holds is let go."""
        forgotten, back, let_go = [], 0, 0
        for bucket in buckets:
            st = bucket.storage
            if not bucket.released:
                forgotten.append(bucket.range)
            elif st is not None and holders(st) > 1:
                st.resize_(bucket.range[1])  # a fresh block, on this stream
                back += 1
            else:
                let_go += 1  # the reducer rebuilt its buckets: nobody reads this one
            bucket.storage = None
        if forgotten:
            self._touch(forgotten)
        with self._lock:
            self.stats["touched"] += back + len(forgotten)
            self.stats["let_go"] += let_go

    # -- the optimizer step -------------------------------------------------------------

    def stepped(self, params: list[torch.Tensor]) -> None:
        """The step's pre-hook: ``params`` have gradients the step will read. Keep the
        storages that DDP modules' gradients view."""
        if not self.active or not self._owner:
            return
        fresh: dict[int, dict[int, _Bucket]] = {}  # id(_Module) -> its buckets
        with self._lock:
            for p in params:
                state = self._owner.get(p)
                g = p.grad
                if state is None or g is None or g.layout != torch.strided:
                    continue
                st = g.untyped_storage()
                ptr = st.data_ptr()
                buckets = fresh.setdefault(id(state), {})
                bucket = buckets.get(ptr)
                if bucket is None:
                    bucket = buckets[ptr] = _Bucket(st, (ptr, st.nbytes(), g.get_device()))
                    state.kept = buckets
                bucket.params.append(weakref.ref(p))
                bucket.grads.append(weakref.ref(g))

    # -- the hooks come off ---------------------------------------------------------------

    def drop(self) -> None:
        """Bring back every bucket still released or forgotten and take the gradient
        hooks off."""
        with self._lock:
            self.active = False
            left = {id(b): b for b in self._pending.values() if not b.touched}
            for b in left.values():
                b.touched = True
            self._pending = {}
            handles = [h for state in self._modules.values() for h in state.handles]
            for state in self._modules.values():
                state.handles = []
                state.kept = {}
            self._modules = WeakIdKeyDictionary()
            self._owner = WeakIdKeyDictionary()
        for h in handles:
            h.remove()
        if left:
            self._bring_back(list(left.values()))

    def counters(self) -> dict[str, int]:
        with self._lock:
            return {f"predict.ddp_{k}": v for k, v in self.stats.items()}
