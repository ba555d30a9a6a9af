"""The one exception type the pipeline raises for anything a user can fix."""

from __future__ import annotations


class BuildError(Exception):
    """A build step failed; the message says what was wrong and what to do.

    The CLI prints ``error: <message>`` and exits with status 2, without a traceback.
    """
