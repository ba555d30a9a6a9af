"""Does eviction by prefetch to the CPU scale with the number of host threads issuing it,
and how does it depend on the size of the ranges in one batch call? (issue 8: training
past the budget is bound by the evictor, design notes §9.)

    python -m bench.probes.evict_threads_probe [--gib 4] [--repeat 2]

Allocates --gib of managed memory with cudaMallocManaged directly (asserted under 80 % of
free GPU memory), in 8 equal ranges resident on the GPU, and evicts them all to host RAM
with cudaMemPrefetchAsync issued by 1, 2, 4 and 8 threads (each its own stream, ranges
dealt round-robin), bringing them back to the GPU between trials; then evicts the same bytes
from one thread as one cudaMemPrefetchBatchAsync call of ranges of 2 MiB (the engine's
chunk), 64 MiB and 512 MiB. Prints GB/s per trial as one JSON line.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import threading
import time

import torch

from bench.probes.readmostly_probe import GPU, HOST, Array, Location, Runtime

RANGES = 8


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args(argv)
    torch.cuda.init()
    free, _ = torch.cuda.mem_get_info()
    total = int(a.gib * (1 << 30)) // RANGES // (2 << 20) * (2 << 20) * RANGES
    assert total < 0.8 * free, "more than 80 % of free GPU memory"
    rt = Runtime().rt  # libcudart with its signatures bound
    size = total // RANGES
    ptrs: list[int] = []
    for _ in range(RANGES):
        p = ctypes.c_void_p()
        assert rt.cudaMallocManaged(ctypes.byref(p), size, 1) == 0
        assert p.value is not None
        ptrs.append(p.value)
    streams = [torch.cuda.Stream() for _ in range(RANGES)]

    def to_gpu() -> None:
        for ptr in ptrs:
            assert rt.cudaMemPrefetchAsync(ptr, size, GPU, 0, None) == 0
        torch.cuda.synchronize()

    def evict(threads: int) -> float:
        def work(k: int) -> None:
            s = ctypes.c_void_p(streams[k].cuda_stream)
            for ptr in ptrs[k::threads]:
                assert rt.cudaMemPrefetchAsync(ptr, size, HOST, 0, s) == 0
            streams[k].synchronize()

        pool = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for t in pool:
            t.start()
        for t in pool:
            t.join()
        torch.cuda.synchronize()
        return total / (time.perf_counter() - t0) / 1e9

    # First touch on the GPU populates device pages; the first eviction populates host
    # pages: one untimed round trip so that every trial starts from the same page state.
    for ptr in ptrs:
        torch.as_tensor(Array(ptr, size // 4), device="cuda").fill_(1.0)
    evict(1)
    out: dict[str, list[float]] = {}
    for _ in range(a.repeat):
        for threads in (1, 2, 4, 8):
            to_gpu()
            out.setdefault(str(threads), []).append(round(evict(threads), 2))
    rt.cudaMemPrefetchBatchAsync.argtypes = [
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.c_size_t,
        ctypes.POINTER(Location),
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.c_size_t,
        ctypes.c_ulonglong,
        ctypes.c_void_p,
    ]

    def evict_batch(piece: int) -> float:
        starts = [p + off for p in ptrs for off in range(0, size, piece)]
        n = len(starts)
        arr_p = (ctypes.c_void_p * n)(*starts)
        arr_s = (ctypes.c_size_t * n)(*([piece] * n))
        loc = (Location * 1)(HOST)
        first = (ctypes.c_size_t * 1)(0)
        s = ctypes.c_void_p(streams[0].cuda_stream)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        err = rt.cudaMemPrefetchBatchAsync(arr_p, arr_s, n, loc, first, 1, 0, s)
        assert err == 0, f"cudaMemPrefetchBatchAsync: {err}"
        torch.cuda.synchronize()
        return total / (time.perf_counter() - t0) / 1e9

    by_range: dict[str, list[float]] = {}
    for _ in range(a.repeat):
        for piece in (2 << 20, 64 << 20, 512 << 20):
            if size % piece == 0:
                to_gpu()
                by_range.setdefault(f"{piece >> 20}MiB", []).append(round(evict_batch(piece), 2))
    for ptr in ptrs:
        rt.cudaFree(ptr)
    print(json.dumps({"bytes": total, "evict_gbs_by_threads": out, "evict_gbs_by_range": by_range}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
