"""Official wheel + replaced/added files -> a ``+um`` wheel with a regenerated RECORD.

Unchanged entries are copied as their compressed bytes (no recompression, nothing held
in memory); the ``.dist-info`` directory is renamed for the new version; METADATA's
Version, the WHEEL tags and ``torch/version.py`` are rewritten; RECORD is regenerated and
the finished wheel's RECORD is validated with ``installer`` before it is renamed into
place. Until then it is ``dist/.tmp-repack.<random>.partial``: nothing that looks like a
wheel, and removed by the next build if this one is killed.
"""

from __future__ import annotations

import base64
import copy
import csv
import hashlib
import io
import os
import re
import struct
import zipfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, cast

from installer.records import Hash, RecordEntry, parse_record_file
from installer.sources import WheelFile
from installer.utils import copyfileobj_with_hashing

from build_scripts import progress, wheelname
from build_scripts.errors import BuildError, damaged_zip
from build_scripts.fsutil import atomic_path

Content = bytes | Path
_VERSION_PY = re.compile(r"""^(__version__\s*=\s*)(['"])([^'"]*)\2""", re.M)
_DATA_DESCRIPTOR = 0x08
# ZIP local file header (APPNOTE 4.3.7): signature ... file name length, extra length
_LOCAL_HEADER = "<4s2B4HL2L2H"
_LOCAL_HEADER_SIZE = struct.calcsize(_LOCAL_HEADER)
_LOCAL_HEADER_MAGIC = b"PK\003\004"


@dataclass(frozen=True)
class RepackSpec:
    source: Path
    out_dir: Path
    version: str  # new version, e.g. "2.6.0+um"
    platform: str  # platform tag for the file name and WHEEL, e.g. manylinux_2_34_x86_64
    files: Mapping[str, Content] = field(default_factory=dict)  # path in wheel -> content
    version_py: str | None = "torch/version.py"


def output_name(source: Path, version: str, platform: str) -> str:
    """The repacked wheel's name: ``version`` and ``platform`` replace the official ones;
    a build tag of the official file (``torch-2.10.0-3-...``) is not carried over."""
    src = wheelname.parse(source.name)
    return wheelname.WheelName(src.name, version, None, src.python, src.abi, (platform,)).filename()


def rewrite_wheel_file(text: str, platform: str) -> str:
    """Replace every ``Tag:`` platform with ``platform`` (one Tag per python-abi pair)."""
    out, seen = [], set()
    for line in text.splitlines():
        if line.startswith("Tag:"):
            py, abi, _plat = line.split(":", 1)[1].strip().split("-")
            if (py, abi) not in seen:
                seen.add((py, abi))
                out.append(f"Tag: {py}-{abi}-{platform}")
        else:
            out.append(line)
    if not seen:
        raise BuildError("WHEEL file has no Tag line")
    return "\n".join(out) + "\n"


def rewrite_metadata(text: str, version: str) -> str:
    head, sep, body = text.partition("\n\n")
    new, n = re.subn(r"^Version:.*$", f"Version: {version}", head, count=1, flags=re.M)
    if n != 1:
        raise BuildError("METADATA has no Version header")
    return new + sep + body


def rewrite_version_py(text: str, version: str) -> str:
    new, n = _VERSION_PY.subn(lambda m: f"{m.group(1)}{m.group(2)}{version}{m.group(2)}", text)
    if n != 1:
        raise BuildError("torch/version.py has no single __version__ assignment")
    return new


def _dist_info(zf: zipfile.ZipFile) -> str:
    tops = {n.split("/", 1)[0] for n in zf.namelist()}
    found = [t for t in tops if t.endswith(".dist-info")]
    if len(found) != 1:
        raise BuildError(f"{zf.filename}: expected one .dist-info directory, found {found}")
    return found[0]


def _raw_copy(src: zipfile.ZipFile, info: zipfile.ZipInfo, dst: zipfile.ZipFile, name: str) -> None:
    """Append ``info``'s compressed bytes to ``dst`` under ``name`` without recompressing."""
    assert src.fp is not None and dst.fp is not None
    src.fp.seek(info.header_offset)
    header = src.fp.read(_LOCAL_HEADER_SIZE)
    fields = struct.unpack(_LOCAL_HEADER, header)
    if fields[0] != _LOCAL_HEADER_MAGIC:
        raise BuildError(f"{src.filename}: bad local header for {info.filename}")
    name_len, extra_len = fields[-2], fields[-1]
    src.fp.seek(info.header_offset + _LOCAL_HEADER_SIZE + name_len + extra_len)

    new = copy.copy(info)
    new.filename = name
    new.orig_filename = name
    new.extra = b""
    new.flag_bits &= ~_DATA_DESCRIPTOR  # sizes go into the local header
    dst.fp.seek(dst.start_dir)
    new.header_offset = dst.fp.tell()
    dst.fp.write(new.FileHeader(zip64=None))
    remaining = info.compress_size
    while remaining:
        chunk = src.fp.read(min(remaining, 1 << 20))
        if not chunk:
            raise BuildError(f"{src.filename}: truncated entry {info.filename}")
        dst.fp.write(chunk)
        remaining -= len(chunk)
    dst.start_dir = dst.fp.tell()
    dst.filelist.append(new)
    dst.NameToInfo[name] = new
    dst._didModify = True  # type: ignore[attr-defined]


def _record_row(path: str, data_hash: str, size: int) -> tuple[str, str, str]:
    row: tuple[str, str, str] = RecordEntry(path, Hash("sha256", data_hash), size).to_row()
    return row


def _hash_stream(stream: BinaryIO) -> tuple[str, int]:
    with open(os.devnull, "wb") as sink:
        digest, size = copyfileobj_with_hashing(stream, sink, "sha256")
    return str(digest), int(size)


def _content_bytes(value: Content) -> bytes:
    if isinstance(value, bytes):
        return value
    try:
        return value.read_bytes()
    except OSError as exc:
        raise BuildError(f"cannot read {value} to put into the wheel: {exc}") from None


def repack(spec: RepackSpec) -> Path:
    """Write the new wheel into ``spec.out_dir`` atomically; return its path."""
    out_name = output_name(spec.source, spec.version, spec.platform)
    dest = spec.out_dir / out_name
    src_name = wheelname.parse(spec.source.name)
    try:
        src = zipfile.ZipFile(spec.source)
    except zipfile.BadZipFile as exc:
        raise BuildError(damaged_zip(spec.source, exc)) from None
    with src:
        old_di = _dist_info(src)
        new_di = f"{src_name.name}-{spec.version}.dist-info"
        old_record = {
            row[0]: row
            for row in parse_record_file(src.read(f"{old_di}/RECORD").decode().splitlines())
        }
        overrides: dict[str, bytes] = {
            f"{new_di}/WHEEL": rewrite_wheel_file(
                src.read(f"{old_di}/WHEEL").decode(), spec.platform
            ).encode(),
            f"{new_di}/METADATA": rewrite_metadata(
                src.read(f"{old_di}/METADATA").decode(), spec.version
            ).encode(),
        }
        if spec.version_py:
            try:
                vp = src.read(spec.version_py).decode()
            except KeyError:
                raise BuildError(f"{spec.source.name} has no {spec.version_py}") from None
            overrides[spec.version_py] = rewrite_version_py(vp, spec.version).encode()
        for path in spec.files:
            if path.startswith(old_di + "/") or path.startswith(new_di + "/"):
                raise BuildError(f"cannot replace dist-info file {path} through the file mapping")
        added = [p for p in spec.files if p not in src.NameToInfo]
        infos = [i for i in src.infolist() if i.filename != f"{old_di}/RECORD"]
        total = sum(i.compress_size for i in infos)
        rows: list[tuple[str, str, str]] = []
        spec.out_dir.mkdir(parents=True, exist_ok=True)
        with atomic_path(dest, label="repack") as tmp:
            with (
                zipfile.ZipFile(tmp, "w", zipfile.ZIP_DEFLATED) as dst,
                progress.bar(f"repack {out_name}", total) as pbar,
            ):
                for info in infos:
                    name = info.filename
                    if name.startswith(old_di + "/"):
                        name = new_di + name[len(old_di) :]
                    if info.is_dir():  # kept as is; RECORD lists files only
                        _raw_copy(src, info, dst, name)
                        continue
                    if name in spec.files or name in overrides:
                        data = overrides.get(name)
                        if data is None:
                            data = _content_bytes(spec.files[name])
                        _write(dst, name, data, info)
                        rows.append(_record_row(name, _b64(data), len(data)))
                    else:
                        rec = old_record.get(info.filename)
                        if rec and rec[1].startswith("sha256=") and rec[2]:
                            rows.append((name, rec[1], rec[2]))
                        else:
                            with src.open(info) as stream:
                                digest, size = _hash_stream(cast(BinaryIO, stream))
                            rows.append(_record_row(name, digest, size))
                        _raw_copy(src, info, dst, name)
                    pbar.update(info.compress_size)
                for name in added:
                    data = _content_bytes(spec.files[name])
                    _write(dst, name, data, None)
                    rows.append(_record_row(name, _b64(data), len(data)))
                rows.append((f"{new_di}/RECORD", "", ""))
                buf = io.StringIO()
                csv.writer(buf, lineterminator="\n").writerows(rows)
                _write(dst, f"{new_di}/RECORD", buf.getvalue().encode(), None)
            validate(tmp, label=out_name)
    return dest


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")


def _write(dst: zipfile.ZipFile, name: str, data: bytes, like: zipfile.ZipInfo | None) -> None:
    info = zipfile.ZipInfo(name, date_time=like.date_time if like else (2025, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_DEFLATED
    info.external_attr = like.external_attr if like else (0o100644 << 16)
    if name.endswith(".so") or ".so." in name:
        info.external_attr = 0o100755 << 16
    dst.writestr(info, data)


def validate(wheel: Path, label: str | None = None) -> None:
    """Every file is listed in RECORD with the right sha256 and size (installer checks).

    ``label``: the wheel file name to check ``wheel`` as (a temporary file has none).
    """
    label = label or wheel.name
    progress.step(f"validating RECORD of {label}")
    try:
        with zipfile.ZipFile(wheel) as zf:
            zf.filename = label  # installer reads the distribution's name from it
            wf = WheelFile(zf)
            wf.validate_record(validate_contents=True)
    except (zipfile.BadZipFile, OSError) as exc:
        raise BuildError(f"{label} is not a readable wheel: {exc}") from None
    except ValueError as exc:
        issues = getattr(exc, "issues", None) or [str(exc)]
        raise BuildError(
            f"RECORD of {label} is invalid ({len(issues)} issue(s)):\n  " + "\n  ".join(issues[:20])
        ) from None
