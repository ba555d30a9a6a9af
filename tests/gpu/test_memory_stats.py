"""Where tools look for memory: the engine's counters in torch.cuda.memory_stats() and
memory_summary() past a device budget (Note [UM counters where tools look for memory],
torch/cuda/_um_memstats.py), both exactly stock's with UM off, and the allocator settings'
interplay (expandable segments ignored with one warning) from either variable torch reads.

Every test runs under the suite's cap (max_managed <= 80 % of free memory at start);
oversubscription is against a device budget of 256 MiB only, and each child process gets
its own cap from subprocess_env.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

from tests.gpu.conftest import Limits, MiB, release_cache, run_child, subprocess_env

torch = pytest.importorskip("torch")

BUDGET = 256 * MiB
UM_KEYS = {
    "um.managed_bytes",
    "um.device_bytes",
    "um.host_bytes",
    "um.device_budget_bytes",
    "um.total_managed_bytes",
    "um.evicted_bytes",
    "um.discarded_bytes",
    "um.brought_back_bytes",
    "um.cap_refusals",
    "um.headroom_refusals",
}


def _child(code: str, env: dict[str, str]) -> dict[str, Any]:
    """Runs code in a fresh interpreter; its last stdout line is JSON."""
    got: dict[str, Any] = json.loads(run_child(code, env).stdout.strip().splitlines()[-1])
    return got


def test_memory_stats_carry_the_um_counters_past_the_budget(
    torch_mod: Any, um: Any, limits: Limits
) -> None:
    release_cache(torch)
    um.configure(device_budget=BUDGET, policy="lru", discard=True)
    tensors = [torch.full((32 * MiB,), float(i), device="cuda") for i in range(4)]  # 512 MiB
    for i, t in enumerate(tensors):  # every one read again: some in place from host RAM
        assert float(t[-1]) == float(i)
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    engine = um.stats()
    print({k: stats[k] for k in sorted(UM_KEYS)})
    assert UM_KEYS <= set(stats), sorted(set(stats) - UM_KEYS)
    assert list(stats) == sorted(stats)  # upstream's order, the um keys sorted in
    assert stats["allocated_bytes.all.current"] >= 512 * MiB  # upstream's keys as before
    assert stats["um.device_budget_bytes"] == BUDGET
    assert stats["um.managed_bytes"] >= 512 * MiB
    assert stats["um.managed_bytes"] == engine["um.managed_bytes"]
    assert stats["um.host_bytes"] > 0, "nothing in host RAM: the test did not go past the budget"
    assert stats["um.device_bytes"] <= BUDGET
    assert stats["um.device_bytes"] + stats["um.host_bytes"] <= stats["um.managed_bytes"]
    assert stats["um.total_managed_bytes"] <= limits.cap
    nested = torch.cuda.memory_stats_as_nested_dict()
    assert nested["um"]["managed_bytes"] == stats["um.managed_bytes"]
    assert isinstance(nested["allocated_bytes"], dict)
    summary = torch.cuda.memory_summary()
    assert "PyTorch CUDA memory summary" in summary
    assert "Unified memory (torch.cuda.um)" in summary and "in host RAM" in summary
    section = summary[summary.index("| Unified memory (torch.cuda.um)") :].splitlines()
    assert all(len(line) == 77 for line in section), section  # in upstream's frame
    # None of the um keys is a peak: resetting upstream's peaks leaves them be.
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    again = torch.cuda.memory_stats()
    assert again["um.managed_bytes"] == stats["um.managed_bytes"]
    del tensors


READ_STATS = """
import json, torch
x = torch.ones(8 << 20, device="cuda")
y = torch.ones(1 << 10, device="cuda")
torch.cuda.synchronize()
stats = torch.cuda.memory_stats()
nested = torch.cuda.memory_stats_as_nested_dict()
summary = torch.cuda.memory_summary()
um = getattr(torch.cuda, "um", None)
print(json.dumps({
    "keys": sorted(stats), "nested": sorted(nested), "summary_lines": len(summary.splitlines()),
    "um_section": "Unified memory" in summary, "stock": um is None,
    "managed": None if um is None else um.is_managed(x),
}))
"""


def test_memory_stats_unchanged_with_um_off_and_as_in_stock(
    torch_mod: Any, um: Any, limits: Limits
) -> None:
    off = _child(READ_STATS, subprocess_env(limits, PYTORCH_CUDA_UM_CONF="enabled:False"))
    assert off["managed"] is False
    assert not any(k.startswith("um.") for k in off["keys"]) and "um" not in off["nested"]
    assert off["um_section"] is False
    on = _child(READ_STATS, subprocess_env(limits))
    assert on["managed"] is True and UM_KEYS <= set(on["keys"]) and on["um_section"] is True
    assert set(on["keys"]) - UM_KEYS == set(off["keys"])
    stock_path = os.environ.get("TORCH_UM_STOCK_PYTHONPATH")
    if stock_path is None:
        pytest.skip("set by tests/gpu/run_on_device.sh: the stock reference")
    env = subprocess_env(limits)
    env["PYTHONPATH"] = stock_path
    stock = _child(READ_STATS, env)
    assert stock["stock"] is True
    assert stock["keys"] == off["keys"] and stock["nested"] == off["nested"]
    assert stock["summary_lines"] == off["summary_lines"]


EXPANDABLE = """
import json, warnings, torch
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    small = torch.ones(1 << 10, device="cuda")
    large = torch.ones(64 << 20, device="cuda")  # a large-pool segment
    torch.cuda.synchronize()
said = [str(w.message) for w in caught if "expandable_segments" in str(w.message)]
print(json.dumps({"warnings": said, "managed": [torch.cuda.um.is_managed(small),
                                                torch.cuda.um.is_managed(large)]}))
"""


@pytest.mark.parametrize("var", ["PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF"])
def test_expandable_segments_ignored_with_one_warning_from_either_variable(
    torch_mod: Any, um: Any, limits: Limits, var: str
) -> None:
    env = subprocess_env(limits, **{var: "expandable_segments:True"})
    other = "PYTORCH_CUDA_ALLOC_CONF" if var == "PYTORCH_ALLOC_CONF" else "PYTORCH_ALLOC_CONF"
    env.pop(other, None)
    on = _child(EXPANDABLE, env)
    assert len(on["warnings"]) == 1, on["warnings"]
    assert "is ignored" in on["warnings"][0]
    assert on["managed"] == [True, True]
    # UM off: the program's expandable segments are used, and nothing is said.
    env["PYTORCH_CUDA_UM_CONF"] = "enabled:False"
    off = _child(EXPANDABLE, env)
    assert off["warnings"] == [] and off["managed"] == [False, False]
