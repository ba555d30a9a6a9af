#!/usr/bin/env bash
# The benchmarks on the GPU host, in the repository root, against its stock torch 2.11
# and the same torch staged as the torch-2.11.0+um wheel has it (tests/gpu/stage_torch.py
# with the bundle of `python -m build_scripts bundle`, carry .device/inject).
#
#   bash bench/run_on_device.sh                          # both, default settings
#   bash bench/run_on_device.sh step_time --rounds 2     # one, with its options
#   bash bench/run_on_device.sh residency train --rounds 1   # residency: train or infer
#
# Results (JSON) and logs go to $OUT (default .device/bench); copy the JSON to
# bench/results/ and run `python -m bench.plot` there.
set -euo pipefail
cd "$(dirname "$0")/.."
BUNDLE=$(cd "${BUNDLE:-.device/inject}" && pwd)
OUT=${OUT:-.device/bench}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PY=${PYTHON:-python3}
STAGE=$(mktemp -d "${TMPDIR:-/tmp}/torch-um-stage.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
"$PY" tests/gpu/stage_torch.py --bundle "$BUNDLE" --dest "$STAGE/site" > "$OUT/stage.log"
STOCK=${PYTHONPATH:-}
UM="$STAGE/site${STOCK:+:$STOCK}"
run() {
  local bench=$1
  shift
  case "$bench" in
    step_time | oversubscribe | residency) ;;
    *) echo "bench/run_on_device.sh: unknown benchmark '$bench' (step_time, oversubscribe, residency)" >&2; exit 2 ;;
  esac
  local log=$bench
  # residency takes its workload (train or infer) first: one log each.
  if [ "$bench" = residency ] && [ "$#" -gt 0 ] && [ "${1#-}" = "$1" ]; then log="$bench-$1"; fi
  echo "== bench.$bench $*"
  "$PY" -m "bench.$bench" --stock-pythonpath "$STOCK" --um-pythonpath "$UM" --out "$OUT" "$@" \
    2>&1 | tee "$OUT/$log.log"
}
if [ "$#" -gt 0 ]; then
  run "$@"
else
  run oversubscribe
  run step_time
fi
