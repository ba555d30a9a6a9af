"""The streams of the predictor's hooks (Note [Saved-activation offload], Note [Optimizer
state staging], Note [Weight streaming]): the side streams its copies run on, one per
device and role, made on first use and kept for the process, so that each kind of copy
queues behind its own kind only; and the current stream, read cheaply, since the hooks
read it at every module call. Thread-safe.

Note [Copies on few SMs]
A copy kernel that reads host RAM holds its SMs while it waits on the link. Beside an
inference forward, 1.3 GB of such copies (the weight streamer's, one foreach kernel per
call) took the forward's kernels from 24.6 to 43.3 ms on an H200, as much as a
cudaMemcpyAsync from managed memory (49.6 ms), which the driver also runs on SMs; only a
copy engine's DMA from page-locked memory left them alone (26.0 ms). On a stream of a CUDA
green context limited to 8, 16 or 32 SMs the same copies left the forward at 30.2, 33.1
and 36.3 ms, and ran at 37, 48 and 49 GB/s against 49 on every SM
(``python -m bench.probes.overlap_probe``, bench/README.md step 23). So the weight streamer's
copies go to such a stream (``predict_copy_sms``; auto: an eighth of the SMs, a multiple
of 8, at least 8: 16 on an H200) under ``predict_copy_kernel:foreach``. The default,
``lean``, replaces foreach by the engine's own copy kernel, which carries the link on two
SMs (Note [Lean copies], _um_copy.py); these streams then serve where that kernel cannot
be had. A green context limits where its own kernels run, not the rest: the forward's
kernels may still use every SM. Events order work across the two contexts of the device
as within one; a device-wide synchronisation of the primary context is not relied on to
cover the green context's stream: every copy the streamer issues is waited for by the
compute stream within the forward.
"""

from __future__ import annotations

import os
import threading

import torch

_lock = threading.Lock()
_streams: dict[tuple[int, str], torch.cuda.Stream] = {}
_green: dict[tuple[int, int], tuple[object, torch.cuda.Stream]] = {}  # (device, SMs) -> both
green_failures: dict[tuple[int, int], str] = {}  # (device, SMs) -> why none was made
# The current stream's handle without making a Stream object (which costs microseconds;
# an inference forward's hooks asked for it some 340 times: bench/README.md, step 15).
_raw_current = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_current: dict[int, torch.cuda.Stream] = {}  # device -> the last current stream seen
# torch.cuda.stream()'s context manager makes a Stream and two device objects each time it
# is entered (bench/README.md, step 32): the weight streamer switches twice a streamed call.
_set_raw = getattr(torch._C, "_cuda_setStream", None)
_get_device = getattr(torch._C, "_cuda_getDevice", None)


# Note [One event a thread for stream waits]
# torch.cuda.Stream.wait_stream records a new Event each time, and the first record of an
# event makes it with cudaEventCreate, which takes the driver's lock; that lock is held
# for the whole of a managed-memory call on any thread (the engine's evictor discarding or
# evicting: 0.5-14 ms a call, bench/probes/launch_contention.cu). Past the budget, a 1.1 B Llama's
# training step makes two such waits per saved activation offloaded (out, and back ahead:
# about 230 for 115 saves), and py-spy found them waiting there (bench/README.md,
# prediction step 35). A stream
# wait takes the event's latest record at the time of the call, so one event per thread
# and device, recorded again for each wait, orders the same; one per thread, because
# another thread's record between this one's record and wait would be waited for instead.
#
# The events are kept in a module dict keyed by thread, not in a threading.local: autograd's
# device threads call this too (the offload's copies back ahead, from unpack), and when the
# process forks (a DataLoader starting its workers), the child clears every other thread's
# state, thread-locals included, so their events were destroyed in the child, whose CUDA
# calls fail: it died with "CUDA error: initialization error" (the GPU suite's DataLoader
# test, run after a test that offloaded saves; step 58). A forked child puts the dict it
# inherited aside and keeps it (_forget_in_child): no CUDA object of the parent's is
# destroyed while the child runs, and a multiprocessing child (a DataLoader's worker) leaves
# by os._exit, which frees nothing. A thread's identifier may be reused once it has ended,
# and its event with it, which orders the same.
_wait_events: dict[tuple[int, int], torch.cuda.Event] = {}  # (thread, device) -> event
_inherited: list[object] = []  # a forked child's copies of the parent's events, never freed


def _forget_in_child() -> None:
    global _wait_events
    _inherited.append(_wait_events)
    _wait_events = {}


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


def wait_stream(waiter: torch.cuda.Stream, waited: torch.cuda.Stream) -> None:
    """``waiter.wait_stream(waited)`` without making an event: ``waiter``'s later work
    runs after everything queued on ``waited`` so far. Both on the same device."""
    key = (threading.get_ident(), waited.device_index)
    event = _wait_events.get(key)
    if event is None:
        event = _wait_events[key] = torch.cuda.Event()
    event.record(waited)
    waiter.wait_event(event)


def side_stream(device: int, role: str) -> torch.cuda.Stream:
    """The stream of ``role`` (e.g. ``"d2h"``, ``"stage-in"``) on device ``device``."""
    key = (device, role)
    with _lock:
        s = _streams.get(key)
        if s is None:
            s = _streams[key] = torch.cuda.Stream(device)
        return s


def auto_copy_sms(device: int) -> int:
    """``predict_copy_sms:auto``: an eighth of the device's SMs, a multiple of 8 (the
    granule of a green context's SMs on compute capability 9.0 and later), at least 8."""
    sms = int(torch.cuda.get_device_properties(device).multi_processor_count)
    return max(8, sms // 8 // 8 * 8)


def few_sm_stream(device: int, role: str, sms: int) -> tuple[torch.cuda.Stream, int]:
    """A stream on ``device`` whose kernels run on at most ``sms`` SMs (Note [Copies on few
    SMs]), with the SMs it got; ``sms`` 0, or a device, driver or torch without green
    contexts, gives the plain side stream of ``role`` and 0 (``green_failures`` says why,
    once per device and count). One per device and count, kept for the process."""
    if sms <= 0:
        return side_stream(device, role), 0
    key = (device, sms)
    with _lock:
        made = _green.get(key)
        if made is not None:
            return made[1], sms
        if key not in green_failures:
            try:
                made = _green[key] = _make_green(device, sms)
                return made[1], sms
            except Exception as e:  # any failure leaves the plain route
                green_failures[key] = f"{type(e).__name__}: {e}"
    return side_stream(device, role), 0


def green_supported() -> bool:
    """Whether this torch can make green contexts: up to 2.13 its build says so
    (``green_contexts.SUPPORTED``); from 2.14 they go through the ``cuda.bindings``
    package, which must be installed (``_HAS_CUDA_BINDINGS``). The driver may still refuse."""
    try:
        from torch.cuda import green_contexts
    except ImportError:
        return False
    if hasattr(green_contexts, "SUPPORTED"):
        return bool(green_contexts.SUPPORTED)
    return bool(getattr(green_contexts, "_HAS_CUDA_BINDINGS", False))


def _make_green(device: int, sms: int) -> tuple[object, torch.cuda.Stream]:
    from torch.cuda import green_contexts

    if not green_supported():
        raise RuntimeError(
            "this torch has no CUDA green contexts (built without them, or, from 2.14, "
            "the cuda.bindings package is not installed)"
        )
    # Keywords: 2.11 takes (num_sms, device_id), 2.14 and later only keywords.
    ctx = green_contexts.GreenContext.create(num_sms=sms, device_id=device)
    s = ctx.Stream()
    if not isinstance(s, torch.cuda.Stream):
        s = torch.cuda.Stream(
            stream_id=s.stream_id, device_index=s.device_index, device_type=s.device_type
        )
    return ctx, s


def current_handle(device: int) -> int:
    """The ``cudaStream_t`` of this thread's current stream on ``device``."""
    if _raw_current is None:
        return int(torch.cuda.current_stream(device).cuda_stream)
    return int(_raw_current(device))


def current_stream(device: int) -> torch.cuda.Stream:
    """``torch.cuda.current_stream(device)``, the Stream object kept while the current
    stream stays the same one (threads may differ: the handle is compared each time)."""
    s = _current.get(device)
    if s is None or _raw_current is None or s.cuda_stream != _raw_current(device):
        s = _current[device] = torch.cuda.current_stream(device)
    return s


def _switch_to(stream: torch.cuda.Stream) -> None:
    assert _set_raw is not None
    _set_raw(
        stream_id=stream.stream_id,
        device_index=stream.device_index,
        device_type=stream.device_type,
    )


class on_stream:
    """``with torch.cuda.stream(stream)`` for a stream of ``device`` whose current stream
    is ``back`` now, without the context manager's Python bookkeeping where ``device``
    is the current device: then ``torch._C._cuda_setStream`` switches to ``stream`` and
    back. Elsewhere (it would make ``device`` current, and switching back would not undo
    that) or on a torch without the raw calls, the context manager itself."""

    __slots__ = ("_back", "_device", "_plain", "_stream")

    def __init__(self, stream: torch.cuda.Stream, device: int, back: torch.cuda.Stream) -> None:
        self._stream, self._device, self._back = stream, device, back
        self._plain: torch.cuda.StreamContext | None = None

    def __enter__(self) -> None:
        if _set_raw is not None and _get_device is not None and _get_device() == self._device:
            _switch_to(self._stream)
        else:
            self._plain = torch.cuda.stream(self._stream)
            self._plain.__enter__()

    def __exit__(self, *exc: object) -> None:
        if self._plain is None:
            _switch_to(self._back)
        else:
            self._plain.__exit__(*exc)
