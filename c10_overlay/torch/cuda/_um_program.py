"""A program's forward, begun and ended by its backward calls, for the saved-activation
offload where no module hook drives (``predict_programs``).

Note [A program's forward between two backwards]
The saved-activation offload (Note [Saved-activation offload], _um_predict.py) copies a
forward's saves to page-locked host memory at the link's speed, where eviction by the
driver runs at 7-11 GB/s; it is what keeps module programs near their floor. Its
saved-tensor hooks need a begin and an end on the program's thread, and the outermost
module's forward gave them. A program of plain tensors has no module, and a compiled
model runs without the module hooks (Note [A compiled model is driven by operators],
um.py), so both evict their activations by the driver's route: 3.4-3.9x their floor in
step 57 (docs/notes/step-57-victims-as-runs.md). But the saved-tensor hooks need no
module: autograd calls them for every save on the thread, a compiled graph's included.
What ends a training iteration's forward, whatever the program, is its backward, and
what begins the next forward is that backward's return. So, while this is installed,
``torch.autograd.backward`` and ``torch.autograd.grad`` end the thread's open forward as
they are called (the offload's hooks come off: the backward's own saves, for a double
backward, are not offloaded) and begin one as they return (the hooks go back on; the
forward's plan is made at its first save: Note [A program's forward is planned at its first
save], _um_predict.py). The first iteration runs without them (the plain policy), every
later forward under them. A
backward that raises begins the next forward too. The functions stay wrapped once wrapped:
with the setting off, the pressure gone or the module hooks back, no forward begins and
one left open ends at the next backward (or at the next module forward's begin).
Programs that call the functions bound before the first wrap (``from torch.autograd
import backward``) are not seen. On by default since step 58: the plain-tensor step 0.69 ->
0.52 s, pattern-change's 0.39 -> 0.27 s, the compiled class unchanged (its driver evictions
are its optimizer's momentum); what such a program's own update keeps, the driver still
evicts (docs/notes/step-58-programs-on.md).

Thread safety: each thread has its own open forward (the offload keeps it in its
thread-local state); wrap_backward() is called once, from any thread."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["wrap_backward"]


def wrap_backward(begin: Callable[[], object], end: Callable[[], object]) -> None:
    """Wraps torch.autograd.backward and torch.autograd.grad for good: ``end()`` before
    each call, ``begin()`` after it (also when it raises). Both are the offload's
    (Offloader.end_program, Offloader.begin_program) and must not raise. Call once a
    process (um.py's watcher does, under its lock)."""
    for name in ("backward", "grad"):
        original = getattr(torch.autograd, name)
        setattr(torch.autograd, name, _wrapped(original, begin, end))


def _wrapped(
    original: Callable[..., Any], begin: Callable[[], object], end: Callable[[], object]
) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        end()
        try:
            return original(*args, **kwargs)
        finally:
            begin()

    return call
