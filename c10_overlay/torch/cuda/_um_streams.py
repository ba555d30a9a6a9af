"""The streams of the predictor's hooks (Note [Saved-activation offload], Note [Optimizer
state staging], Note [Weight streaming]): the side streams its copies run on, one per
device and role, made on first use and kept for the process, so that each kind of copy
queues behind its own kind only; and the current stream, read cheaply, since the hooks
read it at every module call. Thread-safe."""

from __future__ import annotations

import threading

import torch

_lock = threading.Lock()
_streams: dict[tuple[int, str], torch.cuda.Stream] = {}
# The current stream's handle without making a Stream object (which costs microseconds;
# an inference forward's hooks asked for it some 340 times: bench/README.md, step 15).
_raw_current = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_current: dict[int, torch.cuda.Stream] = {}  # device -> the last current stream seen


def side_stream(device: int, role: str) -> torch.cuda.Stream:
    """The stream of ``role`` (e.g. ``"d2h"``, ``"stage-in"``) on device ``device``."""
    key = (device, role)
    with _lock:
        s = _streams.get(key)
        if s is None:
            s = _streams[key] = torch.cuda.Stream(device)
        return s


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
