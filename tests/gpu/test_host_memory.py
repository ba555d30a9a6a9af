"""Managed host memory and zero-copy moves (Note [Managed host memory], issue 9).

CPU tensors allocated inside ``torch.cuda.um.managed_host()`` are managed memory placed in
host RAM; ``torch.cuda.um.move_`` hands them to the GPU without a copy (same address), with
the data equal to what a copy gives, under a device budget too. A storage that other tensors
still reach is copied, never aliased behind their backs.
"""

from __future__ import annotations

import copy
import ctypes
from typing import Any

import pytest

from tests.gpu.conftest import Limits, MiB, cudart, rss_bytes

torch = pytest.importorskip("torch")


def _reference(n: int, seed: int) -> Any:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, generator=g)


def _accessed_by(t: Any) -> set[int]:
    """The devices with AccessedBy advice over the whole of a tensor's storage
    (cudaMemRangeGetAttribute(cudaMemRangeAttributeAccessedBy))."""
    ids = (ctypes.c_int * 8)()
    st = t.untyped_storage()
    rc = cudart().cudaMemRangeGetAttribute(
        ids,
        ctypes.c_size_t(ctypes.sizeof(ids)),
        ctypes.c_int(3),  # cudaMemRangeAttributeAccessedBy
        ctypes.c_void_p(st.data_ptr()),
        ctypes.c_size_t(st.nbytes()),
    )
    assert rc == 0, f"cudaMemRangeGetAttribute failed: {rc}"
    return {d for d in ids if d >= 0}  # unused entries read cudaInvalidDeviceId (-2)


def _managed(n: int, seed: int, um: Any) -> Any:
    g = torch.Generator().manual_seed(seed)
    with um.managed_host():
        return torch.randn(n, generator=g)


def test_scope_makes_large_cpu_tensors_managed(torch_mod: Any, um: Any) -> None:
    before = um.stats()
    with um.managed_host():
        big = torch.ones(4 * MiB // 4)
        small = torch.ones(256)  # under host_alloc_min: ordinary memory
    outside = torch.ones(4 * MiB // 4)
    assert big.device.type == "cpu" and um.is_managed(big)
    assert not um.is_managed(small) and not um.is_managed(outside)
    after = um.stats()
    assert after["um.host_allocations"] == before["um.host_allocations"] + 1
    assert after["um.host_alloc_bytes"] >= before["um.host_alloc_bytes"] + 4 * MiB
    assert float(big.sum()) == float(big.numel())
    del big
    assert um.stats()["um.host_allocations"] == before["um.host_allocations"]


def test_move_to_gpu_and_back_keeps_address_and_data(torch_mod: Any, um: Any) -> None:
    n = 16 * MiB // 4
    x = _managed(n, 1, um)
    ref = _reference(n, 1)
    ptr = x.data_ptr()
    assert um.move_(x, "cuda") is x
    assert x.device.type == "cuda" and x.data_ptr() == ptr and um.is_managed(x)
    assert um.stats()["um.adopted_bytes"] >= n * 4
    assert torch.equal(x.cpu(), ref)
    x.mul_(2)
    um.move_(x, "cpu")
    assert x.device.type == "cpu" and x.data_ptr() == ptr
    assert torch.equal(x, ref * 2)


def test_move_past_the_budget_streams_and_is_exact(torch_mod: Any, um: Any, limits: Limits) -> None:
    budget = 256 * MiB
    um.configure(device_budget=budget)
    n = 2 * budget // 4  # twice the budget
    x = _managed(n, 2, um)
    um.move_(x, "cuda")
    x.pow_(2)
    torch.cuda.synchronize()
    s = um.stats()
    assert s["um.device_placed_bytes"] + s["um.unplaced_bytes"] <= budget
    assert s["um.host_placed_bytes"] >= n * 4 - budget
    ref = _reference(n, 2).pow_(2)
    step = 32 * MiB // 4
    for i in range(0, n, step):
        assert torch.equal(x[i : i + step].cpu(), ref[i : i + step]), f"chunk at {i}"


def test_a_storage_others_reach_is_copied_not_aliased(torch_mod: Any, um: Any) -> None:
    n = 4 * MiB // 4
    x = _managed(n, 3, um)
    view = x[10:]  # user code still holds this CPU view of x's storage
    ptr = x.data_ptr()
    with pytest.raises(ValueError, match="other reference"):
        um.move_(x, "cuda", copy=False)
    assert x.device.type == "cpu"
    um.move_(x, "cuda")  # copy=True: falls back to a copy
    assert x.device.type == "cuda" and x.data_ptr() != ptr
    x.zero_()
    assert view.device.type == "cpu" and torch.equal(view, _reference(n, 3)[10:])


def test_plain_cpu_memory_is_copied(torch_mod: Any, um: Any) -> None:
    x = _reference(4 * MiB // 4, 4)
    with pytest.raises(ValueError, match="not managed"):
        um.move_(x, "cuda", copy=False)
    um.move_(x, "cuda")
    assert x.device.type == "cuda" and torch.equal(x.cpu(), _reference(4 * MiB // 4, 4))


def test_module_moves_in_place_and_computes_as_a_copy(torch_mod: Any, um: Any) -> None:
    torch.manual_seed(0)
    with um.managed_host():
        model = torch.nn.Sequential(
            torch.nn.Linear(1024, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 1024)
        )
    twin = copy.deepcopy(model).cuda()  # plain copy for reference
    weight = model[0].weight
    ptr = weight.data_ptr()
    assert um.is_managed(weight)
    um.move_(model, "cuda")
    assert model[0].weight is weight and weight.device.type == "cuda"
    assert weight.data_ptr() == ptr
    x = torch.randn(64, 1024, device="cuda")
    assert torch.equal(model(x), twin(x))
    opt, opt2 = (torch.optim.SGD(m.parameters(), lr=0.1) for m in (model, twin))
    for m, o in ((model, opt), (twin, opt2)):
        m(x).square().mean().backward()
        o.step()
    assert torch.equal(model[2].weight, twin[2].weight)


def test_checkpoint_loads_to_the_gpu_without_a_copy(torch_mod: Any, um: Any, tmp_path: Any) -> None:
    torch.manual_seed(1)
    src = torch.nn.Sequential(torch.nn.Linear(2048, 1024), torch.nn.Linear(1024, 2048))
    src[1].weight = torch.nn.Parameter(src[0].weight.t())  # a view sharing storage
    path = tmp_path / "ckpt.pt"
    torch.save(src.state_dict(), path)
    with um.managed_host():
        sd = torch.load(path, map_location="cpu", weights_only=True)
    # The weights are managed (the biases, under host_alloc_min, are not: they are copied).
    big = {k: t.data_ptr() for k, t in sd.items() if t.nbytes >= MiB}
    assert len(big) == 2 and all(um.is_managed(sd[k]) for k in big)
    um.move_(list(sd.values()), "cuda")
    assert {k: sd[k].data_ptr() for k in big} == big
    with torch.device("meta"):
        dst = torch.nn.Sequential(torch.nn.Linear(2048, 1024), torch.nn.Linear(1024, 2048))
    dst.load_state_dict(sd, assign=True)
    for (name, a), b in zip(src.state_dict().items(), dst.state_dict().values(), strict=True):
        assert b.device.type == "cuda" and torch.equal(a, b.cpu()), name
    # The tied view still shares memory with its base after the move.
    assert dst[1].weight.data_ptr() == dst[0].weight.data_ptr()


def test_host_alloc_managed_setting(torch_mod: Any, um: Any) -> None:
    torch.ones(1, device="cuda")  # the process has used CUDA
    um.configure(host_alloc="managed")
    x = torch.empty(2 * MiB // 4)
    assert um.is_managed(x)
    um.configure(host_alloc="default")
    assert not um.is_managed(torch.empty(2 * MiB // 4))


def test_copies_of_managed_host_memory_run_as_a_kernel(torch_mod: Any, um: Any) -> None:
    """Note [Copies of managed host memory by kernel] (HostCopy.h): torch's copies between
    a managed CPU tensor and the GPU run as the engine's kernel and give what the driver's
    copy gives; small, misaligned and pageable copies, and host_copy_kernel:False, go to
    the driver."""

    def kernel_copies() -> tuple[int, int]:
        s = um.stats()
        return s["um.kernel_copies"], s["um.kernel_copy_bytes"]

    n = 8 * MiB // 4 + 3  # not a multiple of 16 bytes: the kernel's tail
    src = _managed(n, 7, um)
    ref = _reference(n, 7)
    dst_host = _managed(n, 0, um).zero_()
    c0, b0 = kernel_copies()
    dev = src.to("cuda")  # host to device
    dst_host.copy_(dev * 2)  # device to host
    c1, b1 = kernel_copies()
    assert (c1 - c0, b1 - b0) == (2, 2 * n * 4), um.stats()["um.kernel_copy_failures"]
    assert torch.equal(dev.cpu(), ref) and torch.equal(dst_host, ref * 2)
    # non_blocking: the call returns once the host buffer is free, as for pageable memory
    dst_host.zero_()
    dst_host.copy_(dev, non_blocking=True)
    assert torch.equal(dst_host, ref)
    # to the driver: misaligned alike (4 bytes in), small, pageable, the setting off
    c2, _ = kernel_copies()
    assert torch.equal(src[1:].to("cuda").cpu(), ref[1:])
    assert torch.equal(src[:1024].to("cuda").cpu(), ref[:1024])
    assert torch.equal(ref.to("cuda").cpu(), ref)
    um.configure(host_copy_kernel=False)
    try:
        assert torch.equal(src.to("cuda").cpu(), ref)
    finally:
        um.configure(host_copy_kernel=True)
    assert kernel_copies()[0] == c2
    assert um.stats()["um.kernel_copy_failures"] == 0


def test_large_managed_cpu_tensors_get_their_pages_at_allocation(torch_mod: Any, um: Any) -> None:
    """Note [Host pages are populated by CPU threads] (HostMemory.cpp): a managed CPU tensor
    of 128 MiB or more holds its host pages when torch.empty returns (the process's resident
    memory has grown by its size), mapped for the current GPU before they were made (Note [A
    host allocation is mapped before its pages are made]); a smaller one gets its pages when
    first written and its mapping at its first kernel copy."""
    n = 256 * MiB
    device = torch.cuda.current_device()
    before = rss_bytes()
    with um.managed_host():
        big = torch.empty(n, dtype=torch.uint8)
    assert um.is_managed(big)
    assert rss_bytes() - before >= 0.9 * n
    assert _accessed_by(big) == {device}
    before = rss_bytes()
    with um.managed_host():
        small = torch.empty(64 * MiB, dtype=torch.uint8)
    assert um.is_managed(small)
    assert rss_bytes() - before < 32 * MiB
    assert _accessed_by(small) == set()
    small.fill_(3)
    assert int(small.to("cuda").sum().item()) == 3 * 64 * MiB
    assert _accessed_by(small) == {device}  # mapped at its first kernel copy


def test_copies_past_the_budget_are_shared_with_the_cpu(
    torch_mod: Any, um: Any, limits: Limits
) -> None:
    """Note [Copies shared with the CPU] (HostCopy.h): a kernel copy whose GPU side ends in
    host RAM (a tensor twice the budget) leaves up to host_copy_cpu_share of its bytes, from
    that end, to CPU threads, after the stream's earlier work; the data is what the driver's
    copy gives. host_copy_cpu_share:0 leaves every byte to the kernel."""
    budget = 256 * MiB
    um.configure(device_budget=budget)

    def cpu_bytes() -> int:
        return int(um.stats()["um.kernel_copy_cpu_bytes"])

    n = 2 * budget // 4 + 5  # not a whole number of pages
    src = _managed(n, 11, um)
    ref = _reference(n, 11)
    back = _managed(n, 0, um).zero_()
    c0 = cpu_bytes()
    dev = src.to("cuda")  # host to device: its end in host RAM
    c1 = cpu_bytes()
    assert 0 < c1 - c0 <= 0.35 * n * 4, um.stats()["um.kernel_copy_failures"]
    dev.mul_(2)  # queued just before the copy back: its CPU part must see it
    back.copy_(dev)  # device to host
    c2 = cpu_bytes()
    assert 0 < c2 - c1 <= 0.35 * n * 4
    assert torch.equal(back, ref * 2)
    um.configure(host_copy_cpu_share=0)
    back.zero_()
    dev.add_(1)
    back.copy_(dev)
    assert cpu_bytes() == c2
    assert torch.equal(back, ref * 2 + 1)
    assert um.stats()["um.kernel_copy_failures"] == 0


def test_pageable_copies_past_the_budget_leave_host_ram_to_the_cpu(
    torch_mod: Any, um: Any, limits: Limits
) -> None:
    """Note [Copies of pageable memory past the budget] (HostCopy.h): a copy between an
    ordinary CPU tensor and a GPU tensor twice the budget copies the GPU side's bytes in host
    RAM by CPU threads and the rest through the engine's page-locked buffers (Note [Pageable
    bytes on the device go through page-locked buffers]), after the stream's earlier work;
    the data is what the driver's copies of page-locked memory (not taken) give, both ways.
    pageable_copy_cpu:False leaves every byte to the driver."""
    budget = 256 * MiB
    um.configure(device_budget=budget)

    def counts() -> tuple[int, int, int]:
        s = um.stats()
        return (
            int(s["um.pageable_copies"]),
            int(s["um.pageable_cpu_bytes"]),
            int(s["um.pageable_staged_bytes"]),
        )

    n = 2 * budget // 4 + 5  # not a whole number of pages
    ref = _reference(n, 13)  # pageable
    c0 = counts()
    dev = ref.to("cuda")  # host to device: its end in host RAM
    c1 = counts()
    assert c1[0] - c0[0] == 1 and 0 < c1[1] - c0[1] < n * 4, um.stats()
    assert c1[1] - c0[1] + c1[2] - c0[2] == n * 4  # the rest through page-locked buffers
    by_driver = ref.pin_memory().to("cuda")
    assert counts() == c1  # page-locked: the driver's
    assert torch.equal(dev, by_driver)
    del by_driver
    # About 0.1 s of GPU time queued ahead of the mul_: a CPU part that did not wait for the
    # stream would read dev before it is doubled.
    torch.cuda._sleep(200_000_000)
    dev.mul_(2)  # queued just before the copy back: the CPU's part must see it
    back = dev.cpu()  # device to host, into fresh pageable memory
    c2 = counts()
    assert c2[0] - c1[0] == 1 and 0 < c2[1] - c1[1] < n * 4
    assert c2[1] - c1[1] + c2[2] - c1[2] == n * 4
    assert torch.equal(back, ref * 2)
    into = torch.empty(n, pin_memory=True)
    into.copy_(dev)
    assert counts() == c2
    assert torch.equal(into, back)
    um.configure(pageable_copy_cpu=False)
    dev.add_(1)
    assert torch.equal(dev.cpu(), ref * 2 + 1)
    assert counts() == c2


class _Batches(torch.utils.data.Dataset):  # type: ignore[misc]
    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> Any:
        return torch.full((1 * MiB,), float(i))  # 4 MiB: qualifies for managed memory


def _loader() -> Any:
    """Two fork()ed workers, pin_memory=True: the loader every DataLoader test runs."""
    return torch.utils.data.DataLoader(
        _Batches(), batch_size=None, num_workers=2, pin_memory=True, multiprocessing_context="fork"
    )


def test_dataloader_workers_and_pin_memory_with_managed_setting(torch_mod: Any, um: Any) -> None:
    """Forked workers allocate their batches as ordinary memory (the engine declines
    in a child process), the pin thread pins them, and every batch arrives intact."""
    torch.ones(1, device="cuda")
    um.configure(host_alloc="managed")
    loader = _loader()
    got = [float(b.to("cuda", non_blocking=True).sum()) for b in loader]
    assert got == [float(i * MiB) for i in range(12)]


@pytest.mark.parametrize("how", ["cuda", "to"])
def test_module_cuda_aliases_managed_parameters_nothing_else_reaches(
    torch_mod: Any, um: Any, how: str
) -> None:
    """No code change: .cuda() / .to("cuda") of a module built inside managed_host() keeps
    the memory of parameters only the module holds, and copies one that user code also
    holds (a detached view of it)."""
    torch.manual_seed(2)
    with um.managed_host():
        model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 1024))
    twin = copy.deepcopy(model)  # ordinary memory: copied by .cuda() as in stock torch
    first = model[0].weight
    ptr = first.data_ptr()
    held = model[1].weight.detach()  # user code still reaches this storage on the CPU
    model.cuda() if how == "cuda" else model.to("cuda")
    assert first is model[0].weight and first.is_cuda and first.data_ptr() == ptr
    assert model[1].weight.is_cuda and model[1].weight.data_ptr() != held.data_ptr()
    assert held.device.type == "cpu" and torch.equal(held, twin[1].weight)
    x = torch.randn(16, 1024, device="cuda")
    assert torch.equal(model(x), twin.cuda()(x))


def test_dataloader_pins_batches_in_place(torch_mod: Any, um: Any) -> None:
    """pin_in_place: each batch is page-locked where the worker left it (no copy into
    page-locked buffers), and every batch arrives intact through non-blocking copies."""
    torch.ones(1, device="cuda")
    um.configure(pin_in_place=True)
    before = um._pinned_in_place
    loader = _loader()
    got = []
    for b in loader:
        assert b.is_pinned()
        got.append(float(b.to("cuda", non_blocking=True).sum()))
    assert got == [float(i * MiB) for i in range(12)]
    assert um._pinned_in_place - before == 12
