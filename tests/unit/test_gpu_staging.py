"""The tools that bring a torch version to the GPU host: tests/gpu/ship.py (parts, joined by
sha256) and tests/gpu/stage_torch.py (staging from an official wheel, with library overrides).
Both run there with the standard library only; here they run on fake wheels."""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.gpu import compare_imports, host_extras, ship, stage_torch


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_ship_round_trip_and_pin(tmp_path: Path) -> None:
    data = bytes(range(256)) * 41  # 10496 bytes: four parts of 3000 and a short one
    src = tmp_path / "big.whl"
    src.write_bytes(data)
    listing = ship.split(src, tmp_path / "parts", size=3000)
    record = json.loads(listing.read_text())
    assert [p["size"] for p in record["parts"]] == [3000, 3000, 3000, 1496]
    assert record["sha256"] == _sha(data)
    out = ship.join(listing, tmp_path / "out", pin=_sha(data))
    assert out.read_bytes() == data and out.name == "big.whl"
    assert not list((tmp_path / "out").glob("*.partial"))
    with pytest.raises(ship.ShipError, match="these are parts of another file"):
        ship.join(listing, tmp_path / "out2", pin="0" * 64)


def test_ship_join_names_missing_and_damaged_parts(tmp_path: Path) -> None:
    src = tmp_path / "f.bin"
    src.write_bytes(b"x" * 100)
    listing = ship.split(src, tmp_path / "parts", size=30)
    (tmp_path / "parts" / "f.bin.part02").unlink()
    with pytest.raises(ship.ShipError, match=r"1 of 4 parts .* f\.bin\.part02"):
        ship.join(listing, tmp_path / "out")
    (tmp_path / "parts" / "f.bin.part02").write_bytes(b"y" * 30)
    with pytest.raises(ship.ShipError, match="differ from the list: f.bin.part02"):
        ship.join(listing, tmp_path / "out")
    assert not (tmp_path / "out" / "f.bin").exists()
    assert ship.main(["join", str(tmp_path / "nope.parts.json"), "--out", str(tmp_path)]) == 1


def _fake_install(root: Path) -> Path:
    """An installed torch 1.0.0 with its nvidia/ tree; returns the torch folder."""
    torch_dir = root / "torch"
    (torch_dir / "lib").mkdir(parents=True)
    (torch_dir / "version.py").write_text("__version__ = '1.0.0'\n")
    for rel in ("nccl/lib/libnccl.so.2", "cu13/lib/libcudart.so.13"):
        (root / "nvidia" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "nvidia" / rel).write_bytes(b"old " + rel.encode())
    return torch_dir


def _fake_wheel(path: Path, init: bytes) -> bytes:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("torch/version.py", "__version__ = '9.9.9+cu130'\ngit_version = 'abc123'\n")
        zf.writestr("torch/__init__.py", init)
        zf.writestr("torch/lib/libc10.so", b"\x7fELF c10")
        zf.writestr("torchgen/__init__.py", "")
        zf.writestr("torch-9.9.9.dist-info/entry_points.txt", "[torch.distributed.backends]\n")
    return path.read_bytes()


def _bundle(root: Path, wheel_sha: str, init: bytes) -> Path:
    files = {"torch/__init__.py": b"# patched\n", "torch/lib/libtorch_um.so": b"\x7fELF um"}
    for rel, data in files.items():
        (root / "files" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / "files" / rel).write_bytes(data)
    manifest = {
        "torch_version": "9.9.9",
        "git_version": "abc123",
        "wheel_sha256": wheel_sha,
        "replaced": {"torch/__init__.py": _sha(init)},
        "files": {rel: _sha(data) for rel, data in files.items()},
    }
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def test_stage_from_a_wheel_with_a_newer_library(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed = _fake_install(tmp_path / "site")
    monkeypatch.setattr(stage_torch, "installed_torch", lambda: installed)
    init = b"# official\n"
    wheel = tmp_path / "torch-9.9.9-cp312-cp312-manylinux_2_28_x86_64.whl"
    wheel_sha = _sha(_fake_wheel(wheel, init))
    bundle = _bundle(tmp_path / "bundle", wheel_sha, init)
    newer = tmp_path / "libnccl.so.2"
    newer.write_bytes(b"new nccl")
    stage = tmp_path / "stage"
    libs = {"nccl/lib/libnccl.so.2": newer}

    um = stage_torch.stage(bundle, stage / "site", wheel, libs)
    assert (um / "torch" / "__init__.py").read_bytes() == b"# patched\n"
    assert (um / "torch" / "lib" / "libtorch_um.so").read_bytes() == b"\x7fELF um"
    assert (um / "torch" / "lib" / "libc10.so").is_symlink()  # from the unpacked wheel
    # the wheel's other packages and its metadata (entry points) shadow the host's
    assert (um / "torchgen" / "__init__.py").is_file()
    assert (um / "torch-9.9.9.dist-info" / "entry_points.txt").is_file()
    assert not (um / ".complete").exists()
    assert (um / "nvidia" / "nccl" / "lib" / "libnccl.so.2").read_bytes() == b"new nccl"
    assert (um / "nvidia" / "cu13" / "lib" / "libcudart.so.13").resolve() == (
        tmp_path / "site" / "nvidia" / "cu13" / "lib" / "libcudart.so.13"
    )
    stock = stage_torch.stage(None, stage / "stock", wheel, libs)  # reuses the unpacked wheel
    assert (stock / "torch" / "__init__.py").read_bytes() == init
    assert (um / "torch" / "lib" / "libc10.so").exists()  # still there after the second stage
    assert (tmp_path / "site" / "nvidia" / "nccl" / "lib" / "libnccl.so.2").read_bytes() == (
        b"old nccl/lib/libnccl.so.2"
    )  # the installed tree is untouched


def test_stage_refuses_a_wheel_that_is_not_the_pin(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed = _fake_install(tmp_path / "site")
    monkeypatch.setattr(stage_torch, "installed_torch", lambda: installed)
    wheel = tmp_path / "torch-9.9.9-cp312-cp312-manylinux_2_28_x86_64.whl"
    _fake_wheel(wheel, b"# official\n")
    bundle = _bundle(tmp_path / "bundle", "0" * 64, b"# official\n")
    with pytest.raises(SystemExit, match="not the pinned wheel"):
        stage_torch.stage(bundle, tmp_path / "stage" / "site", wheel)
    assert not (tmp_path / "stage" / "site").exists()


def test_lib_argument_is_checked() -> None:
    assert stage_torch._lib("nccl/lib/libnccl.so.2=/x/libnccl.so.2")[0] == "nccl/lib/libnccl.so.2"
    for bad in ("libnccl.so.2", "=/x", "../etc/passwd=/x", "/abs=/x"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected REL=PATH"):
            stage_torch._lib(bad)


def test_host_extras_joins_and_unpacks_a_library_and_a_package(tmp_path: Path) -> None:
    ship_dir, work = tmp_path / "ship", tmp_path / "work"
    wheel = tmp_path / "torch-9.9.9-cp312-cp312-manylinux_2_28_x86_64.whl"
    wheel_sha = _sha(_fake_wheel(wheel, b"# official\n"))
    ship.split(wheel, ship_dir, size=100)
    bundle = _bundle(tmp_path / "bundle", wheel_sha, b"# official\n")
    manifest = json.loads((bundle / "manifest.json").read_text())
    (bundle / "manifest.json").write_text(json.dumps({**manifest, "built_for_wheel": wheel.name}))
    nccl, vision = tmp_path / "nccl.whl", tmp_path / "vision.whl"
    with zipfile.ZipFile(nccl, "w") as zf:
        zf.writestr("nvidia/nccl/lib/libnccl.so.2", b"new nccl")
    with zipfile.ZipFile(vision, "w") as zf:
        zf.writestr("vision/__init__.py", "")
        zf.writestr("vision/_C.so", b"\x7fELF")
    for w in (nccl, vision):
        ship.split(w, ship_dir, size=64)
    extras = tmp_path / "extras.json"
    lib = {"member": "nvidia/nccl/lib/libnccl.so.2", "lib": "nccl/lib/libnccl.so.2"}
    entries: list[dict[str, object]] = [
        {"filename": nccl.name, "sha256": _sha(nccl.read_bytes()), **lib},
        {"filename": vision.name, "sha256": _sha(vision.read_bytes())},
        {"package": "oldaudio", "hide": True, "why": "built for another torch"},
    ]
    extras.write_text(json.dumps({"9.9.9": entries}))

    ready = host_extras.prepare("9.9.9", bundle, ship_dir, work, extras)
    assert ready.wheel.read_bytes() == wheel.read_bytes()
    assert ready.libs == [f"nccl/lib/libnccl.so.2={work / 'lib/nccl/lib/libnccl.so.2'}"]
    assert (work / "lib/nccl/lib/libnccl.so.2").read_bytes() == b"new nccl"
    assert ready.pythonpath == work / "pkgs"
    assert (work / "pkgs/vision/_C.so").stat().st_mode & 0o111  # executable again
    # the hidden package: absent to import and to find_spec, in a fresh interpreter
    (tmp_path / "oldaudio").mkdir()
    (tmp_path / "oldaudio" / "__init__.py").write_text("raise RuntimeError('other torch')\n")
    probe = (
        "import importlib.util, sys\n"
        "assert importlib.util.find_spec('oldaudio') is None\n"
        "try:\n    import oldaudio\nexcept ModuleNotFoundError:\n    print('hidden')\n"
    )
    env = {**os.environ, "PYTHONPATH": f"{work / 'pkgs'}{os.pathsep}{tmp_path}"}
    out = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True)
    assert out.stdout.strip() == "hidden", out.stderr
    extras.write_text(json.dumps({"9.9.9": [{**entries[0], "sha256": "0" * 64}]}))
    with pytest.raises(ship.ShipError, match="these are parts of another file"):
        host_extras.prepare("9.9.9", bundle, ship_dir, work, extras)


OWNED = Path(__file__).resolve().parents[1] / "gpu" / "owned.sh"


def _runner(tmp_path: Path, child: str) -> str:
    return (
        f"source {OWNED}\nrc=0\nowned {tmp_path}/log.txt bash -c '{child}' || rc=$?\n"
        f'echo "status $rc" >> {tmp_path}/log.txt\n'
    )


def test_a_stopped_gpu_runner_takes_its_job_with_it(tmp_path: Path) -> None:
    """tests/gpu/owned.sh: a TERM to the runner stops the job it runs (which would
    otherwise go on using the GPU), the runner goes on once the job has ended, and the
    log holds all the job wrote."""
    import os
    import signal
    import subprocess
    import time

    pidfile = tmp_path / "child.pid"
    child = f"echo $$ > {pidfile}; echo one; echo two; exec sleep 60"
    runner = subprocess.Popen(["bash", "-c", _runner(tmp_path, child)])
    try:
        for _ in range(200):
            if pidfile.exists() and pidfile.read_text().strip():
                break
            time.sleep(0.05)
        job = int(pidfile.read_text())
        time.sleep(0.2)
        runner.send_signal(signal.SIGTERM)
        assert runner.wait(timeout=20) == 0  # the runner went on after the job ended
    finally:
        runner.kill()
    with pytest.raises(ProcessLookupError):
        os.kill(job, 0)
    assert (tmp_path / "log.txt").read_text().splitlines() == ["one", "two", "status 143"]


def test_a_gpu_runner_passes_its_jobs_status_and_output_on(tmp_path: Path) -> None:
    import subprocess

    done = subprocess.run(
        ["bash", "-c", _runner(tmp_path, "echo out; echo err >&2; exit 3")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 0
    assert sorted(done.stdout.split()) == ["err", "out"]  # shown as well as logged
    lines = (tmp_path / "log.txt").read_text().splitlines()
    assert sorted(lines[:2]) == ["err", "out"] and lines[2] == "status 3"


def _shared_library(tmp: Path, name: str, code: str, *link: str) -> Path:
    """A small shared library compiled from C ``code`` (undefined symbols allowed)."""
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None or shutil.which("nm") is None or shutil.which("readelf") is None:
        pytest.skip("needs a C compiler, nm and readelf")
    src = tmp / f"{name}.c"
    src.write_text(code)
    out = tmp / name
    subprocess.run(
        [cc, "-shared", "-fPIC", f"-Wl,-soname,{name}", "-o", str(out), str(src), *link],
        check=True,
    )
    return out


def _wheel_of(path: Path, members: dict[str, Path]) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        for name, lib in members.items():
            zf.write(lib, name)
    return path


def test_compare_imports_names_what_the_host_lacks_and_what_an_extra_adds(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A symbol counts as on the host when a host library defines it or the host's torch
    imports it; weak imports and the Python C API do not count as missing."""
    libs = tmp_path / "libs"
    libs.mkdir()
    host = _shared_library(libs, "libhost.so.1", "int foo(void) { return 1; }\n")
    extra = _shared_library(libs, "libextra.so.2", "int bar(void) { return 2; }\n")
    old = _shared_library(libs, "libold.so", "int baz(void);\nint old(void) { return baz(); }\n")
    new = _shared_library(
        libs,
        "libnew.so",
        "int foo(void); int bar(void); int baz(void); int PyThing_Do(void);\n"
        "extern int weakone(void) __attribute__((weak));\n"
        "int f(void) { return foo() + bar() + baz() + PyThing_Do() + (weakone ? weakone() : 0); }\n",
        str(host),
    )
    host_torch = _wheel_of(tmp_path / "torch-1.0-cp312.whl", {"torch/lib/libold.so": old})
    new_torch = _wheel_of(tmp_path / "torch-2.0-cp312.whl", {"torch/lib/libnew.so": new})
    host_dir = tmp_path / "host"
    host_dir.mkdir()
    _wheel_of(host_dir / "host-1.0.whl", {"pkg/lib/libhost.so.1": host})
    extra_whl = _wheel_of(tmp_path / "extra-1.0.whl", {"pkg/lib/libextra.so.2": extra})
    ref = tmp_path / "ref"
    ref.mkdir()
    shutil.copy(extra, ref)  # a folder of libraries: the new torch's own pins

    args = [str(new_torch), "--host-torch", str(host_torch), "--host", str(host_dir)]
    assert compare_imports.main([*args, "--ref", str(ref)]) == 1
    out = capsys.readouterr().out
    assert "libnew.so (no library needs it):\n  1 symbol(s) of libextra.so.2: bar\n" in out
    assert out.endswith("1 thing(s) missing on the host\n")
    assert compare_imports.main([*args, "--extra", str(extra_whl)]) == 0
    out = capsys.readouterr().out
    assert "libnew.so: everything it imports is on the host\n" in out


def test_pack_out_leaves_one_archive_per_run(tmp_path: Path) -> None:
    """tests/gpu/owned.sh's pack_out: every file under the folder (two levels down too)
    goes into NAME.tar.gz and is removed; an earlier run's archive stays beside it and is
    not packed again; an empty folder gives no archive."""
    import subprocess
    import tarfile

    out = tmp_path / "out"
    (out / "b").mkdir(parents=True)
    (out / "stage.log").write_text("staged\n")
    (out / "b" / "record.json").write_text("{}\n")

    def pack(name: str) -> None:
        subprocess.run(
            ["bash", "-c", f"source {OWNED}; pack_out {out} {name}"], check=True, timeout=60
        )

    pack("bench-one")
    assert sorted(p.name for p in out.rglob("*") if p.is_file()) == ["bench-one.tar.gz"]
    with tarfile.open(out / "bench-one.tar.gz") as tf:
        assert sorted(tf.getnames()) == ["./b/record.json", "./stage.log"]
        member = tf.extractfile("./b/record.json")
        assert member is not None and member.read() == b"{}\n"
    (out / "two.log").write_text("two\n")
    pack("bench-two")
    assert sorted(p.name for p in out.iterdir() if p.is_file()) == [
        "bench-one.tar.gz",
        "bench-two.tar.gz",
    ]
    with tarfile.open(out / "bench-two.tar.gz") as tf:
        assert tf.getnames() == ["./two.log"]
    pack("bench-three")  # nothing left to pack
    assert not (out / "bench-three.tar.gz").exists()
