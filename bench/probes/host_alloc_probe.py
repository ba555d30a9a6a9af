"""What managed host memory costs the CPU side (Note [Managed host memory]): the numbers
behind host_alloc's default. One process, +um torch, on the GPU host:

    python -m bench.probes.host_alloc_probe [--gib 1]

Prints one JSON line: first-touch write and read bandwidth of a CPU tensor in ordinary and
in managed host memory, the time to allocate and free a 4 MiB tensor each way, what a
fork()ed child sees when it reads its parent's managed tensor, and move_ against .cuda().
The managed-memory cap is 80 % of the GPU's free memory (bench.common.safe_cap).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from bench.common import safe_cap, um_module


def _timed(fn: Any) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def _fork_read(torch: Any, x: Any) -> str:
    """Sum x in a fork()ed child; how the child ended."""
    want = float(x[:1024].sum())
    pid = os.fork()
    if pid == 0:  # the child: no CUDA here, only a CPU read
        try:
            ok = float(x[:1024].sum()) == want
            os._exit(0 if ok else 3)
        except BaseException:
            os._exit(4)
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    code = os.WEXITSTATUS(status)
    return {0: "read the same data", 3: "read different data", 4: "raised"}.get(code, str(code))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.0)
    args = ap.parse_args(argv)
    import torch

    um = um_module(torch, "um")
    torch.cuda.init()
    free, _total, cap = safe_cap(torch)
    um.configure(max_managed=cap)
    n = int(args.gib * (1 << 30)) // 4
    out: dict[str, Any] = {"bytes": n * 4, "cap": cap, "free_at_start": free}
    gb = n * 4 / 1e9
    for kind in ("plain", "managed"):
        scope = um.managed_host() if kind == "managed" else _Null()
        with scope:
            x = torch.empty(n)
        assert um.is_managed(x) == (kind == "managed")
        out[f"{kind}_first_write_gbs"] = gb / _timed(lambda x=x: x.fill_(1.0))
        out[f"{kind}_write_gbs"] = gb / _timed(lambda x=x: x.fill_(2.0))
        out[f"{kind}_read_gbs"] = gb / _timed(lambda x=x: x.sum())
        if kind == "managed":
            out["fork_child_read"] = _fork_read(torch, x)
        del x

        def churn(scope: Any = scope) -> None:
            for _ in range(50):
                with scope:
                    t = torch.empty((4 << 20) // 4)
                t[0] = 1.0
                del t

        torch.ones(1, device="cuda").add_(1)  # GPU work queued while freeing
        out[f"{kind}_alloc_free_4mib_us"] = _timed(churn) / 50 * 1e6
    with um.managed_host():
        x = torch.ones(n)
    y = torch.ones(n)
    torch.cuda.synchronize()
    t_move = _timed(lambda: (um.move_(x, "cuda"), float(x.sum()), torch.cuda.synchronize()))
    t_copy = _timed(lambda: (float(y.cuda().sum()), torch.cuda.synchronize()))
    out.update(move_then_sum_s=t_move, cuda_copy_then_sum_s=t_copy, moved_is_cuda=x.is_cuda)
    print(json.dumps(out))
    return 0


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    raise SystemExit(main())
