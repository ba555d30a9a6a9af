"""``python -m build_scripts bundle``: the folder a GPU host without network stages.

Steps 2-6 of the pipeline for an injection-path version (the official wheel, the engine
library, the patched Python files), written with a manifest and, unless asked not to,
pytest unpacked: what ``tests/gpu/run_on_device.sh`` stages over the host's own torch.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

from build_scripts import integration, matrix, official, progress
from build_scripts.changes import overlay_python_files
from build_scripts.errors import BuildError
from build_scripts.fsutil import sha256_file
from build_scripts.paths import REPO_ROOT, cache_root
from build_scripts.toolchain import overlay_toolchain

#: where ``bundle`` writes by default (git-ignored)
DEFAULT_DEST = REPO_ROOT / ".device" / "inject"


def bundle(
    dest: Path,
    torch_version: str,
    python: str = "3.11",
    *,
    repo: Path = REPO_ROOT,
    cache: Path | None = None,
    pylib: bool = True,
) -> Path:
    """The folder ``tests/gpu/run_on_device.sh`` stages on a GPU host (no network there)."""
    m = matrix.load(torch_version, repo / "patches")
    if m.integration != "inject":
        raise BuildError(
            f"torch {m.torch_version} uses the {m.integration!r} path: its GPU bundle is "
            "tests/gpu/source_path/bundle.py"
        )
    cache = cache or cache_root()
    inputs = official.fetch_inputs(m, python, cache)
    path = integration.for_version(m)
    changes = path.build(m, inputs, python, repo=repo, cache=cache, toolchain=overlay_toolchain())
    files = {**changes.files, **overlay_python_files(repo / "c10_overlay")}
    if dest.exists():
        shutil.rmtree(dest)
    (dest / "files").mkdir(parents=True)
    for rel, src in files.items():
        out = dest / "files" / rel
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(src, out)
    manifest = {
        "torch_version": m.torch_version,
        "git_version": m.upstream.commit,
        "integration": m.integration,
        "built_for_wheel": inputs.pin.filename,
        "wheel_sha256": inputs.pin.sha256,
        "replaced": {f.path: f.sha256 for f in m.sources},
        "files": {rel: sha256_file(dest / "files" / rel) for rel in sorted(files)},
    }
    (dest / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    if pylib:
        _pytest_lib(dest / "pylib", cache)
    progress.step(f"device bundle in {dest}")
    return dest


def _pytest_lib(dest: Path, cache: Path) -> None:
    """pytest and its pure-Python dependencies, unpacked, for a host without pytest."""
    wheels = cache / "pytest-wheels"
    wheels.mkdir(parents=True, exist_ok=True)
    if not any(wheels.glob("pytest-*.whl")):
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--only-binary=:all:",
                "--dest",
                str(wheels),
                "--python-version",
                "3.12",
                "--platform",
                "any",
                "pytest>=8,<9",
            ],
            check=False,
            stdout=sys.stderr,
        )
        if proc.returncode != 0:
            raise BuildError(
                f"pip download pytest failed (exit {proc.returncode}); check the network, "
                "or pass --no-pytest when the GPU host has pytest"
            )
    dest.mkdir(parents=True, exist_ok=True)
    for whl in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(whl) as zf:
            zf.extractall(dest)
