"""Extract from wheels only the parts the build needs (headers, a few libraries)."""

from __future__ import annotations

import shutil
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

from build_scripts import progress
from build_scripts.errors import BuildError, damaged_zip
from build_scripts.fsutil import atomic_dir, atomic_write_text, manifest_problem, write_manifest

_DONE = ".extracted"  # kept for checkouts that predate the manifest


def extract(wheel: Path, dest: Path, want: Callable[[str], bool], label: str) -> Path:
    """Extract the members of ``wheel`` for which ``want(name)`` holds into ``dest``.

    ``dest`` is complete or absent: it is filled in a temporary directory and renamed.
    It is reused only while it matches its manifest; otherwise it is extracted again.
    """
    if dest.is_dir():
        problem = manifest_problem(dest)
        if problem is None:
            return dest
        progress.step(f"{dest} differs from what was extracted ({problem}): extracting it again")
    try:
        with zipfile.ZipFile(wheel) as zf:
            members = [i for i in zf.infolist() if not i.is_dir() and want(i.filename)]
            if not members:
                raise BuildError(f"{wheel.name} holds none of the files the build needs ({label})")
            with (
                atomic_dir(dest) as tmp,
                progress.bar(f"extract {label}", sum(i.file_size for i in members)) as pbar,
            ):
                for info in members:
                    out = tmp / info.filename
                    if ".." in Path(info.filename).parts:
                        raise BuildError(f"{wheel.name}: unsafe member name {info.filename!r}")
                    out.parent.mkdir(parents=True, exist_ok=True)
                    with zf.open(info) as src, out.open("wb") as f:
                        shutil.copyfileobj(src, f, 1 << 20)
                    mode = (info.external_attr >> 16) & 0o777
                    if mode:
                        out.chmod(mode | 0o600)
                    pbar.update(info.file_size)
                atomic_write_text(tmp / _DONE, "")
                write_manifest(tmp)
    except (zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise BuildError(damaged_zip(wheel, exc)) from None
    return dest


def require(path: Path, what: str) -> Path:
    if not path.exists():
        raise BuildError(f"{what} not found at {path}")
    return path
