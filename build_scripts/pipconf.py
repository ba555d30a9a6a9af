"""How the build runs pip for the files it pins by sha256, and what it says when pip fails.

The build asks pip for exact files (``name===version``, one platform, no dependencies) and
checks each against the sha256 that ``upstream.yaml`` pins. Two kinds of pip configuration
outside the project meet those downloads:

- **constraints** (``constraint`` in a pip.conf, ``PIP_CONSTRAINT``): a site's cap such as
  ``torch<=2.14.1`` makes pip refuse a pinned ``torch===2.15.0`` with ResolutionImpossible,
  although the file's hash decides whether it is the right one. The build lifts them for
  its own pip runs: ``PIP_CONSTRAINT`` set to an empty file, which takes precedence over
  every configuration file and over the caller's own ``PIP_CONSTRAINT``.
- **where files come from** (``index-url``, ``extra-index-url``, ``find-links``,
  ``no-index``, ``trusted-host``, ``cert``, ``proxy``, ..., from pip.conf files or ``PIP_*``
  variables): the user's to say, and kept as they are. ``PIP_CONFIG_FILE=/dev/null`` would
  lift a cap too, but it drops every configuration file, index settings included.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

#: the pip setting the build lifts, by environment variable, for downloads of pinned files
LIFTED = ("PIP_CONSTRAINT",)

_ERROR = re.compile(r"^ERROR:\s*(.*)$")
_FROM_VERSIONS = re.compile(r"\s*\(from versions: [^)]*\)")
_REASON_CHARS = 300


def pinned_download_env(base: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a pip run that fetches files pinned by sha256: ``base`` (default:
    this process's) with pip's constraints lifted and everything else as it is."""
    env = dict(os.environ if base is None else base)
    for name in LIFTED:
        env[name] = os.devnull  # an empty constraints file: nothing is constrained
    return env


def reason(stderr: str | None, returncode: int) -> str:
    """pip's own reason for a failed run, as one short clause: its most telling ``ERROR:``
    line (an HTTP error first, then what was not found), without the list of every version
    the index has; its last line when it printed no error; else the exit status."""
    lines = [ln.strip() for ln in (stderr or "").splitlines() if ln.strip()]
    errors = [m.group(1) for ln in lines if (m := _ERROR.match(ln)) and m.group(1)]

    def first(*needles: str) -> str | None:
        return next((e for e in errors if any(n in e for n in needles)), None)

    picked = (
        first("HTTP error", "403", "401", "Forbidden", "Unauthorized")
        or first("No matching distribution")
        or first("Could not find a version", "Cannot install")
        or (errors[0] if errors else None)
        or (lines[-1] if lines else None)
    )
    if picked is None:
        return f"pip exited with status {returncode} and printed no reason"
    text = " ".join(_FROM_VERSIONS.sub("", picked).split()).rstrip(".")
    if len(text) > _REASON_CHARS:
        text = text[: _REASON_CHARS - 3] + "..."
    return f"{text} (pip exit {returncode})"
