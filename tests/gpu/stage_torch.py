"""Stage a torch as a ``+um`` wheel of the injection path has it.

    python3 tests/gpu/stage_torch.py --bundle .device/inject --dest /tmp/x/site
    python3 tests/gpu/stage_torch.py --bundle .device/inject-2.14.1 --dest /tmp/x/site \
        --wheel torch-2.14.1-cp312-cp312-manylinux_2_28_x86_64.whl \
        --lib nccl/lib/libnccl.so.2=/tmp/nccl/nvidia/nccl/lib/libnccl.so.2

``--bundle`` is the folder ``python -m build_scripts bundle`` writes:
``manifest.json`` and, under ``files/``, every file the ``+um`` wheel adds or
replaces (``torch/lib/libtorch_um.so``, the patched ``torch/__init__.py`` and
``torch/cuda/__init__.py``, ``torch/cuda/um.py``). ``--dest`` becomes a
directory to put first on ``PYTHONPATH``: ``torch/`` mirrors the torch package
with symbolic links, except for those files, which are copied in, and
``nvidia/`` links to the installed CUDA libraries so that the RPATHs
(``$ORIGIN/../../nvidia/...``) resolve as in site-packages.

The torch is the installed one, or with ``--wheel`` an official wheel file
(another version than the installed one: unpacked next to ``--dest``, its
sha256 checked against the bundle's pin). ``--lib REL=PATH`` replaces one file
of the installed ``nvidia/`` tree (a newer library that the wheel needs and
the host lacks). Without ``--bundle`` the torch is staged unmodified: the
stock reference of the same version. Nothing installed is modified. The files
the bundle replaces must be byte-identical (sha256) to those of the pinned
wheel, so that the result is exactly the ``+um`` wheel. Standard library
only; does not import torch.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

if __package__:
    from .ship import sha256_file, unzip
else:  # run as a script: python3 tests/gpu/stage_torch.py
    from ship import sha256_file, unzip  # type: ignore[no-redef,import-not-found]


def installed_torch() -> Path:
    spec = importlib.util.find_spec("torch")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("stage_torch: no torch installed for " + sys.executable)
    return Path(next(iter(spec.submodule_search_locations))).resolve()


def _mirror(src: Path, dst: Path, overrides: dict[str, Path], rel: str = "") -> None:
    dst.mkdir(parents=True, exist_ok=True)
    names = {p.name for p in src.iterdir()} if src.is_dir() else set()
    # overrides that live directly in this directory, existing or new
    here = {k[len(rel) :] for k in overrides if k.startswith(rel) and "/" not in k[len(rel) :]}
    subdirs = {
        k[len(rel) :].split("/", 1)[0]
        for k in overrides
        if k.startswith(rel) and "/" in k[len(rel) :]
    }
    for name in sorted(names | here | subdirs):
        key = rel + name
        target = dst / name
        if name in here:
            shutil.copyfile(overrides[key], target)
            os.chmod(target, 0o755 if name.endswith(".so") else 0o644)
        elif name in subdirs:
            _mirror(src / name, target, overrides, key + "/")
        elif name != "__pycache__":
            target.symlink_to(src / name)


def _fail(message: str) -> SystemExit:
    return SystemExit("stage_torch: " + message)


def unpack_wheel(wheel: Path, sha256: str | None, into: Path) -> Path:
    """The wheel unpacked under ``into`` (reused while complete: its marker holds the
    wheel's sha256), checked against ``sha256`` when given; returns the folder that
    holds its ``torch/``."""
    if not wheel.is_file():
        raise _fail(f"no wheel at {wheel}")
    target = into / wheel.name.removesuffix(".whl")
    done = target / ".complete"
    have = done.read_text() if done.is_file() else sha256_file(wheel)
    if sha256 is not None and have != sha256:
        raise _fail(f"{wheel} has sha256 {have}, the pin is {sha256}: not the pinned wheel")
    if done.is_file():
        return target
    partial = target.with_name(target.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    shutil.rmtree(target, ignore_errors=True)
    unzip(wheel, partial)
    (partial / ".complete").write_text(have)
    partial.rename(target)
    return target


def _nvidia(site: Path, dest: Path, libs: dict[str, Path]) -> None:
    """``dest/nvidia``: a link to the installed tree, or a mirror of it with ``libs``."""
    src = site / "nvidia"
    if not libs:
        if src.exists():
            (dest / "nvidia").symlink_to(src)
        return
    for rel, path in libs.items():
        if not path.is_file():
            raise _fail(f"--lib {rel}={path}: no such file")
    _mirror(src, dest / "nvidia", libs)


def stage(
    bundle: Path | None,
    dest: Path,
    wheel: Path | None = None,
    libs: dict[str, Path] | None = None,
) -> Path:
    manifest = json.loads((bundle / "manifest.json").read_text()) if bundle else {}
    installed = installed_torch()
    if wheel is not None:
        pin = manifest.get("wheel_sha256") if manifest else None
        site = unpack_wheel(wheel, pin, dest.parent / "wheels")
        torch_dir = site / "torch"
    else:
        torch_dir = installed
        site = torch_dir.parent
    version_py = (torch_dir / "version.py").read_text()
    want = manifest.get("torch_version")
    if want and f"__version__ = '{want}" not in version_py:
        raise _fail(f"torch at {torch_dir} is not {want}:\n{version_py}")
    if manifest.get("git_version") and manifest["git_version"] not in version_py:
        raise _fail(
            f"torch at {torch_dir} is not the build {manifest['git_version']} "
            "the bundle was made for"
        )
    for rel, sha in manifest.get("replaced", {}).items():
        have = sha256_file(site / rel)
        if have != sha:
            raise _fail(
                f"{site / rel} has sha256 {have}, the pinned wheel's is {sha}: "
                "this is not the same torch build"
            )
    files = {rel: bundle / "files" / rel for rel in manifest["files"]} if bundle else {}
    overrides = {}
    for rel, path in files.items():
        if not rel.startswith("torch/"):
            raise _fail(f"unexpected bundle file {rel}")
        overrides[rel[len("torch/") :]] = path
    if dest.exists():
        shutil.rmtree(dest)
    _mirror(torch_dir, dest / "torch", overrides)
    _nvidia(installed.parent, dest, libs or {})
    if wheel is not None:
        # The wheel's other top-level entries shadow the host's: torchgen and functorch
        # (torch 2.15 imports torchgen modules 2.11's lacks) and its dist-info (2.15 finds
        # its c10d backends, nccl among them, by entry points; importlib.metadata's version).
        for entry in sorted(site.iterdir()):
            if entry.is_dir() and entry.name not in ("torch", "nvidia"):
                (dest / entry.name).symlink_to(entry)
    label = f"torch {want}+um" if bundle else "stock torch"
    print(f"stage_torch: {torch_dir} staged as {label} at {dest / 'torch'}")
    for rel, path in files.items():
        print(f"  {rel}  {sha256_file(path)}")
    for rel, path in (libs or {}).items():
        print(f"  nvidia/{rel} <- {path}  {sha256_file(path)}")
    return dest


def _lib(text: str) -> tuple[str, Path]:
    rel, sep, path = text.partition("=")
    if not sep or not rel or not path or rel.startswith("/") or ".." in rel.split("/"):
        raise argparse.ArgumentTypeError(
            f"--lib {text!r}: expected REL=PATH, REL relative to nvidia/ "
            "(for example nccl/lib/libnccl.so.2=/tmp/libnccl.so.2)"
        )
    return rel, Path(path).resolve()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, default=None, help="the +um files (none: stock)")
    ap.add_argument("--dest", type=Path, required=True)
    ap.add_argument("--wheel", type=Path, default=None, help="an official torch wheel file")
    ap.add_argument("--lib", type=_lib, action="append", default=[], metavar="REL=PATH")
    args = ap.parse_args(argv)
    stage(args.bundle, args.dest, args.wheel, dict(args.lib))
    return 0


if __name__ == "__main__":
    sys.exit(main())
