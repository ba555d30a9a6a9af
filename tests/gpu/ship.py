"""Carry a large file to a GPU host in parts, and put it back together there by its sha256.

    python3 tests/gpu/ship.py split FILE --dest .device/ship [--size 50000000]    # here
    python3 tests/gpu/ship.py join .device/ship/NAME.parts.json --out DIR \\
        [--sha256 PIN]                                                             # there

The device tool carries at most 64 MiB a call, and a GPU host without network keeps
git-ignored files only while it stays warm between calls. ``split`` writes ``NAME.partNN``
files of at most ``--size`` bytes and ``NAME.parts.json`` (the file's name, size and sha256
and each part's); carry one or two parts per call, back to back. ``join`` checks every part
against the list, names any that are missing or differ, writes ``DIR/NAME`` through a
temporary file, and checks the whole file's sha256 (and ``--sha256``, the pin the file must
have) before it takes the final name. Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import zipfile
from pathlib import Path

DEFAULT_SIZE = 50_000_000  # a call carries 64 MiB with the tracked tree (13.6 MB at step 55)


class ShipError(Exception):
    """A message for the user; nothing half-written is left behind."""


def sha256_file(path: Path) -> str:
    """The file's sha256, read in 1 MiB blocks."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def unzip(wheel: Path, dest: Path, member: str | None = None) -> None:
    """A wheel unpacked into ``dest`` (or only its file ``member`` written to ``dest``),
    shared libraries executable again (zipfile drops the mode bits)."""
    with zipfile.ZipFile(wheel) as zf:
        if member is None:
            zf.extractall(dest)
            done = [dest / n for n in zf.namelist() if ".so" in Path(n).name]
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            partial = dest.with_name(dest.name + ".partial")
            with zf.open(member) as src, partial.open("wb") as dst:
                shutil.copyfileobj(src, dst)
            os.replace(partial, dest)
            done = [dest]
    for path in done:
        path.chmod(0o755)


def split(path: Path, dest: Path, size: int = DEFAULT_SIZE) -> Path:
    """Writes the parts and their list; returns the list's path."""
    if not path.is_file():
        raise ShipError(f"no file at {path}")
    if size < 1:
        raise ShipError(f"--size {size}: must be at least 1 byte")
    dest.mkdir(parents=True, exist_ok=True)
    parts = []
    whole = hashlib.sha256()
    with path.open("rb") as f:
        for index in range(10_000):
            data = f.read(size)
            if not data:
                break
            whole.update(data)
            name = f"{path.name}.part{index:02d}"
            (dest / name).write_bytes(data)
            parts.append(
                {"file": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()}
            )
            print(f"  {name}  {len(data)} bytes", flush=True)
    listing = dest / f"{path.name}.parts.json"
    record = {
        "name": path.name,
        "size": path.stat().st_size,
        "sha256": whole.hexdigest(),
        "parts": parts,
    }
    listing.write_text(json.dumps(record, indent=2) + "\n")
    return listing


def join(listing: Path, out: Path, pin: str | None = None) -> Path:
    """Checks the parts, writes ``out/NAME``; returns its path."""
    if not listing.is_file():
        raise ShipError(f"no parts list at {listing}: carry NAME.parts.json with the first part")
    record = json.loads(listing.read_text())
    if pin is not None and pin != record["sha256"]:
        raise ShipError(
            f"{record['name']}: the parts make sha256 {record['sha256']}, the pin is {pin}: "
            "these are parts of another file"
        )
    folder = listing.parent
    name = str(record["name"])
    missing = [p["file"] for p in record["parts"] if not (folder / p["file"]).is_file()]
    if missing:
        raise ShipError(
            f"{len(missing)} of {len(record['parts'])} parts of {record['name']} are not in "
            f"{folder}: {', '.join(missing)} (the host went cold between calls? carry them again)"
        )
    bad = [p["file"] for p in record["parts"] if sha256_file(folder / p["file"]) != p["sha256"]]
    if bad:
        raise ShipError(f"parts that differ from the list: {', '.join(bad)}")
    out.mkdir(parents=True, exist_ok=True)
    target: Path = out / name
    if target.is_file() and sha256_file(target) == record["sha256"]:
        return target
    partial = out / (name + ".partial")
    try:
        with partial.open("wb") as f:
            for p in record["parts"]:
                f.write((folder / p["file"]).read_bytes())
        have = sha256_file(partial)
        if have != record["sha256"]:
            raise ShipError(f"joined {record['name']} has sha256 {have}, not {record['sha256']}")
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="tests/gpu/ship.py", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)
    sp = sub.add_parser("split", help="cut FILE into parts and a parts list")
    sp.add_argument("file", type=Path)
    sp.add_argument("--dest", type=Path, required=True)
    sp.add_argument("--size", type=int, default=DEFAULT_SIZE, help="bytes per part")
    jp = sub.add_parser("join", help="check the parts and put the file back together")
    jp.add_argument("listing", type=Path, help="NAME.parts.json")
    jp.add_argument("--out", type=Path, required=True)
    jp.add_argument("--sha256", default=None, help="the pin the joined file must have")
    a = ap.parse_args(argv)
    try:
        if a.command == "split":
            print(split(a.file, a.dest, a.size))
        else:
            print(join(a.listing, a.out, a.sha256))
    except ShipError as e:
        print(f"ship: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
