"""What it costs to bring fresh managed pages into existence, by route (issue 8, "a
segment's first use does not pay for fault-driven population"; Listing 1's first run).

    python -m bench.probes.populate_probe [GiB] [--json FILE] [--discards-only | --making-only]

Every route takes a fresh ``cudaMallocManaged`` range of GiB (default 2), straight
through libcudart (the engine is not in the way), and times:

- ``populate``: the step that creates the pages, if the route has one: a prefetch to the
  host (the engine's MapHost today), a prefetch to the GPU (PlaceOnDevice), or a CPU
  ``memset`` split over N host threads;
- ``first write``: a GPU kernel (``fill_``) over the whole range right after it;
- ``again``: the same kernel once more, with every page in place (link speed when the
  range lives in host RAM, HBM speed on the GPU);
- ``host_pages_made``: how much of the range the populate step left in host RAM, read as
  the growth of the process's VmRSS (managed host pages count there), so that a route
  touching one byte per 64 KiB or 2 MiB shows how many pages one CPU fault makes;
- for the copy routes, a ``cudaMemcpy`` from ordinary pageable host memory into the range
  (Listing 1's ``x_cpu.to("cuda")``), against the same copy into ``cudaMalloc`` memory.

With ``--making-only`` only the routes that make host pages run (CPU writes, one byte per
page or per larger stride, ``madvise(MADV_POPULATE_WRITE)`` from several threads, the
engine's route). Then (or only, with ``--discards-only``) it checks that data written
after a discard survives, for host pages made by a prefetch and by CPU writes
(``discard_checks``); the exit status is 1 if any route lost data.

Host-placed routes set PreferredLocation=host and AccessedBy=GPU first, as the engine
does. Where each range ended up is read from how long a GPU read of it takes. At most two
ranges exist at once, and the probe refuses to run if that is over 80 % of free GPU memory.
"""

from __future__ import annotations

import argparse
import ctypes
import importlib
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from bench.common import command_line, machine
from bench.host_memory import rss_bytes
from bench.probes.evict_routes import ACCESSED_BY, DEVICE, HOST, PREFERRED, Cuda, threaded, timed

GiB = 1 << 30
COPY_DEFAULT = 4  # cudaMemcpyDefault
MADV_POPULATE_WRITE = 23  # Linux 5.14 and later; EINVAL before


class Span:
    """A byte range of device-visible memory that torch can wrap without owning it."""

    def __init__(self, ptr: int, nbytes: int) -> None:
        self.ptr, self.nbytes = ptr, nbytes

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        return {
            "shape": (self.nbytes // 4,),
            "typestr": "<f4",
            "data": (self.ptr, False),
            "version": 3,
            "stream": None,
        }


def gbps(nbytes: int, seconds: float | None) -> float | None:
    """Bandwidth in GB/s of moving nbytes in seconds; None for a step a route lacks."""
    if seconds is None:
        return None
    return nbytes / seconds / 1e9 if seconds > 0 else float("inf")


def placement(nbytes: int, read_seconds: float) -> str:
    """Where a GPU read says the range lives: HBM reads take well under 1 ms per GiB, a
    read over PCIe (mapped or migrated) at least 15 ms per GiB."""
    return "gpu" if read_seconds < 2e-3 * nbytes / GiB else "host"


def parts(nbytes: int, threads: int, align: int) -> list[tuple[int, int]]:
    """(offset, size) of up to ``threads`` parts of a range, each starting on ``align``,
    that cover it once."""
    step = max(1, -(-nbytes // threads // align)) * align  # whole units, rounded up
    return [(lo, min(step, nbytes - lo)) for lo in range(0, nbytes, step)]


def cpu_memset(ptr: int, nbytes: int, threads: int) -> Callable[[], None]:
    """Zero the range from the CPU, a page-aligned part per thread (ctypes releases the
    GIL)."""

    def part(lo: int, size: int) -> Callable[[], None]:
        def go() -> None:
            ctypes.memset(ptr + lo, 0, size)

        return go

    return lambda: threaded([part(lo, n) for lo, n in parts(nbytes, threads, 4096)])


def cpu_touch(ptr: int, nbytes: int, threads: int, stride: int) -> Callable[[], None]:
    """Write one byte per ``stride`` bytes from the CPU, a part per thread, as the engine's
    populateOnHost does with stride = the page size (numpy's strided fill runs without the
    GIL for a plain dtype). numpy comes with torch's stack on the GPU host; this
    repository's tooling does not depend on it, hence the import by name."""
    np = importlib.import_module("numpy")

    def part(lo: int, size: int) -> Callable[[], None]:
        def go() -> None:
            buf = (ctypes.c_char * size).from_address(ptr + lo)
            np.frombuffer(memoryview(buf).cast("B"), dtype=np.uint8)[::stride] = 0

        return go

    return lambda: threaded([part(lo, n) for lo, n in parts(nbytes, threads, max(stride, 4096))])


def madvise_populate(ptr: int, nbytes: int, threads: int) -> Callable[[], None]:
    """``madvise(MADV_POPULATE_WRITE)`` over the range, a 2 MiB-aligned part per thread: the
    kernel takes the write faults itself, with no return to user space per page. Raises
    OSError (after every thread is done) where the kernel refuses it."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    errors: list[int] = []

    def part(lo: int, size: int) -> Callable[[], None]:
        def go() -> None:
            if libc.madvise(ptr + lo, size, MADV_POPULATE_WRITE) != 0:
                errors.append(ctypes.get_errno())

        return go

    def run() -> None:
        threaded([part(lo, n) for lo, n in parts(nbytes, threads, 2 << 20)])
        if errors:
            raise OSError(errors[0], f"madvise(MADV_POPULATE_WRITE): {os.strerror(errors[0])}")

    return run


def parallel_prefetch(
    cuda: Cuda, ptr: int, nbytes: int, where: int, threads: int
) -> Callable[[], None]:
    """Prefetch the range in 2 MiB-aligned parts, one call per thread (the driver does a
    prefetch to the host on the calling thread)."""

    def part(lo: int, size: int) -> Callable[[], None]:
        def go() -> None:
            cuda.prefetch(ptr + lo, size, where)

        return go

    return lambda: threaded([part(lo, n) for lo, n in parts(nbytes, threads, 2 << 20)])


def discard_checks(cuda: Cuda, torch: Any, nbytes: int) -> list[dict[str, Any]]:
    """Does data written after a discard survive, by how the host pages were made?

    The engine discards dead chunks (cudaMemDiscardBatchAsync) and brings a reused one back
    by a prefetch to the host or to the GPU (Note [Dead content is prefetched, not
    discarded]). For each way of making host pages, where the range lived before the
    discard, where it is prefetched after it, and the writer after that (a kernel, or a
    CUDA graph captured before the discard, as torch.compile's reduce-overhead mode
    replays), a host-advised range is made and written, moved to the GPU or not,
    discarded, prefetched, written again and checked element by element."""
    if not hasattr(cuda.rt, "cudaMemDiscardBatchAsync"):
        return []  # before CUDA 13
    where = {"host": HOST, "gpu": DEVICE}
    makers: dict[str, Callable[[int], None]] = {
        "a prefetch to the host": lambda ptr: cuda.prefetch(ptr, nbytes, HOST),
        "CPU writes from 8 threads": lambda ptr: cpu_memset(ptr, nbytes, 8)(),
    }

    def check(made: str, before: str, after: str, writer: str) -> int:
        """Elements that do not hold the value written after the discard."""
        with cuda.fresh(nbytes) as ptr:
            cuda.advise_host(ptr, nbytes)
            makers[made](ptr)
            cuda.sync()
            t = torch.as_tensor(Span(ptr, nbytes), device="cuda")
            t.fill_(1.0)
            if before == "gpu":
                cuda.prefetch(ptr, nbytes, DEVICE)
                t.fill_(2.0)
            graph = None
            if writer == "graph":
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    t.fill_(5.0)
            torch.cuda.synchronize()
            side = torch.cuda.Stream()
            cuda.discard(ptr, nbytes, side.cuda_stream)
            side.synchronize()
            cuda.prefetch(ptr, nbytes, where[after])
            cuda.sync()
            if graph is not None:
                graph.replay()
            else:
                t.fill_(5.0)
            torch.cuda.synchronize()
            return int((t != 5.0).sum().item())

    return [
        {
            "pages_made_by": made,
            "lived_on_before_discard": before,
            "prefetched_to_after": after,
            "writer": writer,
            "wrong_elements": check(made, before, after, writer),
        }
        for made in makers
        for before in where
        for after in where
        for writer in ("kernel", "graph")
    ]


def print_discards(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        print(
            f"discard, pages made by {r['pages_made_by']:26s} lived on "
            f"{r['lived_on_before_discard']:4s} prefetched to {r['prefetched_to_after']:4s} "
            f"written by a {r['writer']:6s}: {r['wrong_elements']} wrong elements"
        )
    if not rows:
        print("discard checks skipped: this libcudart has no cudaMemDiscardBatchAsync")


def print_routes(rows: list[dict[str, Any]]) -> None:
    for r in rows:
        if "error" in r:
            print(f"{r['route']:72s} not run: {r['error']}")
            continue
        cells = "  ".join(
            f"{k} {r[k + '_GBps']:6.1f}" if r[k + "_GBps"] is not None else f"{k}    -  "
            for k in ("populate", "first_write", "populate_and_write", "again")
        )
        made = r["host_pages_made"]
        print(
            f"{r['route']:72s} {cells}  GB/s  host pages made {made:4.0%}  on {r['lives_on']}"
            f"  ok {r['data_ok']}"
        )


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gib", nargs="?", type=float, default=2.0)
    ap.add_argument("--json", help="write the rows here")
    only = ap.add_mutually_exclusive_group()
    only.add_argument(
        "--discards-only", action="store_true", help="only check data written after discards"
    )
    only.add_argument(
        "--making-only", action="store_true", help="only the routes that make host pages"
    )
    args = ap.parse_args(argv)
    import torch

    cuda = Cuda()
    n = int(args.gib * GiB) // (2 << 20) * (2 << 20)
    free = cuda.free_bytes()
    if 2 * n > 0.8 * free:
        raise SystemExit(
            f"two ranges of {n / GiB:.1f} GiB are more than 80 % of the {free / GiB:.0f} GiB "
            "of free GPU memory: pass a smaller size"
        )

    def save(path: str, **parts: Any) -> None:
        """The record: how it was run, where, the range size, then the probe's rows."""
        head = {"command": command_line("bench.probes.populate_probe"), "machine": machine(torch)}
        with open(path, "w") as f:
            json.dump({**head, "bytes": n, "free_at_start": free, **parts}, f, indent=1)

    if args.discards_only:
        checked = min(n, 256 << 20)
        discards = discard_checks(cuda, torch, checked)
        print_discards(discards)
        if args.json:
            save(args.json, discard_check_bytes=checked, discards=discards)
        return 1 if any(r["wrong_elements"] for r in discards) else 0

    def timed_(fn: Callable[[], object]) -> float:
        return timed(cuda, fn)

    # The first fill and sum of the process load their kernels: not the first route's cost.
    torch.ones(1024, device="cuda").fill_(1.0).sum().item()

    def view(ptr: int) -> Any:
        return torch.as_tensor(Span(ptr, n), device="cuda")

    def advise_host(ptr: int) -> None:
        cuda.advise_host(ptr, n)

    rows: list[dict[str, Any]] = []

    def route(
        name: str,
        advice: Callable[[int], None] | None,
        populate: Callable[[int], Callable[[], None]] | None,
    ) -> None:
        with cuda.fresh(n) as ptr:
            if advice is not None:
                advice(ptr)
            rss0 = rss_bytes()
            try:
                t_pop = timed_(populate(ptr)) if populate is not None else None
            except OSError as e:
                rows.append({"route": name, "error": str(e)})
                return
            made = (rss_bytes() - rss0) / n
            t = view(ptr)
            t_first = timed_(lambda: t.fill_(1.0))
            t_again = timed_(lambda: t.fill_(2.0))
            t_read = timed_(lambda: t.sum().item())
            ok = bool((t[:: max(1, t.numel() // 4096)] == 2.0).all().item())
        rows.append(
            {
                "route": name,
                "populate_s": t_pop,
                "host_pages_made": made,
                "first_write_s": t_first,
                "again_s": t_again,
                "populate_GBps": gbps(n, t_pop),
                "first_write_GBps": gbps(n, t_first),
                "populate_and_write_GBps": gbps(n, (t_pop or 0.0) + t_first),
                "again_GBps": gbps(n, t_again),
                "lives_on": placement(n, t_read),
                "data_ok": ok,
            }
        )

    def prefetch_to(where: int) -> Callable[[int], Callable[[], None]]:
        return lambda ptr: lambda: cuda.prefetch(ptr, n, where)

    def by_cpu(threads: int) -> Callable[[int], Callable[[], None]]:
        return lambda ptr: cpu_memset(ptr, n, threads)

    def by_prefetches(threads: int) -> Callable[[int], Callable[[], None]]:
        return lambda ptr: parallel_prefetch(cuda, ptr, n, HOST, threads)

    def by_touch(threads: int, stride: int) -> Callable[[int], Callable[[], None]]:
        return lambda ptr: cpu_touch(ptr, n, threads, stride)

    def by_madvise(threads: int) -> Callable[[int], Callable[[], None]]:
        return lambda ptr: madvise_populate(ptr, n, threads)

    def prefer_host(ptr: int) -> None:
        cuda.advise(ptr, n, PREFERRED, HOST)

    def then_accessed_by(
        populate: Callable[[int], Callable[[], None]],
    ) -> Callable[[int], Callable[[], None]]:
        """The populate step, then AccessedBy=GPU over the populated range (the GPU's
        mappings made in one call rather than by its faults)."""

        def go(ptr: int) -> Callable[[], None]:
            def run() -> None:
                populate(ptr)()
                cuda.advise(ptr, n, ACCESSED_BY, DEVICE)

            return run

        return go

    if args.making_only:
        # Which advice the CPU faults run under: none, PreferredLocation=host only (a
        # managed CPU tensor, Engine::allocHost), or both (MapHost, advise_host below).
        route("host: no advice, one byte per 4 KiB on 8 threads", None, by_touch(8, 4096))
        for threads in (8, 16):
            route(
                f"host: PreferredLocation only, one byte per 4 KiB on {threads} threads",
                prefer_host,
                by_touch(threads, 4096),
            )
            route(
                f"host: PreferredLocation, one byte per 4 KiB on {threads} threads, then "
                "AccessedBy",
                prefer_host,
                then_accessed_by(by_touch(threads, 4096)),
            )
        for threads in (8, 16):
            route(f"host: CPU memset on {threads} threads", advise_host, by_cpu(threads))
            route(
                f"host: one byte per 4 KiB on {threads} threads (the engine)",
                advise_host,
                by_touch(threads, 4096),
            )
        for stride, threads in [(64 << 10, 1), (64 << 10, 16), (2 << 20, 1), (2 << 20, 16)]:
            route(
                f"host: one byte per {stride >> 10} KiB on {threads} thread(s)",
                advise_host,
                by_touch(threads, stride),
            )
        for threads in (1, 16):
            route(
                f"host: madvise(MADV_POPULATE_WRITE) on {threads} thread(s)",
                advise_host,
                by_madvise(threads),
            )
        print_routes(rows)
        if args.json:
            save(args.json, routes=rows)
        return 0 if all(r.get("data_ok", True) for r in rows) else 1

    route("gpu: no advice, written by faults", None, None)
    route("gpu: prefetch to the GPU, then written (PlaceOnDevice)", None, prefetch_to(DEVICE))
    route(
        "host: prefetch to the host, then written (MapHost today)", advise_host, prefetch_to(HOST)
    )
    route("host: advice only, written by faults", advise_host, None)

    for threads in (1, 4, 8, 16):
        route(
            f"host: CPU memset on {threads} thread(s), then written", advise_host, by_cpu(threads)
        )
    for threads in (4, 8, 16):
        route(
            f"host: prefetch to the host from {threads} threads, then written",
            advise_host,
            by_prefetches(threads),
        )

    # Listing 1's copy in: pageable host memory into the range.
    src = torch.empty(n // 4, dtype=torch.float32).uniform_(-4, 4)
    copies: list[dict[str, Any]] = []

    def copy_route(name: str, prepare: Callable[[int], None] | None) -> None:
        with cuda.fresh(n) as ptr:
            if prepare is not None:
                prepare(ptr)
                cuda.sync()
            fn = lambda: cuda.check(  # noqa: E731
                cuda.rt.cudaMemcpy(ptr, src.data_ptr(), n, COPY_DEFAULT), "cudaMemcpy"
            )
            t_first, t_again = timed_(fn), timed_(fn)
            t = view(ptr)
            t_read = timed_(lambda: t.sum().item())
            ok = bool(
                torch.equal(t[:1024].cpu(), src[:1024])
                and torch.equal(t[-1024:].cpu(), src[-1024:])
            )
        copies.append(
            {
                "route": name,
                "first_s": t_first,
                "again_s": t_again,
                "first_GBps": gbps(n, t_first),
                "again_GBps": gbps(n, t_again),
                "lives_on": placement(n, t_read),
                "data_ok": ok,
            }
        )

    def plain_copy() -> None:
        dst = torch.empty(n // 4, dtype=torch.float32, device="cuda")
        t0 = timed_(lambda: dst.copy_(src))
        t1 = timed_(lambda: dst.copy_(src))
        copies.append(
            {
                "route": "cudaMalloc (stock)",
                "first_s": t0,
                "again_s": t1,
                "first_GBps": gbps(n, t0),
                "again_GBps": gbps(n, t1),
                "lives_on": "gpu",
                "data_ok": bool(torch.equal(dst[:1024].cpu(), src[:1024])),
            }
        )

    plain_copy()
    torch.cuda.empty_cache()
    copy_route("managed, no advice", None)
    copy_route("managed, prefetched to the GPU", lambda p: cuda.prefetch(p, n, DEVICE))
    copy_route("managed, host advice only", advise_host)

    def advise_and_prefetch_host(ptr: int) -> None:
        advise_host(ptr)
        cuda.prefetch(ptr, n, HOST)

    copy_route("managed, host advice, prefetched to the host", advise_and_prefetch_host)

    # What a route leaves behind, in pairs taken twice over (A, B, A, B) to show the noise:
    # a copy out of a host-placed range into populated pageable memory (Listing 1's copy
    # out, without the program's own first touch), and the first eviction of a range placed
    # on the GPU, its host pages never made or made by CPU threads before the placement.
    dst_host = torch.empty_like(src).fill_(0)
    later: list[dict[str, Any]] = []

    def after(name: str, prepare: Callable[[int], None], measure: Callable[[int], None]) -> None:
        with cuda.fresh(n) as ptr:
            prepare(ptr)
            cuda.sync()
            later.append({"route": name, "GBps": gbps(n, timed_(lambda: measure(ptr)))})

    def written(populate: Callable[[int], Callable[[], None]]) -> Callable[[int], None]:
        def go(ptr: int) -> None:
            advise_host(ptr)
            populate(ptr)()
            view(ptr).fill_(3.0)

        return go

    def placed(cpu_first: bool) -> Callable[[int], None]:
        def go(ptr: int) -> None:
            advise_host(ptr)
            if cpu_first:
                cpu_memset(ptr, n, 8)()
            cuda.prefetch(ptr, n, DEVICE)
            view(ptr).fill_(4.0)

        return go

    def copy_out(ptr: int) -> None:
        cuda.check(cuda.rt.cudaMemcpy(dst_host.data_ptr(), ptr, n, COPY_DEFAULT), "cudaMemcpy")

    for _ in range(2):
        after("copy out of host pages made by a prefetch", written(prefetch_to(HOST)), copy_out)
        after(
            "copy out of host pages made by 8 CPU threads",
            written(lambda ptr: cpu_memset(ptr, n, 8)),
            copy_out,
        )
    for _ in range(2):
        after(
            "first eviction, host pages never made",
            placed(False),
            lambda ptr: cuda.prefetch(ptr, n, HOST),
        )
        after(
            "first eviction, host pages made by CPU threads before placement",
            placed(True),
            lambda ptr: cuda.prefetch(ptr, n, HOST),
        )

    print_routes(rows)
    for r in copies:
        print(
            f"copy in, {r['route']:44s} first {r['first_GBps']:6.1f}  again "
            f"{r['again_GBps']:6.1f} GB/s  on {r['lives_on']}  ok {r['data_ok']}"
        )
    discards = discard_checks(cuda, torch, min(n, 256 << 20))
    for r in later:
        print(f"after: {r['route']:64s} {r['GBps']:6.1f} GB/s")
    print_discards(discards)
    ok = all(r["data_ok"] for r in rows + copies) and not any(r["wrong_elements"] for r in discards)
    if args.json:
        save(args.json, routes=rows, copies=copies, after=later, discards=discards, data_ok=ok)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
