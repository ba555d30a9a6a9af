"""How fast page-locked host buffers are made, by torch's routes (Note [Host buffers made
ahead] in torch/cuda/_um_predict.py: the saved-activation offload's buffers). Stock torch
is enough; nothing here is managed memory.

    python -m bench.probes.pinned_alloc_probe [--gib 4] [--buffer-mib 8] [--json FILE]

For each route (torch's ``cudaHostAlloc``, the default; ``pinned_use_cuda_host_register``
with 8 or 16 threads: ``malloc``, pages touched by those threads, then
``cudaHostRegister``) and each count of threads asking at once (1, 4), a fresh process
makes ``--gib`` GiB of page-locked buffers of ``--buffer-mib`` MiB with
``torch.empty(pin_memory=True)`` and prints GB/s; then checks that every buffer is
page-locked and that one copies to the GPU and back intact, frees them all and makes them
again (from torch's host allocator cache: what a later forward pays).
Step 46 measured the default at about 1.6 GB/s from one thread and 2 from four.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from typing import Any

from bench.common import (
    BenchError,
    command_line,
    emit,
    machine,
    run_main,
    run_worker_safely,
)

GiB = 1 << 30
MiB = 1 << 20
# route -> PYTORCH_CUDA_ALLOC_CONF of the worker ("" : torch's default, cudaHostAlloc)
ROUTES = {
    "cudaHostAlloc": "",
    "hostRegister x8": "pinned_use_cuda_host_register:True,pinned_num_register_threads:8",
    "hostRegister x16": "pinned_use_cuda_host_register:True,pinned_num_register_threads:16",
}
THREADS = (1, 4)


def make(torch: Any, sizes: list[int], threads: int) -> tuple[list[Any], float]:
    """``sizes`` page-locked buffers made by ``threads`` threads at once; their seconds."""
    held: list[list[Any]] = [[] for _ in range(threads)]
    errors: list[BaseException] = []

    def part(k: int) -> None:
        try:
            for n in sizes[k::threads]:
                held[k].append(torch.empty(n, dtype=torch.uint8, pin_memory=True))
        except BaseException as e:  # reported by the caller
            errors.append(e)

    t0 = time.perf_counter()
    workers = [threading.Thread(target=part, args=(k,)) for k in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    seconds = time.perf_counter() - t0
    if errors:
        raise BenchError(f"making page-locked buffers failed: {errors[0]}")
    return [b for part_ in held for b in part_], seconds


def worker(conf: str, threads: int, total: int, buffer: int) -> dict[str, Any]:
    if conf:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf
    else:
        os.environ.pop("PYTORCH_CUDA_ALLOC_CONF", None)
    import torch

    if not torch.cuda.is_available():
        raise BenchError("no CUDA device: this probe runs on the GPU host")
    torch.zeros(1, device="cuda")  # the context first: not the first buffer's cost
    sizes = [buffer] * (total // buffer)
    bufs, first = make(torch, sizes, threads)
    pinned = all(b.is_pinned() for b in bufs)
    probe = bufs[-1]
    probe.copy_(torch.arange(probe.numel(), dtype=torch.int64).to(torch.uint8))
    back = probe.to("cuda", non_blocking=True).cpu()
    intact = bool(torch.equal(back, probe))
    del bufs, probe, back
    _again_bufs, again = make(torch, sizes, threads)  # from the host allocator's cache
    made = len(sizes) * buffer
    return {
        "bytes": made,
        "first_s": first,
        "first_gbps": made / first / 1e9,
        "again_s": again,
        "pinned": pinned,
        "intact": intact,
        "machine": machine(torch),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--conf", default="", help=argparse.SUPPRESS)
    ap.add_argument("--threads", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--gib", type=float, default=4.0, help="GiB of buffers per case")
    ap.add_argument("--buffer-mib", type=int, default=8, help="MiB of each buffer")
    ap.add_argument("--timeout", type=int, default=300, help="seconds per case")
    ap.add_argument("--json", default=None, help="also write the record to this file")
    a = ap.parse_args(argv)
    if a.gib <= 0 or a.buffer_mib <= 0 or a.gib * GiB < a.buffer_mib * MiB:
        raise BenchError("--gib and --buffer-mib must be positive, --gib at least one buffer")
    total, buffer = int(a.gib * GiB), a.buffer_mib * MiB
    if a.worker:
        emit(worker(a.conf, a.threads, total, buffer))
        return 0
    rows: list[dict[str, Any]] = []
    host: dict[str, Any] | None = None
    for route, conf in ROUTES.items():
        for threads in THREADS:
            args = ["--conf", conf, "--threads", str(threads), "--gib", str(a.gib)]
            args += ["--buffer-mib", str(a.buffer_mib)]
            base = {"route": route, "conf": conf, "threads": threads}
            row = run_worker_safely("bench.probes.pinned_alloc_probe", args, None, a.timeout, base)
            host = host or row.pop("machine", None)
            row.pop("machine", None)
            rows.append(row)
            if "error" in row:
                print(f"{route:17s} x{threads}  error: {row['error'].splitlines()[-1]}")
            else:
                print(
                    f"{route:17s} x{threads}  {row['first_gbps']:5.1f} GB/s first, "
                    f"again {row['again_s'] * 1e3:7.1f} ms, pinned={row['pinned']} "
                    f"intact={row['intact']}",
                    flush=True,
                )
    if a.json:
        record = {"command": command_line("bench.probes.pinned_alloc_probe"), "machine": host}
        with open(a.json, "w") as f:
            json.dump({**record, "buffer_bytes": buffer, "rows": rows}, f, indent=1)
    return 1 if any("error" in r or not (r["pinned"] and r["intact"]) for r in rows) else 0


if __name__ == "__main__":
    run_main("pinned_alloc_probe", main)
