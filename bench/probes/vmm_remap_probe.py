"""Can data leave the GPU at the link's speed and stay readable at its address? (step 54)

Eviction by ``cudaMemPrefetchAsync`` to the CPU runs at 9-14 GB/s, and a ReadMostly host
duplicate is no faster (docs/notes/step-54-learned-eviction.md); copies by the GPU run at
about 52 GB/s but leave a managed range's own pages without the data. With the CUDA driver's
virtual memory management the address and the memory behind it are separate: a chunk can be
copied into host-located physical memory (``cuMemCreate`` with a host location) by the copy
engine, and that memory then mapped at the chunk's own address in place of the device
memory, so that a kernel the engine did not foresee still reads the right bytes, over the
link. This probe measures, for RANGE bytes in granules of ``--granule-mib`` (2 MiB by
default), without the engine:

- the copy device -> host-located memory by the copy engine (``cuMemcpyAsync``) and by
  kernels (a tensor copy), in GB/s;
- the remap of each granule (unmap the device memory, map the host memory, set access), in
  microseconds a granule;
- that a kernel reading the address afterwards sees the data (a sum), and how fast it reads
  in place;
- the way back (copy to device memory mapped elsewhere, remap);
- whether the remaps wait for a kernel on another stream that touches none of this memory
  (step 55: remapping granule by granule would bound eviction at about 15 GB/s; this and
  ``--granule-mib`` say whether larger allocations or remaps beside the GPU's work do better:
  from 32 MiB a remap costs less than the copy, step 56);
- eviction as an engine would run it: each granule copied while the one before is remapped,
  alone and beside 40 products of 8192 x 8192 bf16 matrices on another stream, with the
  products' own time beside it (do remaps slow the GPU's work?);
- what a remap is made of (unmap, map, set access, each a granule), whether one unmap and
  one access call over many granules cost less than one each (the ledger's chunks are 2 MiB,
  and a mapping is always a whole physical allocation), and whether remaps from four threads
  run side by side.

Run on the GPU host (the stock torch finds the CUDA libraries and launches the kernels):

    python3 bench/probes/vmm_remap_probe.py [MiB] [--granule-mib 2] [--json FILE]

It allocates MiB (default 1024) of device memory and as much host-located memory, plus a
temporary of MiB and a 128 MiB matrix, and refuses to run if three times MiB is more than
80 % of the free GPU memory. No managed memory.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import time
from collections.abc import Callable
from typing import Any

MiB = 1 << 20
GRANULE = 2 * MiB
LOC_DEVICE, LOC_HOST, LOC_HOST_NUMA = 1, 2, 3  # CUmemLocationType
ALLOC_PINNED = 1  # CU_MEM_ALLOCATION_TYPE_PINNED
ACCESS_RW = 3  # CU_MEM_ACCESS_FLAGS_PROT_READWRITE


class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class AllocFlags(ctypes.Structure):
    _fields_ = [
        ("compressionType", ctypes.c_ubyte),
        ("gpuDirectRDMACapable", ctypes.c_ubyte),
        ("usage", ctypes.c_ushort),
        ("reserved", ctypes.c_ubyte * 4),
    ]


class AllocationProp(ctypes.Structure):
    """``CUmemAllocationProp``."""

    _fields_ = [
        ("type", ctypes.c_int),
        ("requestedHandleTypes", ctypes.c_int),
        ("location", Location),
        ("win32HandleMetaData", ctypes.c_void_p),
        ("allocFlags", AllocFlags),
    ]


class AccessDesc(ctypes.Structure):
    """``CUmemAccessDesc``."""

    _fields_ = [("location", Location), ("flags", ctypes.c_int)]


class Driver:
    """The driver calls the probe needs, each checked; ``granule`` bytes a physical
    allocation (a multiple of 2 MiB)."""

    def __init__(self, device: int, granule: int = GRANULE) -> None:
        self.cu = ctypes.CDLL("libcuda.so.1")
        self.device = device
        self.granule = granule
        u64, size = ctypes.c_uint64, ctypes.c_size_t
        self.cu.cuMemCreate.argtypes = [
            ctypes.POINTER(u64),
            size,
            ctypes.POINTER(AllocationProp),
            u64,
        ]
        self.cu.cuMemAddressReserve.argtypes = [ctypes.POINTER(u64), size, size, u64, u64]
        self.cu.cuMemMap.argtypes = [u64, size, size, u64, u64]
        self.cu.cuMemUnmap.argtypes = [u64, size]
        self.cu.cuMemSetAccess.argtypes = [u64, size, ctypes.POINTER(AccessDesc), size]
        self.cu.cuMemRelease.argtypes = [u64]
        self.cu.cuMemAddressFree.argtypes = [u64, size]
        self.cu.cuMemcpyAsync.argtypes = [u64, u64, size, ctypes.c_void_p]
        self.cu.cuStreamSynchronize.argtypes = [ctypes.c_void_p]
        self.cu.cuCtxGetCurrent.argtypes = [ctypes.POINTER(ctypes.c_void_p)]
        self.cu.cuCtxSetCurrent.argtypes = [ctypes.c_void_p]

    def check(self, err: int, what: str) -> None:
        if err != 0:
            text = ctypes.c_char_p()
            self.cu.cuGetErrorString(err, ctypes.byref(text))
            raise RuntimeError(f"{what}: {(text.value or b'?').decode()} ({err})")

    def prop(self, host: int) -> AllocationProp:
        """Device memory (host 0), or host-located memory by CU_MEM_LOCATION_TYPE_HOST (1)
        or HOST_NUMA node 0 (2)."""
        p = AllocationProp()
        p.type = ALLOC_PINNED
        p.location = (
            Location(LOC_DEVICE, self.device)
            if host == 0
            else Location(LOC_HOST if host == 1 else LOC_HOST_NUMA, 0)
        )
        return p

    def create(self, prop: AllocationProp) -> int:
        h = ctypes.c_uint64()
        self.check(
            self.cu.cuMemCreate(ctypes.byref(h), self.granule, ctypes.byref(prop), 0),
            "cuMemCreate",
        )
        return h.value

    def reserve(self, nbytes: int) -> int:
        p = ctypes.c_uint64()
        self.check(
            self.cu.cuMemAddressReserve(ctypes.byref(p), nbytes, self.granule, 0, 0),
            "cuMemAddressReserve",
        )
        return p.value

    def map(self, va: int, handle: int) -> None:
        self.map_only(va, handle)
        self.access(va, self.granule)

    def map_only(self, va: int, handle: int) -> None:
        self.check(self.cu.cuMemMap(va, self.granule, 0, handle, 0), "cuMemMap")

    def access(self, va: int, nbytes: int) -> None:
        """Read and write access for the device over [va, va + nbytes), one call."""
        desc = AccessDesc(Location(LOC_DEVICE, self.device), ACCESS_RW)
        self.check(self.cu.cuMemSetAccess(va, nbytes, ctypes.byref(desc), 1), "cuMemSetAccess")

    def current_context(self) -> int:
        ctx = ctypes.c_void_p()
        self.check(self.cu.cuCtxGetCurrent(ctypes.byref(ctx)), "cuCtxGetCurrent")
        return ctx.value or 0

    def make_current(self, ctx: int) -> None:
        self.check(self.cu.cuCtxSetCurrent(ctypes.c_void_p(ctx)), "cuCtxSetCurrent")

    def unmap(self, va: int) -> None:
        self.check(self.cu.cuMemUnmap(va, self.granule), "cuMemUnmap")

    def copy(self, dst: int, src: int, nbytes: int, stream: int) -> None:
        self.check(
            self.cu.cuMemcpyAsync(dst, src, nbytes, ctypes.c_void_p(stream)), "cuMemcpyAsync"
        )


class View:
    """A float32 tensor over raw device-visible memory (``__cuda_array_interface__``)."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {
            "shape": (nbytes // 4,),
            "typestr": "<f4",
            "data": (ptr, False),
            "version": 3,
            "strides": None,
            "stream": None,
        }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("mib", nargs="?", type=int, default=1024)
    ap.add_argument(
        "--granule-mib",
        type=int,
        default=GRANULE // MiB,
        help="MiB a physical allocation, mapped and remapped as one (a multiple of 2)",
    )
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    if args.granule_mib < 2 or args.granule_mib % 2:
        raise SystemExit(f"--granule-mib {args.granule_mib}: a multiple of 2 MiB is needed")
    granule = args.granule_mib * MiB
    import torch

    n = args.mib * MiB - (args.mib * MiB) % granule
    free, _total = torch.cuda.mem_get_info()
    if 3 * n > 0.8 * free:  # the device memory, the way back's, and one temporary
        raise SystemExit(f"{3 * n / MiB:.0f} MiB of device memory is more than 80 % of free")
    torch.cuda.init()
    torch.empty(1, device="cuda")  # the primary context, current on this thread
    cu = Driver(torch.cuda.current_device(), granule)
    stream = torch.cuda.current_stream().cuda_stream
    chunks = n // granule
    rows: dict[str, Any] = {"bytes": n, "granule bytes": granule}

    def timed(fn: Callable[[], object]) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t0

    host_kind = 0
    for kind in (1, 2):
        try:
            cu.cu.cuMemRelease(cu.create(cu.prop(kind)))
            host_kind = kind
            break
        except RuntimeError as e:
            rows[f"host location {kind}"] = str(e)
    if host_kind == 0:
        print(json.dumps(rows, indent=1))
        print("no host-located physical memory on this driver")
        return 1
    rows["host location"] = "HOST" if host_kind == 1 else "HOST_NUMA 0"
    t0 = time.perf_counter()
    dev = [cu.create(cu.prop(0)) for _ in range(chunks)]
    host = [cu.create(cu.prop(host_kind)) for _ in range(chunks)]
    rows["create us a granule (device and host)"] = (time.perf_counter() - t0) / (2 * chunks) * 1e6
    va, host_va, back_va = cu.reserve(n), cu.reserve(n), cu.reserve(n)
    try:
        for i in range(chunks):
            cu.map(va + i * granule, dev[i])
            cu.map(host_va + i * granule, host[i])
        data = torch.as_tensor(View(va, n), device="cuda")
        data.copy_(torch.arange(data.numel(), device="cuda", dtype=torch.float32).remainder_(977))
        expect = float(data.sum(dtype=torch.float64))
        shadow = torch.as_tensor(View(host_va, n), device="cuda")
        rows["copy engine device -> host-located GB/s"] = (
            n / timed(lambda: cu.copy(host_va, va, n, stream)) / 1e9
        )
        rows["kernel copy device -> host-located GB/s"] = (
            n / timed(lambda: shadow.copy_(data)) / 1e9
        )

        def remap_to_host() -> None:
            for i in range(chunks):
                cu.unmap(va + i * granule)
                cu.map(va + i * granule, host[i])

        rows["remap to host us a granule"] = timed(remap_to_host) / chunks * 1e6
        got = float(data.sum(dtype=torch.float64))
        rows["a kernel reads the remapped address right"] = got == expect
        rows["kernel read in place GB/s"] = n / timed(lambda: data.sum()) / 1e9
        # The way back: device memory mapped at a third address, copied, remapped.
        for i in range(chunks):
            cu.map(back_va + i * granule, dev[i])
        rows["copy engine host-located -> device GB/s"] = (
            n / timed(lambda: cu.copy(back_va, va, n, stream)) / 1e9
        )

        def remap_to_device() -> None:
            for i in range(chunks):
                cu.unmap(va + i * granule)
                cu.map(va + i * granule, dev[i])

        rows["remap to device us a granule"] = timed(remap_to_device) / chunks * 1e6
        rows["a kernel reads the address right after the way back"] = (
            float(data.sum(dtype=torch.float64)) == expect
        )
        # Does a remap wait for the GPU? The same remaps while a kernel that touches none
        # of this memory spins for about 50 ms on another stream: host time of the remaps.
        side = torch.cuda.Stream()
        cycles = int(1e8)
        with torch.cuda.stream(side):
            spin_s = timed(lambda: torch.cuda._sleep(cycles))
        rows["other stream's kernel ms"] = spin_s * 1e3
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            torch.cuda._sleep(cycles)
        t0 = time.perf_counter()
        remap_to_host()
        busy_s = time.perf_counter() - t0
        torch.cuda.synchronize()
        rows["remap to host while another stream's kernel runs, us a granule"] = (
            busy_s / chunks * 1e6
        )
        rows["remaps waited for the other stream's kernel"] = busy_s > 0.5 * spin_s
        remap_to_device()
        rows["a kernel reads the address right after both"] = (
            float(data.sum(dtype=torch.float64)) == expect
        )
        torch.cuda.synchronize()

        # Eviction as an engine would run it (step 56): granule i copied by the copy
        # engine while granule i-1, whose copy is done, is remapped by this thread; alone,
        # and beside a stream of matrix products (a step's compute) on another stream.
        def pipelined() -> None:
            done: list[Any] = []
            for i in range(chunks):
                cu.copy(host_va + i * granule, va + i * granule, granule, stream)
                ev = torch.cuda.Event()
                ev.record()
                done.append(ev)
                if i > 0:
                    done[i - 1].synchronize()
                    cu.unmap(va + (i - 1) * granule)
                    cu.map(va + (i - 1) * granule, host[i - 1])
            done[-1].synchronize()
            cu.unmap(va + (chunks - 1) * granule)
            cu.map(va + (chunks - 1) * granule, host[chunks - 1])

        rows["pipelined eviction (copy + remap) GB/s"] = n / timed(pipelined) / 1e9
        rows["a kernel reads the address right after the pipeline"] = (
            float(data.sum(dtype=torch.float64)) == expect
        )
        remap_to_device()
        mat = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)

        def products() -> None:
            for _ in range(40):
                mat @ mat

        with torch.cuda.stream(side):
            products()  # warm
            alone_s = timed(products)
        rows["matrix products alone ms"] = alone_s * 1e3
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        with torch.cuda.stream(side):
            start.record()
            products()
            end.record()
        t0 = time.perf_counter()
        pipelined()
        evict_s = time.perf_counter() - t0
        torch.cuda.synchronize()
        rows["matrix products beside the pipelined eviction ms"] = start.elapsed_time(end)
        rows["pipelined eviction beside the products GB/s"] = n / evict_s / 1e9
        rows["a kernel reads the address right after the pipeline beside products"] = (
            float(data.sum(dtype=torch.float64)) == expect
        )
        remap_to_device()
        torch.cuda.synchronize()

        # What a remap's time is made of, and whether it batches or spreads: each part
        # granule by granule, then one unmap and one access call over the whole range, then
        # the remaps split over four threads (ctypes lets go of the GIL in each call).
        def each(fn: Callable[[int], None]) -> float:
            t0 = time.perf_counter()
            for i in range(chunks):
                fn(i)
            return float((time.perf_counter() - t0) / chunks * 1e6)

        torch.cuda.synchronize()
        rows["unmap us a granule"] = each(lambda i: cu.unmap(va + i * granule))
        rows["map us a granule"] = each(lambda i: cu.map_only(va + i * granule, host[i]))
        rows["set access us a granule"] = each(lambda i: cu.access(va + i * granule, granule))
        rows["a kernel reads the address right after the parts"] = (
            float(data.sum(dtype=torch.float64)) == expect
        )
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        whole = cu.cu.cuMemUnmap(va, n)
        rows["one unmap over every granule us a granule"] = (
            (time.perf_counter() - t0) / chunks * 1e6 if whole == 0 else f"refused ({whole})"
        )
        if whole != 0:
            each(lambda i: cu.unmap(va + i * granule))
        each(lambda i: cu.map_only(va + i * granule, dev[i]))
        t0 = time.perf_counter()
        cu.access(va, n)
        rows["one access call over every granule us a granule"] = (
            (time.perf_counter() - t0) / chunks * 1e6
        )
        rows["a kernel reads the address right after the batched calls"] = (
            float(data.sum(dtype=torch.float64)) == expect
        )
        import threading

        ctx = cu.current_context()
        failures: list[str] = []

        def remap_part(k: int, threads: int) -> None:
            try:
                cu.make_current(ctx)
                for i in range(k, chunks, threads):
                    cu.unmap(va + i * granule)
                    cu.map(va + i * granule, host[i])
            except RuntimeError as e:
                failures.append(str(e))

        torch.cuda.synchronize()
        workers = [threading.Thread(target=remap_part, args=(k, 4)) for k in range(4)]
        t0 = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        rows["remap to host from 4 threads us a granule"] = (
            (time.perf_counter() - t0) / chunks * 1e6 if not failures else failures[0]
        )
        rows["a kernel reads the address right after the threads' remaps"] = (
            not failures and float(data.sum(dtype=torch.float64)) == expect
        )
        remap_to_device()
        torch.cuda.synchronize()
    finally:
        for base in (va, host_va, back_va):
            for i in range(chunks):
                cu.cu.cuMemUnmap(base + i * granule, granule)  # unmapped ones fail: fine
            cu.cu.cuMemAddressFree(base, n)
        for h in (*dev, *host):
            cu.cu.cuMemRelease(h)
    for k, v in rows.items():
        print(f"{k:52s} {v:.1f}" if isinstance(v, float) else f"{k:52s} {v}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    ok = all(v for k, v in rows.items() if k.startswith("a kernel reads the address right"))
    ok = ok and rows["a kernel reads the remapped address right"]
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
