"""A build killed at any moment leaves nothing that looks final, nothing running, and
nothing the next build would trust; two builds of one version never run at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from build_scripts import cli, fsutil, matrix, official
from build_scripts.errors import BuildError
from build_scripts.paths import REPO_ROOT

from .test_repack import make_wheel


def _spawn(code: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TORCH_UM_NO_PROGRESS": "1"},
    )


def _first_line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    assert line, "the child process ended early"
    return line


def _age(path: Path, seconds: float = 300) -> None:
    """Past the sweep's grace period (an entry that young may not be locked yet)."""
    os.utime(path, (time.time() - seconds,) * 2)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


@pytest.fixture
def fifo(tmp_path: Path) -> Iterator[Path]:
    """A file whose read never ends: a repack reading it is stuck mid-wheel."""
    path = tmp_path / "stuck.so"
    os.mkfifo(path)
    yield path


def test_killed_repack_leaves_no_wheel_and_the_next_build_sweeps_it(
    tmp_path: Path, fifo: Path
) -> None:
    source = make_wheel(tmp_path / "torch-9.1.0-cp311-cp311-manylinux1_x86_64.whl")
    dist = tmp_path / "dist"
    child = _spawn(f"""
        from pathlib import Path
        from build_scripts import repack
        print("repacking", flush=True)
        repack.repack(repack.RepackSpec(
            Path({str(source)!r}), Path({str(dist)!r}), "9.1.0+um", "manylinux_2_34_x86_64",
            files={{"torch/lib/libtorch_um.so": Path({str(fifo)!r})}},
        ))
    """)
    try:
        _first_line(child)
        deadline = time.monotonic() + 20
        # stuck on the fifo once the official entries are written (and the file locked)
        while not any(p.stat().st_size for p in dist.glob(".tmp-*")):
            assert time.monotonic() < deadline
            time.sleep(0.05)
        (partial,) = dist.iterdir()
        assert partial.name.startswith(".tmp-repack.") and partial.name.endswith(".partial")
        _age(partial)
        assert fsutil.sweep_leftovers(dist, depth=1) == []  # its writer is alive
    finally:
        child.kill()
        child.wait()
    assert list(dist.glob("*.whl")) == []
    assert fsutil.sweep_leftovers(dist, depth=1) == [partial]
    assert list(dist.iterdir()) == []


def test_killed_download_folder_is_swept(tmp_path: Path) -> None:
    wheels = tmp_path / "cache" / "wheels"
    child = _spawn(f"""
        import time
        from pathlib import Path
        from build_scripts import fsutil
        with fsutil.temp_dir(Path({str(wheels)!r}), "pip") as tmp:
            (tmp / "torch-2.11.0-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"half")
            print(tmp, flush=True)
            time.sleep(300)
    """)
    try:
        tmp = Path(_first_line(child))
        _age(tmp)
        assert fsutil.sweep_leftovers(tmp_path / "cache") == []
    finally:
        child.kill()
        child.wait()
    assert tmp.is_dir()  # SIGKILL: no cleanup ran
    assert fsutil.sweep_leftovers(tmp_path / "cache") == [tmp]
    assert list(wheels.iterdir()) == []


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGINT, signal.SIGTERM])
def test_killed_build_takes_its_compilers_along(tmp_path: Path, sig: int) -> None:
    """What ``cmake --build`` starts (ninja, the compilers) dies with the build, however
    the build ends."""
    pidfile = tmp_path / "compiler.pid"
    # A shell starts background jobs with SIGINT ignored, and a Python started so keeps
    # ignoring it: the child takes Ctrl-C as an interactive build would.
    child = _spawn(f"""
        import signal
        from pathlib import Path
        from build_scripts import overlay_build
        signal.signal(signal.SIGINT, signal.default_int_handler)
        print("building", flush=True)
        overlay_build._run(
            ["sh", "-c", "sleep 300 & echo $! > {pidfile}; wait"],
            Path({str(tmp_path / "log")!r}), "overlay build", Path({str(tmp_path)!r}),
        )
    """)
    try:
        _first_line(child)
        deadline = time.monotonic() + 20
        while not pidfile.is_file() or not pidfile.read_text().strip():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        compiler = int(pidfile.read_text())
        assert _alive(compiler)
        child.send_signal(sig)
        child.wait(timeout=20)
        deadline = time.monotonic() + 10
        while _alive(compiler) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(compiler)
    finally:
        child.kill()
        child.wait()


def test_second_build_of_a_version_waits_and_says_so(
    tmp_path: Path,
    cache: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    holder = _spawn(f"""
        import time
        from pathlib import Path
        from build_scripts import locks
        with locks.build_lock(Path({str(cache)!r}), "2.11.0"):
            print("holding", flush=True)
            time.sleep(1.5)
    """)
    started: list[float] = []

    def fetch(m: matrix.VersionMatrix, python: str, c: Path) -> None:
        started.append(time.monotonic())
        raise BuildError("stopped after the lock")

    monkeypatch.setattr(official, "fetch_inputs", fetch)
    try:
        _first_line(holder)
        t0 = time.monotonic()
        argv = ["build", "--torch-version", "2.11.0", "--dist", str(tmp_path / "dist")]
        assert cli.main(argv) == 2
    finally:
        holder.wait(timeout=30)
    err = capsys.readouterr().err
    lock = cache / "locks" / "2.11.0.lock"
    assert f"==> another build of torch 2.11.0 holds {lock} (pid {holder.pid} on " in err
    assert "); waiting for it to finish\n" in err
    assert f"==> {lock} is free: building\n" in err
    assert started and started[0] - t0 > 0.5  # it did wait for the holder


def test_builds_of_other_versions_do_not_wait(
    tmp_path: Path, cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from build_scripts import locks

    with locks.build_lock(cache, "2.6.0"), locks.build_lock(cache, "2.11.0"):
        pass
    assert "waiting" not in capsys.readouterr().err
