"""The operator use signal and the learned lookahead on a GPU (Notes [Operator use
signals] in OpSignal.h, [Learned lookahead] in Lookahead.h): a program of plain tensors (no
module, no torch.optim) trained past a tiny device budget gives the losses it gives in
memory, bit for bit, while the observer reports its operators' inputs and, from the second
step, brings the predicted ones in ahead; a program that fits never installs it.

Every test runs under the suite's cap (max_managed <= 80 % of free memory at start) with a
device budget of a few hundred MiB: oversubscription is against the budget only.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.gpu.conftest import Limits, MiB, release_cache

torch = pytest.importorskip("torch")

from bench import classes  # noqa: E402

BUDGET = 256 * MiB
WIDTH = 2048
LAYERS = 12  # 8 MiB a weight, 8 MiB its momentum, 16 MiB an activation: ~560 MiB at peak


def _plain_losses(steps: int, pause: float = 0.0, state: list[Any] | None = None) -> list[float]:
    """bench.classes' plain-tensor training, smaller: (x @ W).relu() through LAYERS weights,
    a momentum update by hand. ``pause``: seconds after the first step, for the pressure
    watcher (10 polls a second) to install the observer. ``state``, if given, receives CPU
    copies of the weights and momenta after the last step (the GPU tensors are freed on
    return)."""
    ws, ms = classes.plain_params(torch, LAYERS, WIDTH, seed=7)
    losses = []
    for step in range(steps):
        x = classes.batch(torch, 4096, step, WIDTH)
        losses.append(classes.plain_step(torch, ws, ms, x, lr=1e-2))
        if step == 0 and pause:
            time.sleep(pause)
    if state is not None:
        state.extend(t.cpu() for t in ws + ms)
    return losses


@pytest.mark.parametrize(("lookahead", "warm_first"), [("0", False), ("64MiB", False), ("0", True)])
def test_plain_tensors_past_the_budget_are_bit_exact_with_the_signal(
    torch_mod: Any, um: Any, limits: Limits, lookahead: str, warm_first: bool
) -> None:
    """The learned order, with the lookahead or without, and with the warm chunks first
    (evict_warm_first, Note [First evictions]): the losses of the run in memory."""
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    release_cache(torch)
    um.configure(device_budget="90%")
    before = um.stats()
    in_memory = _plain_losses(5, pause=0.3)
    fits = um.stats()
    # Everything fits: the observer is never installed.
    assert fits["um.op_signal_installs"] == before["um.op_signal_installs"]
    release_cache(torch)
    um.configure(
        device_budget=BUDGET,
        policy="lru",
        discard=True,
        op_signal=True,
        op_lookahead=lookahead,
        evict_warm_first=warm_first,
    )
    under = _plain_losses(5, pause=0.5)
    after = um.stats()
    calls = after["um.op_calls"] - fits["um.op_calls"]
    brought = after["um.op_touch_bytes"] - fits["um.op_touch_bytes"]
    ahead = after["um.op_ahead_bytes"] - fits["um.op_ahead_bytes"]
    matches = after["um.op_matches"] - fits["um.op_matches"]
    planned = after["um.plan_bytes"] - fits["um.plan_bytes"]
    by_plan = after["um.plan_victim_bytes"] - fits["um.plan_victim_bytes"]
    print(
        f"[um] plain losses in memory {in_memory}\n[um] under the budget {under}\n"
        f"[um] op signal: {calls} operators, {brought / MiB:.0f} MiB brought before them, "
        f"{ahead / MiB:.0f} MiB ahead, {matches} matches, {planned / MiB:.0f} MiB planned, "
        f"{by_plan / MiB:.0f} MiB left by the learned order, "
        f"{(after['um.evict_first_bytes'] - fits['um.evict_first_bytes']) / MiB:.0f} MiB "
        f"first evictions, "
        f"{(after['um.op_signal_ns'] - fits['um.op_signal_ns']) / 1e6:.1f} ms host time"
    )
    assert after["um.op_signal_installs"] > fits["um.op_signal_installs"]
    assert calls > 0 and matches > 0
    assert brought + ahead > 0
    # Note [The learned eviction order]: from the second step the uses are filed under
    # their predicted next use, and room past the budget is made by that order.
    assert planned > 0 and by_plan > 0
    if lookahead == "0":
        assert ahead == 0
    assert under == in_memory


def test_the_signal_off_leaves_the_observer_out(torch_mod: Any, um: Any, limits: Limits) -> None:
    release_cache(torch)
    um.configure(device_budget=BUDGET, policy="lru", op_signal=False)
    before = um.stats()
    _plain_losses(3, pause=0.3)
    after = um.stats()
    assert after["um.op_signal_installs"] == before["um.op_signal_installs"]
    assert after["um.op_calls"] == before["um.op_calls"]


def test_plain_tensors_offload_their_saves_with_predict_programs(
    torch_mod: Any, um: Any, limits: Limits
) -> None:
    """predict_programs (Note [A program's forward between two backwards],
    torch/cuda/_um_program.py): from the second step the plain program's forward runs under
    the offload's saved-tensor hooks, begun and ended by its backward calls; saves leave by
    copy, and the losses are those of the run in memory, bit for bit."""
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    release_cache(torch)
    um.configure(device_budget="90%")
    in_memory = _plain_losses(5, pause=0.3)
    release_cache(torch)
    um.configure(device_budget=BUDGET, policy="lru", op_signal=True, predict_programs=True)
    before = um.predict_stats()
    under = _plain_losses(5, pause=0.5)
    got = um.predict_stats()
    print(f"[um] plain losses in memory {in_memory}\n[um] under the budget {under}\n[um] {got}")
    assert got.get("predict.program_forwards", 0) > before.get("predict.program_forwards", 0)
    assert got.get("predict.offloaded_bytes", 0) > before.get("predict.offloaded_bytes", 0)
    assert under == in_memory


def test_state_one_burst_writes_is_staged_by_copy_bit_exact(
    torch_mod: Any, um: Any, limits: Limits
) -> None:
    """op_stage (Note [State one burst a period writes is staged by copy], Stage.h): the
    hand-written update's momenta, read and written by three operators in a row once a
    step, are staged on a block for the update and copied back into host RAM after it,
    under their storages. The losses, weights and momenta are those of the run in memory,
    bit for bit; every staged storage is put back or freed with it, and none failed."""
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
    release_cache(torch)
    um.configure(device_budget="90%")
    state0: list[Any] = []
    in_memory = _plain_losses(8, pause=0.3, state=state0)
    release_cache(torch)
    um.configure(device_budget=BUDGET, policy="lru", op_signal=True, op_stage=True)
    before = um.stats()
    state1: list[Any] = []
    under = _plain_losses(8, pause=0.5, state=state1)
    after = um.stats()
    got = {
        k: after[f"um.stage_{k}"] - before[f"um.stage_{k}"]
        for k in (
            "ins",
            "in_bytes",
            "outs",
            "out_bytes",
            "dropped",
            "failures",
            "candidates",
            "not_on_host",
        )
    }
    print(f"[um] plain losses in memory {in_memory}\n[um] staged {under}\n[um] {got}")
    assert got["ins"] > 0 and got["in_bytes"] >= got["ins"] * 2 * MiB
    # Each staged storage was put back at its burst's end, or (a storage still on its
    # block when the loop ended: its end was not predicted) freed with its storage; the
    # weights and momenta read back below were read wherever they were.
    assert got["outs"] > 0 and got["outs"] + got["dropped"] == got["ins"]
    assert got["failures"] == 0
    assert under == in_memory
    assert len(state1) == 2 * LAYERS
    for a, b in zip(state0, state1, strict=True):
        assert torch.equal(a, b)


class _Squares(torch.utils.data.Dataset):  # type: ignore[misc]
    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> Any:
        return torch.tensor([float(i * i)])


def test_dataloader_workers_start_after_saves_came_back_ahead(
    torch_mod: Any, um: Any, limits: Limits
) -> None:
    """Note [One event a thread for stream waits] (torch/cuda/_um_streams.py): the offload's
    copies back ahead wait on autograd's device thread; a fork after them (a DataLoader
    starting its workers, pin_memory too) must not destroy CUDA objects of that thread in
    the child. Step 58's suite: the workers died with "CUDA error: initialization error"
    when this ran after a test that offloaded saves."""
    release_cache(torch)
    um.configure(device_budget=BUDGET, policy="lru", op_signal=True, predict_programs=True)
    before = um.predict_stats()
    _plain_losses(5, pause=0.5)
    got = um.predict_stats()
    assert got.get("predict.ahead_bytes", 0) > before.get("predict.ahead_bytes", 0), got
    release_cache(torch)
    loader = torch.utils.data.DataLoader(_Squares(), batch_size=16, num_workers=2, pin_memory=True)
    seen = sorted(int(v) for batch in loader for v in batch.flatten().tolist())
    assert seen == [i * i for i in range(64)]
