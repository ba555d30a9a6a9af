"""The engine's counters in torch.cuda.memory_stats() and memory_summary()
(torch/cuda/_um_memstats.py, Note [UM counters where tools look for memory]), installed on a
stand-in of upstream's torch.cuda.memory: the keys and the section while UM is on, exactly
upstream's results (the same objects) while it is off or before CUDA is initialised."""

from __future__ import annotations

import collections
import types
from collections.abc import Mapping
from typing import Any

import pytest

from .helpers import load_overlay_module

GiB = 1 << 30
MiB = 1 << 20

memstats = load_overlay_module("torch/cuda/_um_memstats.py", "um_memstats_under_test")

UPSTREAM_NESTED = {
    "allocated_bytes": {"all": {"current": 512, "peak": 1024}},
    "num_ooms": 0,
}
UPSTREAM_SUMMARY = "|" + "=" * 75 + "|\n| upstream's table |\n|" + "=" * 75 + "|\n"

ENGINE = {
    "um.enabled": 1,
    "um.managed_segments": 3,
    "um.managed_bytes": 3 * GiB,
    "um.device_placed_bytes": GiB,
    "um.host_placed_bytes": 2 * GiB,
    "um.device_budget_bytes": GiB,
    "um.total_managed_bytes": 3 * GiB,
    "um.evict_bytes": 5 * GiB,
    "um.discard_bytes": 64 * MiB,
    "um.touch_prefetch_bytes": 4 * GiB,
    "um.cap_refusals": 1,
    "um.headroom_refusals": 0,
}


def _upstream(*, initialised: bool = True, flattens_global: bool = True) -> types.ModuleType:
    """A module shaped as upstream's torch/cuda/memory.py is: memory_stats flattens what the
    module's memory_stats_as_nested_dict returns (looked up at call time) and sorts it."""
    mod = types.ModuleType("stand_in_memory")
    calls: list[Any] = []

    def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
        calls.append(device)
        return {k: v for k, v in UPSTREAM_NESTED.items()} if initialised else {}

    def flatten(nested: Mapping[str, Any]) -> collections.OrderedDict[str, Any]:
        out: list[tuple[str, Any]] = []

        def walk(prefix: str, obj: Any) -> None:
            if isinstance(obj, dict):
                for k, v in obj.items():
                    walk(f"{prefix}.{k}" if prefix else k, v)
            else:
                out.append((prefix, obj))

        walk("", nested)
        return collections.OrderedDict(sorted(out))

    if flattens_global:

        def memory_stats(device: Any = None) -> collections.OrderedDict[str, Any]:
            return flatten(mod.memory_stats_as_nested_dict(device=device))

    else:
        own_nested = memory_stats_as_nested_dict

        def memory_stats(device: Any = None) -> collections.OrderedDict[str, Any]:
            return flatten(own_nested(device=device))

    def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
        return UPSTREAM_SUMMARY

    mod.memory_stats_as_nested_dict = memory_stats_as_nested_dict  # type: ignore[attr-defined]
    mod.memory_stats = memory_stats  # type: ignore[attr-defined]
    mod.memory_summary = memory_summary  # type: ignore[attr-defined]
    mod.calls = calls  # type: ignore[attr-defined]
    return mod


def _install(engine: Mapping[str, int] | None, **kw: bool) -> tuple[Any, Any, list[Any]]:
    memory = _upstream(**kw)
    namespace = types.ModuleType("stand_in_cuda")
    for name in ("memory_stats", "memory_stats_as_nested_dict", "memory_summary"):
        setattr(namespace, name, getattr(memory, name))
    reads: list[Any] = []

    def read(device: Any) -> Mapping[str, int] | None:
        reads.append(device)
        return engine

    memstats.install(memory, namespace, read)
    return memory, namespace, reads


EXPECTED = {
    "um.managed_bytes": 3 * GiB,
    "um.device_bytes": GiB,
    "um.host_bytes": 2 * GiB,
    "um.device_budget_bytes": GiB,
    "um.total_managed_bytes": 3 * GiB,
    "um.evicted_bytes": 5 * GiB,
    "um.discarded_bytes": 64 * MiB,
    "um.brought_back_bytes": 4 * GiB,
    "um.cap_refusals": 1,
    "um.headroom_refusals": 0,
}


@pytest.mark.parametrize("flattens_global", [True, False])
def test_memory_stats_carry_the_um_keys_sorted_in(flattens_global: bool) -> None:
    _, namespace, reads = _install(ENGINE, flattens_global=flattens_global)
    stats = namespace.memory_stats(1)
    for key, value in EXPECTED.items():
        assert stats[key] == value
    assert stats["allocated_bytes.all.peak"] == 1024 and stats["num_ooms"] == 0
    assert list(stats) == sorted(stats)
    assert set(stats) == set(EXPECTED) | {"allocated_bytes.all.current",
                                          "allocated_bytes.all.peak", "num_ooms"}
    assert reads and all(d == 1 for d in reads)
    nested = namespace.memory_stats_as_nested_dict(device=1)
    assert nested["um"] == {k.removeprefix("um."): v for k, v in EXPECTED.items()}
    assert nested["allocated_bytes"] == UPSTREAM_NESTED["allocated_bytes"]


def test_unchanged_when_the_engine_has_nothing_to_show() -> None:
    """UM off with no managed segment (the reader says None): the same objects as upstream's,
    and the engine is asked once a call."""
    _, namespace, reads = _install(None)
    nested = namespace.memory_stats_as_nested_dict()
    assert nested == UPSTREAM_NESTED and "um" not in nested
    assert namespace.memory_summary() is UPSTREAM_SUMMARY
    assert not any(k.startswith("um.") for k in namespace.memory_stats())
    assert len(reads) == 3


def test_before_cuda_is_initialised_nothing_is_read() -> None:
    _, namespace, reads = _install(ENGINE, initialised=False)
    assert namespace.memory_stats_as_nested_dict() == {}
    assert dict(namespace.memory_stats()) == {}
    assert reads == []


def test_summary_gains_a_section_in_upstreams_frame() -> None:
    _, namespace, _ = _install(ENGINE)
    text = namespace.memory_summary(0, abbreviated=True)
    assert text.startswith(UPSTREAM_SUMMARY)
    section = text[len(UPSTREAM_SUMMARY):]
    lines = section.splitlines()
    assert section.endswith("|\n")
    assert all(len(line) == 77 and line[0] == "|" and line[-1] == "|" for line in lines), lines
    body = " ".join(section.split())
    assert "Unified memory (torch.cuda.um)" in body
    assert "Managed memory on this GPU 3072 MiB" in body
    assert "on the device 1024 MiB" in body and "in host RAM 2048 MiB" in body
    assert "Evicted to host RAM (total) 5120 MiB" in body
    assert "(max_managed / host_headroom) 1 / 0" in body


def test_installed_once_with_upstreams_names_and_docs() -> None:
    memory, namespace, _ = _install(ENGINE)
    first = memory.memory_summary
    memstats.install(memory, namespace, lambda device: ENGINE)
    assert memory.memory_summary is first and namespace.memory_summary is first
    assert first.__name__ == "memory_summary"
    assert memory.memory_stats_as_nested_dict.__name__ == "memory_stats_as_nested_dict"
    # memory_stats itself is left alone where it reads the nested dict through the global
    assert not getattr(memory.memory_stats, memstats.MARK, False)


def test_a_name_rebound_elsewhere_is_left_alone() -> None:
    memory = _upstream()
    namespace = types.ModuleType("stand_in_cuda")
    namespace.memory_summary = lambda *a, **k: "someone else's"  # type: ignore[attr-defined]
    memstats.install(memory, namespace, lambda device: ENGINE)
    assert namespace.memory_summary() == "someone else's"


@pytest.mark.parametrize(
    ("stats", "shown"),
    [
        ({"um.enabled": 1, "um.managed_segments": 0}, True),
        ({"um.enabled": 0, "um.managed_segments": 2}, True),  # UM switched off, segments left
        ({"um.enabled": 0, "um.managed_segments": 0}, False),
    ],
)
def test_shown_while_on_or_while_managed_segments_remain(stats: dict[str, int], shown: bool) -> None:
    assert memstats.shown(stats) is shown


def test_sizes_read_as_upstreams() -> None:
    assert [memstats.size(n) for n in (0, 1000, 800 << 10, 3 * GiB, 8 * GiB)] == [
        "0 B",
        "1000 B",
        "800 KiB",
        "3072 MiB",
        "8192 MiB",
    ]
