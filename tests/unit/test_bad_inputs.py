"""Every bad input of ``python -m build_scripts build`` ends in one line, ``error: ...``,
with exit status 2, and before anything is downloaded where it can be known that early.

Where the bad input is met deep inside a step, ``pipeline.build`` is replaced by that step
fed with the bad input, so the test still goes through the CLI's own error handling."""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import pytest

from build_scripts import cli, fetch, fsutil, matrix, official, pipeline, toolchain, wheel_parts
from build_scripts.paths import REPO_ROOT
from build_scripts.sources.tarball import extract_members

from .helpers import make_tarball

UNKNOWN = (
    "error: unknown TORCH_VERSION {v!r}: supported versions are "
    + ", ".join(matrix.supported_versions()).replace("{", "{{")
    + "; set TORCH_VERSION to one of them, e.g. `make build TORCH_VERSION="
    + matrix.default_version()
    + "`"
)
PIN = matrix.load("2.11.0").wheel.for_python("3.11")


class Stop(Exception):
    """Raised by a faked step to end a build early once what the test checks happened."""


def error_line(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run the CLI; it must exit 2 and end with one ``error:`` line and no traceback."""
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = err.splitlines()
    assert [ln for ln in lines if ln.startswith("error: ")] == lines[-1:]
    return lines[-1]


def build_args(dist: Path | None = None) -> list[str]:
    args = ["build", "--torch-version", "2.11.0", "--python", "3.11"]
    return args + (["--dist", str(dist)] if dist else [])


def fail_in_build(monkeypatch: pytest.MonkeyPatch, step: Callable[[], object]) -> None:
    """``pipeline.build`` runs ``step`` (the bad input meets its step there)."""

    def build(*args: object, **kwargs: object) -> None:
        step()

    monkeypatch.setattr(pipeline, "build", build)


@pytest.fixture
def no_downloads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record, and refuse, any download: the tests that use it fail before downloads."""
    calls: list[str] = []

    def fetch(m: matrix.VersionMatrix, python: str, cache: Path) -> None:
        calls.append(m.torch_version)
        raise Stop

    monkeypatch.setattr(official, "fetch_inputs", fetch)
    return calls


class Unwritable(NamedTuple):
    path: Path
    reason: str  # the strerror the kernel gives for it


@pytest.fixture
def unwritable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Unwritable]:
    """A directory nobody can create files in. As root, permissions do not stop anyone:
    the directory is made immutable (``chattr +i``) where that is allowed, else creating
    files in it fails as the kernel would fail it for an ordinary user."""
    d = tmp_path / "readonly"
    d.mkdir()
    if os.geteuid() != 0:
        d.chmod(0o555)
        yield Unwritable(d, "Permission denied")
        d.chmod(0o755)
        return
    chattr = shutil.which("chattr")
    if chattr and subprocess.run([chattr, "+i", str(d)], capture_output=True).returncode == 0:
        try:
            yield Unwritable(d, "Operation not permitted")
        finally:
            subprocess.run([chattr, "-i", str(d)], check=True)
        return
    real_open, real_mkdir = os.open, os.mkdir

    def inside(path: Any) -> bool:
        return Path(os.fsdecode(path)).resolve().parent == d.resolve()

    def fake_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> int:
        if flags & os.O_CREAT and inside(path):
            raise PermissionError(errno.EACCES, "Permission denied", os.fsdecode(path))
        return real_open(path, flags, *args, **kwargs)

    def fake_mkdir(path: Any, *args: Any, **kwargs: Any) -> None:
        if inside(path):
            raise PermissionError(errno.EACCES, "Permission denied", os.fsdecode(path))
        real_mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", fake_open)
    monkeypatch.setattr(os, "mkdir", fake_mkdir)
    yield Unwritable(d, "Permission denied")


# ------------------------------------------------------------------ TORCH_VERSION


@pytest.mark.parametrize(
    "version", ["../2.11.0", str(REPO_ROOT / "patches" / "2.11.0"), "", "2.11.0/", "."]
)
def test_version_must_be_a_supported_name(
    version: str, capsys: pytest.CaptureFixture[str], no_downloads: list[str]
) -> None:
    assert error_line(capsys, ["build", "--torch-version", version]) == UNKNOWN.format(v=version)
    assert no_downloads == []


def test_empty_make_variable_gets_the_same_message(tmp_path: Path) -> None:
    """``make build TORCH_VERSION=`` reaches the CLI as an empty value, not as a missing
    argument (argparse's usage text)."""
    proc = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "build",
            "TORCH_VERSION=",
            f"VPY={sys.executable}",
            "STAMP=",
        ],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        env={**os.environ, "TORCH_UM_CACHE": str(tmp_path / "cache")},
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[0] == UNKNOWN.format(v="")
    assert not (tmp_path / "cache").exists()


# ------------------------------------------------------------------ cache and dist/


def test_cache_that_is_a_file(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_downloads: list[str],
) -> None:
    f = tmp_path / "cache-file"
    f.write_text("")
    monkeypatch.setenv("TORCH_UM_CACHE", str(f))
    assert error_line(capsys, build_args(tmp_path / "dist")) == (
        f"error: the cache {f} is not a directory: remove it, or set TORCH_UM_CACHE to a "
        "writable directory"
    )
    assert no_downloads == []


def test_cache_under_a_file(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_downloads: list[str],
) -> None:
    (tmp_path / "file").write_text("")
    cache = tmp_path / "file" / "cache"
    monkeypatch.setenv("TORCH_UM_CACHE", str(cache))
    assert error_line(capsys, build_args(tmp_path / "dist")) == (
        f"error: cannot write the cache {cache} (Not a directory): make it writable, or set "
        "TORCH_UM_CACHE to a writable directory"
    )


def test_read_only_cache(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    unwritable: Unwritable,
    no_downloads: list[str],
) -> None:
    monkeypatch.setenv("TORCH_UM_CACHE", str(unwritable.path))
    assert error_line(capsys, build_args(tmp_path / "dist")) == (
        f"error: cannot write the cache {unwritable.path} ({unwritable.reason}): make it "
        "writable, or set TORCH_UM_CACHE to a writable directory"
    )
    assert no_downloads == []


def test_read_only_dist_is_found_before_any_download(
    cache: Path,
    capsys: pytest.CaptureFixture[str],
    unwritable: Unwritable,
    no_downloads: list[str],
) -> None:
    assert error_line(capsys, build_args(unwritable.path)) == (
        f"error: cannot write the output directory {unwritable.path} ({unwritable.reason}): "
        "make it writable, or pass another --dist"
    )
    assert no_downloads == []


def test_dist_that_is_a_file(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str], no_downloads: list[str]
) -> None:
    f = tmp_path / "dist"
    f.write_text("")
    assert error_line(capsys, build_args(f)) == (
        f"error: the output directory {f} is not a directory: remove it, or pass another --dist"
    )


def test_too_little_room_on_the_disk(
    tmp_path: Path,
    cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_downloads: list[str],
) -> None:
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=100 << 20))
    dist = tmp_path / "dist"
    mount = fsutil.mount_point(tmp_path)
    assert error_line(capsys, build_args(dist)) == (
        f"error: only 100 MiB free on {mount} (holding {cache} and {dist}); the build needs "
        "about 2560 MiB there: free space, or set TORCH_UM_CACHE or --dist to a directory on "
        "another disk"
    )
    assert no_downloads == []


def test_full_disk_during_the_download_names_the_disk(
    tmp_path: Path,
    cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    real_run = subprocess.run
    usage = shutil.disk_usage(tmp_path)
    full = {"now": False}

    def run(cmd: list[str], **kwargs: Any) -> Any:
        if cmd[1:4] != ["-m", "pip", "download"]:
            return real_run(cmd, **kwargs)  # the compiler probe
        full["now"] = True
        msg = "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device\n"
        return subprocess.CompletedProcess(cmd, 1, None, msg)

    def disk_usage(path: Any) -> Any:
        return usage._replace(free=(10 << 20) if full["now"] else (50 << 30))

    monkeypatch.setattr(subprocess, "run", run)
    monkeypatch.setattr(shutil, "disk_usage", disk_usage)
    wheels = cache / "wheels"
    assert error_line(capsys, build_args(tmp_path / "dist")) == (
        f"error: pip download torch===2.11.0 failed: no space left on "
        f"{fsutil.mount_point(wheels)} (the disk of {wheels}, 10 MiB free): free space there, "
        "or set TORCH_UM_CACHE to a directory on a disk with room for the download"
    )
    assert [p.name for p in wheels.iterdir()] == []  # pip's temporary folder is gone


def test_full_disk_in_any_step_names_both_disks(
    tmp_path: Path,
    cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=5 << 20))
    target = cache / "unpacked" / "x" / "torch" / "include" / "c10.h"

    def step() -> None:
        raise OSError(errno.ENOSPC, "No space left on device", str(target))

    fail_in_build(monkeypatch, step)
    dist = tmp_path / "dist"
    mount = fsutil.mount_point(tmp_path)
    assert error_line(capsys, build_args(dist)) == (
        f"error: no space left on device writing {target} (cache {cache} is on {mount}, 5 MiB "
        f"free; dist {dist} is on {mount}, 5 MiB free): free space there, or set "
        "TORCH_UM_CACHE to a directory on a disk with more room"
    )


def test_full_disk_during_a_url_download_is_not_blamed_on_the_server(
    tmp_path: Path,
    cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The Debian tarball and index come by URL; /dev/full fails every write with ENOSPC."""
    served = tmp_path / "pytorch_2.6.0+dfsg.orig.tar.xz"
    served.write_bytes(b"x" * 4096)

    @contextlib.contextmanager
    def full_disk(dest: Path, **kwargs: object) -> Iterator[Path]:
        yield Path("/dev/full")

    monkeypatch.setattr(fetch, "atomic_path", full_disk)
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage._replace(free=0))
    fail_in_build(
        monkeypatch, lambda: fetch.urllib_fetch(served.as_uri(), cache / "src" / served.name, 5)
    )
    dist = tmp_path / "dist"
    mount = fsutil.mount_point(tmp_path)
    assert error_line(capsys, build_args(dist)) == (
        f"error: no space left on device writing a file (cache {cache} is on {mount}, 0 MiB "
        f"free; dist {dist} is on {mount}, 0 MiB free): free space there, or set "
        "TORCH_UM_CACHE to a directory on a disk with more room"
    )


def test_permission_error_in_any_step(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    target = cache / "build" / "x" / "build.ninja"

    def step() -> None:
        raise PermissionError(errno.EACCES, "Permission denied", str(target))

    fail_in_build(monkeypatch, step)
    assert error_line(capsys, build_args()) == (
        f"error: cannot write or read {target} (Permission denied): make it writable, or set "
        "TORCH_UM_CACHE (the cache) or --dist (the wheel) to a directory you own"
    )


def test_other_os_errors_are_one_line(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def step() -> None:
        raise OSError(errno.EIO, "Input/output error", str(cache / "wheels" / "x.whl"))

    fail_in_build(monkeypatch, step)
    assert error_line(capsys, build_args()) == (
        f"error: Input/output error (EIO): {cache}/wheels/x.whl: fix that and run the build again"
    )


# ------------------------------------------------------------------ damaged cache


def test_cached_wheel_that_is_no_zip(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = cache / "cuda-wheels" / "nvidia_cuda_runtime-13.0.96-py3-none-any.whl"
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"PK\x03\x04 truncated")
    fail_in_build(
        monkeypatch, lambda: wheel_parts.extract(bad, cache / "cuda" / "x", lambda n: True, "h")
    )
    assert error_line(capsys, build_args()) == (
        f"error: {bad} is not a readable zip archive (File is not a zip file): remove it with "
        f"`rm {bad}` so that the next build downloads it again"
    )
    assert not (cache / "cuda" / "x").exists()


def test_damaged_zip_anywhere_else(
    cache: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    def step() -> None:
        raise zipfile.BadZipFile("Bad CRC-32 for file 'torch/lib/libc10.so'")

    fail_in_build(monkeypatch, step)
    assert error_line(capsys, build_args()) == (
        "error: a zip archive the build read is damaged (Bad CRC-32 for file "
        "'torch/lib/libc10.so'): run the build again, which verifies every cached download "
        f"first; if this repeats, remove the cache with `rm -rf {cache}`"
    )


def test_corrupt_cached_wheel_with_its_mtime_kept_is_downloaded_again(
    tmp_path: Path,
    cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The stamp of size and mtime that used to let this file pass is still there."""
    wheel = official.cached_wheel(cache, PIN)
    wheel.parent.mkdir(parents=True)
    wheel.write_bytes(b"\0" * 4096)
    st = wheel.stat()
    stamp = wheel.with_name(f".{wheel.name}.verified")
    stamp.write_text(f'{{"size": 4096, "mtime_ns": {st.st_mtime_ns}, "sha256": "{PIN.sha256}"}}')
    real_run = subprocess.run
    pip: list[list[str]] = []

    def run(cmd: list[str], **kwargs: Any) -> Any:
        if cmd[1:4] != ["-m", "pip", "download"]:
            return real_run(cmd, **kwargs)
        pip.append(cmd)
        return subprocess.CompletedProcess(cmd, 1, None, "ERROR: no network here\n")

    monkeypatch.setattr(subprocess, "run", run)
    assert cli.main(build_args(tmp_path / "dist")) == 2
    err = capsys.readouterr().err
    assert f"==> cached {wheel} has sha256 " in err
    assert f"not the pinned {PIN.sha256}: removing it and downloading it again" in err
    assert err.splitlines()[-1] == (
        f"error: cannot download {PIN.filename} (pip download torch===2.11.0): no network here "
        "(pip exit 1). The build asks the package index your pip configuration names "
        "(index-url, extra-index-url, find-links in pip.conf or PIP_* variables; version caps "
        "and constraints are lifted for pinned files): check the network and that this index "
        f"serves the file, or put the file into {wheel.parent} by hand (it is checked against "
        "its pinned sha256)"
    )
    assert "ERROR: no network here" not in err  # pip's own line is not printed as well
    assert len(pip) == 1 and not wheel.exists()


# ------------------------------------------------------------------ tools


def test_every_missing_tool_in_one_message(
    tmp_path: Path,
    cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_downloads: list[str],
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.delenv("PATCH", raising=False)
    monkeypatch.setattr(toolchain, "_python_package_tool", lambda name: None)
    assert error_line(capsys, build_args()) == (
        "error: 4 required tools are missing: 'cmake' not found on PATH: run `make build`, "
        "which installs it into .venv (or: pip install cmake); 'ninja' not found on PATH: run "
        "`make build`, which installs it into .venv (or: pip install ninja); 'c++' not found "
        "on PATH: install a C++17 compiler: apt-get install g++ (or set CXX); 'patch' not "
        "found on PATH: install GNU patch: apt-get install patch"
    )
    assert no_downloads == []


def test_compiler_that_compiles_nothing_fails_before_downloads(
    cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_downloads: list[str],
) -> None:
    monkeypatch.setenv("CXX", "/bin/false")
    assert error_line(capsys, build_args()) == (
        "error: the C++ compiler /bin/false cannot compile a one-line C++17 program (exit 1): "
        "install g++ (apt-get install g++) or set CXX to a working C++17 compiler"
    )
    assert no_downloads == []


def test_compiler_without_its_headers(
    tmp_path: Path,
    cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_downloads: list[str],
) -> None:
    cxx = tmp_path / "c++"
    cxx.write_text(
        "#!/bin/sh\necho 'probe.cpp:1:10: fatal error: cstddef: No such file or directory' >&2\n"
        "exit 1\n"
    )
    cxx.chmod(0o755)
    monkeypatch.setenv("CXX", str(cxx))
    assert error_line(capsys, build_args()) == (
        f"error: the C++ compiler {cxx} cannot compile a one-line C++17 program (exit 1: "
        "probe.cpp:1:10: fatal error: cstddef: No such file or directory): install g++ "
        "(apt-get install g++) or set CXX to a working C++17 compiler"
    )


# ------------------------------------------------------------------ sources


def test_torch_src_on_the_injection_path_is_reported_as_unused(
    tmp_path: Path,
    cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    no_downloads: list[str],
) -> None:
    monkeypatch.setenv("TORCH_SRC", str(tmp_path / "pytorch"))
    with pytest.raises(Stop):
        cli.main(build_args(tmp_path / "dist"))
    assert (
        "==> TORCH_SRC is not used: torch 2.11.0 takes the inject path, which reads no "
        "upstream source\n"
    ) in capsys.readouterr().err


def test_pinned_file_stored_as_a_symlink_in_a_tarball(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import io
    import tarfile

    tarball = tmp_path / "pytorch.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        data = b"int a;\n"
        info = tarfile.TarInfo("pytorch/c10/cuda/Real.cpp")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("pytorch/c10/cuda/A.cpp")
        link.type = tarfile.SYMTYPE
        link.linkname = "Real.cpp"
        tar.addfile(link)
    fail_in_build(
        monkeypatch, lambda: extract_members(tarball, ["c10/cuda/A.cpp"], tmp_path / "out")
    )
    assert error_line(capsys, build_args()) == (
        f"error: source tarball {tarball} stores the pinned file c10/cuda/A.cpp as a symbolic "
        "link (to Real.cpp), not as a file: use a tarball that holds the file itself, e.g. one "
        "made by `git archive`"
    )


def test_tarball_without_the_pinned_files_says_where_it_looked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    tarball = make_tarball(tmp_path / "src.tar.xz", {"other/file.c": b""}, "pytorch")
    fail_in_build(
        monkeypatch, lambda: extract_members(tarball, ["c10/cuda/A.cpp"], tmp_path / "out")
    )
    assert error_line(capsys, build_args()) == (
        f"error: source tarball {tarball} lacks 1 pinned file(s) at its top level or under "
        "one top folder, e.g. c10/cuda/A.cpp"
    )
