"""Builders of small fixtures: upstream.yaml documents, trees, tarballs, and the engine's
C++ test programs."""

from __future__ import annotations

import hashlib
import importlib.util
import io
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

import pytest
import yaml

ZERO = "0" * 64
ROOT = Path(__file__).resolve().parents[2]


def load_overlay_module(relpath: str, name: str) -> ModuleType:
    """A pure-Python module of the shipped overlay (``torch/cuda/_um_plan.py``, ...),
    loaded from its file as ``name``, without the torch package around it."""
    path = ROOT / "c10_overlay" / relpath
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(mod)
    return mod


def build_engine_test(exe: Path, sources: list[Path], *flags: str) -> Path:
    """Compile one of tests/engine's programs with the engine's sources (C++17, warnings
    as errors, the given sanitizer flags); skips the test without a C++ compiler."""
    cxx = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
    if cxx is None:
        pytest.skip("no C++ compiler (set CXX)")
    cmd = [cxx, "-std=c++17", "-O1", "-g", "-Wall", "-Werror", *flags]
    cmd += [f"-I{ROOT / 'c10_overlay'}", *map(str, sources), "-o", str(exe), "-lpthread"]
    done = subprocess.run(cmd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    return exe


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


UPSTREAM_FILES = {
    "c10/cuda/A.cpp": b"int a() { return 1; }\n",
    "c10/cuda/impl/B.h": b"#pragma once\nint b();\n",
}


def matrix_doc(version: str = "9.1.0", **overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "schema": 1,
        "torch_version": version,
        "integration": "source",
        "upstream": {
            "tag": f"v{version}",
            "commit": "a" * 40,
            "repository": "https://git.example/o/r",
        },
        "wheel": {
            "cuda": "12.4",
            "local_label": "cu124",
            "cxx11_abi": 0,
            "files": {
                "3.11": {
                    "filename": f"torch-{version}-cp311-cp311-manylinux1_x86_64.whl",
                    "sha256": ZERO,
                }
            },
        },
        "cuda_packages": [
            {
                "name": "nvidia-cuda-runtime-cu12",
                "version": "12.4.127",
                "filename": "nvidia_cuda_runtime_cu12-12.4.127-py3-none-manylinux2014_x86_64.whl",
                "sha256": ZERO,
                "include": "nvidia/cuda_runtime/include",
                "library": "nvidia/cuda_runtime/lib/libcudart.so.12",
            }
        ],
        "debian": {
            "package": "pytorch",
            "version": f"{version}+dfsg-1",
            "suite": "trixie",
            "component": "main",
            "orig_tarball": f"pytorch_{version}+dfsg.orig.tar.xz",
            "sha256": ZERO,
            "top_dir": f"pytorch-v{version}",
        },
        "overlay": {
            "library": "torch/lib/libc10_cuda.so",
            "soname": "libc10_cuda.so",
            "link_library": "torch/lib/libc10.so",
        },
        "sources": {p: sha(d) for p, d in UPSTREAM_FILES.items()},
    }
    doc.update(overrides)
    return doc


def write_matrix(patches: Path, doc: dict[str, Any]) -> Path:
    d = patches / str(doc["torch_version"])
    d.mkdir(parents=True, exist_ok=True)
    (d / "upstream.yaml").write_text(yaml.safe_dump(doc))
    return d


def write_tree(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)
    return root


def make_tarball(
    path: Path, files: dict[str, bytes], top: str | None, mode: Literal["w:xz", "w:gz"] = "w:xz"
) -> Path:
    with tarfile.open(path, mode) as tar:
        extra = {"README": b"not needed\n"}
        for rel, data in {**files, **extra}.items():
            name = f"{top}/{rel}" if top else rel
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path
