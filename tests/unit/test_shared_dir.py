"""Note [Shared test venvs]: a cached folder one test run uses is never changed under it
by another. flock locks belong to open file descriptions, so two descriptors of one
process contend as two processes would; the threads below stand for two test runs."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from tests.integration import shared_dir


class _Folder:
    """A stand-in for a venv: ``wheel`` is what it holds, ``makes`` counts the installs."""

    def __init__(self, root: Path) -> None:
        self.path = root / "venv"
        self.wheel: str | None = None
        self.makes: list[str] = []

    def hold(self, wheel: str) -> int:
        def make() -> None:
            self.makes.append(wheel)
            self.wheel = wheel

        return shared_dir.hold(self.path, lambda: self.wheel == wheel, make)


def test_a_ready_folder_is_not_made_again(tmp_path: Path) -> None:
    f = _Folder(tmp_path)
    fd = f.hold("a")
    os.close(fd)
    fd = f.hold("a")
    os.close(fd)
    assert f.makes == ["a"]


def test_runs_that_need_the_same_folder_share_it(tmp_path: Path) -> None:
    f = _Folder(tmp_path)
    first = f.hold("a")
    second = f.hold("a")  # would block if the first held it exclusively
    os.close(first)
    os.close(second)
    assert f.makes == ["a"]


def test_a_change_waits_until_the_run_using_the_folder_lets_go(tmp_path: Path) -> None:
    f = _Folder(tmp_path)
    user = f.hold("a")
    got: list[int] = []
    t = threading.Thread(target=lambda: got.append(f.hold("b")))
    t.start()
    time.sleep(0.3)
    assert f.wheel == "a" and f.makes == ["a"], "changed while another run used it"
    assert t.is_alive()
    os.close(user)
    t.join(timeout=10)
    assert not t.is_alive() and f.wheel == "b" and f.makes == ["a", "b"]
    os.close(got[0])


def test_a_failed_make_leaves_no_lock_behind(tmp_path: Path) -> None:
    path = tmp_path / "venv"

    def fail() -> None:
        raise RuntimeError("pip failed")

    try:
        shared_dir.hold(path, lambda: False, fail)
    except RuntimeError:
        pass
    else:
        raise AssertionError("the failure of make() was swallowed")
    ok = shared_dir.hold(path, lambda: True, fail)  # not blocked by the failed run
    os.close(ok)
