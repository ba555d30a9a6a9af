"""How fast a device buffer is filled from, and written back into, managed memory that
lives in host RAM, by a copy (``copy_``: cudaMemcpyAsync) and by a kernel
(``torch._foreach_copy_``), one direction at a time, both at once on two streams, and
both in one foreach launch; and the same for page-locked host memory (issue 8, Note
[Optimizer state staging]: the optimizer state is staged this way).

    python -m bench.probes.stage_routes_probe        # on the GPU host, a +um torch

Two 1 GiB managed tensors moved to host RAM with torch.cuda.um.prefetch before each
measurement, two on the device (4 GiB managed in all, max_managed at 80 % of free memory).
Per route it prints GB/s per direction and, for managed memory, whether the host tensors
were still in host RAM afterwards (a full read under 2 ms means the route migrated them
to the GPU instead of reading them in place; page-locked memory cannot move: null).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import torch

from bench.common import GiB, safe_cap

SIZE = GiB


def _timed(fn: Callable[[], object]) -> float:
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main() -> int:
    um = torch.cuda.um
    _free, _total, cap = safe_cap(torch)
    um.configure(enabled=True, max_managed=cap, device_budget="90%")
    host = [torch.full((SIZE // 4,), 1.5, device="cuda") for _ in range(2)]
    dev = [torch.full((SIZE // 4,), 1.5, device="cuda") for _ in range(2)]
    pinned = [torch.empty(SIZE // 4, pin_memory=True).fill_(1.5) for _ in range(2)]
    side = torch.cuda.Stream()

    def both(fn: Callable[[torch.Tensor, torch.Tensor], object], src: list[torch.Tensor]) -> None:
        fn(dev[0], src[0])  # in
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn(src[1], dev[1])  # out, at the same time
        torch.cuda.current_stream().wait_stream(side)

    # non_blocking: a copy between page-locked and device memory otherwise waits on the
    # host for its end, and the second direction would start only after the first.
    def memcpy(dst: torch.Tensor, src: torch.Tensor) -> None:
        dst.copy_(src, non_blocking=True)

    def kernel(dst: torch.Tensor, src: torch.Tensor) -> None:
        torch._foreach_copy_([dst], [src], non_blocking=True)

    routes: dict[str, Callable[[], object]] = {
        "copy_ in (memcpy)": lambda: memcpy(dev[0], host[0]),
        "kernel in (_foreach_copy_)": lambda: kernel(dev[0], host[0]),
        "copy_ out (memcpy)": lambda: memcpy(host[1], dev[1]),
        "kernel out (_foreach_copy_)": lambda: kernel(host[1], dev[1]),
        "copy_ in and out at once": lambda: both(memcpy, host),
        "kernel in and out at once": lambda: both(kernel, host),
        "kernel in and out, one launch": lambda: torch._foreach_copy_(
            [dev[0], host[1]], [host[0], dev[1]]
        ),
        # Page-locked host memory instead of managed memory in host RAM: does the link
        # run both ways at once for it?
        "page-locked copy_ in": lambda: memcpy(dev[0], pinned[0]),
        "page-locked copy_ out": lambda: memcpy(pinned[1], dev[1]),
        "page-locked copy_ in and out at once": lambda: both(memcpy, pinned),
        "page-locked kernel in and out at once": lambda: both(kernel, pinned),
    }
    rows = []
    for name, fn in routes.items():
        for _ in range(2):  # the first of each pair warms the route up
            um.prefetch(host, "cpu")
            torch.cuda.synchronize()
            seconds = _timed(fn)
        rate = round(SIZE / seconds / 1e9, 1)  # per direction
        in_ram = None  # page-locked memory cannot move
        if not name.startswith("page-locked"):
            in_ram = min(_timed(t.sum) for t in host) > 0.002
        rows.append({"route": name, "GB/s each way": rate, "still_in_host_ram": in_ram})
        print(f"{name:40s} {rate:6.1f} GB/s each way  host after: {in_ram}")
    assert all(float(t[:4].sum()) == 6.0 for t in (*host, *dev, *pinned))
    print(json.dumps({"probe": "stage_routes", "rows": rows}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
