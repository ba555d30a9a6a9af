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
- when the program's allocator settings (``PYTORCH_CUDA_ALLOC_CONF``, or from 2.9
  ``PYTORCH_ALLOC_CONF``) name a key of the route (``pinned_use_cuda_host_register``,
  ``pinned_num_register_threads``): the program's choice stands, ``False`` included.
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
# torch reads the first of these that is set; PYTORCH_ALLOC_CONF from 2.9 on
CONF_VARS = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF")

_lock = threading.Lock()
_decided: tuple[bool, str] | None = None


def registration_settings(
    torch_version: str, environ: Mapping[str, str], cpus: int
) -> tuple[str | None, str]:
    """The allocator settings that turn the registration route on, or None; and why."""
    m = re.match(r"(\d+)\.(\d+)", torch_version)
    version = (int(m.group(1)), int(m.group(2))) if m is not None else (0, 0)
    if version < FIRST_SAFE:
        return None, f"torch {torch_version}: before 2.8 a buffer may be freed by the wrong route"
    read = CONF_VARS if version >= (2, 9) else CONF_VARS[1:]
    name = next((v for v in read if environ.get(v)), None)
    own = environ.get(name, "") if name is not None else ""
    keys = {part.split(":", 1)[0].strip() for part in own.split(",")}
    chosen = sorted(keys.intersection(ROUTE_KEYS))
    if chosen:
        return None, f"{name} sets {', '.join(chosen)}: the program's choice stands"
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
