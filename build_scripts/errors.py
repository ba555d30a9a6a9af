"""The one exception type the pipeline raises for anything a user can fix."""

from __future__ import annotations

import errno
from pathlib import Path

#: errors of the disk written to, never of the file or server read from: steps let them
#: through, and the CLI names the disk (cli.os_error_message)
DISK_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})


class BuildError(Exception):
    """A build step failed; the message says what was wrong and what to do.

    The CLI prints ``error: <message>`` and exits with status 2, without a traceback.
    """


def damaged_zip(path: Path, exc: BaseException) -> str:
    """The message for a cached download that is no readable zip archive."""
    return (
        f"{path} is not a readable zip archive ({exc}): remove it with `rm {path}` so that "
        "the next build downloads it again"
    )
