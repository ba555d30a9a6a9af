#!/usr/bin/env bash
# Runs the source-path allocator check on a GPU host, from a folder made by
# bundle.py (the check binary, the rebuilt libc10_cuda.so, the official
# wheel's libc10.so and the CUDA 12 runtime), without any torch install.
#   tests/gpu/source_path/run_on_device.sh <folder> [<log dir>]
# The check itself caps managed memory at min(80 % of free GPU memory, 4 GiB).
set -euo pipefail
dir=${1:?usage: run_on_device.sh <folder made by bundle.py> [log dir]}
logs=${2:-.}
mkdir -p "$logs"
nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv | tee "$logs/gpu.txt"
cd "$dir"
status=0
# UM off first: must be stock behaviour (plain device memory).
PYTORCH_CUDA_UM_CONF=enabled:False LD_LIBRARY_PATH=. ./um_check off 2>&1 | tee "$logs/um_check_off.log" || status=1
# UM on: the wheel's default.
LD_LIBRARY_PATH=. ./um_check on 2>&1 | tee "$logs/um_check_on.log" || status=1
exit $status
