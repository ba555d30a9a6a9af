from __future__ import annotations

import base64
import csv
import hashlib
import io
import zipfile
from pathlib import Path

import pytest

from build_scripts import repack, wheelname
from build_scripts.errors import BuildError

DI = "torch-9.1.0.dist-info"
FILES = {
    "torch/__init__.py": b"from torch.version import __version__\n",
    "torch/version.py": (
        b"from typing import Optional\n\n__version__ = '9.1.0+cu124'\n"
        b"cuda: Optional[str] = '12.4'\ngit_version = 'abc'\n"
    ),
    "torch/lib/libc10_cuda.so": b"\x7fELF original" * 1000,
    "torch/lib/libc10.so": b"\x7fELF c10" * 5000,
    f"{DI}/METADATA": b"Metadata-Version: 2.1\nName: torch\nVersion: 9.1.0\n\nVersion: in the body stays\n",
    f"{DI}/WHEEL": b"Wheel-Version: 1.0\nGenerator: bdist_wheel (0.34.2)\nRoot-Is-Purelib: false\nTag: cp311-cp311-linux_x86_64\n",
    f"{DI}/entry_points.txt": b"[console_scripts]\ntorchrun = torch.distributed.run:main\n",
}


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).decode().rstrip("=")


def make_wheel(path: Path, files: dict[str, bytes] = FILES) -> Path:
    rows = [(n, _hash(d), str(len(d))) for n, d in files.items()] + [(f"{DI}/RECORD", "", "")]
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerows(rows)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("torch/", b"")  # a directory entry, as official wheels have
        for n, d in files.items():
            zf.writestr(n, d)
        zf.writestr(f"{DI}/RECORD", buf.getvalue())
    return path


@pytest.fixture
def wheel(tmp_path: Path) -> Path:
    return make_wheel(tmp_path / "torch-9.1.0-cp311-cp311-manylinux1_x86_64.whl")


def test_repack_replaces_adds_and_renames(tmp_path: Path, wheel: Path) -> None:
    new_lib = tmp_path / "libc10_cuda.so"
    new_lib.write_bytes(b"\x7fELF rebuilt")
    out = repack.repack(
        repack.RepackSpec(
            source=wheel,
            out_dir=tmp_path / "dist",
            version="9.1.0+um",
            platform="manylinux_2_34_x86_64",
            files={
                "torch/lib/libc10_cuda.so": new_lib,
                "torch/cuda/um.py": b"def enabled(): ...\n",
            },
        )
    )
    assert out.name == "torch-9.1.0+um-cp311-cp311-manylinux_2_34_x86_64.whl"
    assert sorted(p.name for p in (tmp_path / "dist").iterdir()) == [out.name]
    with zipfile.ZipFile(out) as zf:
        names = zf.namelist()
        assert not any(n.startswith(DI) for n in names)
        new_di = "torch-9.1.0+um.dist-info"
        assert zf.read("torch/lib/libc10_cuda.so") == b"\x7fELF rebuilt"
        assert zf.getinfo("torch/lib/libc10_cuda.so").external_attr >> 16 == 0o100755
        assert zf.read("torch/cuda/um.py") == b"def enabled(): ...\n"
        assert zf.read("torch/lib/libc10.so") == FILES["torch/lib/libc10.so"]
        assert "torch/" in names
        version_py = zf.read("torch/version.py").decode()
        assert (
            "__version__ = '9.1.0+um'" in version_py
            and "cuda: Optional[str] = '12.4'" in version_py
        )
        assert "git_version = 'abc'" in version_py
        meta = zf.read(f"{new_di}/METADATA").decode()
        assert "\nVersion: 9.1.0+um\n" in meta and "Version: in the body stays" in meta
        assert (
            zf.read(f"{new_di}/WHEEL").decode().endswith("Tag: cp311-cp311-manylinux_2_34_x86_64\n")
        )
        assert zf.read(f"{new_di}/entry_points.txt") == FILES[f"{DI}/entry_points.txt"]
        record = zf.read(f"{new_di}/RECORD").decode()
        assert names[-1] == f"{new_di}/RECORD"
    assert f"torch/cuda/um.py,{_hash(b'def enabled(): ...' + bytes([10]))}," in record
    assert record.endswith(f"{new_di}/RECORD,,\n")
    repack.validate(out)


def test_repack_failure_leaves_no_partial_wheel(tmp_path: Path) -> None:
    files = dict(FILES)
    files["torch/version.py"] = b"no version here\n"
    src = make_wheel(tmp_path / "torch-9.1.0-cp311-cp311-manylinux1_x86_64.whl", files)
    with pytest.raises(BuildError, match="torch/version.py has no single __version__ assignment"):
        repack.repack(
            repack.RepackSpec(src, tmp_path / "dist", "9.1.0+um", "manylinux_2_34_x86_64")
        )
    dist = tmp_path / "dist"
    assert not dist.exists() or list(dist.iterdir()) == []


def test_repack_failure_during_writing_leaves_nothing(tmp_path: Path, wheel: Path) -> None:
    missing = tmp_path / "does-not-exist.so"
    with pytest.raises(BuildError, match="cannot read .*does-not-exist.so to put into the wheel"):
        repack.repack(
            repack.RepackSpec(
                wheel,
                tmp_path / "dist",
                "9.1.0+um",
                "manylinux_2_34_x86_64",
                files={"torch/lib/libc10_cuda.so": missing},
            )
        )
    assert list((tmp_path / "dist").iterdir()) == []


def test_validate_catches_bad_record(tmp_path: Path) -> None:
    files = dict(FILES)
    src = make_wheel(tmp_path / "torch-9.1.0-cp311-cp311-manylinux1_x86_64.whl", files)
    bad = tmp_path / "bad" / src.name
    bad.parent.mkdir()
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(bad, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename == "torch/__init__.py":
                data = b"tampered\n"
            zout.writestr(info, data)
    with pytest.raises(BuildError) as exc:
        repack.validate(bad)
    assert "RECORD of" in str(exc.value) and "torch/__init__.py didn't match RECORD" in str(
        exc.value
    )


def test_dist_info_files_cannot_be_replaced_through_mapping(tmp_path: Path, wheel: Path) -> None:
    with pytest.raises(BuildError, match="cannot replace dist-info file"):
        repack.repack(
            repack.RepackSpec(
                wheel,
                tmp_path / "d",
                "9.1.0+um",
                "manylinux_2_34_x86_64",
                files={f"{DI}/METADATA": b"x"},
            )
        )


def test_wheel_name_helpers() -> None:
    n = wheelname.parse("torch-2.6.0-cp311-cp311-manylinux1_x86_64.whl")
    assert (n.name, n.version, n.python, n.abi, n.platform) == (
        "torch",
        "2.6.0",
        "cp311",
        "cp311",
        "manylinux1_x86_64",
    )
    with pytest.raises(BuildError, match="is not a wheel file name"):
        wheelname.parse("torch.tar.gz")
    # a build tag (2.10.0's official wheels have one) is read, and not carried over
    tagged = wheelname.parse("torch-2.10.0-3-cp311-cp311-manylinux_2_28_x86_64.whl")
    assert (tagged.version, tagged.build) == ("2.10.0", "3")
    assert (
        repack.output_name(Path(tagged.filename()), "2.10.0+um", "manylinux_2_34_x86_64")
        == "torch-2.10.0+um-cp311-cp311-manylinux_2_34_x86_64.whl"
    )
    # a local label is part of the exact version: a +cpu wheel is not the CUDA one
    assert wheelname.parse("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").version == (
        "2.13.0+cpu"
    )
    cuda = "nvidia_cuda_runtime-13.0.96-py3-none-manylinux2014_x86_64.manylinux_2_17_x86_64.whl"
    assert wheelname.parse(cuda).platform == "manylinux2014_x86_64"
    assert (
        repack.rewrite_wheel_file(
            "Tag: cp311-cp311-linux_x86_64\nTag: cp311-cp311-manylinux1_x86_64\n", "P"
        )
        == "Tag: cp311-cp311-P\n"
    )
    with pytest.raises(BuildError, match="METADATA has no Version header"):
        repack.rewrite_metadata("Name: x\n\nVersion: 1\n", "2")
