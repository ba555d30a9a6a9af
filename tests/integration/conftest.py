"""Fixtures shared by the integration tests: the real build of a torch version, once per
session, and a venv with that wheel and its dependencies, kept in the cache across runs."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from build_scripts import abi, matrix, pipeline, platform_tag
from build_scripts.fsutil import sha256_file
from build_scripts.paths import REPO_ROOT, cache_root
from tests.integration import shared_dir

PYTHON = "3.11"
Build = Callable[[str], pipeline.BuildResult]
Install = Callable[[pipeline.BuildResult], Path]
Hold = Callable[[Path, Callable[[], bool], Callable[[], None]], None]  # held_dirs


@pytest.fixture(scope="session")
def build_wheel() -> Build:
    """``build_wheel(version)``: ``pipeline.build(version, "3.11")``, once per session."""
    done: dict[str, pipeline.BuildResult] = {}

    def build(version: str) -> pipeline.BuildResult:
        if version not in done:
            for needed in ("c10_overlay/CMakeLists.txt", f"patches/{version}/series"):
                assert (REPO_ROOT / needed).is_file(), f"{needed} is missing from the checkout"
            done[version] = pipeline.build(version, PYTHON)
        return done[version]

    return build


@pytest.fixture(scope="session")
def held_dirs() -> Iterator[Hold]:
    """``hold(folder, ready, make)``: a cache folder this session uses, held against other
    test runs until the session ends (Note [Shared test venvs], shared_dir.py)."""
    fds: list[int] = []
    held: set[Path] = set()

    def hold(folder: Path, ready: Callable[[], bool], make: Callable[[], None]) -> None:
        if folder in held:
            # Changing it would wait for this session's own shared lock for ever.
            assert ready(), f"{folder} is held by this session and needs changing: a bug"
            return
        fds.append(shared_dir.hold(folder, ready, make))
        held.add(folder)

    try:
        yield hold
    finally:
        for fd in fds:
            os.close(fd)


@pytest.fixture(scope="session")
def install_wheel(held_dirs: Hold) -> Install:
    """``install_wheel(built)``: a venv with the wheel and its dependencies (pip). Reused
    across runs, one per torch version (the dependencies are GBs of nvidia-* packages);
    torch itself is reinstalled whenever the wheel changed, and never while another test
    run uses the venv (Note [Shared test venvs])."""

    def install(built: pipeline.BuildResult) -> Path:
        version = built.wheel.name.split("-")[1].removesuffix("+um")
        root = cache_root() / "test-venv" / f"cp{PYTHON.replace('.', '')}-{version}"
        py = root / "bin" / "python"
        marker = root / ".installed-wheel"
        digest = sha256_file(built.wheel)

        def ready() -> bool:
            return py.exists() and marker.exists() and marker.read_text() == digest

        def make() -> None:
            if not py.exists():
                subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
            pip = [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
            marker.unlink(missing_ok=True)  # a half-done install is never taken as done
            subprocess.run([*pip, "--force-reinstall", "--no-deps", str(built.wheel)], check=True)
            subprocess.run([*pip, str(built.wheel)], check=True)  # dependencies
            marker.write_text(digest)

        held_dirs(root, ready, make)
        return py

    return install


def run_python(
    venv: Path, code: str, env: Mapping[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``venv -c code`` with no PYTHON* or PYTORCH_* variables of the caller, plus ``env``."""
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "PYTORCH_", "TORCH_"))
    }
    return subprocess.run(
        [str(venv), "-W", "ignore", "-c", code],
        capture_output=True,
        text=True,
        env={**clean, **(env or {})},
        check=False,
    )


def probe(venv: Path, code: str, env: Mapping[str, str] | None = None) -> Any:
    """Run ``code`` in the venv; it prints one JSON document as its last line."""
    proc = run_python(venv, code, env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def pip_check(venv: Path) -> None:
    check = subprocess.run(
        [str(venv), "-m", "pip", "check"], capture_output=True, text=True, check=False
    )
    assert check.returncode == 0, check.stdout


def check_wheel_identity(built: pipeline.BuildResult, version: str, git: str, cuda: str) -> None:
    """dist/torch-<version>+um-cp311-cp311-<tag>.whl, with that version and tag inside and
    torch/version.py naming the official build's commit and CUDA version."""
    assert built.wheel.parent == REPO_ROOT / "dist"
    assert built.wheel.name == f"torch-{version}+um-cp311-cp311-{built.platform_tag}.whl"
    with zipfile.ZipFile(built.wheel) as zf:
        di = f"torch-{version}+um.dist-info"
        wheel_file = zf.read(f"{di}/WHEEL").decode()
        assert f"Tag: cp311-cp311-{built.platform_tag}\n" in wheel_file
        assert "linux_x86_64\n" not in wheel_file.replace(built.platform_tag, "")
        assert f"\nVersion: {version}+um\n" in zf.read(f"{di}/METADATA").decode()
        version_py = zf.read("torch/version.py").decode()
        assert f"__version__ = '{version}+um'" in version_py
        assert f"git_version = '{git}'" in version_py
        assert f"cuda: Optional[str] = '{cuda}'" in version_py
        assert not any(n.startswith(f"torch-{version}.dist-info/") for n in zf.namelist())


def check_platform_tag(built: pipeline.BuildResult, official_platform: str) -> None:
    """The tag the built library's symbol versions give; manylinux_2_34 when built with
    Debian 12's gcc 12 (it needs GLIBC_2.34)."""
    elf = abi.read_elf(built.rebuilt_library)
    assert built.platform_tag == platform_tag.wheel_platform_tag(
        official_platform, elf.version_needs
    )
    libc, ver = platform.libc_ver()
    if libc == "glibc" and ver == "2.36":
        assert "GLIBC_2.34" in elf.version_needs
        assert built.platform_tag == "manylinux_2_34_x86_64"


def check_warm_rerun(built: pipeline.BuildResult, version: str) -> None:
    started = time.monotonic()
    again = pipeline.build(version, PYTHON)
    assert again.reused and again.wheel == built.wheel
    assert time.monotonic() - started < 60


def check_make_build(built: pipeline.BuildResult, *make_args: str) -> None:
    """``make build [make_args]`` succeeds and prints the wheel as its last line."""
    proc = subprocess.run(
        ["make", "--no-print-directory", "build", *make_args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == str(built.wheel)


def official_wheel_for(version: str) -> Path:
    """The cached official cp311 wheel of ``version``, checked against its pin."""
    pin = matrix.load(version).wheel.for_python(PYTHON)
    path = cache_root() / "wheels" / pin.filename
    assert sha256_file(path) == pin.sha256
    return path


def wheel_difference(official: Path, built: Path) -> tuple[set[str], set[str]]:
    """(names added or removed outside .dist-info, names whose content changed)."""
    with zipfile.ZipFile(official) as a, zipfile.ZipFile(built) as b:
        old = {i.filename: (i.CRC, i.file_size) for i in a.infolist()}
        new = {i.filename: (i.CRC, i.file_size) for i in b.infolist()}
    added = {n for n in old.keys() ^ new.keys() if ".dist-info/" not in n}
    changed = {n for n in old.keys() & new.keys() if old[n] != new[n]}
    return added, changed
