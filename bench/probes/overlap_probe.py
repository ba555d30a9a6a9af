"""Does a weight copy running beside an inference forward slow the forward, by route?

    python -m bench.probes.overlap_probe [--gib 1.3] [--reps 10] [--json FILE]   # on the GPU host

The weight streamer (Note [Weight streaming], torch/cuda/_um_weights.py) copies about
1.3 GB of weights from host RAM into a ring of device memory on a side stream while the
forward runs (the 1.28 B model at a 2 GiB budget, bench.residency infer). Its copies are
one foreach kernel per call reading managed memory in host RAM: the kernel holds SMs
while it waits on the link. A cudaMemcpyAsync from the same memory left the SMs alone but
added stalls (bench/README.md, step 15). This probe asks, with stock torch and the model
in device memory (no engine), what each route does to the forward's time:

- ``none``: the forward alone;
- ``kernel-managed``: ``torch._foreach_copy_`` from host-placed managed memory (the
  streamer today; PreferredLocation=host, AccessedBy=GPU, prefetched to the host);
- ``memcpy-managed``: ``copy_`` (cudaMemcpyAsync) from the same memory;
- ``memcpy-pinned``: ``copy_`` from page-locked host memory (a copy engine, plain DMA);
- ``kernel-pinned``: ``torch._foreach_copy_`` from page-locked memory, read in place by
  the kernel through a device view of it (zero-copy reads). Before step 23 this route
  handed foreach the CPU tensor itself, which foreach copies one tensor at a time with a
  blocking ``copy_``: its numbers up to step 22 are the host waiting for DMA, not a kernel;
- ``batch-managed``: one ``cudaMemcpyBatchAsync`` per queue of pieces from the managed
  memory, its source hinted as host-resident, no flags;
- ``overlap-managed``: the same with ``cudaMemcpyFlagPreferOverlapWithCompute``, the hint
  that the copies should leave the SMs to compute (a copy engine's DMA where the driver
  can). Step 23 found cudaMemcpyAsync out of managed memory runs on SMs; this asks
  whether the batch API's hints change that (bench/README.md, step 29);
- ``leanN-managed``: a copy kernel of our own (NVRTC, ``torch.cuda._compile_kernel``) of
  N blocks of 1024 threads, each thread with eight 16-byte loads in flight: can a few
  SMs, each with far more reads in flight than foreach's blocks keep, carry the link
  alone and leave the rest to the forward (step 29)? ``leanNpM-managed``: the same in
  launches of at most M MiB (``--lean-launch-mib``), so that each launch's blocks free
  their SMs sooner (step 30);
- ``stagedN-managed``: copies by the host: a worker thread has N threads copy each piece
  from the managed memory's host pages into one of four page-locked slots (torch's CPU
  copy, a share each), then queues the slot's DMA into the ring on the side stream. No
  SM is held; the price is host memory bandwidth and N cores (step 29);
- ``greenN-managed``, ``greenN-pinned``: the ``kernel`` route's copies on a stream of a
  CUDA green context of N SMs (``torch.cuda.green_contexts``), so that the copy kernels,
  which hold their SMs while they wait on the link, may take at most N of them
  (bench/README.md, step 23).

The copies go in CHUNK pieces into a ring of RING bytes, all queued when the forward
starts. Per route: the forward's time on the compute stream (CUDA events) with the copies
beside it, which it does not wait for, and the copies' time alone. The managed
range is raw ``cudaMallocManaged`` memory, refused past 80 % of free GPU memory.

Each route also runs the copies the streamer's way, issued from the host during the
forward (a forward pre-hook on each transformer block queues its share of the pieces),
and every measurement keeps the host's seconds until ``model(ids)`` returns: step 19
found the page-locked route left the forward bound by the host's launches, every torch
call slower, and this tells whether the copies alone do that, with no engine and no
streamer (bench/README.md, step 22).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import ctypes
import json
import queue as queues
import statistics
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

GiB = 1 << 30
LEAN_SOURCE = r"""
extern "C" __global__ void lean_copy(uint4* __restrict__ dst, const uint4* __restrict__ src,
                                     int n16) {
  const int stride = gridDim.x * blockDim.x;
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 7 * stride < n16; i += 8 * stride) {
    uint4 v[8];
#pragma unroll
    for (int k = 0; k < 8; ++k) v[k] = src[i + k * stride];
#pragma unroll
    for (int k = 0; k < 8; ++k) dst[i + k * stride] = v[k];
  }
  for (; i < n16; i += stride) dst[i] = src[i];
}
"""
CHUNK = 32 << 20  # the largest call of the 1.28 B model (an MLP projection)
RING = 128 << 20
ROUTES = (
    "none",
    "kernel-managed",
    "memcpy-managed",
    "memcpy-pinned",
    "kernel-pinned",
    "batch-managed",
    "overlap-managed",
)


def product_streams() -> Any:
    """The +um layer's ``torch/cuda/_um_streams.py``, loaded from the overlay by path (the
    probe runs on stock torch): the green-context routes take their streams from the weight
    streamer's own maker, ``few_sm_stream`` (Note [Copies on few SMs])."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "c10_overlay/torch/cuda/_um_streams.py"
    spec = importlib.util.spec_from_file_location("um_streams_for_probe", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Staged:
    """Copies by the host (route ``stagedN``): pieces go through page-locked slots."""

    def __init__(self, torch: Any, host: Any, ring: Any, stream: Any, slots: int = 4) -> None:
        self.torch, self.host, self.ring, self.stream = torch, host, ring, stream
        self.threads = 1
        self.pool = concurrent.futures.ThreadPoolExecutor(32)
        self.slots = [torch.empty(CHUNK, dtype=torch.uint8, pin_memory=True) for _ in range(slots)]
        self.done: list[Any] = [None] * slots
        self.at = 0
        self.failed: BaseException | None = None
        self.work: queues.Queue[Any] = queues.Queue()
        threading.Thread(target=self._run, daemon=True).start()

    def put(self, pieces: list[tuple[int, int, int]]) -> None:
        """Queue ``pieces``, their DMA after the compute stream's work so far."""
        after = self.torch.cuda.Event()
        after.record()
        self.work.put((pieces, after))

    def drain(self) -> None:
        self.work.join()
        if self.failed is not None:
            raise RuntimeError("a staged copy failed") from self.failed

    def _run(self) -> None:
        while True:
            pieces, after = self.work.get()
            try:
                self._copy(pieces, after)
            except BaseException as e:  # handed to drain()
                self.failed = e
            finally:
                self.work.task_done()

    def _copy(self, pieces: list[tuple[int, int, int]], after: Any) -> None:
        torch = self.torch
        with torch.inference_mode():
            for s, r, n in pieces:
                i = self.at % len(self.slots)
                self.at += 1
                if self.done[i] is not None:
                    self.done[i].synchronize()  # its last DMA has read it
                slot = self.slots[i][:n]
                share = -(-n // self.threads)
                parts = [(a, min(share, n - a)) for a in range(0, n, share)]
                jobs = [self.pool.submit(self._part, slot, s, a, m) for a, m in parts]
                for job in jobs:
                    job.result()
                with torch.cuda.stream(self.stream):
                    self.stream.wait_event(after)
                    self.ring[r : r + n].copy_(slot, non_blocking=True)
                    done = torch.cuda.Event()
                    done.record(self.stream)
                self.done[i] = done

    def _part(self, slot: Any, s: int, a: int, n: int) -> None:
        with self.torch.inference_mode():
            slot[a : a + n].copy_(self.host[s + a : s + a + n])


def chunks(total: int, chunk: int, ring: int) -> list[tuple[int, int, int]]:
    """(source offset, ring offset, bytes) pieces that cover ``total`` once, the ring
    reused in order."""
    out, at = [], 0
    while at < total:
        n = min(chunk, total - at)
        out.append((at, at % ring if at % ring + n <= ring else 0, n))
        at += n
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gib", type=float, default=1.3, help="bytes copied per forward")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument(
        "--staged-threads", default="4,16", help="CPU threads of the staged routes ('' none)"
    )
    ap.add_argument("--lean-blocks", default="4,8,16", help="block counts of the lean routes")
    ap.add_argument(
        "--lean-launch-mib",
        default="",
        help="also each lean route in launches of at most these MiB, e.g. 4,1 (leanNpM)",
    )
    ap.add_argument(
        "--green-sms", default="8,16,32", help="SM counts of the green-context routes ('' none)"
    )
    args = ap.parse_args(argv)
    import importlib

    import torch

    transformers = importlib.import_module("transformers")

    from bench.probes.evict_routes import HOST, Cuda
    from bench.probes.populate_probe import Span

    cuda = Cuda()
    total = int(args.gib * GiB) // CHUNK * CHUNK
    if total > 0.8 * cuda.free_bytes():
        raise SystemExit(f"{total / GiB:.1f} GiB is more than 80 % of free GPU memory")
    config = transformers.GPT2Config(
        n_layer=24, n_embd=2048, n_head=16, vocab_size=32000, n_positions=1024, use_cache=False
    )
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = transformers.GPT2LMHeadModel(config).to(torch.bfloat16).eval()
    ids = torch.randint(0, 32000, (8, 512), device="cuda")
    ring = torch.empty(RING, dtype=torch.uint8, device="cuda")
    pinned = torch.empty(total, dtype=torch.uint8, pin_memory=True)
    side = torch.cuda.Stream()
    streams = {"kernel": side, "memcpy": side, "batch": side, "overlap": side}
    routes = list(ROUTES)
    few = product_streams()
    device = torch.cuda.current_device()
    for n in (int(x) for x in args.green_sms.split(",") if x.strip()):
        stream, got = few.few_sm_stream(device, "probe", n)
        if got != n:  # an old driver, a torch without them: say so, go on
            print(f"green{n}: no green context ({few.green_failures.get((device, n))})", flush=True)
            continue
        streams[f"green{n}"] = stream
        routes += [f"green{n}-managed", f"green{n}-pinned"]
    lean: dict[str, Any] = {}
    blocks_of = [int(x) for x in args.lean_blocks.split(",") if x.strip()]
    launch_mib = [float(x) for x in args.lean_launch_mib.split(",") if x.strip()]
    if any(m * (1 << 20) < 16 for m in launch_mib):
        raise SystemExit(f"--lean-launch-mib {args.lean_launch_mib}: at least 16 bytes a launch")
    if blocks_of:
        lean["kernel"] = torch.cuda._compile_kernel(LEAN_SOURCE, "lean_copy")
        for b in blocks_of:
            for m in [None, *launch_mib]:
                name = f"lean{b}" if m is None else f"lean{b}p{m:g}"
                streams[name] = side
                # (blocks, bytes a launch): a whole piece, or M MiB in 16-byte words
                lean[name] = (b, CHUNK if m is None else int(m * (1 << 20)) // 16 * 16)
                routes.append(f"{name}-managed")
    threads_of = {
        f"staged{t}": int(t) for t in (x.strip() for x in args.staged_threads.split(",")) if t
    }
    for name in threads_of:
        streams[name] = side
        routes += [f"{name}-managed", f"{name}-pinned"]
    pieces = chunks(total, CHUNK, RING)
    rows: list[dict[str, Any]] = []
    with cuda.fresh(total) as ptr, torch.inference_mode():
        cuda.advise_host(ptr, total)
        cuda.prefetch(ptr, total, HOST)
        cuda.sync()
        managed = torch.as_tensor(Span(ptr, total), device="cuda").view(torch.uint8)
        managed.fill_(1)  # pages in host RAM that hold data (written by the GPU in place)
        pinned.fill_(2)
        # Kernels read page-locked memory through a device view of it (zero copy).
        pinned_view = torch.as_tensor(Span(pinned.data_ptr(), total), device="cuda")
        sources = {"managed": managed, "pinned": pinned}
        kernel_sources = {"managed": managed, "pinned": pinned_view.view(torch.uint8)}
        # The host pages of the same managed memory, as a CPU tensor (the staged routes).
        host_view = torch.frombuffer((ctypes.c_uint8 * total).from_address(ptr), dtype=torch.uint8)
        staged_from = {"managed": host_view, "pinned": pinned}
        staged = Staged(torch, host_view, ring, side) if threads_of else None

        def queue(route: str, some: list[tuple[int, int, int]]) -> None:
            """Queue the pieces ``some`` on the side stream by ``route``, after the compute
            stream's work so far."""
            if route == "none" or not some:
                return
            how, where = route.split("-")
            src = sources[where] if how == "memcpy" else kernel_sources[where]
            stream = streams[how]
            stream.wait_stream(torch.cuda.current_stream())
            if how in ("batch", "overlap"):
                base = ring.data_ptr()
                cuda.copy_batch(
                    [(base + r, src.data_ptr() + s, n) for s, r, n in some],
                    stream.cuda_stream,
                    src=HOST,
                    overlap=how == "overlap",
                )
                return
            if how.startswith("staged"):
                assert staged is not None
                staged.host = staged_from[where]
                staged.put(some)
                return
            if how.startswith("lean"):
                blocks, step = lean[how]
                for s, r, n in some:
                    for a in range(0, n, step):
                        m = min(step, n - a)
                        lean["kernel"](
                            grid=(blocks, 1, 1),
                            block=(1024, 1, 1),
                            args=[ring[r + a : r + a + m], src[s + a : s + a + m], m // 16],
                            stream=stream,
                        )
                return
            with torch.cuda.stream(stream):
                for s, r, n in some:
                    dst, part = ring[r : r + n], src[s : s + n]
                    if how == "memcpy":
                        dst.copy_(part, non_blocking=True)
                    else:
                        torch._foreach_copy_([dst], [part])

        def sync() -> None:
            """Wait for the device: green contexts' streams too, which a device-wide
            synchronisation of the primary context may not cover."""
            if staged is not None:
                staged.drain()
            torch.cuda.synchronize()
            for st in streams.values():
                st.synchronize()

        def copied_right(route: str) -> bool | None:
            """Whether the route's copies, alone, leave the ring holding the source's bytes."""
            if route == "none":
                return None
            ring.zero_()
            sync()
            copies(route)()
            sync()
            want = 1 if route.endswith("managed") else 2
            return bool(ring[: min(total, RING)].eq(want).all())

        def copies(route: str) -> Callable[[], None]:
            return lambda: queue(route, pieces)

        def forward() -> None:
            model(ids)

        blocks = list(model.transformer.h)
        share = -(-len(pieces) // len(blocks))
        issue: dict[str, Any] = {"route": "none"}

        def copy_share(i: int) -> Callable[[Any, Any], None]:
            """Block i's pre-hook: queue its share of the pieces (the streamer's way)."""
            return lambda _block, _args: queue(issue["route"], pieces[i * share : (i + 1) * share])

        hooks = [blk.register_forward_pre_hook(copy_share(i)) for i, blk in enumerate(blocks)]

        def timed(start: Callable[[], None]) -> tuple[float, float]:
            """(compute stream seconds, host seconds until the forward returns)."""
            begin = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            begin.record()
            t0 = time.perf_counter()
            start()
            forward()
            host = time.perf_counter() - t0
            end.record()  # the compute stream's own end, not the copies'
            sync()
            return begin.elapsed_time(end) / 1e3, host

        for route in routes:
            how = route.split("-")[0]
            if how in threads_of:
                assert staged is not None
                staged.threads = threads_of[how]
            start = copies(route)
            fwd, alone, host, fwd_in, host_in = [], [], [], [], []
            for rep in range(args.reps + 1):  # rep 0 warms up
                sync()
                t0 = time.perf_counter()
                start()
                sync()
                t1 = time.perf_counter()
                fw, hw = timed(start)
                issue["route"] = route  # the same copies, from the blocks' pre-hooks
                try:
                    fi, hi = timed(lambda: None)
                finally:
                    issue["route"] = "none"
                if rep:
                    alone.append(t1 - t0)
                    fwd.append(fw)
                    host.append(hw)
                    fwd_in.append(fi)
                    host_in.append(hi)
            row: dict[str, Any] = {
                "route": route,
                "copies_alone_s": statistics.median(alone),
                "forward_with_copies_s": statistics.median(fwd),
                "host_s": statistics.median(host),
                "forward_copies_in_forward_s": statistics.median(fwd_in),
                "host_copies_in_forward_s": statistics.median(host_in),
                "copy_gb_s": total / statistics.median(alone) / 1e9 if route != "none" else None,
                "copied_right": copied_right(route),
            }
            rows.append(row)
            gbs = f"{row['copy_gb_s']:.1f} GB/s" if row["copy_gb_s"] else "-"
            print(
                f"{route:15s} forward with copies {row['forward_with_copies_s'] * 1e3:7.2f} ms "
                f"(host {row['host_s'] * 1e3:6.2f} ms); issued during it "
                f"{row['forward_copies_in_forward_s'] * 1e3:7.2f} ms "
                f"(host {row['host_copies_in_forward_s'] * 1e3:6.2f} ms); "
                f"copies alone {row['copies_alone_s'] * 1e3:7.2f} ms ({gbs}); "
                f"right: {row['copied_right']}",
                flush=True,
            )
        for hook in hooks:
            hook.remove()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bytes": total, "chunk": CHUNK, "ring": RING, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
