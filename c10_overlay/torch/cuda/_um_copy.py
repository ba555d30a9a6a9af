"""The weight streamer's copy kernel: host RAM to the ring on a few SMs.

Note [Lean copies]
A copy that reads host RAM by kernel is bound by how many reads each SM keeps in flight
while they cross the link. ``torch._foreach_copy_`` keeps few a thread, so it needs many
SMs to fill the link: 16 SMs of a green context carried 48 GB/s, 8 carried 34-37
(Note [Copies on few SMs], _um_streams.py). Those SMs are the forward's loss, and more
than their share: the forward's GEMMs are sized for every SM, and an SM held by a copy
keeps one of their blocks waiting. This kernel has each of 1024 threads a block hold
eight 16-byte loads in flight, so that two blocks, two SMs, carry the link alone: 50 GB/s
on the H200 host, where the forward beside the copies took 29.8-30.8 ms against 31.8-31.9
with foreach on 16 SMs and 24.6 ms without copies (``python -m bench.probes.overlap_probe``,
bench/README.md step 29). Fewer blocks were better at every count tried (2, 4, 8, 16).

The default (``predict_copy_kernel:lean``) since step 32; ``foreach`` is the old route.
In the inference benchmark at full CPU speed the streamed forward took 0.0350 s with it
against 0.0369 with foreach on 16 SMs (step 29), and 0.0330 against 0.0359 with the rest
of the engine the same (step 32: 1.37x the floor against 1.49x). The GPU hosts' CPUs run
at half to two thirds of their speed at times, and a run's median follows the share of
its forwards that drew that state; compared forward by forward at the same CPU speed
(the canary read before each), this kernel was faster in every bin of step 32's three
inference runs that held several forwards of both. Step 29 had seen it slower in the
slow state (47.7 ms against 43.5, one process alternating the two routes), step 31 a tie
(38.3 against 38.1). Does the kernel's reading of host RAM bring the slow state on? Not
by the link's traffic: ``bench.probes.link_cpu_probe`` (step 32) found the CPU slow as often with
the machine idle as under these reads. ``generate()``, whose one-token forwards are bound
by the host, ran 0.71 s a step against 0.73 at full CPU speed (step 32).

Its source is the engine's (``c10/cuda/um/HostCopy.cpp``), which compiles it by NVRTC
once per device at its first use (``torch_um_copy_function``) and also runs it for
torch's copies of managed host memory (Note [Copies of managed host memory by kernel],
HostCopy.h). Here it is launched with ``cuLaunchKernel`` through ctypes, one launch
per parameter, or one per LAUNCH_BYTES of it where that is set. Where it cannot be had (no
NVRTC, a compile or load error, a failed launch), ``copier()`` returns None,
``failures`` says why, and the streamer's copies go back to ``torch._foreach_copy_`` (on a
green context's few SMs where those exist). A launch that fails queues nothing but
raises; the streamer drops the copier with a warning and copies that parameter whole, and
all after it, the old way, on the same stream, after any part of it already queued. No
copy is ever left undone.

Why LAUNCH_BYTES (a probe's setting, 0 by default: one launch a parameter, as measured).
A launch's two blocks hold their SMs until its last byte crosses the link: 0.6 ms for a
32 MiB parameter. A GEMM that puts one block on every SM cannot finish before its blocks
on those two SMs have run, so it may wait that long. That would explain why two blocks
still cost the forward 5-6 ms, and why more blocks cost more, while foreach's short
blocks on 16 SMs cost less than 16 lean blocks (step 29). Launches of a few MiB would
free the SMs every 0.1 ms or so, at the price of more launches. This is not measured
yet: ``bench.probes.overlap_probe --lean-launch-mib`` and ``bench.probes.hooks_probe
--alternate-copies lean,lean-split`` test it (bench/README.md, step 30).

Only a contiguous parameter is copied as bytes; a strided one is left to foreach. The
kernel copies 16-byte words where source and destination share their alignment modulo
16 (the ring's parts start 512-byte aligned, parameters from the caching allocator too),
bytes otherwise.

Thread-safe: one copier per device, made under a lock; a launch keeps its arguments in
its own ctypes objects.
"""

from __future__ import annotations

import ctypes
import threading

import torch

THREADS = 1024  # a block's threads: 8 loads of 16 bytes in flight each
BLOCKS = 2  # predict_copy_sms:auto with predict_copy_kernel:lean (Note [Lean copies])
LAUNCH_BYTES = 0  # bytes one launch copies at most; 0: a whole parameter (Note [Lean copies])


_lock = threading.Lock()
_copiers: dict[int, LeanCopier] = {}
failures: dict[int, str] = {}  # device -> why it has no copier


class LeanCopier:
    """The compiled kernel of one device and its launcher."""

    def __init__(self, device: int) -> None:
        from torch.cuda import um

        err = ctypes.create_string_buffer(um._ERRLEN)
        with torch.cuda.device(device):  # the engine makes the device current
            func = um._engine().torch_um_copy_function(device, err, len(err))
        if not func:
            raise RuntimeError(err.value.decode(errors="replace") or "the engine gave no kernel")
        self._func = ctypes.c_void_p(func)
        launch = ctypes.CDLL("libcuda.so.1").cuLaunchKernel
        launch.restype = ctypes.c_int
        launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        self._launch = launch

    def copy(self, dst: torch.Tensor, src: torch.Tensor, stream: int, blocks: int) -> bool:
        """Queue a copy of ``src``'s bytes over ``dst``'s on the stream handle ``stream``,
        on ``blocks`` SMs, in launches of at most LAUNCH_BYTES. False, with nothing
        queued, where this kernel does not apply (either tensor strided, sizes that
        differ); RuntimeError where a launch failed (the launches before it stay queued)."""
        n = src.nbytes
        if n == 0 or dst.nbytes != n or not (src.is_contiguous() and dst.is_contiguous()):
            return False
        d0, s0 = dst.data_ptr(), src.data_ptr()
        for at, size in pieces(n, LAUNCH_BYTES):
            self._launch_one(d0 + at, s0 + at, size, stream, blocks)
        return True

    def _launch_one(self, dst: int, src: int, n: int, stream: int, blocks: int) -> None:
        d, s, size = ctypes.c_void_p(dst), ctypes.c_void_p(src), ctypes.c_ulonglong(n)
        params = (ctypes.c_void_p * 3)(
            ctypes.addressof(d), ctypes.addressof(s), ctypes.addressof(size)
        )
        err = self._launch(self._func, blocks, 1, 1, THREADS, 1, 1, 0, stream, params, None)
        if err != 0:
            raise RuntimeError(f"cuLaunchKernel of the lean copy failed (CUresult {err})")


def copy_pairs(
    device: int, dsts: list[torch.Tensor], srcs: list[torch.Tensor], stream: int, blocks: int
) -> tuple[list[torch.Tensor], list[torch.Tensor], int, str | None]:
    """Queue on the stream handle ``stream`` the copies ``srcs[k] -> dsts[k]`` that the
    lean kernel can make, on ``blocks`` SMs. Returns the pairs left for the caller's
    foreach (those the kernel does not apply to, and every pair from a failed launch on),
    how many the kernel took, and, where a launch failed, why: the device's copier is
    then dropped, and the caller copies the rest the old way on the same stream, after
    what is already queued, so that no copy is left undone."""
    lean = copier(device)
    rest_d: list[torch.Tensor] = []
    rest_s: list[torch.Tensor] = []
    done = 0
    for k, (d, s) in enumerate(zip(dsts, srcs, strict=True)):
        try:
            if lean is not None and lean.copy(d, s, stream, blocks):
                done += 1
                continue
        except RuntimeError as e:
            drop(device, str(e))
            return rest_d + dsts[k:], rest_s + srcs[k:], done, str(e)
        rest_d.append(d)
        rest_s.append(s)
    return rest_d, rest_s, done, None


def pieces(n: int, most: int) -> list[tuple[int, int]]:
    """(offset, bytes) of the launches that copy ``n`` bytes, each at most ``most`` (0: one
    launch). Offsets are multiples of 16, so each piece keeps the whole copy's alignment
    of source against destination modulo 16, and with it the kernel's 16-byte words."""
    step = n if most <= 0 else max(16, most // 16 * 16)
    return [(at, min(step, n - at)) for at in range(0, n, step)]


def copier(device: int) -> LeanCopier | None:
    """The device's copier, made on first use; None where it cannot be had (``failures``
    says why, once per device). The streamer asks at every streamed call: a copier that
    exists is returned without the lock (one dict read)."""
    made = _copiers.get(device)
    if made is not None:
        return made
    with _lock:
        made = _copiers.get(device)
        if made is not None or device in failures:
            return made
        try:
            made = _copiers[device] = LeanCopier(device)
        except Exception as e:  # any failure leaves foreach
            failures[device] = f"{type(e).__name__}: {e}"
        return made


def drop(device: int, why: str) -> None:
    """Give up the device's copier (a launch failed): the streamer goes back to foreach."""
    with _lock:
        _copiers.pop(device, None)
        failures[device] = why
