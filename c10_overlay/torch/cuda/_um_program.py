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
backward, are not offloaded) and begin one as they return (the hooks go back on). The
first iteration runs without them (the plain policy), every later forward under them. A
backward that raises begins the next forward too. The functions stay wrapped once wrapped:
with the setting off, the pressure gone or the module hooks back, no forward begins and
one left open ends at the next backward (or at the next module forward's begin).
Programs that call the functions bound before the first wrap (``from torch.autograd
import backward``) are not seen.

Thread safety: each thread has its own open forward (the offload keeps it in its
thread-local state); install() and remove() may be called from any thread, and a
thread's forward left open when they come off is abandoned at its next save."""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["ProgramForwards"]


class ProgramForwards:
    """Wraps torch.autograd.backward and torch.autograd.grad while installed: ``end()``
    before each call, ``begin()`` after it. Both are the offload's (Offloader.end_program,
    Offloader.begin_program) and must not raise."""

    NAMES = ("backward", "grad")

    def __init__(self, begin: Callable[[], object], end: Callable[[], object]) -> None:
        self._begin = begin
        self._end = end
        self._lock = threading.Lock()
        self._originals: dict[str, Callable[..., Any]] = {}

    @property
    def installed(self) -> bool:
        return bool(self._originals)

    def install(self) -> None:
        with self._lock:
            if self._originals:
                return
            for name in self.NAMES:
                original = getattr(torch.autograd, name)
                self._originals[name] = original
                setattr(torch.autograd, name, self._wrap(original))

    def remove(self) -> None:
        """Puts the functions back (unless the program replaced them since) and ends this
        thread's open forward."""
        with self._lock:
            originals, self._originals = self._originals, {}
            for name, original in originals.items():
                current = getattr(torch.autograd, name)
                if getattr(current, "__wrapped__", None) is original:
                    setattr(torch.autograd, name, original)
        if originals:
            self._end()

    def _wrap(self, original: Callable[..., Any]) -> Callable[..., Any]:
        begin, end = self._begin, self._end

        @functools.wraps(original)
        def call(*args: Any, **kwargs: Any) -> Any:
            end()
            try:
                return original(*args, **kwargs)
            finally:
                begin()

        return call
