"""Stage the installed torch as a ``+um`` wheel of the injection path has it.

    python3 tests/gpu/stage_torch.py --bundle .device/inject --dest /tmp/x/site

``--bundle`` is the folder ``python -m build_scripts bundle`` writes:
``manifest.json`` and, under ``files/``, every file the ``+um`` wheel adds or
replaces (``torch/lib/libtorch_um.so``, the patched ``torch/__init__.py`` and
``torch/cuda/__init__.py``, ``torch/cuda/um.py``). ``--dest`` becomes a
directory to put first on ``PYTHONPATH``: ``torch/`` mirrors the installed
package with symbolic links, except for those files, which are copied in, and
``nvidia/`` links to the installed CUDA libraries so that the RPATHs
(``$ORIGIN/../../nvidia/...``) resolve as in site-packages. The installed torch
is not modified. The files the bundle replaces must be byte-identical (sha256)
to those of the pinned wheel, so that the result is exactly the ``+um`` wheel.
Standard library only; does not import torch.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


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


def stage(bundle: Path, dest: Path) -> Path:
    manifest = json.loads((bundle / "manifest.json").read_text())
    torch_dir = installed_torch()
    site = torch_dir.parent
    version_py = (torch_dir / "version.py").read_text()
    want = manifest["torch_version"]
    if f"__version__ = '{want}" not in version_py:
        raise SystemExit(
            f"stage_torch: installed torch at {torch_dir} is not {want}:\n{version_py}"
        )
    if manifest.get("git_version") and manifest["git_version"] not in version_py:
        raise SystemExit(
            f"stage_torch: installed torch is not the build {manifest['git_version']} "
            "the bundle was made for"
        )
    for rel, sha in manifest["replaced"].items():
        have = _sha256(site / rel)
        if have != sha:
            raise SystemExit(
                f"stage_torch: {site / rel} has sha256 {have}, the pinned wheel's is {sha}: "
                "this is not the same torch build"
            )
    overrides = {}
    for rel in manifest["files"]:
        if not rel.startswith("torch/"):
            raise SystemExit(f"stage_torch: unexpected bundle file {rel}")
        overrides[rel[len("torch/") :]] = bundle / "files" / rel
    if dest.exists():
        shutil.rmtree(dest)
    _mirror(torch_dir, dest / "torch", overrides)
    for sibling in ("nvidia",):
        if (site / sibling).exists():
            (dest / sibling).symlink_to(site / sibling)
    print(f"stage_torch: {torch_dir} staged as torch {want}+um at {dest / 'torch'}")
    for rel in manifest["files"]:
        print(f"  {rel}  {_sha256(bundle / 'files' / rel)}")
    return dest


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bundle", type=Path, required=True)
    ap.add_argument("--dest", type=Path, required=True)
    args = ap.parse_args(argv)
    stage(args.bundle, args.dest)
    return 0


if __name__ == "__main__":
    sys.exit(main())
