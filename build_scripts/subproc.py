"""Child processes that never outlive the build.

A build killed with SIGKILL runs no cleanup, so its children must notice by themselves:
Linux's ``PR_SET_PDEATHSIG`` sends a signal to a process when its parent dies. That
reaches one process only; the CMake build below it (ninja, the compilers) is reached
through a process group. :func:`group` starts a command under a small ``sh`` leader of a
new process group, with ``PR_SET_PDEATHSIG=SIGTERM``; the leader traps SIGTERM and kills
its whole group. The build itself kills the group on any error or Ctrl-C.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import subprocess
from collections.abc import Callable, Iterator
from typing import Any

_PR_SET_PDEATHSIG = 1
_LEADER = 'trap "kill -KILL 0" TERM; "$@" & wait $!'


def _prctl() -> Callable[[int, int], int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn: Callable[[int, int], int] = libc.prctl
    except (OSError, AttributeError):  # not Linux
        return None
    return fn


_PRCTL = _prctl()


def die_with_parent(sig: int = signal.SIGKILL) -> Callable[[], None]:
    """A ``preexec_fn``: the child gets ``sig`` when the process that started it dies."""
    parent = os.getpid()

    def pre() -> None:
        if _PRCTL is not None:
            _PRCTL(_PR_SET_PDEATHSIG, sig)
        if os.getppid() != parent:  # died before the signal was armed
            os._exit(137)

    return pre


@contextlib.contextmanager
def group(cmd: list[str], **popen: Any) -> Iterator[subprocess.Popen[str]]:
    """``Popen(cmd)`` in a process group of its own that dies with this process; the
    group is killed when the block is left before the command finished."""
    leader = die_with_parent(signal.SIGTERM)

    def pre() -> None:
        os.setsid()
        leader()

    proc: subprocess.Popen[str] = subprocess.Popen(
        ["/bin/sh", "-c", _LEADER, "sh", *cmd], preexec_fn=pre, **popen
    )
    try:
        yield proc
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
