"""``TORCH_SRC``: a local upstream checkout or source tarball."""

from __future__ import annotations

import shutil
import tarfile
from collections.abc import Sequence
from pathlib import Path

from build_scripts.errors import BuildError
from build_scripts.matrix import VersionMatrix
from build_scripts.sources.tarball import extract_members


class LocalProvider:
    def __init__(self, location: Path) -> None:
        self.location = location

    @property
    def name(self) -> str:
        return f"TORCH_SRC={self.location}"

    def provide(self, matrix: VersionMatrix, paths: Sequence[str], dest: Path) -> None:
        loc = self.location
        if loc.is_dir():
            root = _tree_root(loc, paths)
            for rel in paths:
                src = root / rel
                if not src.is_file():
                    raise BuildError(
                        f"TORCH_SRC tree {loc} has no {rel}: point TORCH_SRC at the top of a "
                        f"pytorch {matrix.upstream.tag} checkout"
                    )
                out = dest / rel
                out.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src, out)
        elif loc.is_file() and tarfile.is_tarfile(loc):
            extract_members(loc, paths, dest)
        else:
            raise BuildError(
                f"TORCH_SRC={loc} is neither a directory nor a tar archive; set it to a "
                "pytorch source checkout or source tarball, or unset it"
            )


def _tree_root(loc: Path, paths: Sequence[str]) -> Path:
    """The checkout root: ``loc`` itself, or its single subdirectory holding the files."""
    probe = paths[0] if paths else ""
    if (loc / probe).exists():
        return loc
    subdirs = [d for d in loc.iterdir() if d.is_dir()]
    if len(subdirs) == 1 and (subdirs[0] / probe).exists():
        return subdirs[0]
    return loc
