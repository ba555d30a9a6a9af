"""Which page histories make the driver's eviction fast, straight through libcudart.

The engine evicts live managed data by prefetch to the CPU, at about 3 GB/s into host pages a
range never had and 10-12 GB/s into pages it had before (Note [First evictions], Residency.h).
A module class's second step spends most of its time on such first evictions (4.5-6.6 GiB,
docs/notes/step-57-victims-as-runs.md). This probe asks which histories count as "had
pages before", each on a fresh range advised as the engine advises every segment
(PreferredLocation=host, AccessedBy=GPU), then placed on the GPU, written there by a
kernel, and evicted (timed):

- ``fresh``: placed on the GPU straight from cudaMallocManaged (what PlaceOnDevice does);
- ``cpu-made``: its host pages made first by CPU threads (what MapHost does), then
  prefetched to the GPU;
- ``evicted-before``: evicted once before (the warm case of the engine's counters);
- ``discarded-on-gpu``: evicted once, then brought back, discarded on the GPU and placed
  again (a chunk that died and was handed out again);
- ``cpu-made-discarded``: ``cpu-made``, then discarded on the GPU and placed again.

Also: how fast the CPU threads make the pages, the prefetch of a ``cpu-made`` range to the
GPU, and the process's resident host memory with the range on the GPU (does the driver keep
the host pages?). Run on the GPU host:

    python3 -m bench.probes.warm_pages_probe [GiB] [--json FILE]

It refuses to run if a range of GiB is more than 80 % of the free GPU memory (one range
exists at a time). Prints one line per history.
"""

from __future__ import annotations

import ctypes
import json
import sys
from collections.abc import Callable

from bench.common import command_line, machine
from bench.host_memory import rss_bytes
from bench.probes.evict_routes import DEVICE, HOST, GiB, ranges_setup, timed
from bench.probes.populate_probe import cpu_memset


def main(argv: list[str] | None = None) -> int:
    args, cuda, n = ranges_setup(__doc__, argv, 2, 1)
    rt = cuda.rt
    side = cuda.stream()  # the engine discards on a side stream
    rows: dict[str, float] = {}
    facts: dict[str, float] = {}

    def gbps(fn: Callable[[], object]) -> float:
        return n / timed(cuda, fn) / 1e9

    def discard(ptr: int) -> None:
        cuda.discard(ptr, n, side)

    def on_gpu(ptr: int, value: int) -> None:
        cuda.prefetch(ptr, n, DEVICE)
        cuda.check(rt.cudaMemset(ptr, value, n), "cudaMemset")
        cuda.sync()

    def history(name: str, prepare: Callable[[int], None]) -> None:
        with cuda.fresh(n) as ptr:
            cuda.advise_host(ptr, n)  # as the engine advises every segment
            prepare(ptr)
            on_gpu(ptr, 7)
            facts[f"{name}: host RSS with the range on the GPU, GiB"] = rss_bytes() / GiB
            rows[f"{name}: evict"] = gbps(lambda: cuda.prefetch(ptr, n, HOST))
            check = (ctypes.c_ubyte * 4096)()
            cuda.check(rt.cudaMemcpy(check, ptr + n - 4096, 4096, 0), "cudaMemcpy")
            if any(x != 7 for x in check):
                raise SystemExit(f"{name}: data wrong after the eviction")
            # The same range again: a second eviction with the same history.
            on_gpu(ptr, 9)
            rows[f"{name}: evict again"] = gbps(lambda: cuda.prefetch(ptr, n, HOST))

    def cpu_made(ptr: int) -> None:
        rows["cpu-made: make host pages, 8 threads"] = gbps(cpu_memset(ptr, n, 8))
        rows["cpu-made: prefetch to the GPU"] = gbps(lambda: cuda.prefetch(ptr, n, DEVICE))

    def evicted_before(ptr: int) -> None:
        on_gpu(ptr, 1)
        cuda.prefetch(ptr, n, HOST)
        cuda.sync()

    def discarded_on_gpu(ptr: int) -> None:
        evicted_before(ptr)
        on_gpu(ptr, 2)
        discard(ptr)
        cuda.sync()

    def cpu_made_discarded(ptr: int) -> None:
        cpu_memset(ptr, n, 8)()
        on_gpu(ptr, 3)
        discard(ptr)
        cuda.sync()

    facts["host RSS at start, GiB"] = rss_bytes() / GiB
    failed = []
    for name, prepare in (
        ("fresh", lambda ptr: None),
        ("cpu-made", cpu_made),
        ("evicted-before", evicted_before),
        ("discarded-on-gpu", discarded_on_gpu),
        ("cpu-made-discarded", cpu_made_discarded),
    ):
        try:
            history(name, prepare)
        except RuntimeError as e:  # a CUDA call refused: say which, keep the others
            failed.append(f"{name}: {e}")
            print(f"{name}: {e}")
    for name, r in rows.items():
        print(f"{name:48s} {r:8.1f} GB/s")
    for name, v in facts.items():
        print(f"{name:60s} {v:6.2f}")
    if args.json:
        with open(args.json, "w") as f:
            import torch  # loaded already (the CUDA libraries came with it)

            head = {
                "command": command_line("bench.probes.warm_pages_probe"),
                "machine": machine(torch),
            }
            record = {**head, "gib": args.gib, "rows": rows, "facts": facts, "failed": failed}
            json.dump(record, f, indent=1)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
