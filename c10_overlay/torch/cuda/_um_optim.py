"""Optimizer state past the budget is staged on the device for the step, chunk by chunk.

Note [Optimizer state staging]
Past the budget, the optimizer state (Adam's ``exp_avg`` and ``exp_avg_sq``, SGD's
momentum) is the coldest data of a training step: the step reads and writes it once,
nothing else touches it, so the residency policy leaves it in host RAM and the step's
kernels read and write it there in place. A foreach optimizer makes several passes over
it: AdamW reads ``exp_avg`` twice and ``exp_avg_sq`` three times and writes them three
times in all, so that for a 1.28 B bf16 model 12.8 GB cross the link in and 7.7 GB out,
0.29 s of a 0.8 s step on the H200 host (bench/README.md, prediction steps 8 and 10),
where the step takes 0.016 s in device memory. Staged, each byte crosses once each way:
5.1 GB in and 5.1 GB out. Reads and writes of managed memory in host RAM share about
52 GB/s between them (bench/probes/stage_routes_probe.py), so that is about 0.2 s.

So, with ``predict:True`` and while the module hooks are on (Note [Use signals], um.py),
a global optimizer-step pre-hook runs the step itself, in chunks:

- the parameters with a gradient are cut, in the optimizer's order, into runs whose
  state (tensors of at least MIN_BYTES) fits a fifth of the free room under the budget
  past MARGIN (``_um_plan.state_chunks``): three chunks' buffers are live at a time (one
  coming in, one stepped, one going out), and the step's own temporaries take up to two
  more. The saved-activation offload keeps a larger margin (a sixteenth of the budget)
  for its copies in flight; between the backward and the step none are, and with that
  margin two steps in five found too little room and ran unstaged (bench/README.md,
  prediction step 12);
- per chunk: device buffers are taken from the allocator (the blocks the backward
  freed), a copy kernel on one side stream brings the chunk's state into them while the
  chunk before is stepped, the state entries are pointed at the buffers, the
  optimizer's own step runs (unhooked, on the compute stream) with every parameter group
  narrowed to the chunk, the entries are pointed back, and a copy kernel on a second
  side stream takes the chunk's state back out to its original tensors while the next
  chunk is stepped. The compute stream waits for a chunk's copy in before its step, and
  for every copy out before anything after the step. For the model above the optimizer
  phase takes 0.169 s so, against 0.219 s with the copies on the compute stream
  (bench/README.md, prediction step 13);
- a chunk's buffers are freed two chunks later, after the compute stream has waited for
  an event recorded after their copy out, so that the allocator hands their blocks out
  again at once, in stream order. With ``record_stream`` instead, a block came back
  only once the allocator saw the event pass, the engine saw it die no sooner, and the
  forward after the step evicted where it would have reused dead room: the step took
  0.749 s against 0.687 s with the copies on the compute stream (step 13). (Step 11's
  two-stream version lost bit-exactness with SGD once; that was the engine's race of
  step 12, in the run with staging off, not the streams.);
- the step that follows the hook then runs over empty parameter groups (it does
  nothing, but counts as the step: LR schedulers and ``_optimizer_step_code`` see one
  step), and the post-hook puts the groups back. Anything after the step, on the
  compute stream, reads the updated state.

The result is exactly the stock step's. The optimizers staged (ELEMENTWISE, exact
types from torch.optim) update each parameter from its own gradient and state alone,
element by element, and skip parameters without a gradient; a foreach kernel applies
the same arithmetic to an element whatever list it is part of. So a step over the
chunks one after the other updates every parameter once, with the same bits. A state
entry the step replaces instead of updating in place is kept as replaced, not copied
back over.

The copies' kernel (``predict_stage_kernel``). By default a chunk's copy in and its copy
out are one ``torch._foreach_copy_`` launch each. A copy in and a copy out by such
launches at once read about 26 GB/s each way (bench/README.md, step 12, where that was
taken for the link's limit), as do page-locked copies by the copy engines (step 46). But
the link carries more both ways at once for kernels of few blocks: two lean launches of
32 blocks, one each way, moved 38 GB/s each way, of 8 blocks 31, of 2 blocks 28-30
(``bench.probes.copy_routes_probe --both-ways``, step 46); one lean kernel copying host RAM into
host RAM moved 42 each way (step 44). Under ``predict_stage_kernel:lean`` each tensor's
copy is the lean kernel (Note [Lean copies], _um_copy.py) on STAGE_BLOCKS SMs, or on
``predict_copy_sms`` where that is set to a count, which leaves the other SMs to the copy
the other way and to the step's kernels; a pair it does not apply to (a strided tensor)
goes to foreach, and a failed launch returns the staging to foreach for good, after what
is queued (``copy_pairs``). Off by default: in ``bench.residency``'s training (modes
``um-predict-stage-lean``, ``-lean2``; counter ``lean_copies``) the optimizer phase took
0.176-0.180 s with it against 0.171-0.185 with foreach, whose chunked copies in and out
already overlap at 35-40 GB/s each way (``bench.probes.timeline_probe``, step 46).

Note [The step's gradients are touched]
Before anything else, the pre-hook reports every gradient the step will read as used
(um.py's use signal, as a module's parameters are before its forward), whether the step
is then staged or not. A gradient the backward has just allocated is on the device and
costs one call. But a gradient storage that outlives the step is touched by nothing else:
DistributedDataParallel's buckets (``gradient_as_bucket_view``: every ``.grad`` is a view
of one) are allocated once, no module hook covers them and no block event follows, so the
residency policy saw them as the least recently used live data and left them in host RAM,
where every backward wrote them, NCCL read and wrote them and every step read them in
place over the link (bench/README.md, prediction step 27). Touched here, they come back
before the step and stay while they are used; the saved-activation offload then makes
room for them in the forward by copy, which costs the link less than reads in place.
A touch covers a gradient's whole storage (a bucket, which the backward and NCCL use
whole). It is advice: a gradient without a plain storage (FSDP2's DTensor shards, a
fake tensor) is skipped, and a touch that fails is counted (``touch_failures``), never
raised into the step. Not touched: sparse gradients, and any gradient of a step that
torch.compile traces (the touch is a foreign call there), so a compiled step leaves
DDP's buckets where they are.

Not staged (the step runs as usual): another optimizer type or a subclass, a step
given a closure, fused, capturable or differentiable groups, sparse gradients,
parameters on several devices, a step under torch.compile or a CUDA graph capture, an
optimizer with step hooks of its own or other global step hooks (they would see the
narrowed groups, or run after the update they expect to precede), the first step
(there is no state yet) and too little room for a chunk (counted as ``no_room``).

Thread safety: the hooks may run on any thread; what one step holds is keyed by its
optimizer, and the counters are under a lock. Two threads stepping one optimizer at
once is as unsupported as it is in stock torch.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch.cuda import _um_copy
from torch.cuda import _um_plan as plan
from torch.cuda._um_streams import side_stream, wait_stream
from torch.optim import optimizer as _optimizer  # torch.optim does not export the module

MIN_BYTES = 1 << 20  # smaller state (step counters, scalars) is read in place
MIN_CHUNK = 16 << 20  # less room than this for a chunk: the step runs as usual
MARGIN = MIN_CHUNK  # free room under the budget that staging leaves alone
# torch.optim's optimizers that update each parameter from its own gradient and state,
# element by element (Note [Optimizer state staging]).
ELEMENTWISE = frozenset({"Adam", "AdamW", "SGD", "RMSprop", "Adagrad", "Adamax", "NAdam", "RAdam"})

Room = Callable[[int], int]  # device index -> free bytes under the budget
# told the parameters a step will read the gradients of (Note [DDP's buckets between
# steps], torch/cuda/_um_ddp.py)
Seen = Callable[[list[torch.Tensor]], None]


class _Swap:
    """One state entry staged for one chunk: where it lives and its device buffer."""

    __slots__ = ("buffer", "key", "original", "state")

    def __init__(self, state: dict[str, Any], key: str, original: torch.Tensor) -> None:
        self.state = state
        self.key = key
        self.original = original
        self.buffer = torch.empty_like(original)


class Stager:
    """The pre- and post-hook of Note [Optimizer state staging]; one per process."""

    # The lean launches' blocks under predict_copy_sms:auto, a copy in and a copy out at
    # once ("The copies' kernel"): two launches of 32 blocks carried 38 GB/s each way, of
    # 8 blocks 31, of 2 blocks 28-30 (bench/README.md, step 46).
    STAGE_BLOCKS = 32

    def __init__(self, room: Room, touch: plan.Touch) -> None:
        self._room = room
        self._touch = touch
        self.seen: Seen | None = None  # set by um.py while DDP's buckets are watched
        self._lock = threading.Lock()
        self._held: dict[int, list[list[Any]]] = {}  # id(optimizer) -> the groups' params
        self.active = True
        # predict_stage_kernel:lean (um.py's _apply_predict_settings): the copies in and out
        # by the lean kernel (Note [Optimizer state staging], "The copies' kernel")
        self.copy_lean = False
        self.copy_blocks = self.STAGE_BLOCKS  # predict_copy_sms where set to a count
        self.stats = dict.fromkeys(
            (
                "steps",
                "chunks",
                "staged_bytes",
                "skipped",
                "no_room",
                "touch_failures",
                "lean_copies",
            ),
            0,
        )

    # ---- eligibility -----------------------------------------------------------------

    def _eligible(self, opt: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: Any) -> bool:
        """Not in the Note's "Not staged" list (before() checks the parameters)."""
        cls = type(opt)
        return (
            cls.__name__ in ELEMENTWISE
            and cls.__module__.startswith("torch.optim.")
            and all(a is None for a in args[1:])  # no closure
            and all(v is None for v in kwargs.values())
            and getattr(cls.step, "__wrapped__", None) is not None
            and not opt._optimizer_step_pre_hooks
            and not opt._optimizer_step_post_hooks
            and list(_optimizer._global_optimizer_pre_hooks.values()) == [self.before]
            and list(_optimizer._global_optimizer_post_hooks.values()) == [self.after]
            and not any(
                g.get("fused") or g.get("capturable") or g.get("differentiable")
                for g in opt.param_groups
            )
            and not torch.compiler.is_compiling()
            and not torch.cuda.is_current_stream_capturing()
        )

    # ---- hooks -------------------------------------------------------------------------

    def install(self) -> list[Any]:
        """Register the global step hooks; returns their handles."""
        self.active = True
        return [
            _optimizer.register_optimizer_step_pre_hook(self.before),
            _optimizer.register_optimizer_step_post_hook(self.after),
        ]

    def before(self, opt: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: Any) -> None:
        self.after(opt, args, kwargs)  # a step that raised left its groups narrowed
        if not self.active:
            return
        params = [p for g in opt.param_groups for p in g["params"] if p.grad is not None]
        if not params:
            return
        # Note [The step's gradients are touched]. Not while torch.compile traces the step
        # (the touch is a foreign call); under a CUDA graph capture the engine acts on none.
        if not torch.compiler.is_compiling():
            try:
                self._touch([p.grad for p in params if p.grad.layout == torch.strided])
                if self.seen is not None:
                    self.seen(params)
            except RuntimeError:  # a gradient whose storage cannot be read: advice only
                with self._lock:
                    self.stats["touch_failures"] += 1
        device = params[0].device
        if (
            not self._eligible(opt, args, kwargs)
            or device.type != "cuda"
            or any(p.device != device or p.grad.is_sparse for p in params)
        ):
            with self._lock:
                self.stats["skipped"] += 1
            return
        sizes = [self._state_bytes(opt.state.get(p, {}), device) for p in params]
        if sum(sizes) == 0:
            return  # the first step: there is no state yet
        limit = max(0, self._room(device.index or 0) - MARGIN) // 5
        if limit < MIN_CHUNK:
            with self._lock:
                self.stats["no_room"] += 1
            return
        groups = opt.param_groups
        kept = [g["params"] for g in groups]
        step = type(opt).step.__wrapped__
        chunks = plan.state_chunks(sizes, limit)
        try:
            staged = self._run(opt, step, params, chunks, device)
        finally:
            for g, ps in zip(groups, kept, strict=True):
                g["params"] = ps
        # The step that follows runs over empty groups; after() puts them back.
        for g in groups:
            g["params"] = []
        with self._lock:
            self._held[id(opt)] = kept
            self.stats["steps"] += 1
            self.stats["chunks"] += len(chunks)
            self.stats["staged_bytes"] += staged

    def after(self, opt: torch.optim.Optimizer, args: tuple[Any, ...], kwargs: Any) -> None:
        with self._lock:
            kept = self._held.pop(id(opt), None)
        if kept is not None:  # a group added since keeps its own parameters
            for g, ps in zip(opt.param_groups, kept, strict=False):
                g["params"] = ps

    # ---- the staged step ---------------------------------------------------------------

    def _copy(
        self,
        device: int,
        stream: torch.cuda.Stream,
        dst: list[torch.Tensor],
        src: list[torch.Tensor],
    ) -> None:
        """Queue ``src[k] -> dst[k]`` on ``stream``, whichever side of each pair is in host
        RAM: by the lean kernel on ``copy_blocks`` SMs a copy under ``copy_lean``, by one
        foreach launch otherwise and for what the kernel leaves (``copy_`` would issue one
        cudaMemcpy per tensor). Note [Optimizer state staging], "The copies' kernel"."""
        if self.copy_lean and dst:
            dst, src, done, failed = _um_copy.copy_pairs(
                device, dst, src, int(stream.cuda_stream), self.copy_blocks
            )
            if failed is not None:
                # The copier is dropped for the device (_um_copy.failures): foreach from
                # now on, even where a later configure() asks for lean again.
                self.copy_lean = False
                warnings.warn(
                    f"torch.cuda.um: {failed}; the optimizer state staging copies by "
                    "foreach from now on",
                    stacklevel=2,
                )
            if done:
                with self._lock:
                    self.stats["lean_copies"] += done
        if dst:
            with torch.cuda.stream(stream):
                torch._foreach_copy_(dst, src)

    @staticmethod
    def _stageable(t: object, device: torch.device) -> bool:
        return (
            isinstance(t, torch.Tensor)
            and type(t) is torch.Tensor
            and t.device == device
            and t.layout == torch.strided
            and t.is_contiguous()
            and t.untyped_storage().nbytes() >= MIN_BYTES
        )

    def _state_bytes(self, state: dict[str, Any], device: torch.device) -> int:
        return sum(t.nbytes for t in state.values() if self._stageable(t, device))

    def _run(
        self,
        opt: torch.optim.Optimizer,
        step: Callable[[torch.optim.Optimizer], Any],
        params: list[torch.Tensor],
        chunks: list[list[int]],
        device: torch.device,
    ) -> int:
        """The chunks' steps on the compute stream, each chunk's state brought in on one
        side stream while the chunk before is stepped and taken back out on another while
        the chunk after is (Note [Optimizer state staging])."""
        compute = torch.cuda.current_stream(device)
        index = device.index or 0
        into = side_stream(index, "stage-in")
        out = side_stream(index, "stage-out")
        group_of = {id(p): i for i, g in enumerate(opt.param_groups) for p in g["params"]}
        staged = 0

        def bring_in(chunk: list[int]) -> list[_Swap]:
            swaps = [
                _Swap(state, key, t)
                for state in (opt.state.get(params[i], {}) for i in chunk)
                for key, t in list(state.items())
                if self._stageable(t, device)
            ]
            wait_stream(into, compute)  # the buffers' blocks are done with earlier work
            self._copy(index, into, [s.buffer for s in swaps], [s.original for s in swaps])
            return swaps

        leaving: list[tuple[torch.cuda.Event, list[_Swap]]] = []  # copies out in flight
        try:
            coming = bring_in(chunks[0])
            for k, chunk in enumerate(chunks):
                swaps = coming
                wait_stream(compute, into)
                if len(leaving) == 2:  # the chunk two before: its buffers are free again
                    compute.wait_event(leaving.pop(0)[0])
                # launched before this chunk's step, so that the two overlap
                coming = bring_in(chunks[k + 1]) if k + 1 < len(chunks) else []
                members = [params[i] for i in chunk]
                for s in swaps:
                    s.state[s.key] = s.buffer
                    staged += s.original.nbytes
                for i, g in enumerate(opt.param_groups):
                    g["params"] = [p for p in members if group_of[id(p)] == i]
                try:
                    step(opt)
                finally:
                    # An entry the step replaced instead of updating keeps its new value.
                    back = [s for s in swaps if s.state.get(s.key) is s.buffer]
                    for s in back:
                        s.state[s.key] = s.original
                    wait_stream(out, compute)
                    self._copy(index, out, [s.original for s in back], [s.buffer for s in back])
                    copied = torch.cuda.Event()
                    copied.record(out)
                    leaving.append((copied, back))
        finally:
            # Whatever runs after the step reads the state written back; the buffers
            # still held (leaving, coming) are freed after these waits.
            wait_stream(compute, into)
            wait_stream(compute, out)
        return staged

    def counters(self) -> dict[str, int]:
        with self._lock:
            return {f"predict.optimizer_{k}": v for k, v in self.stats.items()}
