"""The container builds end to end, as a user runs them, on a substituted local base.

Gated by UM_CONTAINER_TESTS=1 (`make container-test` sets it): it builds local Debian base
images (mmdebstrap), the overlay stage twice from the same inputs in fresh build caches,
checks that both wheels are byte-identical, builds the CI runtime image from the wheel and
runs its smoke check in a container on this host (CPU: the device check is skipped).

Needs root, mmdebstrap and one of docker/podman/buildah; with buildah and no namespaces or
overlay support it runs as `buildah --storage-driver vfs ... --isolation chroot` (the
defaults below, overridable through the same variables as docker/docker.mk). Measured on a
2-core machine with a warm torch-um download cache: 6 minutes (two overlay builds of 85 s,
the runtime image 160 s with its ~3.5 GB of pinned CUDA packages downloaded, the smoke
check 15 s), plus 1.5 minutes to make the local bases.

With podman or buildah every image lives in a storage root of its own under
build/container/test/storage, and the engine's temporary files under build/container/test/tmp,
both removed when the module ends (and at its start, if a killed run left them): the tests
never touch the host's images, and repeated or killed runs do not pile up gigabytes of vfs
layers. With docker, the runtime image the test tagged is removed at the end.

Before anything is built, the disk holding that root must have NEEDED_GIB free. Asked for by
name (UM_CONTAINER_TESTS=1, `make container-test`), the tests fail at once when it has not,
saying so. With UM_CONTAINER_TESTS=auto (what `.ci/run` sets) they are skipped instead, with
the same message as the reason: CI runs on whatever disk its machine has left, and a disk
too small for the images is a fact about that machine, not about the change under test.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
import uuid
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from build_scripts.fsutil import sha256_file

REPO = Path(__file__).resolve().parents[2]
TORCH_VERSION = os.environ.get("TORCH_VERSION", "2.6.0")
PYTHON = os.environ.get("PYTHON", "3.11")
WORK = REPO / "build" / "container" / "test"
STORE = WORK / "storage"
# The engine's temporary files (layer blobs while an image is committed: gigabytes with
# vfs), kept beside the store so that a killed run's are removed with it by the next run,
# instead of piling up in /var/tmp and taking the disk the next run needs.
TMP = WORK / "tmp"
# Peak disk use of the module with vfs storage, measured at 22 GB (`df` sampled every 3 s),
# and again on 2026-11-26 in a fresh clone under `.ci/run` on a cold cache: 21.2 GiB more in
# use at the peak than when the module started. The runtime image (the wheel and ~3.5 GB of
# CUDA packages, about 6 GB unpacked) exists three times at once (the build container, the
# committed layer, the smoke check's container), plus bases, wheels, pip's cache and
# scratch. The margin is for a disk that other processes fill meanwhile: a build that runs
# out of disk half-way is a worse failure than one refused before it starts.
NEEDED_GIB = 25
# UM_CONTAINER_TESTS: "1" runs them (and fails when the disk is too small), "auto" runs
# them where the disk has room and skips them, saying why, where it has not.
MODE = os.environ.get("UM_CONTAINER_TESTS", "")
RUNTIME_TEST_IMAGE = f"localhost/torch-um/runtime-test:{TORCH_VERSION}-py{PYTHON}"

pytestmark = pytest.mark.skipif(
    MODE not in ("1", "auto"),
    reason="container builds take ~8 min: set UM_CONTAINER_TESTS=1 (make container-test)",
)


def _engine() -> str:
    chosen = os.environ.get("CONTAINER_ENGINE")
    if chosen:
        return chosen
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "info"], capture_output=True).returncode == 0:
        return "docker"
    for name in ("podman", "buildah"):
        if shutil.which(name):
            return name
    pytest.fail("no container engine: install docker, podman or buildah")


def _env(engine: str) -> dict[str, str]:
    env = {**os.environ, "CONTAINER_ENGINE": engine}
    if engine == "buildah":
        # The most portable buildah settings: no overlay mounts, no namespaces needed.
        env.setdefault("CONTAINER_FLAGS", "--storage-driver vfs")
        env.setdefault("CONTAINER_BUILD_FLAGS", "--isolation chroot")
        env.setdefault("CONTAINER_RUN_FLAGS", "--isolation chroot")
    if engine in ("buildah", "podman"):
        flags = env.get("CONTAINER_FLAGS", "")
        env["CONTAINER_FLAGS"] = f"{flags} --root {STORE}/root --runroot {STORE}/run".strip()
        env["TMPDIR"] = str(TMP)
    return env


def _drop_store(engine: str, env: dict[str, str]) -> None:
    """Remove the module's own storage root and everything in it, and the engine's
    temporary files."""
    if STORE.exists():
        flags = env["CONTAINER_FLAGS"].split()
        for args in (["rm", "--all"], ["rmi", "--all", "--force"]):
            subprocess.run([engine, *flags, *args], capture_output=True)
        shutil.rmtree(STORE)
    shutil.rmtree(TMP, ignore_errors=True)


def _short_of_space(free_bytes: int) -> str | None:
    """Why the disk is too small for the module's images, or None where it has room."""
    free_gib = free_bytes / 2**30
    if free_gib >= NEEDED_GIB:
        return None
    return (
        f"the container tests need about {NEEDED_GIB} GiB free on the disk holding "
        f"{WORK.relative_to(REPO)} (vfs image storage), found {free_gib:.1f} GiB: free "
        "space there (old images: `buildah images`, `buildah rmi --prune`) and rerun"
    )


def _check_free_space(mode: str = MODE) -> None:
    why = _short_of_space(shutil.disk_usage(WORK).free)
    if why is None:
        return
    if mode == "auto":
        pytest.skip(why)
    pytest.fail(why)


def _make(target: str, *assignments: str, env: dict[str, str]) -> str:
    makefile = (REPO / "Makefile").read_text()
    files = (
        []
        if "include docker/docker.mk" in makefile
        else ["-f", "Makefile", "-f", "docker/docker.mk"]
    )
    cmd = [
        "make",
        "--no-print-directory",
        *files,
        target,
        f"TORCH_VERSION={TORCH_VERSION}",
        f"PYTHON={PYTHON}",
        *assignments,
    ]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    took = time.monotonic() - started
    log = WORK / f"{target}-{time.strftime('%H%M%S')}.log"
    log.write_text(proc.stdout + proc.stderr)
    print(f"make {target} {' '.join(assignments)}: {took:.0f} s (log: {log.relative_to(REPO)})")
    assert proc.returncode == 0, f"make {target} failed:\n{(proc.stdout + proc.stderr)[-4000:]}"
    return proc.stdout + proc.stderr


def _zip_differences(a: Path, b: Path) -> list[str]:
    """Entries whose name, order, time, mode or content differ: what to fix for determinism."""
    out = []
    with zipfile.ZipFile(a) as za, zipfile.ZipFile(b) as zb:
        ia, ib = za.infolist(), zb.infolist()
        if [i.filename for i in ia] != [i.filename for i in ib]:
            out.append("entry names or order differ")
        for x, y in zip(ia, ib, strict=False):
            fields = ("date_time", "external_attr", "CRC", "compress_type", "file_size", "extra")
            diff = [f for f in fields if getattr(x, f) != getattr(y, f)]
            if diff:
                out.append(f"{x.filename}: {', '.join(diff)}")
    return out


def _labels(engine: str, env: dict[str, str], image: str) -> dict[str, str]:
    flags = env.get("CONTAINER_FLAGS", "").split()
    if engine == "buildah":
        raw = subprocess.run(
            [engine, *flags, "inspect", "--type", "image", image],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        config = json.loads(raw)
        labels = config["Docker"]["config"].get("Labels") or config["OCIv1"]["config"]["Labels"]
    else:
        raw = subprocess.run(
            [engine, *flags, "image", "inspect", "--format", "{{json .Config.Labels}}", image],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        labels = json.loads(raw)
    return dict(labels)


@pytest.fixture(scope="module")
def engine_env() -> Iterator[tuple[str, dict[str, str]]]:
    if os.geteuid() != 0 and shutil.which("mmdebstrap") is None:
        pytest.fail("needs root and mmdebstrap for the local base images")
    WORK.mkdir(parents=True, exist_ok=True)
    engine = _engine()
    env = _env(engine)
    isolated = engine in ("buildah", "podman")
    if isolated:
        _drop_store(engine, env)  # a killed earlier run's
        TMP.mkdir(parents=True)
    _check_free_space()
    try:
        yield engine, env
    finally:
        if isolated:
            _drop_store(engine, env)
        else:
            subprocess.run([engine, "rmi", RUNTIME_TEST_IMAGE], capture_output=True)


@pytest.fixture(scope="module")
def two_wheels(engine_env: tuple[str, dict[str, str]]) -> tuple[Path, Path]:
    """The overlay stage built twice from the same inputs, each in a fresh build cache."""
    engine, env = engine_env
    run = uuid.uuid4().hex[:8]
    wheels = []
    for name in ("a", "b"):
        dest = WORK / f"wheel-{name}"
        shutil.rmtree(dest, ignore_errors=True)
        _make(
            "container-wheel",
            "CONTAINER_BASE=local",
            f"CONTAINER_DIST={dest.relative_to(REPO)}",
            f"CACHE_SCOPE=test-{run}-{name}",
            env=env,
        )
        found = sorted(dest.glob(f"torch-{TORCH_VERSION}+um-*.whl"))
        assert len(found) == 1, f"expected one wheel in {dest}, found {found}"
        wheels.append(found[0])
        if engine in ("buildah", "podman"):  # drop the fresh build cache (only ours)
            tmp = Path(env.get("TMPDIR", "/var/tmp"))
            for parent in ("buildah-cache", f"buildah-cache-{os.getuid()}"):
                shutil.rmtree(
                    tmp / parent / f"torch-um-cache-test-{run}-{name}", ignore_errors=True
                )
    return wheels[0], wheels[1]


def test_overlay_wheel_is_a_um_wheel(two_wheels: tuple[Path, Path]) -> None:
    wheel = two_wheels[0]
    tag = f"cp{PYTHON.replace('.', '')}"
    assert re.fullmatch(
        rf"torch-{re.escape(TORCH_VERSION)}\+um-{tag}-{tag}-manylinux_\d+_\d+_x86_64\.whl",
        wheel.name,
    ), wheel.name
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        assert "torch/lib/libc10_cuda.so" in names
        assert f"torch-{TORCH_VERSION}+um.dist-info/RECORD" in names
    print(f"wheel: {wheel.name}")


def test_wheel_bytes_are_reproducible(two_wheels: tuple[Path, Path]) -> None:
    a, b = two_wheels
    ha, hb = sha256_file(a), sha256_file(b)
    print(f"build a: {ha}  {a.name}\nbuild b: {hb}  {b.name}")
    assert a.name == b.name
    assert ha == hb, "wheels differ:\n" + "\n".join(_zip_differences(a, b)[:40])


def test_runtime_image_smoke_check(
    engine_env: tuple[str, dict[str, str]], two_wheels: tuple[Path, Path]
) -> None:
    engine, env = engine_env
    image = RUNTIME_TEST_IMAGE
    _make(
        "container-runtime",
        "CONTAINER_BASE=local",
        f"CONTAINER_WHEEL={two_wheels[0]}",
        f"RUNTIME_IMAGE={image}",
        env=env,
    )
    labels = _labels(engine, env, image)
    assert labels["torch-um.torch-version"] == f"{TORCH_VERSION}+um"
    assert labels["torch-um.cuda-version"] == "12.4"
    assert labels["torch-um.series"].startswith(f"patches/{TORCH_VERSION}/series sha256:")
    assert labels["org.opencontainers.image.revision"] != "unknown"
    out = _make("container-smoke", f"RUNTIME_IMAGE={image}", env=env)
    print(out[-2000:])
    assert f"torch {TORCH_VERSION}+um" in out
    assert "UM engine: libc10_cuda.so" in out
    assert "smoke check passed" in out
