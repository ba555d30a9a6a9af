"""Do two ranks' transfers slow each other down? (issue 8's DDP bar: each rank within 1.2x
of the single-GPU time at the same budget.)

    python -m bench.probes.ranks_probe [GiB] [--json FILE]      # on a host with 2 GPUs

Each route runs in one worker process per GPU (CUDA_VISIBLE_DEVICES, as DDP runs one
process per rank), first on GPU 0 alone and then on GPUs 0 and 1 at once; the workers set
up, then start each timed repetition together on the parent's word. Routes, GiB each
(default 2):

- ``h2d``, ``d2h``: page-locked copies to and from ``cudaMalloc`` memory (a copy engine);
- ``evict``: a managed range that lives on the GPU, prefetched to the host (how the
  engine evicts: the driver's migration, paid on the calling CPU thread);
- ``fetch``: the same range prefetched back to the GPU.

Per route it prints each worker's GB/s alone and together (median of REPEATS) and the
ratio: 1.0 means the ranks do not share what bounds the route. Managed ranges are raw
``cudaMallocManaged`` memory, one per worker, refused past 80 % of free GPU memory.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

GiB = 1 << 30
ROUTES = ("h2d", "d2h", "evict", "fetch")
REPEATS = 3


# ---------------------------------------------------------------- pure parts (unit tested)


def compare(
    alone: dict[str, list[float]], together: list[dict[str, list[float]]], nbytes: int
) -> list[dict[str, Any]]:
    """One row per route: GB/s alone (GPU 0) and per worker together, medians of the
    repetitions' seconds, and the slowest worker's GB/s together over alone's."""
    rows = []
    for route in ROUTES:
        gbs_alone = nbytes / statistics.median(alone[route]) / 1e9
        each = [nbytes / statistics.median(w[route]) / 1e9 for w in together]
        rows.append(
            {
                "route": route,
                "alone_gb_s": gbs_alone,
                "together_gb_s": each,
                "together_over_alone": min(each) / gbs_alone,
            }
        )
    return rows


# ---------------------------------------------------------------- worker (GPU host)


def worker(nbytes: int) -> None:
    """Set up on this process's GPU, then time one route per line read from stdin."""
    import torch

    from bench.probes.evict_routes import DEVICE, HOST, Cuda, timed

    cuda = Cuda()
    if nbytes > 0.8 * cuda.free_bytes():
        raise SystemExit(f"{nbytes / GiB:.1f} GiB is more than 80 % of free GPU memory")
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    with cuda.fresh(nbytes) as ptr:
        cuda.prefetch(ptr, nbytes, DEVICE)
        cuda.check(cuda.rt.cudaMemset(ptr, 1, nbytes), "cudaMemset")  # pages that hold data
        cuda.sync()
        # route: (untimed set-up that puts the pages where the route starts, timed part)
        routes = {
            "h2d": (None, lambda: dev.copy_(host, non_blocking=True)),
            "d2h": (None, lambda: host.copy_(dev, non_blocking=True)),
            "evict": (DEVICE, lambda: cuda.prefetch(ptr, nbytes, HOST)),
            "fetch": (HOST, lambda: cuda.prefetch(ptr, nbytes, DEVICE)),
        }
        timed(cuda, routes["h2d"][1])  # warm-up
        print("ready", flush=True)
        for line in sys.stdin:
            words = line.split()
            start, go = routes[words[-1]]
            if words[0] == "setup":
                if start is not None:
                    cuda.prefetch(ptr, nbytes, start)
                    cuda.sync()
                print("set", flush=True)
                continue
            print(json.dumps({"route": words[0], "s": timed(cuda, go)}), flush=True)


def _ask(
    procs: list[subprocess.Popen[str]], word: str | None, expect: str | None = None
) -> list[str]:
    """Send ``word`` to every worker (None: nothing), then read one line from each; with
    ``expect``, each line must be that word."""

    def stopped(p: subprocess.Popen[str]) -> SystemExit:
        return SystemExit(f"a worker stopped at {word or 'set-up'} (exit status {p.wait()})")

    for p in procs:
        if word is not None:
            assert p.stdin is not None
            try:
                p.stdin.write(word + "\n")
                p.stdin.flush()
            except BrokenPipeError:
                raise stopped(p) from None
    lines = []
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline()
        if not line:
            raise stopped(p)
        if expect is not None and line.strip() != expect:
            raise SystemExit(f"a worker answered {line.strip()!r} to {word or 'set-up'}")
        lines.append(line)
    return lines


def _run(gpus: list[int], nbytes: int) -> list[dict[str, list[float]]]:
    """Workers on ``gpus``; every route REPEATS times, started together each time."""
    procs = []
    for gpu in gpus:
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": str(gpu)}
        cmd = [sys.executable, "-m", "bench.probes.ranks_probe", "--worker", str(nbytes)]
        procs.append(
            subprocess.Popen(cmd, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        )
    try:
        _ask(procs, None, expect="ready")
        times: list[dict[str, list[float]]] = [{r: [] for r in ROUTES} for _ in procs]
        for route in ROUTES:
            for _ in range(REPEATS):
                # every worker set up before any starts
                _ask(procs, f"setup {route}", expect="set")
                for k, line in enumerate(_ask(procs, route)):
                    times[k][route].append(json.loads(line)["s"])
        return times
    finally:
        for p in procs:
            if p.stdin is not None:
                p.stdin.close()
        for p in procs:
            p.wait(timeout=60)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("gib", nargs="?", type=float, default=2.0)
    ap.add_argument("--json", help="write the rows here")
    ap.add_argument("--worker", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker is not None:
        worker(args.worker)
        return 0
    nbytes = int(args.gib * GiB) // (2 << 20) * (2 << 20)
    alone = _run([0], nbytes)[0]
    together = _run([0, 1], nbytes)
    rows = compare(alone, together, nbytes)
    for r in rows:
        each = ", ".join(f"{g:.1f}" for g in r["together_gb_s"])
        print(
            f"{r['route']:6s} alone {r['alone_gb_s']:6.1f} GB/s, together {each} GB/s "
            f"({r['together_over_alone']:.2f} of alone)"
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bytes": nbytes, "repeats": REPEATS, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
