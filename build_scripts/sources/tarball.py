"""Extract chosen files from a source tarball without unpacking all of it."""

from __future__ import annotations

import shutil
import tarfile
from collections.abc import Sequence
from pathlib import Path

from build_scripts.errors import BuildError


def extract_members(
    tarball: Path, paths: Sequence[str], dest: Path, top_dir: str | None = None
) -> None:
    """Copy ``<top_dir>/<path>`` for each path from ``tarball`` to ``dest/<path>``.

    With ``top_dir=None`` the top directory is detected: either none, or the single
    directory every member lives in.
    """
    wanted = set(paths)
    try:
        with tarfile.open(tarball) as tar:
            found: set[str] = set()
            prefix = None if top_dir is None else top_dir.rstrip("/") + "/"
            for member in tar:
                name = member.name.removeprefix("./")
                if prefix is None:
                    rel = _match_any_prefix(name, wanted)
                else:
                    rel = name[len(prefix) :] if name.startswith(prefix) else None
                if rel is None or rel not in wanted or not member.isfile():
                    continue
                src = tar.extractfile(member)
                if src is None:
                    continue
                out = dest / rel
                out.parent.mkdir(parents=True, exist_ok=True)
                with src, out.open("wb") as f:
                    shutil.copyfileobj(src, f)
                found.add(rel)
                if found == wanted:
                    break
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise BuildError(
            f"cannot read source tarball {tarball}: {exc} (delete it to download it again)"
        ) from None
    missing = sorted(wanted - found)
    if missing:
        where = f"{top_dir}/" if top_dir else ""
        raise BuildError(
            f"source tarball {tarball} lacks {len(missing)} pinned file(s) under "
            f"'{where}', e.g. {', '.join(missing[:5])}"
        )


def _match_any_prefix(name: str, wanted: set[str]) -> str | None:
    if name in wanted:
        return name
    _, sep, rest = name.partition("/")
    return rest if sep and rest in wanted else None
