#!/usr/bin/env python3
"""Smoke check of a torch-X.Y.Z+um install: the default command of the CI runtime image.

1. ``import torch`` works and its version carries the ``+um`` label;
2. the unified-memory engine is in the installed libraries: its C API (c_api.h) is
   exported by ``torch/lib/libc10_cuda.so`` (source-path wheels) or ``libtorch_um.so``
   (injection-path wheels) and answers without a GPU;
3. with a CUDA device, a small tensor is allocated through the caching allocator and must
   lie in managed memory when unified memory is on. The tensor is 1 MiB, far below any
   device's free memory. Without a device this step is reported as skipped.

Exit status 0 when every check that could run passed, 1 otherwise.
"""

from __future__ import annotations

import ctypes
import sys
from pathlib import Path

ENGINE_LIBRARIES = ("libc10_cuda.so", "libtorch_um.so")


def fail(message: str) -> int:
    print(f"FAIL: {message}", file=sys.stderr)
    return 1


def engine_library(torch_lib: Path) -> tuple[Path, ctypes.CDLL] | None:
    for name in ENGINE_LIBRARIES:
        path = torch_lib / name
        if not path.is_file():
            continue
        lib = ctypes.CDLL(str(path))  # already loaded by `import torch`: same handle
        if hasattr(lib, "torch_um_abi_version"):
            return path, lib
    return None


def main() -> int:
    import torch  # type: ignore[import-not-found, unused-ignore]

    version = str(torch.__version__)
    print(f"torch {version} (CUDA {torch.version.cuda}, git {torch.version.git_version})")
    if not version.endswith("+um"):
        return fail(f"torch {version} is not a +um build")

    found = engine_library(Path(torch.__file__).parent / "lib")
    if found is None:
        names = ", ".join(ENGINE_LIBRARIES)
        return fail(f"no library in torch/lib exports the UM engine ({names})")
    path, lib = found
    lib.torch_um_abi_version.restype = ctypes.c_int
    lib.torch_um_enabled.restype = ctypes.c_int
    lib.torch_um_get_config.restype = ctypes.c_long
    lib.torch_um_get_config.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
    buf = ctypes.create_string_buffer(4096)
    length = lib.torch_um_get_config(buf, len(buf))
    if length < 0:
        return fail(f"engine rejected its configuration: {buf.value.decode(errors='replace')}")
    enabled = lib.torch_um_enabled()
    print(
        f"UM engine: {path.name}, C API version {lib.torch_um_abi_version()}, "
        f"enabled={enabled}, config: {buf.value.decode(errors='replace')}"
    )

    if not torch.cuda.is_available():
        print("no CUDA device: allocation check skipped (CPU-only host)")
    else:
        lib.torch_um_is_managed.restype = ctypes.c_int
        lib.torch_um_is_managed.argtypes = [ctypes.c_void_p]
        x = torch.ones(1 << 18, device="cuda")  # 1 MiB
        torch.cuda.synchronize()
        managed = lib.torch_um_is_managed(ctypes.c_void_p(x.data_ptr()))
        print(f"device {torch.cuda.get_device_name()}: 1 MiB tensor managed={managed}")
        if enabled and managed != 1:
            return fail("unified memory is on, but the tensor is not in managed memory")
        if float(x.sum().item()) != float(1 << 18):
            return fail("wrong result of a reduction on the device")
    print("smoke check passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
