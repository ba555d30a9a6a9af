"""Page-locked host buffers made by registration, for the saved-activation offload.

Note [Page-locked buffers by registration]
The offload's host buffers (Note [Saved-activation offload], _um_predict.py) come from
torch's host allocator, which by default asks the driver for them with cudaHostAlloc:
about 1.7 GB/s from one thread and 2.1 from four on the H200 host, because the driver
page-locks mostly one call at a time (bench/README.md, step 47,
``python -m bench.probes.pinned_alloc_probe``). torch has a second route, off by default: with
``pinned_use_cuda_host_register`` it takes the buffer from malloc, has
``pinned_num_register_threads`` threads touch its pages, then page-locks it with one
cudaHostRegister. Measured on the same host: 6.7 GB/s from one thread with 16 register
threads, 10.9-11.0 from four, every buffer page-locked and copied intact. That is the
first training steps' time: with the route on, the 1.28 B model's steps 1-2 took 3.2 s
against 8.1 (``bench.residency train``, step 47).

So, when the offload first starts (um.py ``_predictor``), the engine turns that route on
through torch's own allocator settings, unless the program chose a route itself. It is
not turned on:
- on torch before 2.8. Until then the host allocator freed a buffer by the route set
  at the time of the free, not the one that made it (pytorch#146520), so buffers made
  before the switch and freed after it (an emptied host cache) would be freed wrongly,
  and the record of routes it then added was unguarded against concurrent allocation
  until pytorch#153845; both are in 2.8.
- when the program's allocator settings (the variable torch reads: Note [Which variable
  torch reads its allocator settings from]) name a key of the route
  (``pinned_use_cuda_host_register``, ``pinned_num_register_threads``): the program's
  choice stands, ``False`` included.
torch re-reads its settings whole, so the string set is the program's own setting with
the route's two keys appended. Buffers already made keep their route and are freed by
it. The setting is process-wide: the program's own ``pin_memory`` buffers (a DataLoader's)
are made the same way from then on, page-locked all the same.

Thread safety: ``prefer_registration`` may run on any thread; it sets the route once
per process, under a lock.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Callable, Mapping

REGISTER_THREADS = 16  # most threads that touch a buffer's pages (measured best at 16)
FIRST_SAFE = (2, 8)  # the first torch whose host allocator frees by the route that made it
ROUTE_KEYS = (
    "pinned_use_cuda_host_register",
    "pinned_use_hip_host_register",
    "pinned_num_register_threads",
)
# Note [Which variable torch reads its allocator settings from]
# torch reads the first of its variables that is set, whole, and ignores the others: before
# 2.9 only PYTORCH_CUDA_ALLOC_CONF; from 2.9 PYTORCH_CUDA_ALLOC_CONF, else PYTORCH_ALLOC_CONF
# (2.11.0's libc10.so: AcceleratorAllocatorConfig::instance() tries PYTORCH_CUDA_ALLOC_CONF,
# PYTORCH_HIP_ALLOC_CONF, PYTORCH_ALLOC_CONF in that order, and libc10_cuda.so's parse hook
# PYTORCH_CUDA_ALLOC_CONF before PYTORCH_ALLOC_CONF); from 2.15, where PYTORCH_ALLOC_CONF
# became the primary name, PYTORCH_ALLOC_CONF, else PYTORCH_CUDA_ALLOC_CONF.
CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")
ALLOC_CONF_READ = (2, 9)  # the first torch that reads PYTORCH_ALLOC_CONF at all
ALLOC_CONF_FIRST = (2, 15)  # the first torch that reads it before PYTORCH_CUDA_ALLOC_CONF

# allocator settings that UM turns off while it is on, never set again from the program's
UM_DROPS = ("expandable_segments",)

_lock = threading.Lock()
_decided: tuple[bool, str] | None = None


def program_settings(torch_version: str, environ: Mapping[str, str]) -> tuple[str | None, str]:
    """The variable this torch reads its allocator settings from, and its text ("" if none
    is set): Note [Which variable torch reads its allocator settings from]."""
    version = minor_version(torch_version)
    if version >= ALLOC_CONF_FIRST:
        read: tuple[str, ...] = CONF_VARS
    elif version >= ALLOC_CONF_READ:
        read = CONF_VARS[::-1]
    else:
        read = CONF_VARS[1:]
    name = next((v for v in read if v in environ), None)  # set, even if empty
    return name, environ.get(name, "") if name is not None else ""


def minor_version(torch_version: str) -> tuple[int, int]:
    """(major, minor) of a torch version string; (0, 0) where it has none."""
    m = re.match(r"(\d+)\.(\d+)", torch_version)
    return (int(m.group(1)), int(m.group(2))) if m is not None else (0, 0)


def setting(settings: str, key: str) -> str | None:
    """The value of ``key`` in allocator settings text, the last one given (torch applies
    them in order), or None."""
    value = None
    for part in settings.split(","):
        k, _, v = part.partition(":")
        if k.strip() == key:
            value = v.strip()
    return value


def registration_settings(
    torch_version: str, environ: Mapping[str, str], cpus: int
) -> tuple[str | None, str]:
    """The allocator settings that turn the registration route on, or None; and why."""
    version = minor_version(torch_version)
    if version < FIRST_SAFE:
        return None, f"torch {torch_version}: before 2.8 a buffer may be freed by the wrong route"
    name, own = program_settings(torch_version, environ)
    keys = {part.split(":", 1)[0].strip() for part in own.split(",")}
    chosen = sorted(keys.intersection(ROUTE_KEYS))
    if chosen:
        return None, f"{name} sets {', '.join(chosen)}: the program's choice stands"
    # The program's expandable_segments:True was dropped while UM is on (um.py,
    # _drop_expandable_segments): set again with the route, it would come back.
    own = ",".join(p for p in own.split(",") if p.split(":", 1)[0].strip() not in UM_DROPS)
    threads = 1
    while threads * 2 <= min(REGISTER_THREADS, max(1, cpus)):
        threads *= 2  # torch takes a power of 2
    route = f"pinned_use_cuda_host_register:True,pinned_num_register_threads:{threads}"
    settings = f"{own.strip().rstrip(',')},{route}" if own.strip() else route
    return settings, f"cudaHostRegister, {threads} threads touching the pages"


def prefer_registration(
    torch_version: str, apply: Callable[[str], None], environ: Mapping[str, str] | None = None
) -> tuple[bool, str]:
    """Turn the registration route on once per process, where Note [Page-locked buffers by
    registration] allows (``apply`` sets torch's allocator settings); (on, why)."""
    global _decided
    with _lock:
        if _decided is None:
            env = os.environ if environ is None else environ
            settings, why = registration_settings(torch_version, env, os.cpu_count() or 1)
            if settings is None:
                _decided = (False, why)
            else:
                try:
                    apply(settings)
                    _decided = (True, why)
                except (RuntimeError, ValueError) as e:  # torch refused it: cudaHostAlloc stays
                    _decided = (False, f"torch refused {settings!r}: {e}")
        return _decided
