"""cuBLAS's workspaces past the budget: found once, then held on the device.

Note [Library workspaces]
torch gives cuBLAS one workspace per handle and stream (a handle per thread), taken
from the caching allocator at that pair's first GEMM and kept for the whole run. Every
GEMM on the pair writes and reads it, and no signal the engine sees names it: no block
event after its first, no module owns it. So once the residency policy evicts it (a
live block no touch names is the coldest there is), it stays in host RAM, read and
written in place (Note [Which bytes move, and how], Residency.h). Measured on the H200
with a Llama forward past a 2 GiB budget: every GEMM ran at 0.4x, 10 ms a forward more
with nothing moving; a GEMM on a fresh workspace, in the same process, ran at full
speed (bench/README.md, prediction step 39). Whether it was evicted depended on when
the hooks came on, so a benchmark's workers split between two speeds.

So while the hooks are on, the first hook a thread runs on a stream finds that pair's
workspace and holds it (``torch_um_touch`` with TORCH_UM_TOUCH_HOLD, Note [Held ranges]
in Residency.h): it comes back to the device if it was away, and stays there until a
block event over it. To find it, the hook runs GEMMs on 8x8 matrices, first through
cuBLAS (``torch.mm``), then through cuBLASLt (``addmm`` with a bias, which has a
workspace of its own unless torch shares cuBLAS's), and takes the blocks of a MiB or
more that appeared in the allocator's snapshot around each (the matrices are in its
small pool). If the cuBLAS GEMM made none, the workspace existed already: every
workspace is then freed (``torch._C._cuda_clearCublasWorkspaces``, stream-ordered as
any free) and the GEMMs made again, and the other pairs are looked at again at their
next hook, since their workspaces went too (they come back at their next GEMM, unheld).
On the H200 the cuBLAS workspace was 32 MiB and cuBLASLt's 1 MiB; a first version that
took "any new block" as the answer found only cuBLASLt's and held nothing that mattered.
Clears are few: a pair's first hook usually comes before its first GEMM of the step.
After ``max_clears`` of them, a pair that needs one is left alone. Each install of the
hooks looks at every pair again (a CUDA graph capture, for one, clears the workspaces).

Not done: before CUDA is initialised (a CPU forward: no GEMM has run); under CUDA graph
capture (the allocator's blocks then belong to the graph's pool, and clearing is not
allowed); when the held bytes would pass a sixteenth of the budget (a pair's two
workspaces are 33 MiB on the H200: budgets of 528 MiB and more). Held bytes are taken
from what everything else may use: under a 256 MiB budget the GPU suite's optimizer
staging found no room once a quarter was allowed. The cost after a pair is found is one
dict lookup per hook.

From torch 2.15 no workspace lasts: each GEMM takes one from the caching allocator for
that call and frees it when the call is queued (cuBLAS's of ``getChosenWorkspaceSize()``,
cuBLASLt's of its own size), unless the process starts with
``TORCH_CUBLAS_WORKSPACE_CACHE=1``, which brings the per-pair cache back. A per-call
workspace is an ordinary block, reused by the next GEMM and touched by it like any other,
so there is nothing to hold: ``persistent`` says which case a process is in, and without a
lasting workspace the finder does nothing (no probe GEMMs, no clears).

Thread safety: ``ensure`` runs on the thread whose workspace it finds (the forward's,
autograd's for the backward); the found pairs are behind a lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

MiB = 1 << 20
MIN_WORKSPACE = MiB  # the matrices of the probe live in the allocator's small pool

Block = tuple[int, int]  # (address, size)


def persistent(version: tuple[int, int], env: Mapping[str, str]) -> bool:
    """Whether torch ``version`` (major, minor) keeps each (handle, stream) pair's workspace
    for the run: always before 2.15; from 2.15 only with TORCH_CUBLAS_WORKSPACE_CACHE set
    true when the process started."""
    if version < (2, 15):
        return True
    return env.get("TORCH_CUBLAS_WORKSPACE_CACHE", "").strip().lower() in ("1", "true", "yes", "on")


def active_blocks(snapshot: Iterable[dict[str, Any]], device: int) -> set[Block]:
    """The allocated blocks of ``device`` in a ``torch.cuda.memory_snapshot()``."""
    out: set[Block] = set()
    for seg in snapshot:
        if seg.get("device") != device:
            continue
        for b in seg.get("blocks", ()):
            if b.get("state") == "active_allocated":
                out.add((int(b["address"]), int(b["size"])))
    return out


class Workspaces:
    """The pairs (thread, stream) whose workspaces were found, and the finding.

    ``key`` gives (thread, device, stream) for the calling thread, or None while CUDA
    is not initialised (no GEMM has run, and finding would initialise it); ``blocks(device)``
    the allocated blocks now; ``gemms`` the probe's GEMMs on the current stream, each a
    function of the device, cuBLAS's first (its workspace must be new, or there is a
    clear); ``clear()`` frees every workspace; ``hold(ptr, size, device)`` holds a range;
    ``capturing()`` says whether the current stream is capturing a graph; ``budget()``
    the device budget in bytes."""

    def __init__(
        self,
        *,
        key: Callable[[], tuple[int, int, int] | None],
        blocks: Callable[[int], set[Block]],
        gemms: Sequence[Callable[[int], None]],
        clear: Callable[[], None],
        hold: Callable[[int, int, int], None],
        capturing: Callable[[], bool],
        budget: Callable[[], int],
        max_clears: int = 4,
        persistent: bool = True,
    ) -> None:
        self._key, self._blocks, self._gemms, self._clear = key, blocks, list(gemms), clear
        self._hold, self._capturing, self._budget = hold, capturing, budget
        self.max_clears = max_clears
        self.persistent = persistent
        self._lock = threading.Lock()
        self._found: dict[tuple[int, int, int], list[Block]] = {}
        self.clears = 0
        self.held_bytes = 0  # of the pairs found now
        self.left_alone = 0  # pairs not held: over max_clears, or over the byte bound

    def ensure(self) -> None:
        """Called by every hook: finds and holds this pair's workspace the first time."""
        if not self.persistent:
            return
        key = self._key()
        if key is None or key in self._found:
            return
        with self._lock:
            if key in self._found or self._capturing():
                return
            self._find(key)

    def reset(self) -> None:
        """Look at every pair again at its next hook (the hooks were installed again)."""
        with self._lock:
            self._found.clear()
            self.held_bytes = 0

    def _new_blocks(self, device: int) -> tuple[list[Block], bool]:
        """The workspaces the probe's GEMMs made, and whether the first (cuBLAS) made one."""
        new: list[Block] = []
        first = False
        for i, gemm in enumerate(self._gemms):
            before = self._blocks(device)
            gemm(device)
            made = [b for b in self._blocks(device) - before if b[1] >= MIN_WORKSPACE]
            first = first or (i == 0 and bool(made))
            new += made
        return sorted(new), first

    def _find(self, key: tuple[int, int, int]) -> None:
        device = key[1]
        new, made = self._new_blocks(device)
        if not made:
            if self.clears >= self.max_clears:
                self._found[key] = []
                self.left_alone += 1
                return
            # It existed before: free them all and make this one again. The others
            # went too, so each is looked at again at its next hook.
            self._clear()
            self.clears += 1
            self._found.clear()
            self.held_bytes = 0
            new, made = self._new_blocks(device)
        size = sum(s for _, s in new)
        if not made or self.held_bytes + size > self._budget() // 16:
            self._found[key] = []
            self.left_alone += 1
            return
        for ptr, n in new:
            self._hold(ptr, n, device)
        self._found[key] = new
        self.held_bytes += size

    def held_blocks(self) -> list[Block]:
        """The blocks held now, of every pair found."""
        with self._lock:
            return sorted(b for blocks in self._found.values() for b in blocks)

    def counters(self) -> dict[str, int]:
        with self._lock:
            return {
                "workspaces_held": sum(1 for v in self._found.values() if v),
                "workspace_held_bytes": self.held_bytes,
                "workspace_clears": self.clears,
                "workspaces_left_alone": self.left_alone,
                "workspaces_per_call": 0 if self.persistent else 1,
            }
