"""What an integration path produces: the changes to make to the official wheel."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from build_scripts import abi


@dataclass(frozen=True)
class WheelChanges:
    library: Path  # the library built from c10_overlay/ (libc10_cuda.so or libtorch_um.so)
    elf: abi.ElfInfo  # its ELF facts: the platform tag follows its symbol versions
    official_library: Path  # the official library it replaces or links against
    files: dict[str, Path]  # path inside the wheel -> new content (replaced or added)


def overlay_python_files(overlay: Path) -> dict[str, Path]:
    """``c10_overlay/torch/**`` maps to ``torch/**`` inside the wheel."""
    root = overlay / "torch"
    if not root.is_dir():
        return {}
    return {
        "torch/" + p.relative_to(root).as_posix(): p
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
    }
