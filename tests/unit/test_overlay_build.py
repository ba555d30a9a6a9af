from __future__ import annotations

import zipfile
from pathlib import Path

import pytest

from build_scripts import overlay_build
from build_scripts.errors import BuildError

FAKE_CMAKE = r"""
cmake_minimum_required(VERSION 3.18)
project(fake LANGUAGES CXX)
foreach(v UM_MODE UM_TORCH_INCLUDE UM_TORCH_LIB UM_UPSTREAM_C10_CUDA UM_CUDA_INCLUDE
          UM_CUDART_LIB UM_CXX11_ABI UM_SONAME UM_RPATH)
  file(APPEND "${CMAKE_BINARY_DIR}/received.txt" "${v}=${${v}}\n")
endforeach()
add_library(out SHARED "${UM_UPSTREAM_C10_CUDA}/A.cpp")
set_target_properties(out PROPERTIES OUTPUT_NAME "c10_cuda")
"""


def _inputs(tmp: Path, cmakelists: str | None) -> overlay_build.OverlayInputs:
    src = tmp / "c10_overlay"
    src.mkdir()
    if cmakelists is not None:
        (src / "CMakeLists.txt").write_text(cmakelists)
    c10 = tmp / "patched" / "c10" / "cuda"
    c10.mkdir(parents=True)
    (c10 / "A.cpp").write_text("int a() { return 1; }\n")
    return overlay_build.OverlayInputs(
        source_dir=src,
        torch_include=tmp / "inc",
        torch_lib=tmp / "lib",
        upstream_c10_cuda=c10,
        cuda_include=(tmp / "cuda1", tmp / "cuda2"),
        cudart_lib=tmp / "libcudart.so.12",
        cxx11_abi=0,
        soname="libc10_cuda.so",
        rpath="$ORIGIN/../../nvidia/cuda_runtime/lib:$ORIGIN",
    )


def test_contract_variables_reach_cmake_and_rebuild_is_incremental(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path, FAKE_CMAKE)
    build_dir = overlay_build.build_dir_for(tmp_path / "cache", "9.1.0", "3.11", inputs)
    assert build_dir.name.startswith("9.1.0-py3.11-")
    lib = overlay_build.build(inputs, build_dir)
    assert lib == build_dir / "libc10_cuda.so" and lib.is_file()
    received = dict(
        line.split("=", 1) for line in (build_dir / "received.txt").read_text().splitlines()
    )
    assert received["UM_MODE"] == "source"
    assert received["UM_CUDA_INCLUDE"] == f"{tmp_path}/cuda1;{tmp_path}/cuda2"
    assert received["UM_RPATH"] == "$ORIGIN/../../nvidia/cuda_runtime/lib:$ORIGIN"
    assert received["UM_CXX11_ABI"] == "0" and received["UM_SONAME"] == "libc10_cuda.so"
    mtime = lib.stat().st_mtime_ns
    overlay_build.build(inputs, build_dir)  # no reconfigure, nothing to rebuild
    assert lib.stat().st_mtime_ns == mtime
    assert (build_dir / "received.txt").read_text().count("UM_MODE=") == 1


def test_missing_cmakelists(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path, None)
    with pytest.raises(BuildError, match="CMakeLists.txt does not exist"):
        overlay_build.build(inputs, tmp_path / "b")


def test_compile_error_shows_the_log_tail(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path, FAKE_CMAKE)
    assert inputs.upstream_c10_cuda is not None
    (inputs.upstream_c10_cuda / "A.cpp").write_text("this is not C++;\n")
    with pytest.raises(BuildError) as exc:
        overlay_build.build(inputs, tmp_path / "b")
    msg = str(exc.value)
    assert msg.startswith("overlay build failed (exit 1); last lines:")
    assert "A.cpp" in msg and "full log:" in msg


def test_build_without_the_library_output(tmp_path: Path) -> None:
    inputs = _inputs(tmp_path, FAKE_CMAKE.replace('"c10_cuda"', '"other"'))
    with pytest.raises(BuildError, match="produced no .*libc10_cuda.so"):
        overlay_build.build(inputs, tmp_path / "b")


def test_configure_error(tmp_path: Path) -> None:
    inputs = _inputs(
        tmp_path,
        'cmake_minimum_required(VERSION 3.18)\nproject(x NONE)\nmessage(FATAL_ERROR "UM_X is not set")\n',
    )
    with pytest.raises(
        BuildError, match="(?s)cmake configure of c10_overlay failed .*UM_X is not set"
    ):
        overlay_build.build(inputs, tmp_path / "b")


def test_built_library_changed_in_the_cache_is_linked_again(tmp_path: Path) -> None:
    """Ninja trusts a newer output; the build does not: a library that differs from the
    one it built is removed and linked again."""
    inputs = _inputs(tmp_path, FAKE_CMAKE)
    build_dir = overlay_build.build_dir_for(tmp_path / "cache", "9.1.0", "3.11", inputs)
    lib = overlay_build.build(inputs, build_dir)
    good = lib.read_bytes()
    lib.write_bytes(b"\x7fELF poisoned" + good[14:])  # newer than its inputs, same size
    assert overlay_build.build(inputs, build_dir).read_bytes() == good


@pytest.mark.parametrize(
    ("config", "standard"),
    [
        (None, 17),  # no TorchConfig.cmake
        ("set_target_properties(torch PROPERTIES\n", 17),  # names none (up to 2.12)
        ("set_target_properties(torch PROPERTIES\n    CXX_STANDARD 20\n)\n", 20),  # 2.13, 2.14
        (  # 2.15: a compile feature, -std=c++20 where the compiler reports none
            'if("cxx_std_20" IN_LIST CMAKE_CXX_COMPILE_FEATURES)\n'
            "  target_compile_features(torch INTERFACE cxx_std_20)\nelse()\n"
            '  set_property(TARGET torch APPEND PROPERTY INTERFACE_COMPILE_OPTIONS "-std=c++20")\n'
            "endif()\n",
            20,
        ),
    ],
)
def test_cxx_standard_of_the_wheels_torch_config(
    tmp_path: Path, config: str | None, standard: int
) -> None:
    wheel = tmp_path / "torch-9.1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("torch/__init__.py", "")
        if config is not None:
            zf.writestr("torch/share/cmake/Torch/TorchConfig.cmake", config)
    assert overlay_build.cxx_standard(wheel) == standard


def test_torch_config_naming_two_standards_is_an_error(tmp_path: Path) -> None:
    wheel = tmp_path / "torch-9.1.0-cp311-cp311-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr(
            "torch/share/cmake/Torch/TorchConfig.cmake",
            "target_compile_features(torch INTERFACE cxx_std_20)\n  CXX_STANDARD 17\n",
        )
    with pytest.raises(BuildError, match="names several C\\+\\+ standards"):
        overlay_build.cxx_standard(wheel)
