#!/usr/bin/env bash
# GPU suite of the injection path, run on the GPU host in the repository root.
#
#   bash tests/gpu/run_on_device.sh            # carry: .device/inject
#   bash tests/gpu/run_on_device.sh -k spill   # extra arguments go to pytest
#   bash tests/gpu/run_on_device.sh tests/gpu/test_op_signal.py   # these files only
#
# The host has no network and a stock torch 2.11.0+cu130 for `python3`. This
# script stages that torch exactly as the torch-2.11.0+um wheel has it (its
# libtorch_um.so, patched Python files and torch/cuda/um.py, from the bundle
# that `python -m build_scripts bundle --torch-version 2.11.0` writes to .device/inject),
# without modifying the installed torch, and runs tests/gpu with pytest.
# Logs, the junit report and the environment go to $OUT (default .device/out).
# Budget: under 9 minutes.
set -u -o pipefail

cd "$(dirname "$0")/../.."
BUNDLE=${BUNDLE:-.device/inject}
OUT=${OUT:-.device/out}
PY=${PYTHON:-python3}
mkdir -p "$OUT"
BUNDLE=$(cd "$BUNDLE" && pwd)
OUT=$(cd "$OUT" && pwd)
STAGE=$(mktemp -d "${TMPDIR:-/tmp}/torch-um-stage.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT

{
  echo "## command"
  echo "bash tests/gpu/run_on_device.sh  (BUNDLE=$BUNDLE)"
  echo "## date"
  date -u +%Y-%m-%dT%H:%M:%SZ
  echo "## repository"
  # The GPU host's copy of .git may be an earlier one: TORCH_UM_COMMIT names the tree's.
  echo "TORCH_UM_COMMIT=${TORCH_UM_COMMIT:-(not set)}"
  git rev-parse HEAD 2>/dev/null || echo "(no git)"
  git status --short 2>/dev/null | head -50
  echo "## nvidia-smi"
  nvidia-smi 2>&1 || true
  echo "## host"
  uname -a
  nproc
  free -g 2>/dev/null || true
  echo "## python / torch (stock)"
  "$PY" - <<'EOF' 2>&1
import sys, platform
print(sys.version)
import torch
print("torch", torch.__version__, torch.version.git_version, "cuda", torch.version.cuda)
print("file", torch.__file__)
print("cuda available", torch.cuda.is_available())
if torch.cuda.is_available():
    print("device", torch.cuda.get_device_name(), "capability", torch.cuda.get_device_capability())
    free, total = torch.cuda.mem_get_info()
    print(f"mem free {free / 2**30:.1f} GiB total {total / 2**30:.1f} GiB")
    print("driver", torch._C._cuda_getDriverVersion() if hasattr(torch._C, "_cuda_getDriverVersion") else "?")
for mod in ("torchvision", "triton", "numpy", "pytest"):
    try:
        m = __import__(mod)
        print(mod, getattr(m, "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        print(mod, "unavailable:", e)
EOF
  echo "## bundle"
  cat "$BUNDLE/manifest.json"
} > "$OUT/env.txt" 2>&1
cat "$OUT/env.txt"

STOCK_PYTHONPATH=${PYTHONPATH:-}
# Another version than the installed torch (run_version_on_device.sh): both the +um torch
# and the stock reference are staged from its official wheel, with the libraries it needs.
STAGE_ARGS=()
if [ -n "${TORCH_WHEEL:-}" ]; then
  STAGE_ARGS=(--wheel "$TORCH_WHEEL")
  for lib in ${NVIDIA_LIBS:-}; do STAGE_ARGS+=(--lib "$lib"); done
  "$PY" tests/gpu/stage_torch.py --dest "$STAGE/stock" "${STAGE_ARGS[@]}" 2>&1 | tee "$OUT/stage.log"
  [ "${PIPESTATUS[0]}" = 0 ] || { echo "staging the stock reference failed"; exit 2; }
  STOCK_PYTHONPATH="$STAGE/stock${STOCK_PYTHONPATH:+:$STOCK_PYTHONPATH}"
fi
"$PY" tests/gpu/stage_torch.py --bundle "$BUNDLE" --dest "$STAGE/site" "${STAGE_ARGS[@]}" 2>&1 \
  | tee -a "$OUT/stage.log"
[ "${PIPESTATUS[0]}" = 0 ] || { echo "staging failed"; exit 2; }

PP="$STAGE/site"
if ! "$PY" -c "import pytest" 2>/dev/null; then
  PP="$PP:$BUNDLE/pylib"   # pytest carried in the bundle
fi
export PYTHONPATH="$PP${STOCK_PYTHONPATH:+:$STOCK_PYTHONPATH}"
export PYTHONUNBUFFERED=1
export TORCH_UM_GPU_REQUIRE=1
export TORCH_UM_PRELOAD_LIB="$BUNDLE/files/torch/lib/libtorch_um.so"
export TORCH_UM_STOCK_PYTHONPATH="$STOCK_PYTHONPATH"

# The staged torch is the one imported, and it is the +um one.
"$PY" - <<'EOF' 2>&1 | tee -a "$OUT/stage.log"
import torch
print("staged torch", torch.__file__)
print("engine", torch.cuda.um.engine_library(), "injection", torch.cuda.um.injection_info())
print("config", torch.cuda.um.get_config())
EOF

source tests/gpu/owned.sh
rc=0
# faulthandler_timeout: a test still running after 120 s (the longest takes about 25) has
# every thread's stack written to the log, so that a hang says where it is before the
# timeout kills the run (a crash writes them anyway: pytest enables faulthandler).
# Paths among the arguments (tests/...) replace the whole suite: pytest given tests/gpu and
# a file under it runs both (step 58's run took the whole suite for three files).
targets=(tests/gpu)
for arg in "$@"; do
  case "$arg" in tests/*) targets=(); break ;; esac
done
owned "$OUT/pytest.log" timeout -k 10 500 "$PY" -m pytest ${targets[@]+"${targets[@]}"} -v -rA -s \
  -p no:cacheprovider --junitxml="$OUT/junit.xml" -o junit_family=xunit2 --durations=15 \
  -o faulthandler_timeout=120 "$@" || rc=$?
echo "pytest exit code: $rc" | tee -a "$OUT/pytest.log"
exit "$rc"
