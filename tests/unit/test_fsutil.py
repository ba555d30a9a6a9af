from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from build_scripts import fsutil
from build_scripts.errors import BuildError

from .helpers import sha


def test_verify_sha256_mismatch_names_file_expected_and_actual(tmp_path: Path) -> None:
    f = tmp_path / "thing.whl"
    f.write_bytes(b"content")
    expected = "1" * 64
    with pytest.raises(BuildError) as exc:
        fsutil.verify_sha256(f, expected)
    msg = str(exc.value)
    assert "thing.whl" in msg and expected in msg and sha(b"content") in msg
    fsutil.verify_sha256(f, sha(b"content"))


def test_atomic_path_leaves_nothing_on_failure(tmp_path: Path) -> None:
    dest = tmp_path / "out.bin"
    with pytest.raises(RuntimeError), fsutil.atomic_path(dest) as tmp:
        tmp.write_bytes(b"half")
        raise RuntimeError("boom")
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_replaces_only_on_success(tmp_path: Path) -> None:
    dest = tmp_path / "tree"
    with fsutil.atomic_dir(dest) as tmp:
        (tmp / "a").write_text("1")
    with pytest.raises(RuntimeError), fsutil.atomic_dir(dest) as tmp:
        (tmp / "a").write_text("2")
        raise RuntimeError("boom")
    assert (dest / "a").read_text() == "1"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tree"]
    with fsutil.atomic_dir(dest) as tmp:
        (tmp / "b").write_text("3")
    assert sorted(p.name for p in dest.iterdir()) == ["b"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tree"]


def test_digest_is_stable() -> None:
    assert fsutil.digest_of({"b": 1, "a": [1, 2]}) == fsutil.digest_of({"a": [1, 2], "b": 1})


def _tree(root: Path) -> Path:
    (root / "torch" / "include").mkdir(parents=True)
    (root / "torch" / "include" / "a.h").write_text("int a;\n")
    (root / "torch" / "lib.so").write_bytes(b"\x7fELF")
    fsutil.write_manifest(root)
    return root


def test_manifest_accepts_the_tree_as_made(tmp_path: Path) -> None:
    root = _tree(tmp_path / "t")
    assert fsutil.manifest_problem(root) is None
    # a metadata change alone (touch) is re-hashed and still accepted
    os.utime(root / "torch" / "lib.so", ns=(1, 1))
    assert fsutil.manifest_problem(root) is None


def test_manifest_catches_a_change_with_mtime_and_size_kept(tmp_path: Path) -> None:
    root = _tree(tmp_path / "t")
    header = root / "torch" / "include" / "a.h"
    st = header.stat()
    header.write_text("int b;\n")  # same size
    os.utime(header, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert fsutil.manifest_problem(root) == "torch/include/a.h changed"


def test_manifest_catches_added_and_missing_files(tmp_path: Path) -> None:
    root = _tree(tmp_path / "t")
    (root / "torch" / "include" / "planted.h").write_text("")
    assert fsutil.manifest_problem(root) == "torch/include/planted.h was added"
    (root / "torch" / "include" / "planted.h").unlink()
    (root / "torch" / "lib.so").unlink()
    assert fsutil.manifest_problem(root) == "torch/lib.so is missing"
    (root / fsutil.MANIFEST).unlink()
    assert fsutil.manifest_problem(root) == "it has no manifest"


def test_temporary_names_never_look_final(tmp_path: Path) -> None:
    dest = tmp_path / "torch-9.1.0+um-cp311-cp311-manylinux_2_34_x86_64.whl"
    with fsutil.atomic_path(dest, label="repack") as tmp:
        assert tmp.name.startswith(".tmp-repack.") and tmp.name.endswith(".partial")
        tmp.write_bytes(b"x")
    with fsutil.atomic_dir(tmp_path / "tree") as d:
        assert d.name.startswith(".tmp-tree.") and d.name.endswith(".partial")
    assert sorted(p.name for p in tmp_path.iterdir()) == [dest.name, "tree"]


def test_sweep_takes_only_entries_whose_writer_is_gone(tmp_path: Path) -> None:
    dead = tmp_path / "wheels" / ".tmp-pip.abc.partial"
    (dead / "tmp").mkdir(parents=True)
    (dead / "torch.whl").write_bytes(b"half")
    dead_file = tmp_path / "deep" / "er" / ".tmp-x.json.abc.partial"
    dead_file.parent.mkdir(parents=True)
    dead_file.write_text("{")
    young = tmp_path / ".tmp-y.abc.partial"  # may be between creation and its lock
    young.write_text("")
    old_style = tmp_path / "dist" / ".tmp-k2j3"  # written before the lock convention
    (old_style).mkdir(parents=True)
    (old_style / "torch-2.6.0+um-cp311-cp311-manylinux_2_34_x86_64.whl").write_bytes(b"PK")
    recent_old_style = tmp_path / "dist" / ".tmp-zzzz"
    recent_old_style.mkdir()
    for p in (dead, dead_file):
        os.utime(p, (time.time() - 120,) * 2)
    os.utime(old_style, (time.time() - 2 * 86400,) * 2)
    with fsutil.temp_dir(tmp_path / "wheels", "pip") as live:
        os.utime(live, (time.time() - 3600,) * 2)
        removed = fsutil.sweep_leftovers(tmp_path)
        assert live.is_dir()
    assert removed == sorted([dead, dead_file, old_style])
    assert young.exists() and recent_old_style.exists()
