"""Stock settings that cannot work with managed memory, and what UM chooses instead.

Note [nccl2 registers every segment]
From torch 2.15 the "nccl" backend of torch.distributed is the nccl2 process group unless
``TORCH_DIST_USE_NCCL2=0``. Its allocator hook registers every segment of the caching
allocator's default pool with each communicator (``ncclCommRegister``), except in
expandable-segments mode. NCCL cannot register managed memory: on the H200 with torch
2.15.0, the first allocation after ``init_process_group`` failed with "Failed to register
memory with NCCL: unhandled cuda error" (tests/gpu/test_residency.py, DDP). The legacy
process group registers nothing unless TORCH_NCCL_USE_TENSOR_REGISTER_ALLOCATOR_HOOK is
set, and it is what torch 2.11-2.14 used. So while UM is on, the variable is set to "0"
unless the program set it; a program that chose nccl2 is warned once. torch.distributed
reads the variable when the backend is first registered (the first process group), so
torch/cuda/um.py applies this when it is imported.

Pure functions of the torch version and the environment: tested in
tests/unit/test_um_interplay.py.
"""

from __future__ import annotations

from collections.abc import Mapping

NCCL2 = "TORCH_DIST_USE_NCCL2"


def nccl_process_group(
    version: tuple[int, int], env: Mapping[str, str]
) -> tuple[str | None, str | None]:
    """(value to set for TORCH_DIST_USE_NCCL2 or None, warning or None) while UM is on."""
    if version < (2, 15):
        return None, None
    chosen = env.get(NCCL2)
    if chosen is None:
        return "0", None
    if chosen == "0":
        return None, None
    return None, (
        f"unified memory: {NCCL2}={chosen} selects the nccl2 process group, which registers "
        "every allocator segment with NCCL; NCCL cannot register managed memory, so "
        f"allocations after init_process_group fail. Unset {NCCL2} (while UM is on the legacy "
        "NCCL process group is used) or set PYTORCH_CUDA_UM_CONF=enabled:False."
    )
