from __future__ import annotations

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


def test_verify_cached_remembers_success_and_notices_change(tmp_path: Path) -> None:
    f = tmp_path / "w.whl"
    f.write_bytes(b"one")
    fsutil.verify_cached(f, sha(b"one"))
    assert (tmp_path / ".w.whl.verified").is_file()
    f.write_bytes(b"two")  # other size: stamp no longer applies
    with pytest.raises(BuildError, match="sha256 mismatch for w.whl"):
        fsutil.verify_cached(f, sha(b"one"))


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
