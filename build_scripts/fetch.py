"""Downloads into the cache: registry wheels through ``pip download``, other files by URL.

Every file is verified against its pinned sha256 on every use, cached or not: hashing
costs 0.4 s for the 530 MB torch 2.11.0 wheel and 0.7 s for 900 MB with the file in the
page cache (1.3 s for 530 MB read cold from disk), and it catches what a stamp of size and
mtime cannot, such as a corrupted file whose mtime was kept. A cached file that no longer
matches is removed and downloaded again; a download that does not match stops the build
naming the file, the expected and the actual hash.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from build_scripts import pipconf, progress, subproc
from build_scripts.errors import DISK_ERRNOS, BuildError
from build_scripts.fsutil import (
    atomic_path,
    mebibytes,
    mount_point,
    sha256_file,
    temp_dir,
    verify_sha256,
)

#: signature of a URL fetcher: (url, destination, timeout seconds) -> None
Fetcher = Callable[[str, Path, float], None]


class FetchError(Exception):
    """A URL could not be fetched (unreachable, 404, timeout)."""


def urllib_fetch(url: str, dest: Path, timeout: float) -> None:
    """Fetch ``url`` (http, https or file) to ``dest`` atomically, with a progress bar."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            length = resp.headers.get("Content-Length")
            total = int(length) if length and length.isdigit() else None
            name = url.rsplit("/", 1)[-1]
            with atomic_path(dest) as tmp, tmp.open("wb") as out, progress.bar(name, total) as pbar:
                while chunk := resp.read(1 << 20):
                    out.write(chunk)
                    pbar.update(len(chunk))
    except (urllib.error.URLError, OSError, ValueError) as exc:
        if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS:
            raise  # the cache's disk, not the server: the CLI names the disk
        raise FetchError(f"{url}: {exc}") from None


def cached_url(
    url: str,
    dest: Path,
    sha256: str | None,
    *,
    fetcher: Fetcher = urllib_fetch,
    timeout: float = 60.0,
) -> Path:
    """Return ``dest``, fetching ``url`` there first unless a verified copy exists."""
    if dest.is_file() and sha256 and cached_ok(dest, sha256):
        return dest
    fetcher(url, dest, timeout)
    if sha256:
        try:
            verify_sha256(dest, sha256, what=dest.name)
        except BuildError:
            # keep nothing that failed verification in the cache
            dest.unlink(missing_ok=True)
            raise
    return dest


def cached_ok(dest: Path, sha256: str) -> bool:
    """Whether the cached ``dest`` still has its pinned sha256; if not, it is removed (and
    the caller downloads it again)."""
    actual = sha256_file(dest)
    if actual == sha256.lower():
        return True
    progress.step(
        f"cached {dest} has sha256 {actual}, not the pinned {sha256}: removing it and "
        "downloading it again"
    )
    dest.unlink()
    return False


def pip_download(
    spec: str,
    filename: str,
    sha256: str,
    dest_dir: Path,
    *,
    python_version: str,
    platform: str,
    abi: str | None = None,
) -> Path:
    """Download one binary wheel with ``pip download`` into ``dest_dir``, verified.

    ``filename`` is the exact file the pin names; ``platform`` restricts pip to it.
    """
    dest = dest_dir / filename
    if dest.is_file() and cached_ok(dest, sha256):
        return dest
    dest_dir.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        python_version,
        "--platform",
        platform,
        "--implementation",
        "cp",
        "--dest",
    ]
    with temp_dir(dest_dir, "pip") as tmp:
        cmd.append(str(tmp))
        if abi:
            cmd += ["--abi", abi]
        cmd.append(spec)
        # pip's own temporary files go to the same disk, and away with the rest; a cap on
        # versions in pip's configuration does not apply to a file pinned by sha256, the
        # index configuration does (pipconf)
        (tmp / "tmp").mkdir()
        env = pipconf.pinned_download_env()
        env["TMPDIR"] = str(tmp / "tmp")
        progress.step(f"downloading {filename} (pip download {spec})")
        proc = subprocess.run(
            cmd,
            check=False,
            stdout=sys.stderr,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            preexec_fn=subproc.die_with_parent(),
        )
        got = tmp / filename
        if proc.returncode == 0 and got.is_file() and proc.stderr:
            sys.stderr.write(proc.stderr)  # pip's warnings; a failure is said in one line
        if proc.returncode != 0 or not got.is_file():
            free = shutil.disk_usage(dest_dir).free
            if _NO_SPACE in (proc.stderr or "") or free < _LOW_SPACE:
                raise BuildError(
                    f"pip download {spec} failed: no space left on {mount_point(dest_dir)} "
                    f"(the disk of {dest_dir}, {mebibytes(free)} free): free space there, or "
                    "set TORCH_UM_CACHE to a directory on a disk with room for the download"
                )
            raise BuildError(refused(spec, filename, dest_dir, proc.stderr, proc.returncode, tmp))
        verify_sha256(got, sha256, what=filename)
        os.replace(got, dest)
    return dest


def refused(
    spec: str, filename: str, dest_dir: Path, stderr: str | None, returncode: int, tmp: Path
) -> str:
    """One line for a pinned file pip did not download: the file, pip's reason, what to do."""
    got = [p.name for p in tmp.iterdir() if p.name != "tmp"] if tmp.is_dir() else []
    why = pipconf.reason(stderr, returncode) if not got else f"it gave {', '.join(got)} instead"
    return (
        f"cannot download {filename} (pip download {spec}): {why}. The build asks the package "
        "index your pip configuration names (index-url, extra-index-url, find-links in pip.conf "
        "or PIP_* variables; version caps and constraints are lifted for pinned files): check "
        "the network and that this index serves the file, or put the file into "
        f"{dest_dir} by hand (it is checked against its pinned sha256)"
    )


_NO_SPACE = "No space left on device"
#: below this, a failed download is blamed on the disk, not the network
_LOW_SPACE = 64 << 20
