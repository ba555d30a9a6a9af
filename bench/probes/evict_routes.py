"""Measure the routes that take managed memory off the GPU, straight through libcudart.

The engine's eviction is bound by `cudaMemPrefetchAsync` to the CPU (design notes, section 9:
3-16 GB/s, with the host time spent on the calling thread). This probe asks the two questions
the residency policy depends on, without the engine in the way:

- does eviction scale with the number of host threads issuing it (one stream each)?
- what does it cost to drop a read-only duplicate (ReadMostly) instead of writing pages back?

Run on the GPU host (plain libcudart, no +um torch needed; torch only finds the library):

    python3 bench/probes/evict_routes.py [GiB] [--json FILE]

It allocates two ranges of GiB (default 4) with cudaMallocManaged and refuses to run if that
is more than 80 % of the free GPU memory. Prints one line per route in GB/s.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import glob
import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator

GiB = 1 << 30
HOST, DEVICE = 2, 1  # cudaMemLocationType
READ_MOSTLY, UNSET_READ_MOSTLY, PREFERRED, ACCESSED_BY = 1, 2, 3, 5  # cudaMemoryAdvise


class Location(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("id", ctypes.c_int)]


class CopyAttributes(ctypes.Structure):
    """``cudaMemcpyAttributes`` (CUDA 13), for ``cudaMemcpyBatchAsync``."""

    _fields_ = [
        ("srcAccessOrder", ctypes.c_int),
        ("srcLocHint", Location),
        ("dstLocHint", Location),
        ("flags", ctypes.c_uint),
    ]


ORDER_STREAM = 1  # cudaMemcpySrcAccessOrderStream
PREFER_OVERLAP = 1  # cudaMemcpyFlagPreferOverlapWithCompute


def load_cudart() -> ctypes.CDLL:
    import torch  # noqa: F401  (loads the wheel's CUDA libraries)

    roots = [os.path.dirname(p) for p in sys.path if p]
    for root in roots:
        for lib in glob.glob(os.path.join(root, "nvidia", "cu13", "lib", "libcudart.so.13")):
            return ctypes.CDLL(lib)
    return ctypes.CDLL("libcudart.so.13")


class Cuda:
    def __init__(self) -> None:
        self.rt = load_cudart()
        self.rt.cudaMemPrefetchAsync.argtypes = [
            ctypes.c_void_p,
            ctypes.c_size_t,
            Location,
            ctypes.c_uint,
            ctypes.c_void_p,
        ]
        self.rt.cudaMemAdvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, Location]
        self.rt.cudaMemset.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t]
        self.rt.cudaFree.argtypes = [ctypes.c_void_p]
        self.rt.cudaMemcpy.argtypes = [
            ctypes.c_void_p,
            ctypes.c_void_p,
            ctypes.c_size_t,
            ctypes.c_int,
        ]

    def check(self, err: int, what: str) -> None:
        if err != 0:
            self.rt.cudaGetErrorString.restype = ctypes.c_char_p
            raise RuntimeError(f"{what}: {self.rt.cudaGetErrorString(err).decode()}")

    def managed(self, nbytes: int) -> int:
        p = ctypes.c_void_p()
        self.check(
            self.rt.cudaMallocManaged(ctypes.byref(p), ctypes.c_size_t(nbytes), 1),
            "cudaMallocManaged",
        )
        assert p.value is not None
        return p.value

    @contextlib.contextmanager
    def fresh(self, nbytes: int) -> Iterator[int]:
        """A new managed range of nbytes, freed on leaving (after the device is idle)."""
        ptr = self.managed(nbytes)
        try:
            yield ptr
        finally:
            self.sync()
            self.check(self.rt.cudaFree(ptr), "cudaFree")

    def stream(self) -> int:
        s = ctypes.c_void_p()
        self.check(self.rt.cudaStreamCreateWithFlags(ctypes.byref(s), 1), "cudaStreamCreate")
        assert s.value is not None
        return s.value

    def prefetch(self, ptr: int, n: int, where: int, stream: int = 0) -> None:
        loc = Location(where, 0)
        self.check(self.rt.cudaMemPrefetchAsync(ptr, n, loc, 0, stream), "cudaMemPrefetchAsync")

    def advise(self, ptr: int, n: int, advice: int, where: int = DEVICE) -> None:
        self.check(self.rt.cudaMemAdvise(ptr, n, advice, Location(where, 0)), "cudaMemAdvise")

    def advise_host(self, ptr: int, n: int) -> None:
        """Where the weight streamer's managed memory lives: preferred in host RAM, and
        accessed by the GPU there (its kernels read it over the link, no migration)."""
        self.advise(ptr, n, PREFERRED, HOST)
        self.advise(ptr, n, ACCESSED_BY, DEVICE)

    def discard(self, ptr: int, n: int, stream: int) -> None:
        """``cudaMemDiscardBatchAsync`` of one range on ``stream`` (CUDA 13; not the legacy
        NULL stream, which the call refuses with invalid argument)."""
        fn = self.rt.cudaMemDiscardBatchAsync
        fn.argtypes = [
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.POINTER(ctypes.c_size_t),
            ctypes.c_size_t,
            ctypes.c_ulonglong,
            ctypes.c_void_p,
        ]
        ptrs = (ctypes.c_void_p * 1)(ptr)
        sizes = (ctypes.c_size_t * 1)(n)
        self.check(fn(ptrs, sizes, 1, 0, stream), "cudaMemDiscardBatchAsync")

    def sync(self) -> None:
        self.check(self.rt.cudaDeviceSynchronize(), "cudaDeviceSynchronize")

    def copy_batch(
        self, copies: list[tuple[int, int, int]], stream: int, *, src: int, overlap: bool
    ) -> None:
        """``cudaMemcpyBatchAsync`` of (dst, src, bytes) copies on ``stream``, in stream
        order, the source hinted at location type ``src`` (0: no hint) and, with
        ``overlap``, the hint that the copies should overlap compute (a copy engine rather
        than SMs, where the driver can)."""
        n = len(copies)
        dsts = (ctypes.c_void_p * n)(*[d for d, _, _ in copies])
        srcs = (ctypes.c_void_p * n)(*[s for _, s, _ in copies])
        sizes = (ctypes.c_size_t * n)(*[b for _, _, b in copies])
        attrs = CopyAttributes(
            ORDER_STREAM, Location(src, 0), Location(DEVICE, 0), PREFER_OVERLAP if overlap else 0
        )
        index = ctypes.c_size_t(0)
        self.check(
            self.rt.cudaMemcpyBatchAsync(
                dsts,
                srcs,
                sizes,
                ctypes.c_size_t(n),
                ctypes.byref(attrs),
                ctypes.byref(index),
                ctypes.c_size_t(1),
                ctypes.c_void_p(stream),
            ),
            "cudaMemcpyBatchAsync",
        )

    def free_bytes(self) -> int:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self.check(
            self.rt.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)), "cudaMemGetInfo"
        )
        return free.value


def timed(cuda: Cuda, fn: Callable[[], object]) -> float:
    cuda.sync()
    t0 = time.perf_counter()
    fn()
    cuda.sync()
    return time.perf_counter() - t0


def threaded(parts: list[Callable[[], None]]) -> None:
    threads = [threading.Thread(target=p) for p in parts]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def ranges_setup(
    doc: str | None, argv: list[str] | None, default_gib: int, ranges: int
) -> tuple[argparse.Namespace, Cuda, int]:
    """A probe's arguments (a range size in GiB, --json FILE), libcudart, and the range's
    bytes; refuses to run if ``ranges`` ranges of that size would be more than 80 % of the
    free GPU memory (the rule of every GPU run)."""
    ap = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    ap.add_argument("gib", nargs="?", type=int, default=default_gib)
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    cuda = Cuda()
    n = args.gib * GiB
    free = cuda.free_bytes()
    if ranges * n > 0.8 * free:
        raise SystemExit(
            f"{ranges * args.gib} GiB of managed memory is more than 80 % of the "
            f"{free / GiB:.0f} GiB free"
        )
    return args, cuda, n


def main(argv: list[str] | None = None) -> int:
    args, cuda, n = ranges_setup(__doc__, argv, 4, 2)
    free = cuda.free_bytes()
    a, b = cuda.managed(n), cuda.managed(n)
    streams = [cuda.stream() for _ in range(8)]
    rows: list[tuple[str, float]] = []

    def row(name: str, fn: Callable[[], object], scale: int = 1) -> None:
        rows.append((name, scale * n / timed(cuda, fn) / 1e9))

    def on_gpu(ptr: int, value: int) -> None:
        cuda.prefetch(ptr, n, DEVICE)
        cuda.check(cuda.rt.cudaMemset(ptr, value, n), "cudaMemset")
        cuda.sync()

    def evict(threads: int, ptr: int, piece: int = 0) -> Callable[[], None]:
        step = n // threads

        def part(k: int) -> Callable[[], None]:
            def go() -> None:
                lo, hi = ptr + k * step, ptr + (k + 1) * step
                size = piece or step
                for off in range(lo, hi, size):
                    cuda.prefetch(off, min(size, hi - off), HOST, streams[k])

            return go

        if threads == 1:
            return part(0)
        return lambda: threaded([part(k) for k in range(threads)])

    # Fresh host pages the first time, populated ones later: the first eviction of a range
    # pays for host page allocation. Measure each variant after one untimed round.
    on_gpu(a, 1)
    row("evict by prefetch to CPU, fresh host pages, 1 thread", evict(1, a))
    for threads in (1, 2, 4, 8):
        on_gpu(a, 1)
        row(f"evict by prefetch to CPU, {threads} thread(s)", evict(threads, a))
    on_gpu(a, 1)
    row("evict in 2 MiB calls, 1 thread", evict(1, a, 2 << 20))
    on_gpu(a, 1)
    row("evict in 2 MiB calls, 4 threads", evict(4, a, 2 << 20))

    # Read-only duplicates: b is written on the CPU side (host copy valid), then duplicated.
    cuda.prefetch(b, n, HOST)
    cuda.check(cuda.rt.cudaMemset(b, 3, n), "cudaMemset")
    cuda.prefetch(b, n, HOST)
    cuda.sync()
    cuda.advise(b, n, PREFERRED, HOST)
    cuda.advise(b, n, ACCESSED_BY, DEVICE)
    cuda.advise(b, n, READ_MOSTLY)
    row("ReadMostly: duplicate to GPU by prefetch", lambda: cuda.prefetch(b, n, DEVICE))
    row("ReadMostly: duplicate again (already there)", lambda: cuda.prefetch(b, n, DEVICE))
    row("ReadMostly: prefetch to CPU", lambda: cuda.prefetch(b, n, HOST))
    row("ReadMostly: duplicate to GPU after that", lambda: cuda.prefetch(b, n, DEVICE))
    row(
        "ReadMostly: unset (drop GPU copy, preferred=host)",
        lambda: cuda.advise(b, n, UNSET_READ_MOSTLY),
    )
    row("prefetch to CPU of pages already in host RAM", lambda: cuda.prefetch(b, n, HOST))
    row("ReadMostly: set again", lambda: cuda.advise(b, n, READ_MOSTLY))
    row("ReadMostly: duplicate to GPU after unset/set", lambda: cuda.prefetch(b, n, DEVICE))

    def cycle() -> None:
        for _ in range(4):
            cuda.advise(b, n, UNSET_READ_MOSTLY)
            cuda.advise(b, n, READ_MOSTLY)
            cuda.prefetch(b, n, DEVICE)

    row("ReadMostly: 4 x (unset, set, duplicate), per GB moved", cycle, scale=4)

    # Eviction by duplicate: data written on the GPU (device pages only, advised as the
    # engine advises every segment) leaves by ReadMostly + prefetch to the CPU (a host
    # copy, the GPU's stays valid) + unset (the GPU copy dropped, preferred location
    # host). Coherent at every step: a write in between collapses the copies.
    cuda.advise(a, n, PREFERRED, HOST)
    cuda.advise(a, n, ACCESSED_BY, DEVICE)
    for round_ in ("fresh host pages", "host pages populated before"):
        on_gpu(a, 5)
        row(f"evict by duplicate, {round_}: set ReadMostly", lambda: cuda.advise(a, n, READ_MOSTLY))
        row(f"evict by duplicate, {round_}: prefetch to CPU", lambda: cuda.prefetch(a, n, HOST))
        row(
            f"evict by duplicate, {round_}: unset (drop GPU copy)",
            lambda: cuda.advise(a, n, UNSET_READ_MOSTLY),
        )

    def by_duplicate() -> None:
        cuda.advise(a, n, READ_MOSTLY)
        cuda.prefetch(a, n, HOST)
        cuda.advise(a, n, UNSET_READ_MOSTLY)

    on_gpu(a, 7)
    row("evict by duplicate, the three steps as one", by_duplicate)
    on_gpu(a, 1)
    row("evict by prefetch to CPU, same range, for comparison", evict(1, a))
    free_after = cuda.free_bytes()

    check = (ctypes.c_ubyte * 4096)()
    cuda.check(cuda.rt.cudaMemcpy(check, b + n - 4096, 4096, 0), "cudaMemcpy")
    ok_b = all(x == 3 for x in check)
    cuda.check(cuda.rt.cudaMemcpy(check, a + n - 4096, 4096, 0), "cudaMemcpy")
    ok_a = all(x == 1 for x in check)
    for name, r in rows:
        print(f"{name:58s} {r:8.1f} GB/s")
    print(f"cudaMemGetInfo free before {free / GiB:.1f} GiB, after {free_after / GiB:.1f} GiB")
    print("data intact" if ok_a and ok_b else "DATA WRONG")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"gib": args.gib, "rows": dict(rows), "data_ok": ok_a and ok_b}, f, indent=1)
    return 0 if ok_a and ok_b else 1


if __name__ == "__main__":
    sys.exit(main())
