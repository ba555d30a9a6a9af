"""Extract chosen files from a source tarball without unpacking all of it."""

from __future__ import annotations

import shutil
import tarfile
from collections.abc import Sequence
from pathlib import Path

from build_scripts.errors import DISK_ERRNOS, BuildError


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
                if rel is None or rel not in wanted:
                    continue
                if member.issym():
                    raise BuildError(
                        f"source tarball {tarball} stores the pinned file {rel} as a symbolic "
                        f"link (to {member.linkname}), not as a file: use a tarball that holds "
                        "the file itself, e.g. one made by `git archive`"
                    )
                if not (member.isfile() or member.islnk()):
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
        if isinstance(exc, OSError) and exc.errno in DISK_ERRNOS:
            raise  # the destination's disk, not the tarball: the CLI says which
        raise BuildError(
            f"cannot read source tarball {tarball}: {exc} (delete it to download it again)"
        ) from None
    missing = sorted(wanted - found)
    if missing:
        where = f"under '{top_dir}/'" if top_dir else "at its top level or under one top folder"
        raise BuildError(
            f"source tarball {tarball} lacks {len(missing)} pinned file(s) {where}, "
            f"e.g. {', '.join(missing[:5])}"
        )


def _match_any_prefix(name: str, wanted: set[str]) -> str | None:
    if name in wanted:
        return name
    _, sep, rest = name.partition("/")
    return rest if sep and rest in wanted else None
