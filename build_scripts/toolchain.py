"""Find the external tools the build runs, or say what to install."""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from build_scripts.errors import BuildError

_INSTALL_HINTS = {
    "cmake": "pip install cmake (a dependency of this package: run `make build`, which "
    "installs it into .venv)",
    "ninja": "pip install ninja (a dependency of this package: run `make build`, which "
    "installs it into .venv)",
    "patch": "GNU patch: apt-get install patch",
    "c++": "a C++17 compiler: apt-get install g++ (or set CXX)",
    "c++filt": "binutils: apt-get install binutils",
}


def _python_package_tool(name: str) -> Path | None:
    """cmake/ninja installed from the registry ship their binaries inside the package."""
    try:
        if name == "cmake":
            import cmake

            p = Path(cmake.CMAKE_BIN_DIR) / "cmake"
        elif name == "ninja":
            import ninja

            p = Path(ninja.BIN_DIR) / "ninja"
        else:
            return None
    except (ImportError, AttributeError):
        return None
    return p if p.is_file() and os.access(p, os.X_OK) else None


def find_tool(name: str, env_var: str | None = None) -> Path:
    """Path to ``name``: ``$env_var`` if set, the Python package's copy, else ``PATH``."""
    if env_var and os.environ.get(env_var):
        value = os.environ[env_var]
        found = shutil.which(value)
        if found:
            return Path(found)
        raise BuildError(f"{env_var}={value} is not an executable; fix or unset {env_var}")
    pkg = _python_package_tool(name)
    if pkg:
        return pkg
    found = shutil.which(name)
    if found:
        return Path(found)
    hint = _INSTALL_HINTS.get(name, f"install {name}")
    raise BuildError(f"required tool '{name}' not found on PATH: install {hint}")


def find_cxx() -> Path:
    if os.environ.get("CXX"):
        return find_tool("c++", "CXX")
    for candidate in ("c++", "g++", "clang++"):
        found = shutil.which(candidate)
        if found:
            return Path(found)
    raise BuildError(f"required tool 'c++' not found on PATH: install {_INSTALL_HINTS['c++']}")


@dataclass(frozen=True)
class Toolchain:
    cmake: Path
    ninja: Path
    cxx: Path


def overlay_toolchain() -> Toolchain:
    return Toolchain(cmake=find_tool("cmake"), ninja=find_tool("ninja"), cxx=find_cxx())


def gnu_patch() -> Path:
    return find_tool("patch", "PATCH")
