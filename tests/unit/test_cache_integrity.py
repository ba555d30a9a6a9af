"""Nothing in the cache is trusted on a stamp alone: a cached download is hashed on every
use, and a derived tree (extracted wheel parts, a patched tree, the built library, the
repacked wheel) is checked against the record made with it. A corrupted file whose mtime
was put back is caught; it is then fetched or made again, never shipped."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from build_scripts import fetch, matrix, official, pipeline, series, sources, wheel_parts
from build_scripts.errors import BuildError
from build_scripts.sources.local import LocalProvider

from .helpers import UPSTREAM_FILES, matrix_doc, sha, write_matrix, write_tree
from .test_repack import make_wheel


def _corrupt_keeping_mtime(path: Path, data: bytes | None = None) -> None:
    """Overwrite ``path`` with bytes of the same size and put its times back."""
    st = path.stat()
    old = path.read_bytes()
    new = data if data is not None else bytes(b ^ 0xFF for b in old)
    assert len(new) == len(old)
    path.write_bytes(new)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert path.stat().st_mtime_ns == st.st_mtime_ns and path.stat().st_size == st.st_size


def test_cached_download_with_its_mtime_kept_is_fetched_again(tmp_path: Path) -> None:
    served = tmp_path / "served.tar.xz"
    served.write_bytes(b"payload")
    dest = tmp_path / "cache" / "x.tar.xz"
    fetch.cached_url(served.as_uri(), dest, sha(b"payload"))
    _corrupt_keeping_mtime(dest)
    assert fetch.cached_url(served.as_uri(), dest, sha(b"payload")).read_bytes() == b"payload"


def test_cached_wheel_with_its_mtime_kept_is_downloaded_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    name = "pkg-1.0-py3-none-any.whl"
    (tmp_path / name).write_bytes(b"wheel-bytes")
    _corrupt_keeping_mtime(tmp_path / name, b"wheel-bytez")
    runs: list[list[str]] = []

    def run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        runs.append(cmd)
        (Path(cmd[cmd.index("--dest") + 1]) / name).write_bytes(b"wheel-bytes")
        return subprocess.CompletedProcess(cmd, 0, None, "")

    monkeypatch.setattr(subprocess, "run", run)
    got = fetch.pip_download(
        "pkg==1.0", name, sha(b"wheel-bytes"), tmp_path, python_version="3.11", platform="any"
    )
    assert got.read_bytes() == b"wheel-bytes" and len(runs) == 1
    assert (
        f"==> cached {tmp_path / name} has sha256 {sha(b'wheel-bytez')}, not the pinned "
        f"{sha(b'wheel-bytes')}: removing it and downloading it again\n"
    ) in capsys.readouterr().err


def _extract(wheel: Path, dest: Path) -> Path:
    return wheel_parts.extract(wheel, dest, lambda n: n.startswith("torch/"), "torch/")


def test_poisoned_extracted_tree_is_extracted_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wheel = make_wheel(tmp_path / "torch-9.1.0-cp311-cp311-manylinux1_x86_64.whl")
    dest = tmp_path / "unpacked" / "abc"
    lib = _extract(wheel, dest) / "torch/lib/libc10.so"
    original = lib.read_bytes()
    _corrupt_keeping_mtime(lib)
    assert _extract(wheel, dest) == dest
    assert lib.read_bytes() == original
    (dest / "torch" / "planted.h").write_text("#define X 1\n")
    _extract(wheel, dest)
    assert not (dest / "torch" / "planted.h").exists()
    err = capsys.readouterr().err
    assert f"==> {dest} differs from what was extracted (torch/lib/libc10.so changed): " in err
    assert f"==> {dest} differs from what was extracted (torch/planted.h was added): " in err


def test_poisoned_patched_tree_is_patched_again(tmp_path: Path) -> None:
    upstream = write_tree(tmp_path / "upstream", {"torch/__init__.py": b"x = 1\n"})
    d = tmp_path / "patches" / "9.1.0"
    d.mkdir(parents=True)
    (d / "0001-a.patch").write_text(
        "--- a/torch/__init__.py\n+++ b/torch/__init__.py\n@@ -1 +1 @@\n-x = 1\n+x = 2\n"
    )
    (d / "series").write_text("0001-a.patch\n")
    tree = series.patched_tree(upstream, d / "series", tmp_path / "patched")
    shipped = tree / "torch/__init__.py"
    assert shipped.read_text() == "x = 2\n"
    _corrupt_keeping_mtime(shipped, b"x = 3\n")
    series.patched_tree(upstream, d / "series", tmp_path / "patched")
    assert shipped.read_text() == "x = 2\n"


def test_wheel_in_dist_changed_with_its_mtime_kept_is_repacked(tmp_path: Path) -> None:
    source = make_wheel(tmp_path / "torch-9.1.0-cp311-cp311-manylinux1_x86_64.whl")
    write_matrix(tmp_path / "patches", matrix_doc("9.1.0"))
    m = matrix.load("9.1.0", tmp_path / "patches")
    pin = m.wheel.for_python("3.11")
    inputs = official.OfficialInputs(source, pin, (), tmp_path / "libcudart.so.12")
    files: dict[str, Any] = {"torch/cuda/um.py": b"x = 1\n"}
    dist, cache = tmp_path / "dist", tmp_path / "cache"
    tag = "manylinux_2_34_x86_64"
    out, reused = pipeline.repack_if_changed(inputs, m, tag, files, dist=dist, cache=cache)
    assert not reused
    assert pipeline.repack_if_changed(inputs, m, tag, files, dist=dist, cache=cache)[1]
    good = out.read_bytes()
    _corrupt_keeping_mtime(out)
    out2, reused = pipeline.repack_if_changed(inputs, m, tag, files, dist=dist, cache=cache)
    assert out2 == out and not reused and out.read_bytes() == good


def _matrix(tmp_path: Path) -> matrix.VersionMatrix:
    write_matrix(tmp_path / "patches", matrix_doc("9.1.0"))
    return matrix.load("9.1.0", tmp_path / "patches")


def test_upstream_cache_with_a_planted_file_is_fetched_again(tmp_path: Path) -> None:
    """CMake compiles every c10/cuda/*.cpp it finds: an extra file is not harmless."""
    m = _matrix(tmp_path)
    tree = write_tree(tmp_path / "src", UPSTREAM_FILES)
    got = sources.fetch_upstream(m, [LocalProvider(tree)], cache=tmp_path / "c")
    (got / "c10/cuda/Planted.cpp").write_text("int planted;\n")
    assert sources.fetch_upstream(m, [LocalProvider(tree)], cache=tmp_path / "c") == got
    assert not (got / "c10/cuda/Planted.cpp").exists()


def test_torch_src_is_used_and_verified_even_when_the_cache_is_warm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    m = _matrix(tmp_path)
    good = write_tree(tmp_path / "good", UPSTREAM_FILES)
    sources.fetch_upstream(m, [LocalProvider(good)], cache=tmp_path / "c")  # warm cache
    wrong = write_tree(tmp_path / "wrong", {**UPSTREAM_FILES, "c10/cuda/A.cpp": b"changed\n"})
    monkeypatch.setenv("TORCH_SRC", str(wrong))
    monkeypatch.setenv("TORCH_UM_NO_GIT", "1")
    with pytest.raises(BuildError) as exc:
        sources.fetch_upstream(m, cache=tmp_path / "c")
    changed = sha(b"changed\n")
    assert str(exc.value) == (
        f"upstream file c10/cuda/A.cpp from TORCH_SRC={wrong} has sha256 {changed}, "
        f"but upstream.yaml pins {sha(UPSTREAM_FILES['c10/cuda/A.cpp'])}: the source is not "
        "the pinned upstream commit (point TORCH_SRC at the right tree, or update the pin "
        "deliberately)"
    )


def test_two_output_folders_sharing_a_cache_keep_their_own_stamp(tmp_path: Path) -> None:
    """Checkouts (worktrees) share the cache but each has its own dist/: building into one
    must not make the other's wheel look out of date."""
    source = make_wheel(tmp_path / "torch-9.1.0-cp311-cp311-manylinux1_x86_64.whl")
    write_matrix(tmp_path / "patches", matrix_doc("9.1.0"))
    m = matrix.load("9.1.0", tmp_path / "patches")
    inputs = official.OfficialInputs(
        source, m.wheel.for_python("3.11"), (), tmp_path / "libcudart.so.12"
    )
    cache, tag = tmp_path / "cache", "manylinux_2_34_x86_64"
    checkouts: dict[Path, dict[str, Any]] = {  # each with its own overlay Python file
        tmp_path / "a" / "dist": {"torch/cuda/um.py": b"x = 1\n"},
        tmp_path / "b" / "dist": {"torch/cuda/um.py": b"x = 2\n"},
    }
    for dist, files in checkouts.items():
        assert not pipeline.repack_if_changed(inputs, m, tag, files, dist=dist, cache=cache)[1]
    for dist, files in checkouts.items():
        assert pipeline.repack_if_changed(inputs, m, tag, files, dist=dist, cache=cache)[1]
