"""Reliability on the GPU: no memory growth under repeated graph capture, a 1000-step soak
with host and device memory flat, and a process that survives failing CUDA calls.

The failing calls come from an LD_PRELOAD shim (tests/gpu/fault/cudart_fault.c, built here
with the system C compiler) that wraps cudaMallocManaged, the prefetch, advise and discard
calls under their libcudart.so.13 symbol versions and fails them while armed.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.conftest import GiB, Limits, MiB, release_cache, rss_bytes, subprocess_env

torch = pytest.importorskip("torch")

HERE = Path(__file__).resolve().parent


def _device_used() -> int:
    free, total = torch.cuda.mem_get_info()
    return int(total - free)


def test_repeated_graph_capture_does_not_grow(torch_mod: Any, um: Any, limits: Limits) -> None:
    """4 x 100 x (capture torch.mm into a new CUDAGraph, replay it): device memory in use must
    stay within 0.1 GB of where it started (upstream's bound, test_cuda.py's
    test_repeat_graph_capture_cublas_workspace_memory), and managed segments within 0.1 GB.
    Before Note [Segments made during a capture are plain] (Engine.cpp) each capture's private
    pool took a managed segment, freed at the next capture, and device memory in use moved
    +40, +40, -88, +40 MiB over four batches of 100 on an H200
    (tests/gpu/results/inject-2.11.0-h200-2026-11-24.md); stock torch and UM off stay at 0."""
    a = torch.randn(1024, 512, device="cuda")
    b = torch.randn(512, 64, device="cuda")
    expected = a @ b

    plain: list[bool] = []
    s = torch.cuda.Stream()  # one warm-up stream: each new stream gets its own cuBLAS workspace

    def once() -> None:
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            torch.mm(a, b)  # warm cuBLAS outside the capture
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            out = torch.mm(a, b)
        g.replay()
        torch.cuda.synchronize()
        assert torch.allclose(out, expected)
        plain.append(not um.is_managed(out))
        del out, g

    for _ in range(5):  # cuBLAS handles and workspaces, the first pool
        once()
    torch.cuda.synchronize()
    stats0 = um.stats()
    used = [_device_used()]
    for _ in range(4):
        for _ in range(100):
            once()
        torch.cuda.synchronize()
        used.append(_device_used())
    stats1 = um.stats()
    out_is_plain = all(plain)
    batches = [after - before for before, after in itertools.pairwise(used)]
    highest = max(used[1:]) - used[0]
    managed_grown = stats1["um.total_managed_bytes"] - stats0["um.total_managed_bytes"]
    # Managed pages the engine placed on the device count as memory in use too: printed so
    # that a failure says whether growth is the engine's.
    placed_grown = stats1["um.device_placed_bytes"] - stats0["um.device_placed_bytes"]
    print(
        f"[um] 4 x 100 graph captures: device memory in use moved "
        f"{', '.join(f'{g / MiB:+.1f}' for g in batches)} MiB, managed segments "
        f"{managed_grown / MiB:.1f} MiB, placed on the device {placed_grown / MiB:.1f} MiB"
    )
    assert highest < 0.1e9, f"device memory in use rose {highest / 1e9:.3f} GB in 400 captures"
    assert managed_grown < 0.1e9, f"managed segments grew by {managed_grown / 1e9:.3f} GB"
    # Note [Segments made during a capture are plain]: the captures' pools are not managed.
    assert out_is_plain, "a segment made during a capture is managed memory"


def test_soak_1000_steps_memory_flat(torch_mod: Any, um: Any, limits: Limits) -> None:
    """1000 training steps past a small device budget: host RSS, device memory in use and the
    engine's managed bytes are flat after warm-up, and the engine really evicted."""
    release_cache(torch)
    um.configure(device_budget=64 * MiB, policy="lru", discard=True, hooks=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(8)]).cuda()  # 32 MiB
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)  # + grads and 64 MiB of state
    x = torch.randn(64, 1024, device="cuda")
    before = um.stats()
    samples: dict[int, tuple[int, int, int]] = {}
    for step in range(1, 1001):
        loss = model(x).square().mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step in (200, 1000):
            torch.cuda.synchronize()
            samples[step] = (rss_bytes(), _device_used(), um.stats()["um.total_managed_bytes"])
    assert torch.isfinite(loss).item()
    after = um.stats()
    (rss0, dev0, man0), (rss1, dev1, man1) = samples[200], samples[1000]
    evicted = after["um.evict_bytes"] - before["um.evict_bytes"]
    print(
        f"[um] soak 200 -> 1000 steps: host RSS {rss0 / MiB:.0f} -> {rss1 / MiB:.0f} MiB, "
        f"device in use {dev0 / MiB:.0f} -> {dev1 / MiB:.0f} MiB, managed {man0 / MiB:.0f} -> "
        f"{man1 / MiB:.0f} MiB, evicted {evicted / GiB:.1f} GiB"
    )
    assert evicted > GiB, "the soak did not run past its budget"
    assert rss1 - rss0 < 64 * MiB, f"host RSS grew {(rss1 - rss0) / MiB:.0f} MiB over 800 steps"
    assert dev1 - dev0 < 64 * MiB, (
        f"device memory grew {(dev1 - dev0) / MiB:.0f} MiB over 800 steps"
    )
    assert man1 == man0, f"managed segments changed {man0} -> {man1} over 800 steps"
    assert after["um.executor_failures"] == before["um.executor_failures"]


@pytest.fixture(scope="module")
def fault_shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cc = shutil.which(os.environ.get("CC", "cc")) or shutil.which("gcc")
    if cc is None:
        pytest.skip("needs a C compiler (cc or gcc) to build the fault-injection shim")
    out = tmp_path_factory.mktemp("fault") / "libcudart_fault.so"
    src = HERE / "fault"
    subprocess.run(
        [
            cc,
            "-O1",
            "-Wall",
            "-shared",
            "-fPIC",
            "-o",
            str(out),
            str(src / "cudart_fault.c"),
            f"-Wl,--version-script={src / 'cudart_fault.map'}",
            "-ldl",
        ],
        check=True,
    )
    return out


FAULT_CHILD = textwrap.dedent(
    """
    import ctypes, os, sys, warnings
    import torch
    um = torch.cuda.um
    shim = ctypes.CDLL(os.environ["UM_FAULT_SHIM"])
    MALLOC, PREFETCH, ADVISE, DISCARD = range(4)
    assert um.is_available() and um.injection_info()["interposed"] == 1

    def train(steps):
        torch.manual_seed(0)
        model = torch.nn.Sequential(*[torch.nn.Linear(512, 512) for _ in range(12)]).cuda()
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        x = torch.randn(32, 512, device="cuda")
        losses = []
        for _ in range(steps):
            loss = model(x).square().mean()
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            losses.append(float(loss))
        return losses

    um.configure(device_budget=24 << 20, policy="lru", discard=True, hooks=True)
    clean = train(30)
    torch.cuda.empty_cache()
    # Placement hints fail: the job goes on, with the same losses; failures are counted.
    failures = um.stats()["um.executor_failures"]
    for kind in (PREFETCH, ADVISE, DISCARD):
        shim.um_fault_arm(kind, 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        faulty = train(30)
    for kind in (PREFETCH, ADVISE, DISCARD):
        shim.um_fault_arm(kind, 0)
    failed = [shim.um_fault_count(k) for k in (PREFETCH, ADVISE, DISCARD)]
    assert sum(failed) > 0, f"no call was failed: {failed}"
    assert um.stats()["um.executor_failures"] > failures, um.stats()
    assert faulty == clean, (clean[-3:], faulty[-3:])
    print("hints failed", failed, "warnings", [str(w.message)[:80] for w in caught])
    # Allocation fails: a clear OutOfMemoryError, and the process allocates again after.
    torch.cuda.empty_cache()
    shim.um_fault_arm(MALLOC, 1)
    try:
        torch.empty(64 << 20, dtype=torch.uint8, device="cuda")
    except torch.OutOfMemoryError as e:
        print("OOM as expected:", str(e).splitlines()[0][:120])
    else:
        raise AssertionError("allocation succeeded with cudaMallocManaged failing")
    finally:
        shim.um_fault_arm(MALLOC, 0)
    assert shim.um_fault_count(MALLOC) > 0
    t = torch.full((64 << 20,), 3, dtype=torch.uint8, device="cuda")
    assert int(t.sum()) == 3 * (64 << 20)
    assert train(30) == clean
    print("FAULTS SURVIVED")
    """
)


def test_process_survives_failing_cuda_calls(
    torch_mod: Any, um: Any, limits: Limits, fault_shim: Path, tmp_path: Path
) -> None:
    release_cache(torch)
    script = tmp_path / "fault_child.py"
    script.write_text(FAULT_CHILD)
    env = subprocess_env(limits, UM_FAULT_SHIM=str(fault_shim))
    env["LD_PRELOAD"] = f"{fault_shim} {env.get('LD_PRELOAD', '')}".strip()
    proc = subprocess.run(
        [sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=240
    )
    print(proc.stdout[-3000:], proc.stderr[-3000:])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "FAULTS SURVIVED" in proc.stdout
