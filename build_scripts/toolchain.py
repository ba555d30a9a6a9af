"""Find the external tools the build runs, or say what to install.

:func:`build_toolchain` reports every missing tool in one message and compiles a one-line
C++17 program with the compiler, all before anything is downloaded.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from build_scripts.errors import BuildError

_INSTALL_HINTS = {
    "cmake": "run `make build`, which installs it into .venv (or: pip install cmake)",
    "ninja": "run `make build`, which installs it into .venv (or: pip install ninja)",
    "patch": "install GNU patch: apt-get install patch",
    "c++": "install a C++17 compiler: apt-get install g++ (or set CXX)",
    "c++filt": "install binutils: apt-get install binutils",
}
_PROBE = "#include <cstddef>\nint main() { return static_cast<int>(std::size_t{0}); }\n"


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
    raise BuildError(f"required tool '{name}' not found on PATH: {hint}")


def find_cxx() -> Path:
    if os.environ.get("CXX"):
        return find_tool("c++", "CXX")
    for candidate in ("c++", "g++", "clang++"):
        found = shutil.which(candidate)
        if found:
            return Path(found)
    raise BuildError(f"required tool 'c++' not found on PATH: {_INSTALL_HINTS['c++']}")


@dataclass(frozen=True)
class Toolchain:
    cmake: Path
    ninja: Path
    cxx: Path


def overlay_toolchain() -> Toolchain:
    cmake, ninja, cxx = _all_found(lambda: find_tool("cmake"), lambda: find_tool("ninja"), find_cxx)
    return Toolchain(cmake=cmake, ninja=ninja, cxx=cxx)


def gnu_patch() -> Path:
    return find_tool("patch", "PATCH")


def build_toolchain() -> Toolchain:
    """Everything ``make build`` runs, checked at once; the compiler compiles a probe."""
    cmake, ninja, cxx, _patch = _all_found(
        lambda: find_tool("cmake"), lambda: find_tool("ninja"), find_cxx, gnu_patch
    )
    check_compiles(cxx)
    return Toolchain(cmake=cmake, ninja=ninja, cxx=cxx)


def _all_found(*finders: Callable[[], Path]) -> list[Path]:
    found, missing = [], []
    for find in finders:
        try:
            found.append(find())
        except BuildError as exc:
            missing.append(str(exc))
    if len(missing) == 1:
        raise BuildError(missing[0])
    if missing:
        raise BuildError(
            f"{len(missing)} required tools are missing: "
            + "; ".join(m.removeprefix("required tool ") for m in missing)
        )
    return found


def check_compiles(cxx: Path) -> None:
    """Compile a one-line C++17 program with ``cxx``; say what to do if it cannot."""
    with tempfile.TemporaryDirectory(prefix="um-cxx-probe-") as tmp:
        src = Path(tmp) / "probe.cpp"
        src.write_text(_PROBE)
        cmd = [str(cxx), "-std=c++17", "-c", str(src), "-o", str(Path(tmp) / "probe.o")]
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise BuildError(
                f"the C++ compiler {cxx} cannot be run ({exc}): install g++ "
                "(apt-get install g++) or set CXX to a working C++17 compiler"
            ) from None
    if proc.returncode != 0:
        first = next((ln.strip() for ln in proc.stderr.splitlines() if ln.strip()), "")
        why = f"exit {proc.returncode}" + (f": {first}" if first else "")
        raise BuildError(
            f"the C++ compiler {cxx} cannot compile a one-line C++17 program ({why}): "
            "install g++ (apt-get install g++) or set CXX to a working C++17 compiler"
        )
