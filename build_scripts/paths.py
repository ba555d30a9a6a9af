"""Where the repository and the download/build cache live."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def cache_root() -> Path:
    """``${XDG_CACHE_HOME:-~/.cache}/torch-um``; ``TORCH_UM_CACHE`` overrides it."""
    override = os.environ.get("TORCH_UM_CACHE")
    if override:
        return Path(override).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "torch-um"


def patches_root(repo: Path = REPO_ROOT) -> Path:
    return repo / "patches"
