from __future__ import annotations

from pathlib import Path

import pytest

from build_scripts import toolchain
from build_scripts.errors import BuildError


@pytest.fixture
def empty_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.delenv("PATCH", raising=False)
    monkeypatch.setattr(toolchain, "_python_package_tool", lambda name: None)


@pytest.mark.parametrize(
    ("tool", "hint"),
    [
        ("cmake", "pip install cmake"),
        ("ninja", "pip install ninja"),
        ("patch", "apt-get install patch"),
    ],
)
@pytest.mark.usefixtures("empty_path")
def test_missing_tool_says_what_to_install(tool: str, hint: str) -> None:
    with pytest.raises(BuildError) as exc:
        toolchain.find_tool(tool)
    assert f"required tool '{tool}' not found on PATH" in str(exc.value)
    assert hint in str(exc.value)


@pytest.mark.usefixtures("empty_path")
def test_missing_compiler_says_what_to_install() -> None:
    with pytest.raises(
        BuildError,
        match=r"'c\+\+' not found on PATH: install a C\+\+17 compiler: apt-get install g\+\+",
    ):
        toolchain.find_cxx()


@pytest.mark.usefixtures("empty_path")
def test_overlay_toolchain_fails_on_first_missing_tool() -> None:
    with pytest.raises(BuildError, match="'cmake' not found"):
        toolchain.overlay_toolchain()


def test_bad_override_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CXX", "/nonexistent/g++")
    with pytest.raises(BuildError, match="CXX=/nonexistent/g\\+\\+ is not an executable"):
        toolchain.find_cxx()


def test_registry_cmake_and_ninja_are_found() -> None:
    tc = toolchain.overlay_toolchain()
    assert tc.cmake.name == "cmake" and tc.ninja.name == "ninja"
