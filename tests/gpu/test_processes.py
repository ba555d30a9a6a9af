"""Processes: DataLoader workers, CUDA IPC refusal, UM off per process, preload."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.gpu.conftest import Limits, run_child, subprocess_env

torch = pytest.importorskip("torch")

IPC_HINT = "PYTORCH_CUDA_UM_CONF=enabled:False"


class _Regression(torch.utils.data.Dataset):  # type: ignore[misc]
    def __init__(self, n: int = 4096) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 64, generator=g)
        self.w = torch.randn(64, 1, generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[Any, Any]:
        x = self.x[i]
        return x, x @ self.w


def test_dataloader_workers_pin_memory(torch_mod: Any, um: Any, limits: Limits) -> None:
    loader = torch.utils.data.DataLoader(
        _Regression(), batch_size=128, shuffle=True, num_workers=2, pin_memory=True
    )
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 1).cuda()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    first = last = None
    for _epoch in range(3):
        for xb, yb in loader:
            assert xb.is_pinned() and yb.is_pinned()
            xb, yb = xb.cuda(non_blocking=True), yb.cuda(non_blocking=True)
            loss = torch.nn.functional.mse_loss(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            first = float(loss) if first is None else first
            last = float(loss)
    assert um.is_managed(model.weight)
    assert first is not None and last is not None and last < 0.05 * first, (first, last)


def test_sharing_managed_cuda_tensor_fails_clearly(torch_mod: Any, um: Any, limits: Limits) -> None:
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing

    t = torch.ones(1024, device="cuda")
    assert um.is_managed(t)
    with pytest.raises(RuntimeError, match=IPC_HINT):
        ForkingPickler.dumps(t)
    # The process keeps working, and with UM off new tensors share as stock.
    assert float(t.sum()) == 1024
    del t  # its managed segment must not host the next block
    um.configure(enabled=False)
    torch.cuda.empty_cache()
    plain = torch.ones(1024, device="cuda")
    assert not um.is_managed(plain)
    assert len(ForkingPickler.dumps(plain)) > 0


def _run_child(code: str, env: dict[str, str], timeout: int = 180) -> str:
    proc = run_child(code, env, timeout)
    return proc.stdout + proc.stderr


def test_ipc_refused_in_cpp_too(torch_mod: Any, um: Any, limits: Limits) -> None:
    # Straight at the storage's C++ export, in a fresh process: the interposed
    # cudaIpcGetMemHandle refuses with the engine's c10::Error, which surfaces as
    # RuntimeError (no crash), and the refusal is counted.
    _run_child(
        f"""
        import torch
        t = torch.ones(1024, device="cuda")
        assert torch.cuda.um.is_managed(t)
        try:
            torch._C.StorageBase._share_cuda_(t.untyped_storage())
        except RuntimeError as e:
            assert {IPC_HINT!r} in str(e), str(e)
            refusals = torch.cuda.um.injection_info()["ipc_refusals"]
            assert refusals == 1, refusals
            print("REFUSED", refusals)
        else:
            raise SystemExit("managed storage was exported through CUDA IPC")
        assert float(t.sum()) == 1024
        """,
        subprocess_env(limits),
    )


def test_um_off_per_process_is_stock(torch_mod: Any, um: Any, limits: Limits) -> None:
    out = _run_child(
        """
        import torch
        from multiprocessing.reduction import ForkingPickler
        import torch.multiprocessing
        t = torch.ones(1 << 20, device="cuda")
        assert torch.cuda.um.is_enabled() is False
        assert not torch.cuda.um.is_managed(t)
        assert torch.cuda.um.stats()["um.managed_bytes"] == 0
        assert len(ForkingPickler.dumps(t)) > 0
        print("STOCK", torch.cuda.memory_reserved())
        """,
        subprocess_env(limits, PYTORCH_CUDA_UM_CONF="enabled:False"),
    )
    assert "STOCK" in out


def test_bad_config_is_reported(torch_mod: Any, um: Any, limits: Limits) -> None:
    out = _run_child(
        """
        import torch
        try:
            torch.ones(16, device="cuda")
        except RuntimeError as e:
            print("ERROR", e)
        """,
        subprocess_env(limits, PYTORCH_CUDA_UM_CONF="device_budget:lots"),
    )
    assert "ERROR" in out and "device_budget" in out


def test_preload_into_stock_torch(torch_mod: Any, um: Any, limits: Limits) -> None:
    lib = os.environ.get("TORCH_UM_PRELOAD_LIB")
    stock_path = os.environ.get("TORCH_UM_STOCK_PYTHONPATH")
    if not lib or stock_path is None:
        pytest.skip("set by tests/gpu/run_on_device.sh (TORCH_UM_PRELOAD_LIB)")
    env = subprocess_env(limits)
    env["PYTHONPATH"] = stock_path
    # The documented route (docs/injection.md): torch/lib and the CUDA runtime
    # of the stock install on the library path, the engine preloaded.
    find = (
        "import importlib.util,os;print(os.path.dirname(importlib.util.find_spec('torch').origin))"
    )
    torch_dir = subprocess.run(
        [sys.executable, "-c", find], env=env, capture_output=True, text=True, check=True
    ).stdout.strip()
    torch_lib = os.path.join(torch_dir, "lib")
    env["LD_LIBRARY_PATH"] = f"{torch_lib}:{torch_lib}/../../nvidia/cu13/lib"
    env["LD_PRELOAD"] = lib
    out = _run_child(
        """
        import ctypes, torch
        assert not hasattr(torch.cuda, "um"), "expected a stock torch"
        g = ctypes.CDLL(None)
        t = torch.ones(1 << 20, device="cuda")
        assert g.torch_um_is_managed(ctypes.c_void_p(t.data_ptr())) == 1
        y = (t * 2).sum()
        assert float(y) == 2 * (1 << 20)
        print("PRELOADED", torch.__file__)
        """,
        env,
    )
    assert "PRELOADED" in out


def test_pressure_watcher_is_stopped_before_the_interpreter_finalises(
    torch_mod: Any, um: Any, limits: Limits
) -> None:
    # Note [The pressure watcher stops before the interpreter finalises] (um.py): a daemon
    # thread still running torch code then ends the process with std::terminate (exit
    # status 134). The child's own atexit check is registered before torch is imported, so
    # it runs after torch.cuda.um's (atexit is last in, first out), and reports whether
    # the watcher is still alive at that point.
    out = _run_child(
        """
        import atexit, threading
        NAME = "torch.cuda.um pressure watch"
        def alive():
            return any(t.name == NAME and t.is_alive() for t in threading.enumerate())
        atexit.register(lambda: print("WATCHER ALIVE AT EXIT", alive(), flush=True))
        import torch
        t = torch.ones(1 << 20, device="cuda")
        torch.cuda.synchronize()
        assert torch.cuda.um.is_managed(t)
        print("WATCHER RUNNING", alive(), flush=True)
        """,
        subprocess_env(limits),
    )
    assert "WATCHER RUNNING True" in out  # the check is meaningful: it ran
    assert "WATCHER ALIVE AT EXIT False" in out


def test_ledger_trace_replays_to_the_engines_counters(
    torch_mod: Any, um: Any, limits: Limits, tmp_path: Path
) -> None:
    """Note [Ledger traces]: a process past a small budget records its ledger's calls
    (TORCH_UM_LEDGER_TRACE), and bench/probes/ledger_replay.cpp, built here, replays the file to
    the very bytes the engine counted: discarded, placed again, evicted, brought back."""
    from tests.unit.helpers import ROOT, build_engine_test

    um_src = ROOT / "c10_overlay" / "c10" / "cuda" / "um"
    exe = build_engine_test(
        tmp_path / "ledger_replay",
        [
            ROOT / "bench" / "probes" / "ledger_replay.cpp",
            um_src / "Residency.cpp",
            um_src / "LedgerTrace.cpp",
        ],
        "-O2",
    )
    keys = ("discard_bytes", "reuse_bytes", "evict_bytes", "touch_prefetch_bytes")
    out = _run_child(
        f"""
        import json, os, random
        import torch
        um = torch.cuda.um
        um.configure(device_budget=256 << 20, policy="lru", discard=True)
        rng = random.Random(0)
        live = []
        for step in range(300):
            if live and rng.random() < 0.45:
                live.pop(rng.randrange(len(live)))
            else:
                n = rng.choice([1 << 18, 3 << 20, 9 << 20, 24 << 20])
                live.append(torch.full((n,), 1.0, device="cuda"))
            if step % 25 == 0:
                for t in live:
                    torch.cuda.um.prefetch(t)  # a use signal: brings evicted data back
                    t.add_(1.0)
        torch.cuda.synchronize()
        s = um.stats()
        print("STATS", os.getpid(), json.dumps({{k: int(s["um." + k]) for k in {keys!r}}}))
        """,
        subprocess_env(limits, TORCH_UM_LEDGER_TRACE=str(tmp_path / "trace")),
    )
    line = next(x for x in out.splitlines() if x.startswith("STATS "))
    _, pid, text = line.split(" ", 2)
    stats = json.loads(text)
    assert stats["evict_bytes"] > 0 and stats["discard_bytes"] > 0, stats  # past the budget
    traces = list(tmp_path.glob("trace.*"))
    assert [p.name for p in traces] == [f"trace.{pid}"]
    done = subprocess.run(
        [str(exe), str(traces[0]), "--from", "0"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stdout + done.stderr
    replayed = json.loads(done.stdout.splitlines()[0])
    assert replayed["order"] == "lru"
    assert {k: replayed[k] for k in keys} == stats


_ROUTE_CHILD = """
import torch

def mapping(ptr):
    # the /proc/self/maps line holding ptr: cudaHostAlloc's pages are a file mapping the
    # driver makes (/dev/zero on the H200 host), malloc's (the registration route's)
    # anonymous memory
    with open("/proc/self/maps") as f:
        for line in f:
            lo, hi = (int(x, 16) for x in line.split()[0].split("-"))
            if lo <= ptr < hi:
                return line.split()[5] if len(line.split()) > 5 else "(anonymous)"
    return "(none)"

torch.ones(1, device="cuda")
before = torch.empty(64 << 20, dtype=torch.uint8, pin_memory=True)
on = torch.cuda.um._prefer_registration()
after = torch.empty(96 << 20, dtype=torch.uint8, pin_memory=True)  # not from the cache
after.fill_(7)
back = after.cuda().add_(1).cpu()
assert after.is_pinned() and before.is_pinned()
assert bool((back == 8).all())
print("ON", on)
print("BEFORE", mapping(before.data_ptr()))
print("AFTER", mapping(after.data_ptr()))
del before, after
torch._C._host_emptyCache()  # each buffer freed by the route that made it
print("FREED")
"""


def _route_lines(out: str) -> dict[str, str]:
    return {
        line.split(" ", 1)[0]: line.split(" ", 1)[1]
        for line in out.splitlines()
        if line.split(" ", 1)[0] in ("ON", "BEFORE", "AFTER") and " " in line
    }


def test_page_locked_buffers_by_registration(torch_mod: Any, um: Any, limits: Limits) -> None:
    """Note [Page-locked buffers by registration] (torch/cuda/_um_pinned.py): once the
    offload starts, torch's new page-locked buffers are malloc'd memory registered with
    the driver (anonymous pages), those made before stay the driver's (a /dev/zero
    mapping on the H200 host, measured in step 47), and emptying the
    host cache frees each by its own route; a program's own route setting stands."""
    if torch.torch_version.TorchVersion(torch.__version__) < (2, 8):
        pytest.skip("the route is switched on from torch 2.8 only (pytorch#146520)")
    got = _route_lines(_run_child(_ROUTE_CHILD, subprocess_env(limits)))
    assert got["ON"] == "True"
    assert got["BEFORE"] != "(anonymous)" and got["AFTER"] == "(anonymous)", got
    kept = _route_lines(
        _run_child(
            _ROUTE_CHILD,
            subprocess_env(limits, PYTORCH_CUDA_ALLOC_CONF="pinned_use_cuda_host_register:False"),
        )
    )
    assert kept["ON"] == "False"
    assert kept["AFTER"] == kept["BEFORE"] != "(anonymous)", kept
