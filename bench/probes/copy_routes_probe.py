"""What a copy between a CPU tensor and a GPU tensor costs in the +um torch, by route.

    python -m bench.probes.copy_routes_probe [--gib 2] [--reps 3]   # on the GPU host, +um torch

Listing 1 (bench.oversubscribe) copies 8 GiB in and out with ``Tensor.to`` and ``copy_``;
under ``host_alloc:managed`` its CPU tensors are managed memory placed in host RAM, and
torch's copies of them are ``cudaMemcpyAsync`` calls, which the driver ran at 6.8-7.1 GB/s
(bench/README.md, step 41) where page-locked memory runs at 51-55. A GPU reads and writes
host-placed managed memory in place at about 52 GB/s (design notes, section 9). This
probe asks, for one device budget that holds the GPU tensor, what each route carries:

- ``memcpy``: ``dst.copy_(src)`` (torch's route: ``cudaMemcpyAsync``, which the +um torch
  runs as its copy kernel where the host side is managed: Note [Copies of managed host
  memory by kernel], HostCopy.h);
- ``driver``: the same with ``host_copy_kernel:False``, the driver's copy (managed only);
- ``leanN``: the lean copy kernel (Note [Lean copies], torch/cuda/_um_copy.py) on N blocks;
- ``--first``: the first copy of fresh managed host memory, by how its pages were prepared;
- ``--duplex``: the kernel from managed host memory into managed host memory (both
  directions of the link at once);
- ``--split``: the same copy by the CPU's threads (torch's CPU ``copy_``, no link), and
  split between the kernel (the first part) and the CPU (the rest) at once;
- ``--both-ways``: a copy in and a copy out of different tensors at once, each on its own
  stream, by torch's copy (``memcpy``: the copy engines for page-locked memory, the
  engine's kernel for managed) and by two lean kernels of N blocks each, for page-locked
  and managed host memory: whether the half duplex step 12 measured is the link's or the
  routes';

for the pairs: managed host memory to the GPU (``h2d-managed``) and back (``d2h-managed``),
and as references ordinary pageable memory (``h2d-pageable``, ``d2h-pageable``: memcpy
only, a kernel cannot read it) and page-locked memory (``h2d-pinned``, ``d2h-pinned``).
Each route's copy is checked against its source. GB/s is the best of ``--reps``.

The total-managed cap is 80 % of the free memory read at start (design notes, section 4),
and the probe's managed memory (three tensors of ``--gib``, four with ``--duplex``) must
fit under it (one more with ``--split``, one more with ``--both-ways``). Prints a table
and one ``BENCH_RESULT`` JSON line.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable
from typing import Any

from bench.common import BenchError, GiB, emit, machine, safe_cap, um_module

LEAN_BLOCKS = (2, 8, 32, 132)


def timed(torch: Any, fn: Callable[[], object], reps: int) -> float:
    """Best seconds of ``reps`` calls of ``fn``, each from an idle device to an idle one."""
    best = float("inf")
    for _ in range(reps):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t)
    return best


def _memcpy(dst: Any, src: Any) -> Callable[[], object]:
    return lambda: dst.copy_(src)


def _lean(copier: Any, dst: Any, src: Any, stream: int, blocks: int) -> Callable[[], object]:
    return lambda: copier.copy(dst, src, stream, blocks)


def _prepare(torch: Any, um: Any, host: Any, how: str) -> None:
    """``advise`` or ``prefetch`` a CPU tensor's managed memory through the engine's C API
    (torch.cuda.um's advise and prefetch take CUDA tensors)."""
    import ctypes

    lib, err = um._engine(), ctypes.create_string_buffer(512)
    ptr, size = ctypes.c_void_p(host.data_ptr()), host.nbytes
    if how == "advise":
        rc = lib.torch_um_advise(
            ptr, size, um._ADVICE["accessed_by"], torch.cuda.current_device(), err, 512
        )
    else:
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        rc = lib.torch_um_prefetch(
            ptr, size, um._device_index("cpu", allow_host=True), stream, err, 512
        )
    if rc != 0:
        raise BenchError(f"{how}: {err.value.decode(errors='replace')}")


def first_copies(torch: Any, um: Any, n: int, dev: Any, dev_src: Any) -> list[dict[str, Any]]:
    """The first copy of a fresh managed host tensor (torch's copy, the kernel's route),
    and the copy after it, by how its pages were prepared: its first GPU access maps
    each page (the source, populated by the CPU) or makes it (the destination, never
    touched). ``advise``: ``cudaMemAdviseSetAccessedBy`` for the GPU first, its own
    seconds apart; ``prefetch``: a prefetch to host RAM first, likewise."""
    rows: list[dict[str, Any]] = []
    for direction in ("h2d", "d2h"):
        for prep in ("none", "advise", "prefetch", "driver"):
            um.configure(host_alloc="managed")
            host = torch.empty(n, dtype=torch.uint8)
            um.configure(host_alloc="default")
            if direction == "h2d":
                host.random_()  # populated by the CPU, as a program's data is
            torch.cuda.synchronize()
            t = time.perf_counter()
            if prep in ("advise", "prefetch"):
                _prepare(torch, um, host, prep)
            torch.cuda.synchronize()
            prep_s = time.perf_counter() - t
            dst, src = (dev, host) if direction == "h2d" else (host, dev_src)
            um.configure(host_copy_kernel=prep != "driver")
            first = timed(torch, _memcpy(dst, src), 1)
            again = timed(torch, _memcpy(dst, src), 1)
            um.configure(host_copy_kernel=True)
            ok = bool(torch.equal(dst.cpu() if dst.is_cuda else dst, src.cpu()))
            rows.append(
                {
                    "pair": direction,
                    "prep": prep,
                    "prep_s": prep_s,
                    "first_s": first,
                    "again_s": again,
                    "equal": ok,
                }
            )
            print(
                f"first {direction} {prep:8} prep {prep_s:6.3f} s  first {n / first / 1e9:6.1f} "
                f"GB/s  again {n / again / 1e9:6.1f} GB/s  equal={ok}",
                flush=True,
            )
            del host
    return rows


def duplex_copies(
    torch: Any, um: Any, copier: Any, src: Any, stream: int, reps: int
) -> list[dict[str, Any]]:
    """The lean kernel copying managed host memory into managed host memory, both mapped
    for the GPU: every byte crosses the link twice, once each way. Step 43's Listing 1
    copy in moved 8 GiB from host RAM and wrote 4 GiB of it back to host RAM in 0.19 s,
    more than a half-duplex link at 55 GB/s carries: payload GB/s above about 27 here
    says the link carries a kernel's reads and writes at once."""
    if copier is None:
        return []
    um.configure(host_alloc="managed")
    dst = torch.empty(src.numel(), dtype=torch.uint8)
    um.configure(host_alloc="default")
    dst.fill_(0)  # its pages made by the CPU, as src's were
    for t in (src, dst):
        _prepare(torch, um, t, "advise")
    rows = []
    for b in LEAN_BLOCKS:
        s = timed(torch, _lean(copier, dst, src, stream, b), reps)
        ok = bool(torch.equal(dst, src))
        rows.append({"route": f"lean{b}", "s": s, "gbps": src.nbytes / s / 1e9, "equal": ok})
        print(f"h2h-managed lean{b:<4} {src.nbytes / s / 1e9:7.1f} GB/s  equal={ok}", flush=True)
    return rows


BOTH_WAYS_BLOCKS = (2, 8, 32)


def both_ways_copies(
    torch: Any, copier: Any, hosts: dict[str, tuple[Any, Any]], dev: Any, dev_src: Any, reps: int
) -> list[dict[str, Any]]:
    """For each kind of host memory (``hosts``: kind -> (source, destination), both CPU
    tensors of ``dev``'s size): the copy in (source -> ``dev``) on one stream and the copy out
    (``dev_src`` -> destination) on another, started together; GB/s each way is the bytes
    of one direction over the time both take. Step 12 read 26 GB/s each way for copies and
    for torch's copy kernels (bench/README.md, "the link is half duplex") where one
    direction alone runs at 51-52; step 44's lean kernel moved 42 GB/s each way when one
    kernel did both. A lean kernel of few blocks leaves SMs to the other one, so that two
    of them can run at once (a kernel of every SM's worth of blocks may start only after
    the other's blocks have left)."""
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]

    def together(launch: Callable[[], None]) -> None:
        """The copy in on streams[0] and the copy out on streams[1], after the current
        stream's work and before its next."""
        for stream in streams:
            stream.wait_stream(torch.cuda.current_stream())
        launch()
        for stream in streams:
            torch.cuda.current_stream().wait_stream(stream)

    def memcpy(src: Any, dst: Any) -> Callable[[], object]:
        def go() -> None:
            with torch.cuda.stream(streams[0]):
                dev.copy_(src, non_blocking=True)
            with torch.cuda.stream(streams[1]):
                dst.copy_(dev_src, non_blocking=True)

        return lambda: together(go)

    def lean(src: Any, dst: Any, blocks: int) -> Callable[[], object]:
        def go() -> None:
            copier.copy(dev, src, streams[0].cuda_stream, blocks)
            copier.copy(dst, dev_src, streams[1].cuda_stream, blocks)

        return lambda: together(go)

    rows = []
    for kind, (src, dst) in hosts.items():
        routes = {"memcpy": memcpy(src, dst)}
        if copier is not None:
            routes.update({f"lean{b} x 2": lean(src, dst, b) for b in BOTH_WAYS_BLOCKS})
        for route, fn in routes.items():
            dev.zero_()
            dst.fill_(0)
            sec = timed(torch, fn, reps)
            ok = bool(torch.equal(dev.cpu(), src) and torch.equal(dst, dev_src.cpu()))
            rate = src.nbytes / sec / 1e9
            rows.append(
                {"host": kind, "route": route, "s": sec, "gbps_each_way": rate, "equal": ok}
            )
            print(
                f"both ways {kind:8} {route:20} {rate:7.1f} GB/s each way  equal={ok}", flush=True
            )
    return rows


SPLIT_CPU_PARTS = (0.0, 0.15, 0.25, 0.35, 0.5, 1.0)


def split_copies(
    torch: Any, um: Any, copier: Any, src: Any, stream: int, reps: int
) -> list[dict[str, Any]]:
    """Managed host memory into managed host memory, the last ``cpu_part`` of it by the
    CPU's threads (torch's CPU ``copy_``, which never crosses the link) while the kernel
    copies the rest over the link both ways: whether the two add up (0.0 is the kernel
    alone, 1.0 the CPU alone)."""
    if copier is None:
        return []
    um.configure(host_alloc="managed")
    dst = torch.empty(src.numel(), dtype=torch.uint8)
    um.configure(host_alloc="default")
    dst.fill_(0)
    _prepare(torch, um, dst, "advise")
    n = src.numel()
    rows = []
    for part in SPLIT_CPU_PARTS:
        k = int(n * (1 - part)) // 16 * 16

        def both(k: int = k) -> None:
            if k > 0:
                copier.copy(dst[:k], src[:k], stream, 8)
            if k < n:
                dst[k:].copy_(src[k:])

        dst.fill_(0)
        s = timed(torch, both, reps)
        ok = bool(torch.equal(dst, src))
        rows.append(
            {
                "cpu_part": part,
                "s": s,
                "gbps": n / s / 1e9,
                "equal": ok,
                "threads": torch.get_num_threads(),
            }
        )
        print(f"h2h-managed split cpu {part:4.2f} {n / s / 1e9:7.1f} GB/s  equal={ok}", flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=2.0, help="bytes a copy, in GiB")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument(
        "--first", action="store_true", help="also the first copy of fresh managed host memory"
    )
    ap.add_argument(
        "--duplex",
        action="store_true",
        help="also the kernel copying managed host memory into managed host memory",
    )
    ap.add_argument(
        "--split",
        action="store_true",
        help="also that copy by CPU threads, and split between the kernel and the CPU",
    )
    ap.add_argument(
        "--both-ways",
        action="store_true",
        help="also a copy in and a copy out at once, on two streams, by each route",
    )
    a = ap.parse_args(argv)
    if a.gib <= 0 or a.reps < 1:
        ap.error("--gib takes a positive size, --reps a count of at least 1")
    import torch
    from torch.cuda import _um_copy

    um = um_module(torch, "um")
    free, _total, cap = safe_cap(torch)
    n = int(a.gib * GiB) // 16 * 16
    tensors = 3 + int(a.duplex) + int(a.split) + int(a.both_ways)
    if tensors * n > cap:
        raise BenchError(
            f"--gib {a.gib}: {tensors} tensors of it exceed the managed cap ({cap / GiB:.1f} GiB)"
        )
    um.configure(enabled=True, max_managed=cap, device_budget=3 * n)
    torch.ones(1, device="cuda")  # host_alloc:managed applies once a managed segment exists
    um.configure(host_alloc="managed")
    kinds: dict[str, Any] = {
        "managed": torch.empty(n, dtype=torch.uint8).random_(),
    }
    if not um.is_managed(kinds["managed"]):
        raise BenchError("host_alloc:managed left the CPU tensor in ordinary memory")
    um.configure(host_alloc="default")
    kinds["pageable"] = torch.empty(n, dtype=torch.uint8).random_()
    kinds["pinned"] = torch.empty(n, dtype=torch.uint8, pin_memory=True).random_()
    dev = torch.empty(n, dtype=torch.uint8, device="cuda")
    dev_src = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
    copier = _um_copy.copier(torch.cuda.current_device())
    stream = torch.cuda.current_stream().cuda_stream

    rows: list[dict[str, Any]] = []
    for kind, host in kinds.items():
        for direction in ("h2d", "d2h"):
            dst, src = (dev, host) if direction == "h2d" else (host, dev_src)
            routes: dict[str, Callable[[], object]] = {"memcpy": _memcpy(dst, src)}
            if kind == "managed":  # torch's copy with the engine's kernel turned off
                routes["driver"] = _memcpy(dst, src)
            if kind != "pageable" and copier is not None:
                for b in LEAN_BLOCKS:
                    routes[f"lean{b}"] = _lean(copier, dst, src, stream, b)
            for route, fn in routes.items():
                dst.zero_() if dst.is_cuda else dst.fill_(0)
                um.configure(host_copy_kernel=route != "driver")
                s = timed(torch, fn, a.reps)
                um.configure(host_copy_kernel=True)
                ok = bool(torch.equal(dst.cpu() if dst.is_cuda else dst, src.cpu()))
                rows.append(
                    {
                        "pair": f"{direction}-{kind}",
                        "route": route,
                        "s": s,
                        "gbps": n / s / 1e9,
                        "equal": ok,
                    }
                )
                print(
                    f"{direction}-{kind:9} {route:8} {n / s / 1e9:7.1f} GB/s  equal={ok}",
                    flush=True,
                )
    first = first_copies(torch, um, n, dev, dev_src) if a.first else []
    duplex = duplex_copies(torch, um, copier, kinds["managed"], stream, a.reps) if a.duplex else []
    split = split_copies(torch, um, copier, kinds["managed"], stream, a.reps) if a.split else []
    both_ways: list[dict[str, Any]] = []
    if a.both_ways:
        um.configure(host_alloc="managed")
        managed_dst = torch.empty(n, dtype=torch.uint8)
        um.configure(host_alloc="default")
        managed_dst.fill_(0)  # its pages made by the CPU, as the source's were
        for t in (kinds["managed"], managed_dst):
            _prepare(torch, um, t, "advise")
        hosts = {
            "pinned": (kinds["pinned"], torch.empty(n, dtype=torch.uint8, pin_memory=True)),
            "managed": (kinds["managed"], managed_dst),
        }
        both_ways = both_ways_copies(torch, copier, hosts, dev, dev_src, a.reps)
    emit(
        {
            "probe": "copy_routes_probe",
            "first": first,
            "duplex": duplex,
            "split": split,
            "both_ways": both_ways,
            "bytes": n,
            "free_at_start": free,
            "cap": cap,
            "copier": None if copier is None else "lean",
            "copier_failure": _um_copy.failures.get(torch.cuda.current_device()),
            "rows": rows,
            "machine": machine(torch),
        }
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
