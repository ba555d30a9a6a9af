"""The side streams the predictor's copies run on (Note [Saved-activation offload],
Note [Optimizer state staging], Note [Weight streaming]): one per device and role, made
on first use and kept for the process, so that each kind of copy queues behind its own
kind only. Thread-safe."""

from __future__ import annotations

import threading

import torch

_lock = threading.Lock()
_streams: dict[tuple[int, str], torch.cuda.Stream] = {}


def side_stream(device: int, role: str) -> torch.cuda.Stream:
    """The stream of ``role`` (e.g. ``"d2h"``, ``"stage-in"``) on device ``device``."""
    key = (device, role)
    with _lock:
        s = _streams.get(key)
        if s is None:
            s = _streams[key] = torch.cuda.Stream(device)
        return s
