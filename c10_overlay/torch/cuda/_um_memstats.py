"""The engine's counters in ``torch.cuda.memory_stats()`` and ``torch.cuda.memory_summary()``.

Note [UM counters where tools look for memory]
Lightning, accelerate and the HF Trainer read ``torch.cuda.memory_stats()`` and print
``torch.cuda.memory_summary()``; with the engine's counters only in ``torch.cuda.um.stats()``
they see a job past its device budget as one that fits. So, while unified memory is on or
the device still holds managed segments, both carry a few of the engine's counters:

- ``memory_stats_as_nested_dict(device)`` gains the key ``"um"``, a dict of ``KEYS``'s
  names; upstream's ``memory_stats`` flattens the nested dict by joining keys with ``.``
  and sorts them, so ``memory_stats()`` gains ``um.managed_bytes``, ``um.device_bytes``,
  ... with no change to it. Where a torch's ``memory_stats`` does not read the nested
  dict through the module's global, it is wrapped too (``install``).
- ``memory_summary(device)`` gains a short section after upstream's table, in its frame.

With UM off (``PYTORCH_CUDA_UM_CONF=enabled:False``) and no managed segment on the
device, before CUDA is initialised (upstream returns ``{}``), and in a stock torch (which
has no ``torch.cuda.um``), both return exactly what upstream returns, the same objects.
The cost when UM is off is one call into the engine and one read of its counters a call,
a few microseconds beside upstream's own dictionaries, for tools that call these every
step.

The counters are the engine's since the process started: current sizes, and totals that
only grow (``*_bytes`` of moves, ``*_refusals``). None of them is a peak, so
``reset_peak_memory_stats`` has nothing of the engine's to reset, and
``reset_accumulated_memory_stats`` resets upstream's totals only (``torch.cuda.um``
documents all of the engine's counters, ``torch.cuda.um.reset_peak`` its one peak).

Pure Python, no torch import: tested on a stand-in of upstream's module in
tests/unit/test_um_memstats.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import ModuleType
from typing import Any

# memory_stats()'s key (after "um.") -> the torch.cuda.um.stats() counter it reads
KEYS: tuple[tuple[str, str], ...] = (
    ("managed_bytes", "um.managed_bytes"),  # this device's managed segments
    ("device_bytes", "um.device_placed_bytes"),  # of those, on the device
    ("host_bytes", "um.host_placed_bytes"),  # of those, in host RAM
    ("device_budget_bytes", "um.device_budget_bytes"),
    ("total_managed_bytes", "um.total_managed_bytes"),  # all devices, against max_managed
    ("evicted_bytes", "um.evict_bytes"),  # live bytes moved to host RAM, all devices
    ("discarded_bytes", "um.discard_bytes"),  # dead bytes dropped without a copy
    ("brought_back_bytes", "um.touch_prefetch_bytes"),  # live bytes moved back to a device
    ("cap_refusals", "um.cap_refusals"),  # allocations refused by max_managed
    ("headroom_refusals", "um.headroom_refusals"),  # ... by host_headroom
)
SECTION = "um"
WIDTH = 75  # inside the frame of upstream's summary
MARK = "_um_counters"  # set on the wrappers, so that install() wraps once

# device -> torch.cuda.um.stats(device), or None when the counters are not to be shown
Reader = Callable[[Any], Mapping[str, int] | None]


def shown(stats: Mapping[str, int]) -> bool:
    """Whether the counters belong in memory_stats: UM is on, or the device still holds
    managed segments made while it was."""
    return bool(stats.get("um.enabled")) or stats.get("um.managed_segments", 0) > 0


def counters(stats: Mapping[str, int]) -> dict[str, int]:
    """The ``"um"`` section of memory_stats_as_nested_dict, from ``torch.cuda.um.stats()``."""
    return {name: int(stats.get(source, 0)) for name, source in KEYS}


def with_counters(nested: dict[str, Any], stats: Mapping[str, int] | None) -> dict[str, Any]:
    """Upstream's nested statistics with the ``"um"`` section added: the same object where
    there is nothing to add (no counters, or CUDA not initialised: ``{}``)."""
    if stats is None or not nested:
        return nested
    return {**nested, SECTION: counters(stats)}


def size(n: int) -> str:
    """Bytes in binary units, three to four digits kept (1536 MiB, 8 GiB, 512 KiB)."""
    unit = "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if n < 768 * 1024:
            break
        n //= 1024
        unit = bigger
    return f"{n} {unit}"


def _row(label: str, value: str) -> str:
    return f"| {label:<{WIDTH - 3 - len(value)}} {value} |"


def summary_section(c: Mapping[str, int]) -> str:
    """The summary's unified-memory section, in upstream's frame (``|`` borders, 75 wide),
    ending with a newline as upstream's text does."""
    lines = [
        _row("Unified memory (torch.cuda.um)", ""),
        "|" + "-" * WIDTH + "|",
        _row("Managed memory on this GPU", size(c["managed_bytes"])),
        _row("  on the device", size(c["device_bytes"])),
        _row("  in host RAM", size(c["host_bytes"])),
        _row("Device budget", size(c["device_budget_bytes"]) if c["device_budget_bytes"] else "-"),
        _row("Managed memory, all GPUs", size(c["total_managed_bytes"])),
        _row("Evicted to host RAM (total)", size(c["evicted_bytes"])),
        _row("Discarded, dead (total)", size(c["discarded_bytes"])),
        _row("Brought back to a GPU (total)", size(c["brought_back_bytes"])),
        _row(
            "Allocations refused (max_managed / host_headroom)",
            f"{c['cap_refusals']} / {c['headroom_refusals']}",
        ),
        _row("More: print(torch.cuda.um.summary())", ""),
        "|" + "=" * WIDTH + "|",
    ]
    return "\n".join(lines) + "\n"


def with_section(text: str, stats: Mapping[str, int] | None) -> str:
    """Upstream's summary with the unified-memory section appended (unchanged without
    counters)."""
    if stats is None:
        return text
    return text + summary_section(counters(stats))


def install(memory: ModuleType, namespace: ModuleType, read: Reader) -> None:
    """Wraps ``memory_stats_as_nested_dict`` and ``memory_summary`` of ``memory``
    (``torch.cuda.memory``) and puts the wrappers under the same names in ``namespace``
    (``torch.cuda``) too. ``memory_stats`` picks the counters up from the nested dict where
    it reads it through the module's global (upstream, every supported version); otherwise
    it is wrapped as well. Once only."""
    nested_fn = memory.memory_stats_as_nested_dict
    if getattr(nested_fn, MARK, False):
        return
    summary_fn = memory.memory_summary
    stats_fn = memory.memory_stats

    def memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
        nested: dict[str, Any] = nested_fn(device=device)
        if not nested:
            return nested
        return with_counters(nested, read(device))

    def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
        text: str = summary_fn(device=device, abbreviated=abbreviated)
        return with_section(text, read(device))

    wrappers: dict[str, Callable[..., Any]] = {
        "memory_stats_as_nested_dict": memory_stats_as_nested_dict,
        "memory_summary": memory_summary,
    }
    code = getattr(stats_fn, "__code__", None)
    if code is None or "memory_stats_as_nested_dict" not in code.co_names:

        def memory_stats(device: Any = None) -> dict[str, Any]:
            flat: dict[str, Any] = stats_fn(device=device)
            stats = read(device) if flat else None
            if stats is None:
                return flat
            flat.update({f"{SECTION}.{k}": v for k, v in counters(stats).items()})
            return type(flat)(sorted(flat.items()))

        wrappers["memory_stats"] = memory_stats
    for name, wrapper in wrappers.items():
        original = getattr(memory, name)
        wrapper.__name__ = original.__name__
        wrapper.__qualname__ = original.__qualname__
        wrapper.__doc__ = original.__doc__
        wrapper.__module__ = original.__module__
        wrapper.__wrapped__ = original  # type: ignore[attr-defined]
        setattr(wrapper, MARK, True)
        setattr(memory, name, wrapper)
        if getattr(namespace, name, None) is original:
            setattr(namespace, name, wrapper)
