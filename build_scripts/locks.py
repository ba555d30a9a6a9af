"""One build at a time per torch version and cache.

Two builds of the same version share the cache's build folder (``cmake --build`` in the
same directory) and its derived trees. The second one waits for the first and says so.
The lock is an ``flock`` on ``<cache>/locks/<version>.lock``: the kernel releases it when
its holder exits in any way, so a killed build never leaves a stale lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

from build_scripts import progress


@contextlib.contextmanager
def build_lock(cache: Path, torch_version: str) -> Iterator[None]:
    path = cache / "locks" / f"{torch_version}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 256, 0).decode(errors="replace").strip() or "unknown"
            progress.step(
                f"another build of torch {torch_version} holds {path} ({holder}); waiting "
                "for it to finish"
            )
            fcntl.flock(fd, fcntl.LOCK_EX)
            progress.step(f"{path} is free: building")
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}, since {stamp}\n".encode(), 0)
        yield
    finally:
        os.close(fd)
