"""Hashing and all-or-nothing file writes.

Every file the pipeline produces is written to a temporary sibling and renamed into
place, so an interrupted or failed step never leaves a partial result that a later
run would take as valid.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from build_scripts.errors import BuildError

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def verify_sha256(path: Path, expected: str, what: str | None = None) -> None:
    """Raise :class:`BuildError` naming the file, expected and actual hash on mismatch."""
    actual = sha256_file(path)
    if actual != expected.lower():
        raise BuildError(
            f"sha256 mismatch for {what or path.name} ({path}): expected {expected}, "
            f"got {actual}. Delete the file so it is downloaded again; if it still differs, "
            "the pin in upstream.yaml or the server is wrong."
        )


def verify_cached(path: Path, expected: str, what: str | None = None) -> None:
    """Like :func:`verify_sha256`, but remembers a success keyed by size and mtime.

    Rehashing a 767 MB wheel on every warm rerun costs seconds; the stamp next to the
    file records the (size, mtime_ns, sha256) that were verified.
    """
    stamp = path.with_name(f".{path.name}.verified")
    st = path.stat()
    key = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": expected.lower()}
    try:
        if json.loads(stamp.read_text()) == key:
            return
    except (OSError, ValueError):
        pass
    verify_sha256(path, expected, what)
    atomic_write_text(stamp, json.dumps(key))


@contextlib.contextmanager
def atomic_path(dest: Path, *, suffix: str = "") -> Iterator[Path]:
    """Yield a temporary path next to ``dest``; rename it onto ``dest`` on success."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".tmp-{dest.name}.", suffix=suffix, dir=dest.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        yield tmp
        os.replace(tmp, dest)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def atomic_write_bytes(dest: Path, data: bytes) -> None:
    with atomic_path(dest) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(dest: Path, text: str) -> None:
    atomic_write_bytes(dest, text.encode())


@contextlib.contextmanager
def atomic_dir(dest: Path) -> Iterator[Path]:
    """Yield an empty temporary directory next to ``dest``; swap it in on success.

    An existing ``dest`` is replaced only after the new tree is complete.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{dest.name}.", dir=dest.parent))
    try:
        yield tmp
        if dest.exists():
            old = Path(tempfile.mkdtemp(prefix=f".old-{dest.name}.", dir=dest.parent))
            os.replace(dest, old / "d")
            os.replace(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def write_json(path: Path, value: Any) -> None:
    atomic_write_text(path, json.dumps(value, indent=2, sort_keys=True) + "\n")


def digest_of(value: Any) -> str:
    """A stable short hash of a JSON-serialisable value (cache keys, stamps)."""
    return sha256_bytes(json.dumps(value, sort_keys=True).encode())[:16]
