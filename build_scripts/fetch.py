"""Downloads into the cache: registry wheels through ``pip download``, other files by URL.

Every file is verified against its pinned sha256 before use; a mismatch stops the build
naming the file, the expected and the actual hash.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from build_scripts import progress
from build_scripts.errors import BuildError
from build_scripts.fsutil import atomic_path, verify_cached, verify_sha256

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
    if dest.is_file() and sha256:
        try:
            verify_cached(dest, sha256)
            return dest
        except BuildError:
            dest.unlink()
    fetcher(url, dest, timeout)
    if sha256:
        try:
            verify_cached(dest, sha256, what=dest.name)
        except BuildError:
            # keep nothing that failed verification in the cache
            dest.unlink(missing_ok=True)
            raise
    return dest


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
    if dest.is_file():
        try:
            verify_cached(dest, sha256, what=filename)
            return dest
        except BuildError:
            dest.unlink()
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
    with tempfile.TemporaryDirectory(prefix=".tmp-pip-", dir=dest_dir) as tmp:
        cmd.append(tmp)
        if abi:
            cmd += ["--abi", abi]
        cmd.append(spec)
        progress.step(f"downloading {filename} (pip download {spec})")
        proc = subprocess.run(cmd, check=False, stdout=sys.stderr)
        got = Path(tmp) / filename
        if proc.returncode != 0 or not got.is_file():
            found = ", ".join(p.name for p in Path(tmp).iterdir()) or "nothing"
            raise BuildError(
                f"pip download {spec} did not produce {filename} (exit {proc.returncode}, "
                f"got {found}). Check the network and pip's index configuration, or put the "
                f"file into {dest_dir} by hand."
            )
        verify_sha256(got, sha256, what=filename)
        shutil.move(str(got), dest)
    verify_cached(dest, sha256, what=filename)
    return dest
