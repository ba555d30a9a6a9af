"""Which CUDA call drops a read-only (ReadMostly) duplicate from the GPU and keeps the host
copy, and what each step costs (issue 8: evicting read-only data without a write-back).

    python -m bench.probes.readmostly_probe        # on the GPU host, any torch built for CUDA 13

Allocates 1 GiB ranges with cudaMallocManaged directly (not through the engine: the driver's
own behaviour is measured), one at a time, asserting they stay far under 80 % of free GPU
memory. Per drop route it prints the milliseconds of: SetReadMostly on host-resident pages,
the prefetch that makes the GPU duplicate, a GPU read of the duplicate, the drop, a GPU read
after it (slow when the GPU copy is gone), and whether the data is intact. Whether a range is
on the GPU is read from the time of a full GPU read (HBM: under 1 ms per GiB).
"""

from __future__ import annotations

import ctypes
import functools
import json
import time
from collections.abc import Callable
from typing import Any

import torch

GiB = 1 << 30
SIZE = GiB
READ_MOSTLY, UNSET_READ_MOSTLY, PREFERRED_LOCATION = 1, 2, 3


class Location(ctypes.Structure):  # struct cudaMemLocation (CUDA 13)
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


GPU, HOST = Location(1, 0), Location(2, 0)


class Array:
    """A CUDA float32 view of a raw pointer (__cuda_array_interface__, no copy)."""

    def __init__(self, ptr: int, n: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (n,),
            "typestr": "<f4",
            "data": (ptr, False),
            "version": 3,
        }


class Runtime:
    def __init__(self) -> None:
        rt = ctypes.CDLL("libcudart.so.13")
        rt.cudaMallocManaged.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_size_t,
            ctypes.c_uint,
        ]
        rt.cudaMemAdvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, Location]
        rt.cudaMemPrefetchAsync.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            Location,
            ctypes.c_uint,
            ctypes.c_void_p,
        ]
        rt.cudaFree.argtypes = [ctypes.c_void_p]
        self.rt = rt

    def check(self, err: int, what: str) -> None:
        if err != 0:
            raise RuntimeError(f"{what}: CUDA error {err}")

    def managed(self) -> tuple[int, Any]:
        """A 1 GiB managed range filled with 1.0 on the GPU, and its tensor view."""
        p = ctypes.c_void_p()
        self.check(self.rt.cudaMallocManaged(ctypes.byref(p), SIZE, 1), "cudaMallocManaged")
        assert p.value is not None
        t = torch.as_tensor(Array(p.value, SIZE // 4), device="cuda")
        t.fill_(1.0)
        torch.cuda.synchronize()
        return p.value, t

    def advise(self, ptr: int, advice: int, where: Location) -> None:
        self.check(self.rt.cudaMemAdvise(ptr, SIZE, advice, where), f"cudaMemAdvise {advice}")

    def prefetch(self, ptr: int, where: Location) -> None:
        self.check(self.rt.cudaMemPrefetchAsync(ptr, SIZE, where, 0, None), "prefetch")

    def free(self, ptr: int) -> None:
        self.check(self.rt.cudaFree(ptr), "cudaFree")


def ms(fn: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return round((time.perf_counter() - t0) * 1e3, 2)


def routes(cu: Runtime) -> dict[str, Callable[[int], None]]:
    def unset(p: int) -> None:
        cu.advise(p, UNSET_READ_MOSTLY, GPU)

    def preferred_host(p: int) -> None:
        cu.advise(p, PREFERRED_LOCATION, HOST)

    def prefetch_host(p: int) -> None:
        cu.prefetch(p, HOST)

    def preferred_then_prefetch(p: int) -> None:
        preferred_host(p)
        prefetch_host(p)

    def preferred_then_unset(p: int) -> None:
        preferred_host(p)
        unset(p)

    return {
        "unset_read_mostly": unset,
        "preferred_host": preferred_host,
        "prefetch_host_rm": prefetch_host,
        "preferred_host_then_prefetch_host": preferred_then_prefetch,
        "unset_rm_preferred_host_first": preferred_then_unset,
    }


def main() -> int:
    torch.cuda.init()
    free, _ = torch.cuda.mem_get_info()
    assert 2 * SIZE < 0.8 * free, "not enough free GPU memory for the safety rule"
    cu = Runtime()
    out: dict[str, Any] = {}
    # Baseline: eviction by prefetch of GPU-resident pages, a GPU read, a bring-in.
    p, t = cu.managed()
    out["evict_plain_ms"] = ms(lambda: cu.prefetch(p, HOST))
    out["read_after_evict_ms"] = ms(t.sum)
    out["prefetch_in_ms"] = ms(lambda: cu.prefetch(p, GPU))
    out["read_resident_ms"] = ms(t.sum)
    del t
    cu.free(p)
    for name, drop in routes(cu).items():
        p, t = cu.managed()
        cu.prefetch(p, HOST)  # the usual start: the data in host RAM only
        torch.cuda.synchronize()
        r: dict[str, Any] = {}
        r["set_rm_ms"] = ms(functools.partial(cu.advise, p, READ_MOSTLY, GPU))
        r["dup_in_ms"] = ms(functools.partial(cu.prefetch, p, GPU))  # the GPU duplicate
        r["read_dup_ms"] = ms(t.sum)
        r["drop_ms"] = ms(functools.partial(drop, p))
        r["read_after_drop_ms"] = ms(t.sum)  # slow when the GPU copy is gone
        r["sum_ok"] = float(t.sum()) == float(SIZE // 4)
        r["again_in_ms"] = ms(functools.partial(cu.prefetch, p, GPU))
        r["read_again_ms"] = ms(t.sum)
        out[name] = r
        del t
        cu.free(p)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
