"""Listing 1 of Choi et al. (ACSOS-C 2021), scaled to a device budget.

A CPU tensor twice the device budget is copied to the GPU and squared on both
sides; the results are equal. With UM off and a stock memory fraction equal to
the budget, the same program raises torch.OutOfMemoryError. Device-resident
bytes stay within the budget throughout (engine statistics), and cudaMemGetInfo
within the budget plus what the engine has evicted: the UVM driver keeps the
GPU memory it evicted pages from for its own reuse, so eviction does not show
as free memory there (measured: 4 GiB evicted, cudaMemGetInfo unchanged, while
a full read of the tensor went from 1.1 ms to 84 ms, i.e. over PCIe).
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.gpu.conftest import GiB, Limits

torch = pytest.importorskip("torch")

# Non-managed device memory the process may add meanwhile (cuBLAS/CUDA
# context growth, small segments): the slack of the cudaMemGetInfo check.
SLACK = 1 * GiB


def _device_resident(um: Any) -> int:
    s = um.stats()
    return s["um.device_placed_bytes"] + s["um.unplaced_bytes"]


def test_listing1_oversubscribed(torch_mod: Any, um: Any, limits: Limits) -> None:
    budget = limits.budget
    n = 2 * budget // 4  # float32 elements: 2x the budget
    x_cpu = torch.empty(n, dtype=torch.float32).uniform_(-4, 4)

    # Stock behaviour at the same budget: OutOfMemoryError.
    um.configure(enabled=False)
    torch.cuda.empty_cache()
    torch.cuda.set_per_process_memory_fraction(budget / limits.total)
    with pytest.raises(torch.OutOfMemoryError):
        x_cpu.cuda()
    torch.cuda.set_per_process_memory_fraction(1.0)

    # Unified memory: the same program runs.
    um.configure(enabled=True, device_budget=budget, max_managed=limits.cap)
    torch.cuda.empty_cache()
    free0, _ = torch.cuda.mem_get_info()
    samples: list[tuple[str, int, int]] = []

    evicted0 = um.stats()["um.evict_bytes"]

    def sample(what: str) -> None:
        torch.cuda.synchronize()
        free, _ = torch.cuda.mem_get_info()
        evicted = um.stats()["um.evict_bytes"] - evicted0
        samples.append((what, free0 - free - evicted, _device_resident(um)))

    t0 = time.perf_counter()
    x = x_cpu.cuda()
    sample("after copy to GPU")
    t1 = time.perf_counter()
    y = x * x
    sample("after square on GPU")
    t2 = time.perf_counter()
    assert um.is_managed(x) and um.is_managed(y)
    assert um.stats()["um.managed_bytes"] >= 2 * x.nbytes
    y_host = y.cpu()
    del x, y
    ref = x_cpu.square_()
    assert torch.equal(y_host, ref), "GPU square under unified memory differs from CPU square"
    for what, used, resident in samples:
        print(
            f"[listing1] {what}: cudaMemGetInfo used less evicted +{used / GiB:.2f} GiB, "
            f"engine device-resident {resident / GiB:.2f} GiB, budget {budget / GiB:.2f} GiB"
        )
        assert resident <= budget, (what, resident, budget)
        assert used <= budget + SLACK, (what, used, budget)
    print(
        f"[listing1] {2 * budget / GiB:.1f} GiB tensor, budget {budget / GiB:.1f} GiB: "
        f"copy {t1 - t0:.2f} s, square {t2 - t1:.2f} s"
    )
