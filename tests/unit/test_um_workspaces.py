"""Finding and holding cuBLAS's workspaces (torch/cuda/_um_workspaces.py, Note [Library
workspaces]) against a simulated cuBLAS: per (thread, device, stream) a cuBLAS workspace
(32 MiB) and a cuBLASLt one (1 MiB), each made at that pair's first GEMM of its kind, all
freed by a clear. A workspace made before the first hook is found by one clear, also
when only cuBLASLt's is new (as on the H200); the pairs that clear freed are found again
at their next hook; clears are bounded; nothing is done under capture or past the byte
bound."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .helpers import load_overlay_module

MiB = 1 << 20
ws = load_overlay_module("torch/cuda/_um_workspaces.py", "um_workspaces_under_test")

Key = tuple[int, int, int]


@dataclass
class FakeCublas:
    """The allocator's blocks, cuBLAS's workspaces, and the calls the finder made."""

    size: int = 32 * MiB
    lt_size: int = 1 * MiB
    key: Key = (1, 0, 7)
    cuda_ready: bool = True  # False: CUDA not initialised, the finder's key is None
    blocks: set[tuple[int, int]] = field(default_factory=set)
    workspaces: dict[Key, tuple[int, int]] = field(default_factory=dict)
    lt_workspaces: dict[Key, tuple[int, int]] = field(default_factory=dict)
    next_addr: int = 1 << 32
    held: list[tuple[int, int, int]] = field(default_factory=list)
    gemms: int = 0
    capturing: bool = False

    def alloc(self, size: int) -> tuple[int, int]:
        b = (self.next_addr, size)
        self.next_addr += size
        self.blocks.add(b)
        return b

    def gemm(self, device: int) -> None:
        """A cuBLAS GEMM on the current pair: its workspace, if new, and a small output."""
        self.gemms += 1
        if self.key not in self.workspaces:
            self.workspaces[self.key] = self.alloc(self.size)
        self.alloc(256)

    def gemm_lt(self, device: int) -> None:
        """The same through cuBLASLt, which has a workspace of its own."""
        self.gemms += 1
        if self.key not in self.lt_workspaces:
            self.lt_workspaces[self.key] = self.alloc(self.lt_size)
        self.alloc(256)

    def clear(self) -> None:
        for b in [*self.workspaces.values(), *self.lt_workspaces.values()]:
            self.blocks.discard(b)
        self.workspaces.clear()
        self.lt_workspaces.clear()

    def both(self, key: Key) -> list[tuple[int, int, int]]:
        return sorted([(*self.workspaces[key], 0), (*self.lt_workspaces[key], 0)])

    def finder(self, budget: int = 8 << 30, max_clears: int = 4, persistent: bool = True) -> Any:
        return ws.Workspaces(
            key=lambda: self.key if self.cuda_ready else None,
            blocks=lambda device: set(self.blocks),
            gemms=(self.gemm, self.gemm_lt),
            clear=self.clear,
            hold=lambda ptr, size, device: self.held.append((ptr, size, device)),
            capturing=lambda: self.capturing,
            budget=lambda: budget,
            max_clears=max_clears,
            persistent=persistent,
        )


def test_a_workspace_not_made_yet_is_found_without_a_clear_and_held_once() -> None:
    cu = FakeCublas()
    f = cu.finder()
    f.ensure()
    assert sorted(cu.held) == cu.both(cu.key)
    assert f.counters() == {"workspaces_held": 1, "workspace_held_bytes": 33 * MiB,
                            "workspace_clears": 0, "workspaces_left_alone": 0,
                            "workspaces_per_call": 0}
    gemms = cu.gemms
    f.ensure()  # found: a lookup, no GEMM, no second hold
    assert cu.gemms == gemms and len(cu.held) == 2


def test_a_workspace_made_before_the_hooks_is_found_by_one_clear() -> None:
    cu = FakeCublas()
    cu.gemm(0)  # the forward before the hooks came on
    old = cu.workspaces[cu.key]
    f = cu.finder()
    f.ensure()
    new = cu.workspaces[cu.key]
    assert new != old and old not in cu.blocks
    assert sorted(cu.held) == cu.both(cu.key)
    assert f.counters()["workspace_clears"] == 1
    assert f.held_blocks() == [(p, n) for p, n, _ in cu.both(cu.key)]  # the new ones only


def test_a_new_cublaslt_workspace_alone_does_not_stop_the_clear() -> None:
    """The H200's case: the forward before the hooks used cuBLAS only, so the probe's
    cuBLASLt GEMM makes a workspace while cuBLAS's, the one that matters, exists."""
    cu = FakeCublas()
    cu.gemm(0)
    old = cu.workspaces[cu.key]
    f = cu.finder()
    f.ensure()
    assert f.counters()["workspace_clears"] == 1
    assert (*old, 0) not in cu.held
    assert sorted(cu.held) == cu.both(cu.key)


def test_a_clear_for_one_pair_makes_the_others_found_again() -> None:
    cu = FakeCublas()
    f = cu.finder()
    f.ensure()  # the forward's thread: found, no clear
    forward = cu.key
    cu.key = (2, 0, 7)  # autograd's thread, whose workspace exists at its first hook
    cu.gemm(0)
    f.ensure()
    assert f.counters()["workspace_clears"] == 1
    assert forward not in cu.workspaces  # freed by the clear
    cu.key = forward
    f.ensure()  # its next hook, before its next GEMM: found again without a clear
    assert f.counters() == {"workspaces_held": 2, "workspace_held_bytes": 66 * MiB,
                            "workspace_clears": 1, "workspaces_left_alone": 0,
                            "workspaces_per_call": 0}
    assert sorted(cu.held[-4:]) == sorted(cu.both((2, 0, 7)) + cu.both(forward))


def test_clears_are_bounded() -> None:
    cu = FakeCublas()
    f = cu.finder(max_clears=1)
    cu.gemm(0)
    f.ensure()
    cu.key = (2, 0, 7)
    cu.gemm(0)
    f.ensure()  # would need a second clear: left alone
    c = f.counters()
    assert c["workspace_clears"] == 1 and c["workspaces_left_alone"] == 1
    assert (2, 0, 7) in cu.workspaces and len(cu.held) == 2


def test_nothing_under_capture_and_found_after_it() -> None:
    cu = FakeCublas(capturing=True)
    f = cu.finder()
    f.ensure()
    assert cu.gemms == 0 and cu.held == []
    cu.capturing = False
    f.ensure()
    assert len(cu.held) == 2


def test_reset_looks_again_with_one_clear() -> None:
    cu = FakeCublas()
    f = cu.finder()
    f.ensure()
    f.reset()  # the hooks came on again
    f.ensure()
    assert f.counters()["workspace_clears"] == 1 and f.counters()["workspaces_held"] == 1
    assert sorted(cu.held[-2:]) == cu.both(cu.key)


def test_no_hold_past_a_sixteenth_of_the_budget() -> None:
    cu = FakeCublas()
    f = cu.finder(budget=512 * MiB)  # a sixteenth is 32 MiB, the workspaces 33
    f.ensure()
    assert cu.held == []
    assert f.counters()["workspaces_left_alone"] == 1


def test_active_blocks_reads_a_memory_snapshot() -> None:
    snapshot = [
        {"device": 0, "blocks": [{"address": 10, "size": 4, "state": "active_allocated"},
                                 {"address": 14, "size": 4, "state": "inactive"}]},
        {"device": 1, "blocks": [{"address": 99, "size": 4, "state": "active_allocated"}]},
    ]
    assert ws.active_blocks(snapshot, 0) == {(10, 4)}
    assert ws.active_blocks(snapshot, 1) == {(99, 4)}


def test_nothing_before_cuda_is_initialised() -> None:
    """A CPU forward with the hooks on: the key is None, and nothing runs."""
    cu = FakeCublas(cuda_ready=False)
    f = cu.finder()
    f.ensure()
    assert cu.gemms == 0 and cu.held == [] and f.counters()["workspaces_held"] == 0


def test_torch_2_15_keeps_no_workspace_unless_told_and_the_finder_stands_aside() -> None:
    assert ws.persistent((2, 14), {})
    assert not ws.persistent((2, 15), {})
    assert not ws.persistent((3, 0), {"TORCH_CUBLAS_WORKSPACE_CACHE": "0"})
    assert ws.persistent((2, 15), {"TORCH_CUBLAS_WORKSPACE_CACHE": "1"})
    assert ws.persistent((2, 16), {"TORCH_CUBLAS_WORKSPACE_CACHE": "True"})
    cu = FakeCublas()
    f = cu.finder(persistent=False)
    f.ensure()
    assert cu.gemms == 0 and cu.held == []  # no probe GEMM, no clear, nothing held
    assert f.counters()["workspaces_per_call"] == 1
    assert f.counters()["workspace_clears"] == 0
