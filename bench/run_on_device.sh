#!/usr/bin/env bash
# The benchmarks on the GPU host, in the repository root, against its stock torch 2.11
# and the same torch staged as the torch-2.11.0+um wheel has it (tests/gpu/stage_torch.py
# with the bundle of `python -m build_scripts bundle --torch-version 2.11.0`, carry .device/inject).
#
#   bash bench/run_on_device.sh                          # both, default settings
#   bash bench/run_on_device.sh step_time --rounds 2     # one, with its options
#   bash bench/run_on_device.sh residency train --rounds 1   # residency: train, infer, generate or ddp
#   bash bench/run_on_device.sh host_memory --scenarios listing1   # peak host memory (issue 9)
#   PACK=1 OUT=$OUT/a bash bench/run_on_device.sh classes train-plain
#       # what it wrote comes back as one file, $OUT/a/bench-classes-train-plain.tar.gz: a
#       # device call brings back at most 8 files
#   PREV_BUNDLE=.device/prev bash bench/run_on_device.sh residency train
#       # adds mode um-prev (residency, oversubscribe, step_time): the engine of an earlier
#       # commit's bundle (carry it too)
#
# Results (JSON) and logs go to $OUT (default .device/bench); copy the JSON to
# bench/results/ and run `python -m bench.plot` there (a record that only a lab note cites
# goes to docs/notes/results/ instead: bench/README.md, "Current results"). Set TORCH_UM_COMMIT to the commit
# of the tree you sent (`git rev-parse HEAD` here): the GPU host's copy of .git may be an
# earlier one, and the records would name its HEAD.
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE=$(cd "${BUNDLE:-.device/inject}" && pwd)
OUT=${OUT:-.device/bench}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
STAGE=$(mktemp -d "${TMPDIR:-/tmp}/torch-um-stage.XXXXXX")
PACK_NAME=bench
# PACK=1: everything this run wrote to $OUT leaves as one $OUT/bench-<log>.tar.gz, also
# when a benchmark fails (tests/gpu/owned.sh, pack_out).
trap 'rm -rf "$STAGE"; if [ "${PACK:-0}" = 1 ]; then pack_out "$OUT" "$PACK_NAME"; fi' EXIT
source tests/gpu/owned.sh
STOCK=${PYTHONPATH:-}
# Another version than the installed torch (see tests/gpu/run_version_on_device.sh, which
# joins its wheel): TORCH_WHEEL and NVIDIA_LIBS stage both torches from that wheel.
STAGE_ARGS=()
if [ -n "${TORCH_WHEEL:-}" ]; then
  STAGE_ARGS=(--wheel "$TORCH_WHEEL")
  for lib in ${NVIDIA_LIBS:-}; do STAGE_ARGS+=(--lib "$lib"); done
  "$PY" tests/gpu/stage_torch.py --dest "$STAGE/stock" "${STAGE_ARGS[@]}" > "$OUT/stage.log"
  STOCK="$STAGE/stock${STOCK:+:$STOCK}"
fi
"$PY" tests/gpu/stage_torch.py --bundle "$BUNDLE" --dest "$STAGE/site" "${STAGE_ARGS[@]}" \
  >> "$OUT/stage.log"
UM="$STAGE/site${STOCK:+:$STOCK}"
PREV_ARGS=()
if [ -n "${PREV_BUNDLE:-}" ]; then
  "$PY" tests/gpu/stage_torch.py --bundle "$(cd "$PREV_BUNDLE" && pwd)" --dest "$STAGE/prev" \
    >> "$OUT/stage.log"
  PREV_ARGS=(--prev-pythonpath "$STAGE/prev${STOCK:+:$STOCK}")
fi
run() {
  local bench=$1
  shift
  case "$bench" in
    step_time | oversubscribe | residency | host_memory | classes) ;;
    *) echo "bench/run_on_device.sh: unknown benchmark '$bench' (step_time, oversubscribe, residency, host_memory, classes)" >&2; exit 2 ;;
  esac
  local log=$bench
  # residency and classes take their workload first: one log each.
  if { [ "$bench" = residency ] || [ "$bench" = classes ]; } && [ "$#" -gt 0 ] && [ "${1#-}" = "$1" ]; then log="$bench-$1"; fi
  # host_memory: one log per --scenarios selection.
  if [ "$bench" = host_memory ]; then
    local prev=""
    for arg in "$@"; do
      if [ "$prev" = --scenarios ]; then log="$bench-${arg//,/-}"; fi
      prev=$arg
    done
  fi
  PACK_NAME="bench-$log"
  local extra=()
  case "$bench" in residency | oversubscribe | step_time | classes) extra=("${PREV_ARGS[@]}") ;; esac
  echo "== bench.$bench $*"
  owned "$OUT/$log.log" "$PY" -m "bench.$bench" --stock-pythonpath "$STOCK" \
    --um-pythonpath "$UM" --out "$OUT" "${extra[@]}" "$@"
}
if [ "$#" -gt 0 ]; then
  run "$@"
else
  run oversubscribe
  run step_time
fi
