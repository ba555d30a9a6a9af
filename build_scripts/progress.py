"""Progress bars (tqdm, on stderr) shared by downloads, the C++ build and the repack."""

from __future__ import annotations

import os
import sys
from typing import Never

from tqdm import tqdm


def enabled() -> bool:
    return os.environ.get("TORCH_UM_NO_PROGRESS", "") == ""


def bar(desc: str, total: int | None, *, unit: str = "B") -> tqdm[Never]:
    scale = unit == "B"
    return tqdm(
        total=total,
        desc=desc,
        unit=unit,
        unit_scale=scale,
        unit_divisor=1024 if scale else 1000,
        file=sys.stderr,
        disable=not enabled(),
        mininterval=1.0 if not sys.stderr.isatty() else 0.1,
        leave=True,
    )


def step(message: str) -> None:
    """One line saying which step starts, so logs read as the pipeline reads."""
    print(f"==> {message}", file=sys.stderr, flush=True)
