r"""Unified memory for the CUDA caching allocator (``torch-X.Y.Z+um`` wheels).

In a ``+um`` wheel the caching allocator takes its segments with
``cudaMallocManaged`` instead of ``cudaMalloc``: a program whose tensors
outgrow the GPU keeps running, with the overflow in host RAM, instead of
failing with ``torch.OutOfMemoryError``. Nothing in user code has to change.
This module reads and steers the engine that does it.

Configuration comes from the environment variable ``PYTORCH_CUDA_UM_CONF``
(same syntax as ``PYTORCH_CUDA_ALLOC_CONF``), read at the first CUDA
allocation, and from :func:`configure` at run time::

    PYTORCH_CUDA_UM_CONF="enabled:True,max_managed:64GiB,device_budget:90%,host_headroom:2GiB,prefetch:True"

``enabled``
    new segments are managed memory (``False``: exactly stock torch).
``max_managed``
    hard cap on managed bytes over all GPUs (``none``: no cap); past it the
    allocator raises ``torch.OutOfMemoryError``.
``device_budget``
    per GPU, managed bytes placed on the device (bytes or ``N%`` of its
    memory); segments past it live in host RAM, mapped for the GPU.
``host_headroom``
    host RAM a host-placed segment must leave available.
``prefetch``
    prefetch a new segment to where it was placed.
``predict``
    past the budget, saved activations leave the device by copy as the forward
    saves them and come back ahead of the backward, and an optimizer's state is
    staged on the device for its step, chunk by chunk (on by default; counters in
    :func:`predict_stats`; ``predict_lookahead`` bounds the bytes brought back
    ahead). The other keys are listed in the repository's README.

Sizes are bytes or take binary units (``512MB``, ``8GiB``, ``1.5G``).

Everything here is importable and callable without a GPU; functions that move
memory need CUDA. Managed memory cannot be shared between processes through
CUDA IPC: run a process that must do so with ``PYTORCH_CUDA_UM_CONF=enabled:False``.

For a stock torch install whose wheel cannot be replaced, the engine library
of a ``+um`` wheel of the same torch version can be preloaded (see
``docs/injection.md`` in the torch-um repository): ``LD_PRELOAD=<dir>/libtorch_um.so``
with ``<dir>`` the stock install's ``torch/lib``.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import os
import platform
import sys
import threading
import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias, Union

import torch

if TYPE_CHECKING:
    from torch.nn import Module


__all__ = [
    "HOST",
    "advise",
    "configure",
    "engine_library",
    "get_config",
    "injection_info",
    "is_available",
    "is_enabled",
    "is_managed",
    "managed_host",
    "move_",
    "placement",
    "predict_stats",
    "prefetch",
    "reset_peak",
    "set_device_budget",
    "set_host_headroom",
    "set_max_managed",
    "stats",
    "summary",
]

#: ``device`` value meaning host RAM, for :func:`prefetch` and :func:`advise`.
HOST = -1

_ABI_VERSION = 1
_ERRLEN = 1024

# torch.nn is not imported yet when torch.cuda imports this module.
Size: TypeAlias = int | str
DeviceLike: TypeAlias = torch.device | str | int | None
TensorsLike: TypeAlias = Union[torch.Tensor, "Module", Iterable[torch.Tensor]]


class _Stats(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "struct_size",
            "managed_segments",
            "managed_bytes",
            "device_placed_bytes",
            "host_placed_bytes",
            "unplaced_bytes",
            "prefetches",
            "prefetch_bytes",
            "prefetches_skipped_capture",
            "device_budget_bytes",
            "device_total_bytes",
            "total_managed_bytes",
            "peak_managed_bytes",
            "cap_refusals",
            "headroom_refusals",
            "policy_lru",
            "dead_device_bytes",
            "events_attached",
            "block_events",
            "touches",
            "touch_prefetch_bytes",
            "reuse_bytes",
            "place_bytes",
            "map_host_bytes",
            "evictions",
            "evict_bytes",
            "discards",
            "discard_bytes",
            "executor_calls",
            "executor_failures",
            "executor_ns",
            "evictor_ns",
            "duplicate_bytes",
            "drop_bytes",
            "cancelled_bytes",
            "host_allocations",
            "host_alloc_bytes",
            "adopted_bytes",
            "host_fallbacks",
            "evicted_unused_bytes",
            "evictor_wait_ns",
            "evict_ranges",
            "fence_waits",
            "fence_wait_ns",
            "fence_wait_issuing_ns",
            "forget_bytes",
            "forgotten_discard_bytes",
            "hold_bytes",
            "event_samples",
            "event_sample_ns",
            "kernel_copies",
            "kernel_copy_bytes",
            "kernel_copy_failures",
            "kernel_copy_cpu_bytes",
            "pageable_copies",
            "pageable_cpu_bytes",
            "pageable_staged_bytes",
            "op_signal_installed",
            "op_signal_installs",
            "op_calls",
            "op_touch_bytes",
            "op_ahead_ranges",
            "op_ahead_bytes",
            "op_matches",
            "op_paths",
            "op_signal_ns",
            "plan_bytes",
            "plan_victim_bytes",
            "op_mixed",
            "op_counterparts",
            "evict_first_bytes",
            "stage_ins",
            "stage_in_bytes",
            "stage_outs",
            "stage_out_bytes",
            "stage_dropped",
            "stage_failures",
            "stage_candidates",
            "stage_not_on_host",
        )
    ]


class _InjectInfo(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_uint64)
        for name in (
            "struct_size",
            "interposed",
            "attached",
            "segment_allocs",
            "segment_frees",
            "passthrough_mallocs",
            "passthrough_frees",
            "block_allocs",
            "block_frees",
            "segment_alloc_events",
            "segment_free_events",
            "oom_events",
            "captures_underway",
            "ipc_refusals",
        )
    ]


_ADVICE: dict[str, int] = {
    "preferred_location": 1,
    "unset_preferred_location": 2,
    "accessed_by": 3,
    "unset_accessed_by": 4,
    "read_mostly": 5,
    "unset_read_mostly": 6,
}


def _bind(lib: ctypes.CDLL) -> None:
    c = ctypes
    sigs: dict[str, tuple[object, list[object]]] = {
        "torch_um_abi_version": (c.c_int, []),
        "torch_um_configure": (c.c_int, [c.c_char_p, c.c_char_p, c.c_size_t]),
        "torch_um_get_config": (c.c_long, [c.c_char_p, c.c_size_t]),
        "torch_um_enabled": (c.c_int, []),
        "torch_um_is_managed": (c.c_int, [c.c_void_p]),
        "torch_um_get_stats": (c.c_int, [c.c_int, c.POINTER(_Stats)]),
        "torch_um_reset_peak": (None, []),
        "torch_um_prefetch": (
            c.c_int,
            [c.c_void_p, c.c_size_t, c.c_int, c.c_void_p, c.c_char_p, c.c_size_t],
        ),
        "torch_um_advise": (
            c.c_int,
            [c.c_void_p, c.c_size_t, c.c_int, c.c_int, c.c_char_p, c.c_size_t],
        ),
        "torch_um_touch": (c.c_longlong, [c.c_void_p, c.c_size_t, c.c_int, c.c_void_p, c.c_int]),
        "torch_um_forget": (c.c_longlong, [c.c_void_p, c.c_size_t]),
        "torch_um_where": (c.c_longlong, [c.c_void_p, c.c_size_t, c.c_int]),
        "torch_um_under_pressure": (c.c_int, []),
        "torch_um_host_room": (c.c_uint64, []),
        "torch_um_attach_events": (c.c_int, [c.c_char_p, c.c_size_t]),
        "torch_um_host_install": (c.c_int, [c.c_char_p, c.c_size_t]),
        "torch_um_host_scope": (c.c_int, [c.c_int]),
        "torch_um_copy_function": (c.c_void_p, [c.c_int, c.c_char_p, c.c_size_t]),
        "torch_um_alias": (c.c_void_p, [c.c_void_p, c.c_int, c.c_char_p, c.c_size_t]),
        "torch_um_pin_alias": (c.c_void_p, [c.c_void_p, c.c_char_p, c.c_size_t]),
        "torch_um_op_signal": (c.c_int, [c.c_int, c.c_char_p, c.c_size_t]),
    }
    for name, (res, args) in sigs.items():
        fn = getattr(lib, name)
        fn.restype = res
        fn.argtypes = args


def _bind_inject(lib: ctypes.CDLL) -> bool:
    c = ctypes
    try:
        lib.torch_um_inject_attach.restype = c.c_int
        lib.torch_um_inject_attach.argtypes = [c.c_char_p, c.c_size_t]
        lib.torch_um_inject_info.restype = c.c_int
        lib.torch_um_inject_info.argtypes = [c.POINTER(_InjectInfo)]
        lib.torch_um_inject_library_path.restype = c.c_char_p
        lib.torch_um_inject_library_path.argtypes = []
    except AttributeError:
        return False
    return True


def _find_engine() -> tuple[ctypes.CDLL | None, str, str | None]:
    """(library, path kind, file): the engine of this process, if any.

    ``inject``: torch/lib/libtorch_um.so (loaded by ``import torch``);
    ``source``: a rebuilt torch/lib/libc10_cuda.so that carries the engine;
    ``preload``: libtorch_um.so preloaded into a stock install.
    """
    if platform.system() != "Linux":
        return None, "", None
    libdir = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "lib")
    candidates = [
        ("inject", os.path.join(libdir, "libtorch_um.so")),
        ("source", os.path.join(libdir, "libc10_cuda.so")),
    ]
    for kind, path in candidates:
        if not os.path.exists(path):
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        if hasattr(lib, "torch_um_abi_version"):
            return lib, kind, path
    try:
        lib = ctypes.CDLL(None)
    except OSError:
        return None, "", None
    if hasattr(lib, "torch_um_abi_version") and hasattr(lib, "torch_um_inject_info"):
        return lib, "preload", None
    return None, "", None


_lib, _kind, _path = _find_engine()
if _lib is not None:
    _bind(_lib)
    _version = int(_lib.torch_um_abi_version())
    if _version != _ABI_VERSION:
        warnings.warn(
            f"torch.cuda.um: the engine's C API is version {_version}, this module "
            f"speaks {_ABI_VERSION}; unified-memory helpers are unavailable",
            stacklevel=2,
        )
        _lib, _kind, _path = None, "", None
_injected = _lib is not None and _kind in ("inject", "preload") and _bind_inject(_lib)


def _engine() -> ctypes.CDLL:
    if _lib is None:
        raise RuntimeError(
            "torch.cuda.um: this torch has no unified-memory engine (it is not a "
            "torch-um '+um' build and libtorch_um.so is not preloaded)"
        )
    return _lib


def is_available() -> bool:
    """Whether this torch carries the unified-memory engine."""
    return _lib is not None


def engine_library() -> str | None:
    """The file of the engine (``None`` without one, or when preloaded)."""
    return _path


def is_enabled() -> bool:
    """Whether new allocator segments are managed memory."""
    return _lib is not None and bool(_lib.torch_um_enabled())


def _size(value: Size, what: str) -> str:
    if isinstance(value, bool):
        raise TypeError(f"{what} must be a byte count (int) or a size string, not bool")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{what} must not be negative, got {value}")
        return str(value)
    if isinstance(value, str):
        return value.strip()
    raise TypeError(f"{what} must be an int or a str, got {type(value).__name__}")


def configure(
    conf: str | None = None,
    *,
    enabled: bool | None = None,
    max_managed: Size | None = None,
    device_budget: Size | None = None,
    host_headroom: Size | None = None,
    prefetch: bool | None = None,
    policy: str | None = None,
    discard: bool | None = None,
    hooks: bool | None = None,
    op_signal: bool | None = None,
    op_lookahead: Size | None = None,
    op_stage: bool | None = None,
    evict_warm_first: bool | None = None,
    predict: bool | None = None,
    predict_lookahead: Size | None = None,
    predict_copy_sms: int | str | None = None,
    predict_copy_kernel: str | None = None,
    predict_stage_kernel: str | None = None,
    predict_ddp_buckets: bool | None = None,
    predict_programs: bool | None = None,
    read_copies: bool | None = None,
    host_alloc: str | None = None,
    host_alloc_min: Size | None = None,
    host_copy_kernel: bool | None = None,
    host_copy_cpu_share: float | None = None,
    pageable_copy_cpu: bool | None = None,
    pin_in_place: bool | None = None,
) -> None:
    """Change the engine's settings for allocations made from now on. A change of
    ``predict``, ``predict_ddp_buckets``, ``hooks``, ``policy`` or ``enabled`` while the
    module hooks are on (a device past its budget) also replaces them at once (Note [Use
    signals]).

    ``conf`` is ``PYTORCH_CUDA_UM_CONF`` text; the keyword arguments override
    single keys (``None`` leaves a key unchanged; ``max_managed="none"``
    removes the cap). All or nothing: on a bad key or value, nothing changes
    and :class:`ValueError` carries the engine's message.

    Example::

        torch.cuda.um.configure(device_budget="8GiB", max_managed=64 << 30)
    """
    parts: list[str] = []
    if conf is not None:
        if not isinstance(conf, str):
            raise TypeError(f"conf must be a str, got {type(conf).__name__}")
        if conf.strip():
            parts.append(conf.strip())
    for key, word in (
        ("policy", policy),
        ("host_alloc", host_alloc),
        ("predict_copy_kernel", predict_copy_kernel),
        ("predict_stage_kernel", predict_stage_kernel),
    ):
        if word is not None:
            if not isinstance(word, str):
                raise TypeError(f"{key} must be a str, got {type(word).__name__}")
            parts.append(f"{key}:{word}")
    for key, flag in (
        ("enabled", enabled),
        ("prefetch", prefetch),
        ("discard", discard),
        ("hooks", hooks),
        ("op_signal", op_signal),
        ("op_stage", op_stage),
        ("evict_warm_first", evict_warm_first),
        ("predict", predict),
        ("predict_ddp_buckets", predict_ddp_buckets),
        ("predict_programs", predict_programs),
        ("read_copies", read_copies),
        ("host_copy_kernel", host_copy_kernel),
        ("pageable_copy_cpu", pageable_copy_cpu),
        ("pin_in_place", pin_in_place),
    ):
        if flag is not None:
            if not isinstance(flag, bool):
                raise TypeError(f"{key} must be a bool, got {type(flag).__name__}")
            parts.append(f"{key}:{flag}")
    if host_copy_cpu_share is not None:
        if isinstance(host_copy_cpu_share, bool) or not isinstance(
            host_copy_cpu_share, (int, float)
        ):
            raise TypeError(
                f"host_copy_cpu_share must be a number, got {type(host_copy_cpu_share).__name__}"
            )
        parts.append(f"host_copy_cpu_share:{host_copy_cpu_share!r}")
    if predict_copy_sms is not None:
        if isinstance(predict_copy_sms, bool) or not isinstance(predict_copy_sms, (int, str)):
            raise TypeError(
                f"predict_copy_sms must be 'auto' or an int, got {type(predict_copy_sms).__name__}"
            )
        parts.append(f"predict_copy_sms:{predict_copy_sms}")
    for key, size in (
        ("max_managed", max_managed),
        ("device_budget", device_budget),
        ("host_headroom", host_headroom),
        ("host_alloc_min", host_alloc_min),
        ("predict_lookahead", predict_lookahead),
        ("op_lookahead", op_lookahead),
    ):
        if size is not None:
            parts.append(f"{key}:{_size(size, key)}")
    if not parts:
        return
    lib = _engine()
    # One lock with the pressure watcher: it cannot install the hooks of the old settings
    # between the check and the change.
    global _compiled_forward_seen
    with _hooks_lock:
        hook_keys = _hook_settings() if _hooks_installed else None
        err = ctypes.create_string_buffer(_ERRLEN)
        if lib.torch_um_configure(",".join(parts).encode(), err, _ERRLEN) != 0:
            raise ValueError(err.value.decode(errors="replace"))
        _compiled_forward_seen = False  # Note [A compiled model is driven by operators]
        _apply_host_settings()
        _apply_predict_settings()
        if hook_keys is not None and _hook_settings() != hook_keys:
            _refresh_hooks()


def set_device_budget(budget: Size) -> None:
    """Per-GPU managed bytes placed on the device: bytes, a size or ``"N%"``."""
    configure(device_budget=budget)


def set_max_managed(cap: Size | None) -> None:
    """Cap on managed bytes over all GPUs; ``None`` removes the cap."""
    configure(max_managed="none" if cap is None else cap)


def set_host_headroom(headroom: Size) -> None:
    """Host RAM that a host-placed segment must leave available."""
    configure(host_headroom=headroom)


def get_config() -> dict[str, str]:
    """The effective settings, e.g. ``{"enabled": "True", "max_managed": "none", ...}``.

    Raises :class:`ValueError` if ``PYTORCH_CUDA_UM_CONF`` is malformed.
    """
    lib = _engine()
    need = int(lib.torch_um_get_config(None, 0))
    buf = ctypes.create_string_buffer(max(need, _ERRLEN) + 1)
    n = int(lib.torch_um_get_config(buf, len(buf)))
    if n < 0:
        raise ValueError(buf.value.decode(errors="replace"))
    out: dict[str, str] = {}
    for item in buf.value.decode().split(","):
        if item:
            key, _, value = item.partition(":")
            out[key] = value
    return out


def _device_index(device: DeviceLike, *, allow_host: bool) -> int:
    if device is None:
        return int(torch.cuda.current_device()) if torch.cuda.is_initialized() else 0
    if isinstance(device, bool):
        raise TypeError("device must be a torch.device, a str or an int")
    if isinstance(device, int):
        if device == HOST and allow_host:
            return HOST
        if device < 0:
            raise ValueError(f"bad device index {device}")
        return device
    dev = torch.device(device)
    if dev.type == "cpu":
        if not allow_host:
            raise ValueError("a CUDA device is required here, not 'cpu'")
        return HOST
    if dev.type != "cuda":
        raise ValueError(f"unified memory is for CUDA devices, not {dev.type!r}")
    if dev.index is None:
        return int(torch.cuda.current_device())
    return int(dev.index)


def stats(device: DeviceLike = None) -> dict[str, int]:
    """Unified-memory counters, in the style of :func:`torch.cuda.memory_stats`.

    Keys (all ints): ``um.enabled`` and ``um.<field>`` for each field of the
    engine's ``TorchUmStats`` (``c10/cuda/um/c_api.h``, where each is
    explained). Placement: ``um.managed_segments``, ``um.managed_bytes``,
    ``um.device_placed_bytes``, ``um.host_placed_bytes``,
    ``um.unplaced_bytes``, ``um.prefetches``, ``um.prefetch_bytes``,
    ``um.prefetches_skipped_capture``, ``um.device_budget_bytes``,
    ``um.device_total_bytes`` (this device); limits: ``um.total_managed_bytes``,
    ``um.peak_managed_bytes``, ``um.cap_refusals``, ``um.headroom_refusals``
    (whole process); the residency policy: ``um.evict_bytes`` (of them
    ``um.evict_first_bytes``, chunks never in host RAM before: the driver's
    slow case), ``um.discard_bytes``, ``um.touch_prefetch_bytes``, ``um.reuse_bytes``,
    ``um.cancelled_bytes`` and more; the executor's host time:
    ``um.executor_ns``, ``um.evictor_ns``, ``um.evictor_wait_ns``,
    ``um.fence_wait_ns``; the block events' own cost, sampled (one in 8 a
    thread): ``um.event_samples``, ``um.event_sample_ns``. Empty without an
    engine. Does not initialise CUDA.
    """
    if _lib is None:
        return {}
    index = _device_index(device, allow_host=False)
    s = _raw_stats(index)
    if s is None:
        get_config()  # raises the engine's own message if PYTORCH_CUDA_UM_CONF is malformed
        raise ValueError(f"torch.cuda.um.stats: bad device {index}")
    out = {"um.enabled": int(is_enabled())}
    for name, *_ in _Stats._fields_:
        if name != "struct_size":
            out["um." + name] = int(getattr(s, name))
    return out


def _raw_stats(index: int) -> _Stats | None:
    """The engine's counters of device ``index`` as its C struct; None if it refuses."""
    s = _Stats()
    s.struct_size = ctypes.sizeof(_Stats)
    if _lib is None or _lib.torch_um_get_stats(index, ctypes.byref(s)) != 0:
        return None
    return s


def reset_peak() -> None:
    """Reset ``um.peak_managed_bytes`` to the current managed bytes."""
    _engine().torch_um_reset_peak()


def injection_info() -> dict[str, int]:
    """Counters of the injection path (empty on the source path).

    ``interposed`` is 1 when the caching allocator's ``cudaMalloc`` is the
    engine's; ``segment_allocs`` counts the segments it took through it;
    ``block_allocs``/``block_frees`` come from the allocator's trace tracker
    (``attached``) once CUDA is initialised.
    """
    if not _injected or _lib is None:
        return {}
    info = _InjectInfo()
    info.struct_size = ctypes.sizeof(_InjectInfo)
    if _lib.torch_um_inject_info(ctypes.byref(info)) != 0:
        return {}
    return {
        name: int(getattr(info, name)) for name, *_ in _InjectInfo._fields_ if name != "struct_size"
    }


def is_managed(obj: torch.Tensor | torch.UntypedStorage | int) -> bool:
    """Whether a tensor's (or storage's, or address's) memory is managed memory:
    a CUDA tensor's with unified memory on, a CPU tensor's allocated inside
    :func:`managed_host` or with ``host_alloc:managed``."""
    if _lib is None:
        return False
    if isinstance(obj, torch.Tensor):
        if obj.device.type not in ("cuda", "cpu"):
            return False
        ptr = obj.untyped_storage().data_ptr()
    elif isinstance(obj, torch.UntypedStorage):
        if obj.device.type not in ("cuda", "cpu"):
            return False
        ptr = obj.data_ptr()
    elif isinstance(obj, int) and not isinstance(obj, bool):
        ptr = obj
    else:
        raise TypeError(
            f"expected a Tensor, an UntypedStorage or an address, got {type(obj).__name__}"
        )
    return ptr != 0 and bool(_lib.torch_um_is_managed(ctypes.c_void_p(ptr)))


def _tensors(obj: TensorsLike) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, torch.nn.Module):  # imported by now
        return [*obj.parameters(), *obj.buffers()]
    items = list(obj)
    for t in items:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"expected tensors, got {type(t).__name__}")
    return items


def _storage_ranges(obj: TensorsLike) -> list[tuple[int, int, int]]:
    """(address, bytes, device) of each distinct managed CUDA storage."""
    seen: set[int] = set()
    out = []
    for t in _tensors(obj):
        if t.device.type != "cuda":
            continue
        st = t.untyped_storage()
        ptr, size = st.data_ptr(), st.nbytes()
        if ptr == 0 or size == 0 or ptr in seen or not is_managed(ptr):
            continue
        seen.add(ptr)
        out.append((ptr, size, t.device.index or 0))
    return out


def prefetch(
    obj: TensorsLike,
    device: DeviceLike = None,
    stream: torch.cuda.Stream | None = None,
) -> int:
    """Migrate the managed memory of tensors (or a module's parameters and
    buffers) to a GPU (``device``: index, ``"cuda:N"``; ``None``: the current
    one) or to host RAM (``"cpu"`` or :data:`HOST`), ordered on ``stream``
    (default: the current stream of the tensor's device). Tensors that are not
    managed are skipped. Returns the number of bytes whose prefetch was issued.
    Do not call while a CUDA graph is being captured.
    """
    lib = _engine()
    location = _device_index(device, allow_host=True)
    err = ctypes.create_string_buffer(_ERRLEN)
    total = 0
    for ptr, size, dev in _storage_ranges(obj):
        s = stream if stream is not None else torch.cuda.current_stream(dev)
        rc = lib.torch_um_prefetch(
            ctypes.c_void_p(ptr), size, location, ctypes.c_void_p(s.cuda_stream), err, _ERRLEN
        )
        if rc != 0:
            raise RuntimeError(err.value.decode(errors="replace"))
        total += size
    return total


# TorchUmWhere (c_api.h): what torch_um_where counts.
_WHERE = {"device": 0, "host": 1, "unplaced": 2, "held": 3}


class Placement(NamedTuple):
    """Bytes of managed memory by where the engine placed them (:func:`placement`)."""

    device: int  #: on the GPU
    host: int  #: in host RAM, read by the GPU in place or brought back on use
    unplaced: int  #: not placed yet: their pages go where they are first touched
    held: int  #: of ``device``, held there (Note [Held ranges] in Residency.h)


def placement(obj: TensorsLike) -> Placement:
    """Where the engine has the managed memory of tensors (or a module's parameters
    and buffers) now, in bytes of their storages, counted by the 2 MiB chunks of the
    engine's ledger::

        p = torch.cuda.um.placement(model)
        print(f"{p.host / 2**30:.1f} GiB of the model is in host RAM")

    This is where the engine placed the memory, not pages the driver moved on its own
    (a fault from a kernel). Tensors that are not managed CUDA memory count nothing.
    The four counts are read one after another: while other threads move memory they
    need not add up to the storages' bytes.
    """
    lib = _engine()
    total = dict.fromkeys(_WHERE, 0)
    for ptr, size, _ in _storage_ranges(obj):
        for name, kind in _WHERE.items():
            n = lib.torch_um_where(ctypes.c_void_p(ptr), size, kind)
            if n < 0:
                raise RuntimeError(f"torch.cuda.um.placement: the engine could not read {name}")
            total[name] += n
    return Placement(**total)


def advise(obj: TensorsLike, advice: str, device: DeviceLike = None) -> int:
    """Apply ``cudaMemAdvise`` to the managed memory of tensors (or a module).

    ``advice``: ``preferred_location``, ``accessed_by``, ``read_mostly`` or
    their ``unset_`` forms. ``device``: a GPU, or ``"cpu"``/:data:`HOST` (for
    ``preferred_location``). Returns the number of bytes advised.
    """
    lib = _engine()
    if advice not in _ADVICE:
        raise ValueError(f"unknown advice {advice!r}; expected one of {', '.join(_ADVICE)}")
    location = _device_index(device, allow_host=True)
    err = ctypes.create_string_buffer(_ERRLEN)
    total = 0
    for ptr, size, _dev in _storage_ranges(obj):
        rc = lib.torch_um_advise(
            ctypes.c_void_p(ptr), size, _ADVICE[advice], location, err, _ERRLEN
        )
        if rc != 0:
            raise RuntimeError(err.value.decode(errors="replace"))
        total += size
    return total


# ---- managed host memory and zero-copy moves --------------------------------------
#
# Note [Managed host memory] (c10/cuda/um/HostAllocator.h) has the design. A
# CPU tensor allocated inside managed_host() (or anywhere, with
# host_alloc:managed, once CUDA is in use) is managed memory placed in host
# RAM; move_ then hands it to a GPU without a copy: the same pages, viewed on
# the device through a DLPack alias that keeps the CPU storage alive, and
# entered into the device's residency ledger, which migrates what the budget
# allows and lets the GPU read the rest in place.

_host_installed = False
_host_lock = threading.Lock()


def _install_host_allocator() -> None:
    global _host_installed
    with _host_lock:
        if _host_installed:
            return
        err = ctypes.create_string_buffer(_ERRLEN)
        if _engine().torch_um_host_install(err, _ERRLEN) != 0:
            raise RuntimeError(f"torch.cuda.um: {err.value.decode(errors='replace')}")
        _patch_module_moves()
        _host_installed = True


def _apply_host_settings() -> None:
    """The Python side of host_alloc and pin_in_place, after a configure() or at CUDA
    initialisation."""
    global _pin_on, _pin_min
    conf = get_config()
    if conf.get("host_alloc") == "managed":
        _install_host_allocator()
    _pin_min = int(conf.get("host_alloc_min", 1 << 20))
    _pin_on = conf.get("pin_in_place") == "True"
    if _pin_on:
        _patch_pin_memory()


def _apply_predict_settings() -> None:
    """The one place ``predict_lookahead``, ``predict_copy_sms``, ``predict_copy_kernel``,
    ``predict_stage_kernel`` and the device budget reach the offloader, the streamer and
    the optimizer state stager: when the streamer or the stager is made, and after every
    configure(), so that a change takes effect at once, not when the hooks are next
    installed."""
    conf = get_config()
    if _stager is not None:
        _stager.copy_lean = conf.get("predict_stage_kernel", "foreach") == "lean"
        # The lean launches' blocks: predict_copy_sms where set to a count, else the
        # two-way default (auto, and 0, "any SM", which two launches at once cannot have)
        sms = conf.get("predict_copy_sms", "auto")
        _stager.copy_blocks = int(sms) if sms not in ("auto", "0") else _stager.STAGE_BLOCKS
    lookahead = int(conf.get("predict_lookahead", 1 << 30))
    if _offloader is not None:
        _offloader.max_lookahead = lookahead
        from torch.cuda import _um_plan

        budget = _current_budget()
        if budget > 0:  # the margin follows the budget, as the streamer's does
            _offloader.set_margin(_um_plan.budget_margin(budget))
    if _streamer is not None:
        _streamer.max_lookahead = lookahead
        sms = conf.get("predict_copy_sms", "auto")
        _streamer.copy_sms = -1 if sms == "auto" else int(sms)  # -1: auto
        _streamer.copy_lean = conf.get("predict_copy_kernel", "lean") == "lean"
        budget = _current_budget()  # the ring's cap and the target's margin follow it
        if budget > 0:
            _streamer.set_budget(budget)


# Note [Pinned in place] (HostAllocator.h). Read by the DataLoader's pin thread.
_pin_on = False
_pin_min = 1 << 20
_pin_patched = False
_pinned_in_place = 0  # batches pinned where they lay (tests read it)


def _pin_in_place(t: torch.Tensor) -> torch.Tensor | None:
    """t's storage page-locked where it lies, as a CPU view of the same memory; None
    when it is small, already pinned, or cudaHostRegister refuses (then the stock copy)."""
    global _pinned_in_place
    st = t.untyped_storage()
    if st.nbytes() < _pin_min or t.is_pinned():
        return None
    err = ctypes.create_string_buffer(_ERRLEN)
    raw = _engine().torch_um_pin_alias(ctypes.c_void_p(st._cdata), err, _ERRLEN)
    if not raw:
        return None
    alias = torch.utils.dlpack.from_dlpack(_capsule(raw)).untyped_storage()
    view = torch.empty(0, dtype=t.dtype)
    view.set_(alias, t.storage_offset(), t.size(), t.stride())
    _pinned_in_place += 1
    return view


def _patch_pin_memory() -> None:
    """DataLoader(pin_memory=True): while pin_in_place is on, each CPU tensor of a batch
    is page-locked in place instead of copied (the loader's pin thread calls this
    module's pin_memory for every tensor of a batch)."""
    global _pin_patched
    with _host_lock:
        if _pin_patched:
            return
        from torch.utils.data._utils import pin_memory as loader_pin

        stock = loader_pin.pin_memory

        def pin_memory(data: object, device: object = None) -> object:
            if _pin_on and isinstance(data, torch.Tensor) and data.device.type == "cpu":
                pinned = _pin_in_place(data)
                if pinned is not None:
                    return pinned
            return stock(data, device)

        loader_pin.pin_memory = pin_memory
        _pin_patched = True


def _patch_module_moves() -> None:
    """Module.to / .cuda: a module's managed CPU parameters and buffers that nothing
    outside the module reaches become CUDA tensors over the same memory before the
    stock method runs, which then finds them in place (and moves the rest, gradients
    included, as always). Installed with the managed host allocator: before it, no CPU
    tensor is managed and there is nothing to alias."""
    from torch.nn import Module

    stock_to, stock_cuda = Module.to, Module.cuda

    def to(self: Module, *args: object, **kwargs: object) -> Module:
        device, dtype, _non_blocking, fmt = torch._C._nn._parse_to(*args, **kwargs)
        if device is not None and device.type == "cuda" and dtype is None and fmt is None:
            _alias_module(self, device)
        return stock_to(self, *args, **kwargs)

    def cuda(self: Module, device: DeviceLike = None) -> Module:
        _alias_module(self, torch.device("cuda", _device_index(device, allow_host=False)))
        return stock_cuda(self, device)

    to.__doc__, cuda.__doc__ = stock_to.__doc__, stock_cuda.__doc__
    Module.to, Module.cuda = to, cuda  # type: ignore[method-assign,unused-ignore]


def _alias_module(module: Module, device: torch.device) -> None:
    index = _device_index(device, allow_host=False)
    for storage, tensors in _groups(module, index, strict=False):
        if tensors[0].device.type == "cpu":
            _alias(storage, tensors, index)  # "" or why not: then the stock move copies


class managed_host:
    """Context manager: CPU tensors this thread allocates inside it, of at least
    ``host_alloc_min`` bytes (default 1 MiB), are managed memory placed in host
    RAM, which :func:`move_` can hand to a GPU without a copy::

        with torch.cuda.um.managed_host():
            x = torch.rand(1 << 30)          # host RAM, managed
        y = torch.cuda.um.move_(x, "cuda")    # x itself, now on the GPU

    The tensors are ordinary CPU tensors otherwise. Use it for data that will
    move to a GPU: a fork()ed child process (a DataLoader worker under the
    fork start method) cannot read managed memory of its parent, and freeing
    managed memory waits for the GPU. Allocations the engine declines (the
    ``max_managed`` cap, ``host_headroom``) are ordinary host memory. The
    first use initialises CUDA.
    """

    def __enter__(self) -> managed_host:
        lib = _engine()
        _install_host_allocator()
        lib.torch_um_host_scope(1)
        return self

    def __exit__(self, *exc: object) -> None:
        _engine().torch_um_host_scope(-1)


def _alias(storage: torch.UntypedStorage, tensors: list[torch.Tensor], index: int) -> str:
    """Re-point `tensors` (all of `storage`'s users but one reference) at the same memory
    seen from device `index` (HOST: the CPU). Returns "" or why that cannot be done."""
    # Each tensor holds one reference to the storage, and `storage` one more:
    # any other means code outside this call can still reach the memory.
    users = torch._C._storage_Use_Count(storage._cdata)
    if not is_managed(storage):
        return "its memory is not managed (allocate it inside torch.cuda.um.managed_host())"
    if users != len(tensors) + 1:
        return (
            f"{users - 1 - len(tensors)} other reference(s) to its storage exist outside "
            "this call, which would see the same memory on another device"
        )
    lib = _engine()
    err = ctypes.create_string_buffer(_ERRLEN)
    if index == HOST:
        # CPU reads must see finished GPU work, as after .cpu().
        torch.cuda.current_stream(storage.device).synchronize()
    raw = lib.torch_um_alias(ctypes.c_void_p(storage._cdata), index, err, _ERRLEN)
    if not raw:
        return err.value.decode(errors="replace")
    alias = torch.utils.dlpack.from_dlpack(_capsule(raw)).untyped_storage()
    if index == HOST:
        # Bring the pages to host RAM through the engine's ledger.
        lib.torch_um_prefetch(
            ctypes.c_void_p(storage.data_ptr()), storage.nbytes(), HOST, None, err, _ERRLEN
        )
    _repoint(tensors, alias)
    return ""


def _repoint(tensors: list[torch.Tensor], storage: torch.UntypedStorage) -> None:
    """Each tensor, in place, becomes the same view of `storage` it was of its own."""
    with torch.no_grad():
        for t in tensors:
            view = torch.empty(0, dtype=t.dtype, device=storage.device)
            view.set_(storage, t.storage_offset(), t.size(), t.stride())
            t.data = view


def _groups(
    obj: TensorsLike, index: int, strict: bool = True
) -> list[tuple[torch.UntypedStorage, list[torch.Tensor]]]:
    """obj's tensors not yet on device `index`, grouped by storage. A tensor that cannot
    move (not on the CPU or a GPU, or recorded by autograd) raises ValueError, or with
    `strict` off is left out."""
    groups: dict[int, tuple[torch.UntypedStorage, list[torch.Tensor]]] = {}
    seen: set[int] = set()
    for i, t in enumerate(_tensors(obj)):
        if id(t) in seen:
            continue
        seen.add(id(t))
        movable = t.device.type in ("cpu", "cuda") and t.grad_fn is None
        if not movable and not strict:
            continue
        if t.device.type not in ("cpu", "cuda"):
            raise ValueError(f"torch.cuda.um.move_: tensor {i} is on {t.device}, not cpu or cuda")
        if t.grad_fn is not None:
            raise ValueError(
                f"torch.cuda.um.move_: tensor {i} was computed by autograd ({t.grad_fn.name()}); "
                "move leaf tensors (parameters, buffers, loaded data)"
            )
        here = HOST if t.device.type == "cpu" else int(t.device.index or 0)
        if here != index:
            st = t.untyped_storage()
            groups.setdefault(st._cdata, (st, []))[1].append(t)
    return list(groups.values())


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


def _capsule(managed_tensor: int) -> object:
    # A "dltensor" capsule without a destructor: torch.from_dlpack takes
    # ownership (and calls the record's deleter when the tensor dies).
    return _PyCapsule_New(managed_tensor, b"dltensor", None)


def move_(obj: TensorsLike, device: DeviceLike = "cuda", *, copy: bool = True) -> TensorsLike:
    """Move tensors, or a module's parameters and buffers, to ``device`` in place,
    without a copy where the memory allows it; returns ``obj``.

    A tensor whose storage is managed memory (a CPU tensor allocated inside
    :func:`managed_host`; any CUDA tensor with unified memory on) and that no
    tensor outside ``obj`` shares becomes a tensor of ``device`` over the same
    memory: same address, no second copy; the engine migrates its pages as
    the device budget allows (to a GPU) or brings them to host RAM (to
    ``"cpu"``, after the current stream's work is done). Otherwise it is
    copied, as ``Tensor.to`` would, unless ``copy=False``, which raises
    :class:`ValueError` naming the reason instead.

    The tensor objects themselves change device (``t.data`` is replaced), so
    a module's parameters stay the same :class:`torch.nn.Parameter` objects.
    Tensors of ``obj`` that share a storage (views, tied weights) keep
    sharing it. Contract: memory is aliased only when no reference to the
    storage exists outside ``obj``, so no tensor user code can still reach
    is left on the old device over the same memory. A tensor that autograd
    has recorded (not a leaf) is refused.

    Example::

        with torch.cuda.um.managed_host():
            state = torch.load("ckpt.pt", map_location="cpu")
        torch.cuda.um.move_(list(state.values()), "cuda")
        model.load_state_dict(state, assign=True)
    """
    if not isinstance(copy, bool):
        raise TypeError(f"copy must be a bool, got {type(copy).__name__}")
    index = _device_index(device, allow_host=True)
    for storage, tensors in _groups(obj, index):
        why = _alias(storage, tensors, index)
        if why:
            if not copy:
                raise ValueError(f"torch.cuda.um.move_: cannot move without a copy: {why}")
            _repoint(tensors, storage.to(device="cpu" if index == HOST else f"cuda:{index}"))
    return obj


# ---- use signals: module hooks -------------------------------------------------
#
# Note [Use signals]
# The allocator's block events tell the engine when a block is handed out, not
# when a long-lived tensor (a weight, a saved activation) is used again. Once a
# device has run past its budget, and only then, global module hooks report
# such uses to the engine (torch_um_touch), just before they happen:
#   - forward pre-hook: the module's own parameters and buffers;
#   - forward hook, when autograd records: a hook on the module's output that
#     fires when its gradient arrives, i.e. just before the module's backward,
#     and touches the module's parameters, inputs and outputs (what its
#     backward reads);
#   - with predict:True, an optimizer step pre-hook: the gradients the step
#     reads (Note [The step's gradients are touched], torch/cuda/_um_optim.py).
# A touch brings the range to the device on the current stream, the least
# recently used ranges leaving to make room (policy lru). Memory that is not
# managed is ignored. A watcher thread, started when CUDA initialises, polls
# torch_um_under_pressure() ten times a second: the hooks are installed while
# the managed bytes of some device exceed 90 % of its budget and removed when
# none do, so that a job that fits never pays for them. configure() of a setting that
# decides the set (predict, predict_ddp_buckets, hooks, policy, enabled) while they are
# on replaces them at once (_refresh_hooks), not when the pressure next comes and goes.
# With predict:True, the parameters a forward without autograd reads by copy (Note
# [Weight streaming], torch/cuda/_um_weights.py) are not touched: their call reads device
# buffers.

_hooks_installed = False
_hook_handles: list[object] = []


def _ranges_of(tensors: Iterable[object]) -> list[tuple[int, int, int]]:
    out = []
    seen: set[int] = set()
    for t in tensors:
        if not isinstance(t, torch.Tensor) or not t.is_cuda:
            continue
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr == 0 or ptr in seen:
            continue
        seen.add(ptr)
        out.append((ptr, st.nbytes(), t.get_device()))
    return out


# TorchUmTouchFlags (c_api.h)
_TOUCH_READ_ONLY = 1  # TORCH_UM_TOUCH_READ_ONLY
_TOUCH_HOLD = 2  # TORCH_UM_TOUCH_HOLD: Note [Library workspaces]
_current_handle: Callable[[int], int] | None = None  # _um_streams.current_handle, once imported


def _touch(ranges: list[tuple[int, int, int]], flags: int = 0) -> None:
    """The use signal: each range is about to be used on its device. Called at every
    module call while the hooks are on, so it passes plain ints (ctypes converts them
    by the argument types) and reads the current stream without making a Stream."""
    global _current_handle
    if _lib is None:
        return
    handle = _current_handle
    if handle is None:
        from torch.cuda._um_streams import current_handle

        handle = _current_handle = current_handle
    touch = _lib.torch_um_touch
    for ptr, size, dev in ranges:
        touch(ptr, size, dev, handle(dev), flags)


def _own_tensors(module: Module) -> list[object]:
    return [*module._parameters.values(), *module._buffers.values()]


def _pre_forward(module: Module, args: object) -> None:
    global _module_forward_seen, _compiled_forward_seen
    _module_forward_seen = True  # Note [Which signal drives the engine]
    if not _compiled_forward_seen and _compiled_module(module):
        _compiled_forward_seen = True  # Note [A compiled model is driven by operators]
    if _workspaces is not None:
        _workspaces.ensure()  # Note [Library workspaces]
    if torch.is_grad_enabled():
        if _ddp_type is not None and isinstance(module, _ddp_type):
            _buckets.enter(module)  # Note [DDP's buckets between steps]
        own = _own_tensors(module)
        if own:
            _touch(_ranges_of(own))
        return
    # Without autograd (inference), a forward reads its parameters and writes
    # none: they come back as read-only copies that leave the device without
    # a write-back (Note [Read-only duplicates] in Residency.h). Buffers may be
    # updated in place (batch-norm statistics), so they are touched as usual.
    params = module._parameters
    if params:
        tensors: Iterable[torch.Tensor | None] = params.values()
        if _streamer is not None:
            # Parameters read by copy in this call (Note [Weight streaming]) are not used.
            ring = _streamer.swapped_in()
            if ring:
                tensors = [p for p in tensors if p is None or p.data_ptr() not in ring]
        ranges = _ranges_of(tensors)
        if ranges:
            _touch(ranges, _TOUCH_READ_ONLY)
    buffers = module._buffers
    if buffers:
        ranges = _ranges_of(buffers.values())
        if ranges:
            _touch(ranges)


def _flat(obj: object) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (tuple, list)):
        return [t for t in obj if isinstance(t, torch.Tensor)]
    return []


def _post_forward(module: Module, args: object, output: object) -> None:
    if not torch.is_grad_enabled():
        return
    outs = _flat(output)
    anchor = next((t for t in outs if t.requires_grad), None)
    if anchor is None:
        return
    ranges = _ranges_of([*_own_tensors(module), *_flat(args), *outs])
    if not ranges:
        return

    def before_backward(grad: torch.Tensor) -> None:
        if _workspaces is not None:
            _workspaces.ensure()  # autograd's thread has a workspace of its own
        _touch(ranges)

    anchor.register_hook(before_backward)


# The settings that decide which hooks are installed (_hooks_wanted, _register_hooks).
_HOOK_KEYS = ("enabled", "policy", "hooks", "predict", "predict_ddp_buckets")
# Install and removal: the pressure watcher's thread and configure() on the program's.
_hooks_lock = threading.RLock()


def _hook_settings() -> tuple[str | None, ...]:
    cfg = get_config()
    return tuple(cfg.get(k) for k in _HOOK_KEYS)


def _refresh_hooks() -> None:
    """configure() changed a setting that decides the installed hooks (predict,
    predict_ddp_buckets, hooks, policy, enabled) while they are on: take them off (which
    touches back DDP buckets still forgotten), and put back at once the set the
    new settings want if the pressure is still there. Without this the old set stayed
    until the pressure went away: ``configure(predict=False)`` went on predicting."""
    with _hooks_lock:
        _remove_hooks()
        _sync_hooks()  # the settings have changed: a failure warns, it does not raise


def _sync_hooks() -> bool:
    """Install the hooks or take them off, as the pressure and the settings want now (the
    watcher's poll, and _refresh_hooks). False if they could not be installed: then the
    residency policy goes on from block events alone (hooks:False), with a warning."""
    lib = _lib
    if lib is None:
        return True
    with _hooks_lock:
        try:
            wanted = bool(lib.torch_um_under_pressure()) and _hooks_wanted()
            if wanted == _hooks_installed:
                return True
            _install_hooks() if wanted else _remove_hooks()
        except Exception as e:
            warnings.warn(
                f"torch.cuda.um: the module hooks could not be installed ({e!r}); "
                "running without them",
                stacklevel=1,
            )
            return False
    return True


def _install_hooks() -> None:
    global _hooks_installed
    with _hooks_lock:
        if _hooks_installed:
            return
        try:
            _register_hooks()
        except Exception:
            _remove_hooks()  # none or all: a half-installed set would run twice next time
            raise
        _hooks_installed = True


def _register_hooks() -> None:
    from torch.cuda import _um_plan
    from torch.nn.modules import module as nn_module

    # Note [Hooks that come on during a forward] (_um_plan.py).
    _um_plan.OutermostForward.call_code = nn_module.Module._call_impl.__code__
    offloader = _predictor()
    if offloader is not None:
        # Before the use signal, which then leaves the parameters it swapped alone.
        streamer = _weight_streamer()
        _hook_handles.append(nn_module.register_module_forward_pre_hook(streamer.enter))
        _hook_handles.append(
            nn_module.register_module_forward_hook(streamer.exit, always_call=True)
        )
    _workspace_finder().reset()
    _hook_handles.append(nn_module.register_module_forward_pre_hook(_pre_forward))
    _hook_handles.append(nn_module.register_module_forward_hook(_post_forward))
    if offloader is not None:
        offloader.active = True
        _hook_handles.append(nn_module.register_module_forward_pre_hook(offloader.enter))
        _hook_handles.append(
            nn_module.register_module_forward_hook(offloader.exit, always_call=True)
        )
        stager = _optimizer_stager(_free_room, _touch_tensors)
        stager.seen = _watch_ddp_buckets()
        _hook_handles.extend(stager.install())


def _remove_hooks() -> None:
    global _hooks_installed, _module_forward_seen
    with _hooks_lock:
        if _offloader is not None:
            _offloader.active = False
            _offloader.abandon_runs()
        if _stager is not None:
            _stager.active = False
        if _streamer is not None:
            _streamer.active = False
            _streamer.abandon_runs()
            _streamer.drop_rings()
        _drop_ddp_buckets()
        while _hook_handles:
            handle = _hook_handles.pop()
            handle.remove()  # type: ignore[attr-defined]
        _hooks_installed = False
        _module_forward_seen = False


# ---- prediction: saved activations leave by copy (Note [Saved-activation offload],
# torch/cuda/_um_predict.py) --------------------------------------------------------

_offloader: Any = None


def _stream_counters(index: int) -> tuple[int, int, int, int]:
    """(bytes the engine has evicted from device ``index`` so far, bytes it has
    discarded so far, free room under its budget: dead bytes count as free, the
    allocator reuses them without a move; and the placed bytes past the budget: what
    would not fit on the device now, dead bytes left out)."""
    s = _raw_stats(index)
    if s is None:
        return 0, 0, 0, 0
    room = s.device_budget_bytes + s.dead_device_bytes - s.device_placed_bytes
    over = s.device_placed_bytes + s.host_placed_bytes - s.dead_device_bytes - s.device_budget_bytes
    return int(s.evict_bytes), int(s.discard_bytes), max(0, int(room)), max(0, int(over))


def _engine_counters(index: int) -> tuple[int, int]:
    """(bytes evicted from device ``index`` so far, free room under its budget), for the
    saved-activation offload."""
    evicted, _, room, _ = _stream_counters(index)
    return evicted, room


def _current_budget() -> int:
    """The current device's budget in bytes (0 before the engine has resolved it)."""
    s = _raw_stats(_device_index(None, allow_host=False))
    return int(s.device_budget_bytes) if s is not None else 0


def _free_room(index: int) -> int:
    """Free room under device ``index``'s budget (the optimizer state staging's)."""
    return _engine_counters(index)[1]


def _host_room() -> int:
    """Host RAM a new page-locked buffer may still take (torch_um_host_room)."""
    return int(_lib.torch_um_host_room()) if _lib is not None else 0


def _predictor() -> Any:
    """The process's offloader when ``predict:True``, else None."""
    global _offloader
    cfg = get_config()
    if cfg.get("predict") != "True":
        return None
    if _offloader is None:
        from torch.cuda import _um_plan, _um_predict

        lookahead = int(cfg.get("predict_lookahead", 1 << 30))
        margin = _um_plan.budget_margin(_current_budget())
        _offloader = _um_predict.Offloader(_engine_counters, _host_room, lookahead, margin)
        _offloader.register_route = _prefer_registration()
    return _offloader


def _prefer_registration() -> bool:
    """torch's page-locked buffers by cudaHostRegister from now on, where Note [Page-locked
    buffers by registration] (torch/cuda/_um_pinned.py) allows; whether they are."""
    from torch.cuda import _um_pinned

    def setter(settings: str) -> None:
        for name in (
            "_accelerator_setAllocatorSettings",  # 2.9 on
            "_cuda_cudaCachingAllocator_set_allocator_settings",
        ):
            if hasattr(torch._C, name):
                getattr(torch._C, name)(settings)
                return
        raise RuntimeError("this torch has no call to set its allocator settings")

    return bool(_um_pinned.prefer_registration(torch.__version__, setter)[0])


_stager: Any = None


def _touch_tensors(tensors: list[torch.Tensor]) -> None:
    _touch(_ranges_of(tensors))


def _optimizer_stager(room: Any, touch: Any) -> Any:
    """The process's optimizer state stager (Note [Optimizer state staging],
    torch/cuda/_um_optim.py), made on first use."""
    global _stager
    if _stager is None:
        from torch.cuda import _um_optim

        _stager = _um_optim.Stager(room, touch)
        _apply_predict_settings()  # predict_stage_kernel
    return _stager


_streamer: Any = None

# ---- Note [Library workspaces] (torch/cuda/_um_workspaces.py): cuBLAS's workspaces,
# found at a thread's first hook and held on the device --------------------------------

_workspaces: Any = None


def _probe_cublas(device: int) -> None:
    """A GEMM on 8x8 matrices through cuBLAS: this pair's workspace exists after it."""
    a = torch.ones(8, 8, device=device)
    torch.mm(a, a)


def _probe_cublaslt(device: int) -> None:
    """The same through cuBLASLt (addmm with a bias), in float32 and bfloat16."""
    a = torch.ones(8, 8, device=device)
    bias = torch.ones(8, device=device)
    torch.addmm(bias, a, a)
    h = a.to(torch.bfloat16)
    torch.addmm(bias.to(torch.bfloat16), h, h)


def _workspace_finder() -> Any:
    """The process's Workspaces, made on first use (the hooks' install)."""
    global _workspaces
    if _workspaces is None:
        from torch.cuda import _um_pinned, _um_streams, _um_workspaces

        def key() -> tuple[int, int, int] | None:
            if not torch.cuda.is_initialized():  # a CPU forward: nothing to find yet
                return None
            dev = torch.cuda.current_device()
            return threading.get_ident(), dev, _um_streams.current_handle(dev)

        _workspaces = _um_workspaces.Workspaces(
            key=key,
            blocks=lambda dev: _um_workspaces.active_blocks(torch.cuda.memory_snapshot(), dev),
            gemms=(_probe_cublas, _probe_cublaslt),
            clear=torch._C._cuda_clearCublasWorkspaces,
            hold=lambda ptr, size, dev: _touch([(ptr, size, dev)], _TOUCH_HOLD),
            capturing=lambda: (
                torch.compiler.is_compiling() or torch.cuda.is_current_stream_capturing()
            ),
            budget=_current_budget,
            persistent=_um_workspaces.persistent(
                _um_pinned.minor_version(torch.__version__), os.environ
            ),
        )
    return _workspaces


# Note [DDP's buckets between steps] (torch/cuda/_um_ddp.py): the process's Buckets, and
# the DDP class _pre_forward looks for while it is on (None: off).
_buckets: Any = None
_ddp_type: type | None = None


def _forget(ptr: int, size: int) -> int:
    return int(_lib.torch_um_forget(ptr, size)) if _lib is not None else 0


def _watch_ddp_buckets() -> Any:
    """With ``predict_ddp_buckets:True`` and torch.distributed: the process's Buckets,
    made on first use and switched on, with _pre_forward watching for DDP modules; its
    ``stepped`` is the optimizer stager's ``seen``. Else None."""
    global _buckets, _ddp_type
    if get_config().get("predict_ddp_buckets") != "True" or not torch.distributed.is_available():
        return None
    from torch.cuda import _um_ddp
    from torch.nn.parallel import DistributedDataParallel

    if _buckets is None:
        _buckets = _um_ddp.Buckets(_forget, _touch)
    _buckets.active = True
    _ddp_type = DistributedDataParallel
    return _buckets.stepped


def _drop_ddp_buckets() -> None:
    global _ddp_type
    _ddp_type = None
    if _buckets is not None:
        _buckets.drop()


def _send_to_host(tensors: list[torch.Tensor]) -> None:
    prefetch(tensors, HOST)


def _weight_streamer() -> Any:
    """The process's weight streamer (Note [Weight streaming], torch/cuda/_um_weights.py),
    made on first use."""
    global _streamer
    if _streamer is None:
        from torch.cuda import _um_weights

        _patch_empty_cache()

        lookahead = int(get_config().get("predict_lookahead", 1 << 30))
        _streamer = _um_weights.Streamer(
            _stream_counters, _send_to_host, _current_budget(), lookahead, _touch_tensors
        )
        _apply_predict_settings()  # predict_copy_sms
    _streamer.active = True
    return _streamer


def _patch_empty_cache() -> None:
    """``torch.cuda.empty_cache`` also gives back the weight streamer's rings, device memory
    it keeps cached between forwards (Note [Weight streaming]). Otherwise a ring outlives
    the cache it belongs to until the pressure watcher removes the hooks, and a program
    that empties the cache to start afresh (the GPU tests do, between workloads) still
    finds the ring's segment held, its free part then hosting the next model's blocks."""
    from torch.cuda import memory

    original = memory.empty_cache
    if getattr(original, "_um_streamer_rings", False):
        return

    @functools.wraps(original)
    def empty_cache() -> None:
        if _streamer is not None:
            _streamer.drop_rings()
        original()

    empty_cache._um_streamer_rings = True  # type: ignore[attr-defined]
    memory.empty_cache = empty_cache
    torch.cuda.empty_cache = empty_cache


def predict_stats() -> dict[str, int]:
    """Counters of the saved-activation offload (``predict:True``), empty before its
    first use: ``predict.forwards`` (forwards run under it), ``predict.target_bytes``
    (bytes of saves the next forward like the last one offloads; the largest over the
    outermost modules, each of which learns its own), ``predict.offloaded_bytes`` /
    ``predict.offloaded_saves`` / ``predict.kept_bytes`` (saves that left by copy and
    that stayed), ``predict.ahead_bytes`` (brought back ahead of use), ``predict.hits``
    (a use found its bytes back), ``predict.late`` (still on their way),
    ``predict.misses`` / ``predict.miss_bytes`` (copied back at the use),
    ``predict.lookahead_bytes``, ``predict.failures`` (saves that stayed because
    page-locked memory was refused), ``predict.host_limited`` (forwards that offloaded
    less to leave ``host_headroom`` of host RAM), ``predict.warmed_bytes`` (page-locked
    buffers made ahead of the forward that takes them, Note [Host buffers made ahead]),
    ``predict.warm_ns`` / ``predict.warm_wait_ns`` (host time the threads took to make them,
    and that the next forward's start waited for them),
    ``predict.register_route`` (1: page-locked buffers are made by cudaHostRegister,
    Note [Page-locked buffers by registration], torch/cuda/_um_pinned.py),
    ``predict.room_stops`` /
    ``predict.lookahead_stops`` (uses after which the next save could not be brought
    back yet for want of room under the budget, or of lookahead); and of the
    optimizer state staging
    (Note [Optimizer state staging], torch/cuda/_um_optim.py):
    ``predict.optimizer_steps`` / ``predict.optimizer_chunks`` /
    ``predict.optimizer_staged_bytes`` (steps run staged, their chunks and the state
    bytes staged), ``predict.optimizer_skipped`` (steps past the budget that ran as
    usual: an optimizer it does not stage, see the Note) and
    ``predict.optimizer_no_room`` (steps that ran as usual for want of free room under
    the budget to stage into), ``predict.optimizer_touch_failures`` (steps whose
    gradients could not be reported as used: Note [The step's gradients are touched]),
    ``predict.optimizer_lean_copies`` (state tensors copied in or out by the lean copy
    kernel under ``predict_stage_kernel:lean``);
    and of the weight streaming (Note [Weight streaming],
    torch/cuda/_um_weights.py): ``predict.stream_forwards`` (forwards without autograd
    under it), ``predict.stream_records`` (orders of module calls recorded: the first
    forward of a model, and each departure), ``predict.stream_departures`` (forwards
    that left their record), ``predict.stream_target_bytes`` (parameter bytes the next
    forward reads by copy), ``predict.stream_low_room_bytes`` (the least free room under
    the budget seen at a streamed call of the last forward, which shrinks the target),
    ``predict.stream_streamed_bytes`` /
    ``predict.stream_streamed_params`` (read by copy so far),
    ``predict.stream_sent_bytes`` (parameters sent to host RAM to be read by copy;
    ``predict.stream_send_failures``: sends the engine refused, the copies then read
    the parameters where they are; ``predict.stream_ring_failures``: forwards that read
    every parameter in place, for want of device memory for the ring of copies),
    ``predict.stream_unused_bytes`` (copied, then not used: the forward departed),
    ``predict.stream_stale`` (copies not used: the parameter changed after its copy),
    ``predict.stream_write_backs`` (parameters a call wrote in place, copied back),
    ``predict.stream_pressured`` (forwards in which the engine still evicted to make
    room: the target grew), ``predict.stream_discard_growths`` (forwards in which it
    discarded dead blocks past a margin instead, and the target grew by them: Note
    [Discards past the budget], torch/cuda/_um_plan.py), ``predict.stream_copy_sms``
    (the SMs the copies hold: a green context's SMs under
    ``predict_copy_kernel:foreach``, or the lean copy kernel's blocks under ``lean``,
    the default; 0: any) and
    ``predict.stream_lean_copies`` (parameters copied by the lean copy kernel: Note
    [Lean copies], torch/cuda/_um_copy.py); and of DistributedDataParallel's buckets
    (``predict_ddp_buckets``, Note [DDP's buckets between steps],
    torch/cuda/_um_ddp.py): ``predict.ddp_forgotten`` / ``predict.ddp_forgotten_bytes``
    (buckets given up at a forward's start, and their bytes), ``predict.ddp_released``
    (those of them released: their memory went back to the allocator; the others were
    forgotten, and the engine's ``um.forgotten_discard_bytes`` counts what of those then
    left the device without a copy: Note [Who else holds a bucket]),
    ``predict.ddp_touched`` (buckets brought back by a gradient hook: given memory again,
    or touched) and ``predict.ddp_let_go`` (released buckets the reducer had replaced,
    never brought back); and of cuBLAS's workspaces, which the hooks hold on the device with
    or without ``predict`` (Note [Library workspaces], torch/cuda/_um_workspaces.py):
    ``predict.workspaces_held`` / ``predict.workspace_held_bytes`` (the (thread, stream)
    pairs whose workspace is held now, and its bytes; the engine's ``um.hold_bytes``
    counts every hold), ``predict.workspace_clears`` (times every workspace was freed
    to find one), ``predict.workspaces_left_alone`` (pairs not held) and
    ``predict.workspaces_per_call`` (1: this torch gives each GEMM a workspace of its own,
    torch 2.15 and later by default, and there is none to hold); ``predict.program_forwards``
    (forwards offloaded between two backward calls, ``predict_programs``: Note [A program's
    forward between two backwards], torch/cuda/_um_program.py); ``predict.compiled_model``
    (1 once a compiled module was called: Note [A compiled model is driven by
    operators])."""
    out = {} if _offloader is None else dict(_offloader.counters())
    if _stager is not None:
        out.update(_stager.counters())
    if _streamer is not None:
        out.update(_streamer.counters())
    if _buckets is not None:
        out.update(_buckets.counters())
    if _workspaces is not None:
        out.update({"predict." + k: v for k, v in _workspaces.counters().items()})
    if _compiled_forward_seen:
        out["predict.compiled_model"] = 1  # Note [A compiled model is driven by operators]
    return out


def summary(device: DeviceLike = None) -> str:
    """The engine's counters of ``device`` and of ``predict``, read for a person: where
    the managed memory is, what crossed the link by which route, whether ``predict``
    brought data back ahead of use, and a note for each counter that records something
    to act on (an allocation refused by ``max_managed``, a forward that read every weight
    in place, ...), naming that counter (Note [The summary says what the counters say],
    torch/cuda/_um_report.py). ``print(torch.cuda.um.summary())``. Does not initialise
    CUDA."""
    if _lib is None:
        return "torch.cuda.um summary: this torch has no unified-memory engine"
    from torch.cuda import _um_report

    index = _device_index(device, allow_host=False)
    text: str = _um_report.summary_text(
        index, stats(index), predict_stats(), get_config(), _hooks_installed
    )
    return text


def _hooks_wanted() -> bool:
    cfg = get_config()
    return (
        cfg.get("policy") == "lru"
        and cfg.get("hooks") == "True"
        and is_enabled()
        and not _compiled_forward_seen
    )


# Note [A compiled model is driven by operators]
# The module hooks' predictions are built on eager forwards: a module's pre-forward,
# the saved-tensor hooks of its forward, the parameters its forward reads. A model under
# torch.compile runs its layers inside generated code that fires the global hooks around
# graph breaks at best, and the predictions built on them went wrong: a torch.compile'd
# model of 24 nn.Linear layers past a 6 GiB budget ran 5.8-5.9 s a step with the hooks,
# 34x its floor, on this engine and the one before it; with hooks:False, where the
# operator observer drives (the ATen operators Inductor calls, its matrix products among
# them, pass the dispatcher), 0.58 s, 3.4x (docs/notes/step-57-victims-as-runs.md). So
# once the program calls a compiled module (torch.compile's wrapper, or a module whose
# own compile() was called), the watcher takes the hooks off and the observer drives, as
# under hooks:False, until configure() is called again (which starts the choice afresh:
# a program that goes back to eager modules can ask for the hooks that way). A compiled
# function that calls eager modules is not seen here and keeps the hooks.
_compiled_forward_seen = False
_optimized_module: type | None = None  # torch._dynamo's OptimizedModule, once loaded


def _compiled_module(module: Module) -> bool:
    """Whether calling `module` runs a compiled graph: torch.compile's wrapper
    (OptimizedModule) or a module whose compile() was called."""
    global _optimized_module
    if getattr(module, "_compiled_call_impl", None) is not None:
        return True
    if _optimized_module is None:
        frames = sys.modules.get("torch._dynamo.eval_frame")
        if frames is None:
            return False
        _optimized_module = getattr(frames, "OptimizedModule", None)
        if _optimized_module is None:
            return False
    return isinstance(module, _optimized_module)


# ---- use signals: every operator (Note [Operator use signals] in OpSignal.h) -----------
#
# The engine's own observer of ATen operators: installed by the pressure watcher while a
# device is near its budget (the setting op_signal), removed when none is, so that a job
# that fits never boxes an operator's arguments for it. Where it cannot be installed
# (torch's observer functions not found), one warning, and the engine goes on with the
# module hooks and unified memory's faults.

_op_signal_on = False
_op_signal_error: str | None = None

# Note [Which signal drives the engine]
# Past the budget, a program built from modules is driven by the module hooks and the
# predictions built on them (saved-activation offload, optimizer staging, weight
# streaming), which move data by copy at the link's speed; the operator observer's
# bring-ins and lookahead move it by migration. Both at once fought: a model of
# nn.Linear layers trained by a hand-written Lion update ran 1.69 s a step with both
# against 0.50 s with the hooks alone, and the optimizer staging found no room
# (bench/results/classes-train-custom-opt-h200-2026-11-29-call2.json,
# docs/notes/step-53-operator-signal.md). So the observer is the signal of the work no
# module hook describes: the watcher installs it one poll after the hooks, and only while
# no module forward has run under them since; a module forward takes it off at the next
# poll. A program of plain tensors keeps it for good.
_module_forward_seen = False
_op_signal_polls = 0  # polls under pressure with the hooks on and no module forward seen


def _op_signal_wanted() -> bool:
    cfg = get_config()
    return cfg.get("policy") == "lru" and cfg.get("op_signal") == "True" and is_enabled()


def _modules_drive() -> bool:
    """Whether the module hooks drive the engine now (Note [Which signal drives the
    engine]): they are on and a module forward ran under them, or they came on so recently
    that no poll has seen whether one does."""
    global _op_signal_polls
    if not _hooks_installed:
        _op_signal_polls = 0
        return False
    if _module_forward_seen:
        return True
    _op_signal_polls += 1
    return _op_signal_polls < 2


def _sync_op_signal() -> None:
    """Install the operator observer or take it off, as the pressure and the settings
    want now (the watcher's poll)."""
    global _op_signal_on, _op_signal_error
    lib = _lib
    if lib is None or _op_signal_error is not None:
        return
    with _hooks_lock:
        wanted = (
            bool(lib.torch_um_under_pressure()) and _op_signal_wanted() and not _modules_drive()
        )
        if wanted == _op_signal_on:
            return
        err = ctypes.create_string_buffer(_ERRLEN)
        if int(lib.torch_um_op_signal(int(wanted), err, _ERRLEN)) != 0:
            _op_signal_error = err.value.decode(errors="replace")
            warnings.warn(f"torch.cuda.um: {_op_signal_error}; running without it", stacklevel=1)
            return
        _op_signal_on = wanted


# Note [The pressure watcher stops before the interpreter finalises]
# The watcher is a daemon thread, and removing the hooks frees tensors on it (the weight
# streamer's rings). Freeing a tensor releases the GIL inside torch's C++ code. A daemon
# thread that takes the GIL back once the interpreter has begun to finalise is ended
# with pthread_exit, whose unwinding through that noexcept C++ frame calls
# std::terminate: the process printed "terminate called without an active exception"
# and exited with status 134 after its last line, in 2 of 3 runs of a GPU-suite subset
# (bench/README.md, prediction step 19). The program's own objects are freed at exit, so
# the pressure falls then, and that is just when the watcher removes the hooks. So an
# atexit handler, which runs before finalisation starts, stops the watcher and waits
# for it.
_watch_stop = threading.Event()
_watch_thread: threading.Thread | None = None


def _stop_watch() -> None:
    _watch_stop.set()
    if _watch_thread is not None:
        _watch_thread.join(timeout=10)


def _watch_pressure() -> None:
    global _watch_thread
    lib = _lib
    if lib is None or _watch_thread is not None:
        return

    def watch() -> None:
        while not _watch_stop.wait(0.1):
            hooks_ok = _sync_hooks()
            _sync_op_signal()
            _sync_program_forwards()
            if not hooks_ok:
                return

    _watch_thread = threading.Thread(target=watch, name="torch.cuda.um pressure watch", daemon=True)
    _watch_thread.start()
    atexit.register(_stop_watch)


# Note [A program's forward between two backwards] (torch/cuda/_um_program.py): with
# predict_programs, while the operator observer drives (no module forward under the hooks),
# the saved-activation offload runs over the program's forward between two backward calls.
_backward_wrapped = False


def _sync_program_forwards() -> None:
    """Let the offload begin program forwards, or stop it, as the pressure, the settings
    and the signal that drives want now (the watcher's poll). torch.autograd's backward
    and grad stay wrapped once wrapped: a forward left open ends at the next backward."""
    global _backward_wrapped
    lib = _lib
    if lib is None:
        return
    with _hooks_lock:
        # _op_signal_on: the observer drives (Note [Which signal drives the engine]); module
        # hooks may be installed and idle (no module forward), or off
        wanted = (
            _op_signal_on
            and get_config().get("predict_programs") == "True"
            and bool(lib.torch_um_under_pressure())
        )
        offloader = _predictor() if wanted else _offloader
        if offloader is None:
            return
        if wanted and not _backward_wrapped:
            from torch.cuda import _um_program

            _um_program.wrap_backward(offloader.begin_program, offloader.end_program)
            _backward_wrapped = True
        if wanted and not offloader.programs:
            offloader.active = True
        offloader.programs = wanted


# ---- wiring into torch (injection path) --------------------------------------

_attach_lock = threading.Lock()
_attach_error: str | None = None


def _attach() -> None:
    """Runs once CUDA is initialised (torch.cuda._lazy_call): connects the
    engine to the caching allocator's block events (its trace tracker)."""
    global _attach_error
    if _lib is None:
        return
    with _attach_lock:
        err = ctypes.create_string_buffer(_ERRLEN)
        if _injected:
            rc = int(_lib.torch_um_inject_attach(err, _ERRLEN))
        else:  # source path: the tracker is attached by the engine's C API
            rc = int(_lib.torch_um_attach_events(err, _ERRLEN))
        if rc != 0:
            _attach_error = err.value.decode(errors="replace")
            if is_enabled():
                warnings.warn(f"torch.cuda.um: {_attach_error}", stacklevel=2)
        _drop_expandable_segments()
        if is_enabled():
            _watch_pressure()
            _apply_host_settings()


def _expandable_requested() -> bool:
    """Whether the allocator settings torch reads (PYTORCH_ALLOC_CONF, else
    PYTORCH_CUDA_ALLOC_CONF; the last value given) turn expandable segments on."""
    from torch.cuda import _um_pinned

    _, own = _um_pinned.program_settings(torch.__version__, os.environ)
    return (_um_pinned.setting(own, "expandable_segments") or "").lower() == "true"


def _drop_expandable_segments() -> None:
    # Expandable segments (cuMemMap) cannot be managed memory: as on the
    # source path, the request is dropped with one warning while UM is on.
    # On the source path the patched allocator drops it itself (with its warning).
    if not _injected or not is_enabled() or not _expandable_requested():
        return
    warnings.warn(
        "unified memory: expandable_segments:True is ignored because expandable "
        "segments (cuMemCreate/cuMemMap) cannot be managed memory. Set "
        "PYTORCH_CUDA_UM_CONF=enabled:False to use them instead of unified memory.",
        stacklevel=3,
    )
    torch._C._accelerator_setAllocatorSettings("expandable_segments:False")


def _memory_stats_counters(device: object = None) -> dict[str, int] | None:
    """torch.cuda.um.stats(device) for torch.cuda.memory_stats() and memory_summary(), or
    None while UM is off and the device holds no managed segment (Note [UM counters where
    tools look for memory], torch/cuda/_um_memstats.py). Called after upstream's own
    reading, so CUDA is initialised and ``device`` is one upstream accepted."""
    from torch.cuda import _um_memstats
    from torch.cuda._utils import _get_device_index

    index = _get_device_index(device, optional=True)
    s = _raw_stats(index)
    enabled = is_enabled()
    if s is None or not (enabled or s.managed_segments > 0):
        return None
    out = {src: int(getattr(s, src.removeprefix("um."))) for _, src in _um_memstats.KEYS}
    out["um.enabled"] = int(enabled)
    return out


def _install_memory_stats() -> None:
    # torch.cuda is still being imported (its __init__ imports this module last), so
    # `torch.cuda` is not an attribute of torch yet: the module comes from sys.modules.
    import sys

    from torch.cuda import _um_memstats, memory

    _um_memstats.install(memory, sys.modules["torch.cuda"], _memory_stats_counters)


def _install() -> None:
    # Sharing a managed CUDA tensor through CUDA IPC is refused by the engine
    # itself (checkIpcExportable, reached by the source path's patch or the
    # interposed cudaIpcGetMemHandle): torch raises RuntimeError with its text.
    if _lib is None:
        return
    # torch.cuda is still being imported: take _lazy_call from the module.
    from torch.cuda import _lazy_call

    _lazy_call(_attach)
    _install_memory_stats()
    _choose_nccl_process_group()


def _choose_nccl_process_group() -> None:
    """Note [nccl2 registers every segment] (torch/cuda/_um_interplay.py)."""
    if not is_enabled():
        return
    from torch.cuda import _um_interplay, _um_pinned

    value, warning = _um_interplay.nccl_process_group(
        _um_pinned.minor_version(torch.__version__), os.environ
    )
    if value is not None:
        os.environ[_um_interplay.NCCL2] = value
    if warning is not None:
        warnings.warn(warning, stacklevel=2)


_install()
