"""The engine reaches the caching allocator, and the allocator behaves as stock under UM."""

from __future__ import annotations

import ctypes
import shutil
from typing import Any

import pytest

from tests.gpu.conftest import (
    GiB,
    Limits,
    MiB,
    cudart,
    release_cache,
    run_threads,
    stream_fuzz,
)

torch = pytest.importorskip("torch")

CUDA_MEMORY_TYPE_DEVICE = 2
CUDA_MEMORY_TYPE_MANAGED = 3
CUDA_CPU_DEVICE_ID = -1
RANGE_PREFERRED_LOCATION = 2  # cudaMemRangeAttributePreferredLocation
RANGE_LAST_PREFETCH_LOCATION = 4  # cudaMemRangeAttributeLastPrefetchLocation


class _PointerAttributes(ctypes.Structure):
    _fields_ = [
        ("type", ctypes.c_int),
        ("device", ctypes.c_int),
        ("devicePointer", ctypes.c_void_p),
        ("hostPointer", ctypes.c_void_p),
        ("reserved", ctypes.c_long * 8),  # CUDA 13 driver_types.h
    ]


def range_attribute(t: torch.Tensor, attribute: int) -> int:
    """cudaMemRangeGetAttribute of a tensor's storage (a device index, or -1 for host)."""
    value = ctypes.c_int(-99)
    st = t.untyped_storage()
    rc = cudart().cudaMemRangeGetAttribute(
        ctypes.byref(value),
        ctypes.c_size_t(4),
        ctypes.c_int(attribute),
        ctypes.c_void_p(st.data_ptr()),
        ctypes.c_size_t(st.nbytes()),
    )
    assert rc == 0, f"cudaMemRangeGetAttribute failed: {rc}"
    return value.value


def memory_type(ptr: int) -> int:
    """cudaPointerGetAttributes(ptr).type, asked of the CUDA runtime directly."""
    attrs = _PointerAttributes()
    rc = cudart().cudaPointerGetAttributes(ctypes.byref(attrs), ctypes.c_void_p(ptr))
    assert rc == 0, f"cudaPointerGetAttributes failed: {rc}"
    return attrs.type


def test_interposed_and_managed(torch_mod: Any, um: Any, limits: Limits) -> None:
    before = um.injection_info()
    x = torch.ones(64 * MiB // 4, device="cuda")
    info = um.injection_info()
    assert info["interposed"] == 1
    assert info["segment_allocs"] > before["segment_allocs"]
    assert info["attached"] == 1, "trace tracker not attached at CUDA init"
    assert um.is_managed(x)
    assert memory_type(x.data_ptr()) == CUDA_MEMORY_TYPE_MANAGED
    s = um.stats()
    assert s["um.enabled"] == 1
    assert s["um.managed_bytes"] >= x.nbytes
    assert s["um.managed_segments"] >= 1
    assert float(x.sum()) == x.numel()
    print(f"[um] stats {s}\n[um] injection {info}")


def test_other_callers_keep_device_memory(torch_mod: Any, um: Any, limits: Limits) -> None:
    # cudaMalloc called by anything but libc10_cuda.so (here: ctypes through the
    # process-wide symbol, as NCCL or an extension would) stays plain.
    glob = ctypes.CDLL(None)
    ptr = ctypes.c_void_p()
    before = um.injection_info()["passthrough_mallocs"]
    assert glob.cudaMalloc(ctypes.byref(ptr), ctypes.c_size_t(1 * MiB)) == 0
    try:
        assert memory_type(ptr.value) == CUDA_MEMORY_TYPE_DEVICE
        assert not um.is_managed(ptr.value)
        assert um.injection_info()["passthrough_mallocs"] == before + 1
    finally:
        assert glob.cudaFree(ptr) == 0


def test_um_off_is_stock(torch_mod: Any, um: Any, limits: Limits) -> None:
    um.configure(enabled=False)
    managed_before = um.stats()["um.managed_bytes"]
    x = torch.ones(32 * MiB // 4, device="cuda")
    assert not um.is_managed(x)
    assert memory_type(x.data_ptr()) == CUDA_MEMORY_TYPE_DEVICE
    assert um.stats()["um.managed_bytes"] == managed_before
    del x
    um.configure(enabled=True)
    torch.cuda.empty_cache()
    y = torch.ones(32 * MiB // 4, device="cuda")
    assert um.is_managed(y)


def test_memory_stats_summary_snapshot_consistent(torch_mod: Any, um: Any, limits: Limits) -> None:
    keep = [torch.randn(n, device="cuda") for n in (1, 1000, 300_000, 5_000_000, 40_000_000)]
    torch.cuda.synchronize()
    stats = torch.cuda.memory_stats()
    snap = torch.cuda.memory_snapshot()
    reserved = stats["reserved_bytes.all.current"]
    assert stats["allocated_bytes.all.current"] >= sum(t.nbytes for t in keep)
    assert sum(seg["total_size"] for seg in snap) == reserved
    for seg in snap:
        assert um.is_managed(seg["address"]), seg
    assert um.stats()["um.managed_bytes"] == reserved
    assert torch.cuda.memory_reserved() == reserved
    summary = torch.cuda.memory_summary()
    assert "PyTorch CUDA memory summary" in summary
    info = um.injection_info()
    assert info["block_allocs"] > 0 and info["segment_alloc_events"] > 0
    # empty_cache releases managed segments
    del keep
    torch.cuda.empty_cache()
    after = torch.cuda.memory_stats()["reserved_bytes.all.current"]
    assert um.stats()["um.managed_bytes"] == after
    assert um.injection_info()["segment_free_events"] > 0


def _reuse_while_side_stream_busy(um: Any, enabled: bool) -> tuple[bool, bool]:
    """Free a block recorded on a busy side stream, allocate the same size again.

    Returns (side stream still busy when reallocating, old block handed out again).
    """
    um.configure(enabled=enabled)
    release_cache(torch)
    side = torch.cuda.Stream()
    # Warm up the kernels used below: the first launch of a lazily loaded CUDA
    # module can wait for the device, which would end the side stream's sleep.
    with torch.cuda.stream(side):
        torch.cuda._sleep(1000)
        torch.zeros(1, device="cuda").add_(1)
    side.synchronize()
    x = torch.zeros(8 * MiB // 4, device="cuda")
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.cuda._sleep(2_000_000_000)  # about a second of busy side stream
        x.add_(1)
    x.record_stream(side)
    old = x.data_ptr()
    del x
    busy = not side.query()
    y = torch.empty(8 * MiB // 4, device="cuda")
    reused = y.data_ptr() == old
    assert um.is_managed(y) == enabled
    side.synchronize()
    z = torch.full((8 * MiB // 4,), 3.0, device="cuda")
    assert float(z.sum()) == 3.0 * z.numel()
    del y, z
    return busy, reused


def test_record_stream(torch_mod: Any, um: Any, limits: Limits) -> None:
    on = _reuse_while_side_stream_busy(um, True)
    off = _reuse_while_side_stream_busy(um, False)
    print(f"[um] record_stream (side busy, block reused): UM on {on}, stock {off}")
    assert on[0], "premise broken: the side stream finished before the reallocation"
    assert not on[1], "block reused before the recorded stream finished (UM on)"
    assert on == off, "record_stream behaves differently with UM on than stock"


def test_threads_and_streams_fuzz(torch_mod: Any, um: Any, limits: Limits) -> None:
    sizes = [1, 7, 512, 4099, 1 << 16, 1 << 20, 3 << 20, 9 << 20]
    errors = run_threads(lambda i: stream_fuzz(i, 250, sizes), 4)
    assert not errors, errors
    assert um.stats()["um.managed_bytes"] == torch.cuda.memory_reserved()


def test_cuda_graph_capture_and_replay(torch_mod: Any, um: Any, limits: Limits) -> None:
    static_in = torch.zeros(1 << 20, device="cuda")
    skipped_before = um.stats()["um.prefetches_skipped_capture"]
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):  # warm up
            static_out = static_in * 2 + 1
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        static_out = static_in * 2 + 1
        extra = torch.empty(16 * MiB // 4, device="cuda").fill_(5)  # a new pool segment
    assert um.injection_info()["captures_underway"] == 0
    for k in range(3):
        static_in.fill_(float(k))
        g.replay()
        torch.cuda.synchronize()
        assert torch.all(static_out == 2 * k + 1)
        assert float(extra[0]) == 5.0
    # The private pool's segments were made during the capture: plain cudaMalloc memory, as in
    # stock torch (Note [Segments made during a capture are plain], Engine.cpp).
    assert not um.is_managed(static_out) and not um.is_managed(extra)
    assert um.stats()["um.prefetches_skipped_capture"] == skipped_before
    del g, static_out, extra


def test_compile_reduce_overhead(torch_mod: Any, um: Any, limits: Limits) -> None:
    from torch.utils._triton import has_triton

    if not has_triton():
        pytest.skip("Triton does not work on this host")
    if not (shutil.which("gcc") or shutil.which("cc")):
        pytest.skip("no C compiler for Triton's launcher on this host")

    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(a @ b) + a.sum()

    cf = torch.compile(f, mode="reduce-overhead")
    a = torch.randn(256, 256, device="cuda")
    b = torch.randn(256, 256, device="cuda")
    for _ in range(4):
        out = cf(a, b)
    torch.cuda.synchronize()
    assert torch.allclose(out, f(a, b), rtol=1e-3, atol=1e-3)
    # Whether `out` is managed depends on where cudagraph trees put it: in a segment their
    # warm-up made (managed) or one made during the recording (plain, Note [Segments made
    # during a capture are plain]).
    assert um.injection_info()["captures_underway"] == 0


def test_cap_raises_oom_and_recovers(torch_mod: Any, um: Any, limits: Limits) -> None:
    um.configure(max_managed=256 * MiB)
    before = um.stats()["um.cap_refusals"]
    oom_before = um.injection_info()["oom_events"]
    with pytest.warns(UserWarning, match="max_managed"):
        with pytest.raises(torch.OutOfMemoryError):
            torch.empty(512 * MiB // 4, device="cuda")
    assert um.stats()["um.cap_refusals"] > before
    assert um.injection_info()["oom_events"] > oom_before
    y = torch.ones(16 * MiB // 4, device="cuda")
    assert float(y.sum()) == y.numel()
    um.configure(max_managed=limits.cap)
    z = torch.ones(512 * MiB // 4, device="cuda")
    assert float(z.sum()) == z.numel()
    # An OOM no refusal caused (a stock memory fraction below what is reserved) must not
    # repeat the earlier refusal's reason.
    torch.cuda.set_per_process_memory_fraction(128 * MiB / limits.total)
    try:
        with pytest.warns(UserWarning, match="CUDA out of memory under unified memory") as rec:
            with pytest.raises(torch.OutOfMemoryError):
                torch.empty(1 * GiB // 4, device="cuda")
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    texts = [str(w.message) for w in rec if "unified memory" in str(w.message)]
    assert texts and not any("Refused by unified memory" in t for t in texts), texts


def test_host_headroom_raises_oom_and_recovers(torch_mod: Any, um: Any, limits: Limits) -> None:
    torch.cuda.empty_cache()
    um.configure(device_budget=64 * MiB, host_headroom="1000000GiB")
    before = um.stats()["um.headroom_refusals"]
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(256 * MiB // 4, device="cuda")
    assert um.stats()["um.headroom_refusals"] > before
    um.configure(device_budget="90%", host_headroom="2GiB")
    y = torch.ones(256 * MiB // 4, device="cuda")
    assert float(y.sum()) == y.numel()


def test_python_api_on_gpu(torch_mod: Any, um: Any, limits: Limits) -> None:
    x = torch.ones(64 * MiB // 4, device="cuda")
    assert um.prefetch(x, "cpu") == x.untyped_storage().nbytes()
    torch.cuda.synchronize()
    assert range_attribute(x, RANGE_LAST_PREFETCH_LOCATION) == CUDA_CPU_DEVICE_ID
    assert um.prefetch(x, 0) == x.untyped_storage().nbytes()
    torch.cuda.synchronize()
    assert range_attribute(x, RANGE_LAST_PREFETCH_LOCATION) == 0
    model = torch.nn.Linear(512, 512).cuda()
    assert um.prefetch(model, "cuda") > 0
    assert um.advise(model, "read_mostly", 0) > 0
    assert um.advise(model, "unset_read_mostly", 0) > 0
    assert um.advise(x, "preferred_location", "cpu") > 0
    assert range_attribute(x, RANGE_PREFERRED_LOCATION) == CUDA_CPU_DEVICE_ID
    assert um.advise(x, "accessed_by", 0) > 0
    torch.cuda.synchronize()
    assert float(x.sum()) == x.numel()
    with pytest.raises(ValueError):
        um.advise(x, "no_such_advice", 0)
    um.set_device_budget(2 * GiB)
    assert int(um.stats()["um.device_budget_bytes"]) == 2 * GiB
    um.set_max_managed(limits.cap)
    um.reset_peak()
    assert um.stats()["um.peak_managed_bytes"] == um.stats()["um.total_managed_bytes"]
