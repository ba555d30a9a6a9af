"""A folder in the cache that test runs share (the test venvs), with a lock that keeps one
run from changing it while another uses it.

Note [Shared test venvs]
The integration tests install each built wheel into a venv kept in the cache, one per torch
version, because its dependencies are gigabytes of nvidia-* packages. Two test runs on one
machine (a developer's `make test` beside a CI clone's) share that venv. Before this lock,
the second run reinstalled torch while the first was importing it, and the first failed
with `module 'torch' has no attribute '__version__'` (2026-11-25). Now a run holds a shared
`flock` on `<folder>.lock` for as long as it uses the folder (the test session), and
changes the folder only under an exclusive one, which waits until no other run uses it.
A run that finds the folder as it needs it (the same wheel) never waits for another run
that needs the same. flock's change from exclusive to shared is not atomic, so the folder
is checked again under the shared lock, and made again if another run changed it in
between. Locks die with their process: a killed run holds nothing.
"""

from __future__ import annotations

import fcntl
import os
import sys
from collections.abc import Callable
from pathlib import Path


def hold(folder: Path, ready: Callable[[], bool], make: Callable[[], None]) -> int:
    """Hold ``folder`` for use: once ``ready()`` says it is as this run needs it (after
    ``make()`` under the exclusive lock where it was not), return the descriptor of its
    lock file, locked shared. The caller keeps it open while it uses the folder and closes
    it to let other runs change the folder."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder.parent / f"{folder.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        while True:
            _lock(fd, fcntl.LOCK_SH, folder, "to use it")
            if ready():
                return fd
            fcntl.flock(fd, fcntl.LOCK_UN)
            _lock(fd, fcntl.LOCK_EX, folder, "to change it")
            if not ready():
                make()
            fcntl.flock(fd, fcntl.LOCK_UN)  # and check it again under the shared lock
    except BaseException:
        os.close(fd)
        raise


def _lock(fd: int, kind: int, folder: Path, why: str) -> None:
    try:
        fcntl.flock(fd, kind | fcntl.LOCK_NB)
    except BlockingIOError:
        # Straight to the terminal: pytest captures a fixture's output, and a wait of
        # minutes with nothing on the screen looks like a hang.
        print(
            f"\n{folder}: another test run is using it; waiting {why}",
            file=sys.__stderr__,
            flush=True,
        )
        fcntl.flock(fd, kind)
