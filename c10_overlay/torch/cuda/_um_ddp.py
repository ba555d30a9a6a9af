"""DistributedDataParallel's gradient buckets between steps: forgotten, not moved.

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
  whose parameters has a gradient any more is forgotten (``torch_um_forget``, Note
  [Forgotten content] in Residency.h): its chunks are the first to leave the device, by
  discard, without a copy. The storage is then let go, so that the reducer's rebuild
  can free it;
- every parameter of the module carries a gradient hook, which autograd runs before it
  accumulates the gradient, and so before the reducer writes it into its view. The first
  of a forgotten bucket's parameters to get a gradient touches the whole bucket, which
  comes back by discard-and-prefetch, without a copy, one bucket at a time as the
  backward reaches it. A touch ends the forgetting wherever the bucket is: a write
  after it can never be discarded.

What is given up is only what DDP overwrites itself: a gradient view kept past
``zero_grad(set_to_none=True)`` and read before the next backward reads undefined bytes,
where stock torch reads the old gradient until that backward overwrites it there too.
Not forgotten:

- a bucket any of whose parameters still has a gradient (``zero_grad(set_to_none=False)``,
  gradient accumulation under ``no_sync``): its bytes are live;
- modules with ``find_unused_parameters=True``: the reducer zeroes the views of unused
  parameters, which get no gradient and so no hook before the write;
- ``gradient_as_bucket_view=False``: the buckets are never views, so never seen here;
- steps the optimizer hooks do not see (torch.compile'd steps, optimizers outside
  ``torch.optim``): nothing is kept, nothing forgotten.

When the hooks come off (the pressure went away, ``configure``), ``drop`` touches every
bucket still forgotten, so that the next backward's writes are never discarded, and takes
the gradient hooks off.

Thread safety: ``enter``, ``stepped``, the gradient hooks and ``drop`` may run on any
thread (a backward runs its hooks on autograd's threads); the state is under one lock,
released around calls into the engine that may block.
"""

from __future__ import annotations

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

    __slots__ = ("params", "range", "storage", "touched")

    def __init__(self, storage: torch.UntypedStorage, rng: Range) -> None:
        self.storage: torch.UntypedStorage | None = storage  # held until forgotten
        self.range = rng
        self.params: list[weakref.ref[torch.Tensor]] = []
        self.touched = False


class _Module:
    """What is known of one DDP module: its parameters' hooks and its buckets."""

    __slots__ = ("eligible", "handles", "kept")

    def __init__(self, eligible: bool) -> None:
        self.eligible = eligible
        self.handles: list[Any] = []
        self.kept: dict[int, _Bucket] = {}  # data_ptr -> bucket, from the last step


def eligible(module: torch.nn.Module) -> bool:
    """A DDP module whose buckets this forgets: bucket views, no unused parameters."""
    return bool(getattr(module, "gradient_as_bucket_view", False)) and not bool(
        getattr(module, "find_unused_parameters", True)
    )


class Buckets:
    """Note [DDP's buckets between steps]; one per process."""

    def __init__(self, forget: Forget, touch: TouchRanges) -> None:
        self._forget = forget
        self._touch = touch
        self._lock = threading.Lock()
        self._modules: WeakIdKeyDictionary = WeakIdKeyDictionary()  # DDP -> _Module
        self._owner: WeakIdKeyDictionary = WeakIdKeyDictionary()  # param -> _Module
        self._pending: dict[int, _Bucket] = {}  # id(param) -> its forgotten bucket
        self.active = True
        self.stats = dict.fromkeys(("forgotten", "forgotten_bytes", "touched"), 0)

    # -- the DDP module's forward -----------------------------------------------------

    def enter(self, module: torch.nn.Module) -> None:
        """A DDP module's forward with autograd starts: forget the buckets its last
        step left without a gradient."""
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
        marked = 0
        for bucket in dead:  # outside the lock: the engine's lock is taken
            # The storage is still held here, so the range is still its own: never
            # memory the allocator has handed to someone else since.
            ptr, size, _ = bucket.range
            got = self._forget(ptr, size)
            marked += max(0, got)
        for bucket in kept.values():
            bucket.storage = None  # let the reducer free it if it rebuilds
        with self._lock:
            for bucket in dead:
                for ref in bucket.params:
                    p = ref()
                    if p is not None:
                        self._pending[id(p)] = bucket
            self.stats["forgotten"] += len(dead)
            self.stats["forgotten_bytes"] += marked

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
                self.stats["touched"] += 1
            self._touch([bucket.range])

        return before_accumulate

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

    # -- the hooks come off ---------------------------------------------------------------

    def drop(self) -> None:
        """Touch every bucket still forgotten and take the gradient hooks off."""
        with self._lock:
            self.active = False
            left = {id(b): b for b in self._pending.values() if not b.touched}
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
            self._touch([b.range for b in left.values()])

    def counters(self) -> dict[str, int]:
        with self._lock:
            return {f"predict.ddp_{k}": v for k, v in self.stats.items()}
