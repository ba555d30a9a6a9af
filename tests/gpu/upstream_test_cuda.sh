#!/usr/bin/env bash
# Upstream's own allocator tests: PyTorch's test/test_cuda.py, the allocator subset, run on
# the GPU host under stock torch and under the staged +um torch, compared test by test.
#
#   bash tests/gpu/upstream_test_cuda.sh                 # carry: .device/inject, .device/upstream
#   bash tests/gpu/upstream_test_cuda.sh 2.14.1          # another version: through
#       bash tests/gpu/run_version_on_device.sh 2.14.1 bash tests/gpu/upstream_test_cuda.sh 2.14.1
#
# Upstream's file is never committed: it is read from UPSTREAM (default
# .device/upstream/test_cuda-VERSION.py, git-ignored), checked against the sha256 file
# beside it (VERSION.py.sha256, sha256sum's format); the .source file beside it, if any,
# names the upstream commit it was taken from and goes into the record. The wheels its test
# helpers need that the host lacks lie beside it too, pinned in tests/gpu/upstream_deps.txt.
#
# Staging is tests/gpu/run_on_device.sh's: the +um torch from BUNDLE, the stock reference the
# host's torch (or, with TORCH_WHEEL, both from that wheel, as run_version_on_device.sh sets
# it). The +um run's total-managed cap is 80 % of the GPU's free memory read at start
# (PYTORCH_CUDA_UM_CONF=max_managed:N, docs/design.md, "Safety rule for every GPU run"); the
# stock run uses plain cudaMalloc and needs none. Both runs without pytest-xdist, each under
# `timeout` (PER_RUN_S, default 225 s; SIGINT, so that pytest still writes its junit report
# with what ran): at most 8.5 minutes in all.
#
# Writes to OUT (default .device/out): upstream-stock.xml, upstream-um.xml (junit), their
# logs, and upstream-test_cuda-VERSION.md, the per-test comparison (tests/gpu/upstream_compare.py)
# to commit under tests/gpu/results/. Exit status: the comparison's (0: every test that
# passed on stock passed on +um; 1: some did not; 2: the runs could not be made).
set -u -o pipefail

cd "$(dirname "$0")/../.."
VERSION=${1:-2.11.0}
UPSTREAM=${UPSTREAM:-.device/upstream/test_cuda-$VERSION.py}
BUNDLE=${BUNDLE:-.device/inject}
OUT=${OUT:-.device/out}
PY=${PYTHON:-python3}
PER_RUN_S=${PER_RUN_S:-225}
DEPS=${UPSTREAM_DEPS:-tests/gpu/upstream_deps.txt}
SUBSET="memory or caching or graph or stream or pinned or oom or fraction or snapshot or empty_cache or allocator or mempool or Absorption or expandable or fuzz"

fail() { echo "upstream_test_cuda.sh: $*" >&2; exit 2; }

[ -f "$UPSTREAM" ] || fail "no upstream test file at $UPSTREAM (see the comment at the top)"
[ -f "$UPSTREAM.sha256" ] || fail "no $UPSTREAM.sha256 beside the upstream test file"
[ -d "$BUNDLE/files" ] || fail "no injection bundle at $BUNDLE (python -m build_scripts bundle)"
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
BUNDLE=$(cd "$BUNDLE" && pwd)
want=$(awk '{print $1; exit}' "$UPSTREAM.sha256")
have=$(sha256sum "$UPSTREAM" | awk '{print $1}')
[ "$want" = "$have" ] || fail "$UPSTREAM has sha256 $have, its .sha256 file says $want"
SOURCE="$(basename "$UPSTREAM"), sha256 $have"
if [ -f "$UPSTREAM.source" ]; then SOURCE="$SOURCE; $(tr '\n' ' ' < "$UPSTREAM.source")"; fi

STAGE=$(mktemp -d "${TMPDIR:-/tmp}/torch-um-upstream.XXXXXX")
trap 'rm -rf "$STAGE"' EXIT
# pytest names the module after the file: test_cuda, as upstream's CI does.
mkdir -p "$STAGE/tests"
cp "$UPSTREAM" "$STAGE/tests/test_cuda.py"
# Names a newer upstream file imports that this wheel lacks (tests/gpu/upstream_conftest.py).
cp tests/gpu/upstream_conftest.py "$STAGE/tests/conftest.py"
# Wheels upstream's test helpers import that the host lacks ($DEPS), each beside the test file,
# checked against its pin and unpacked into the stage (by python3's zipfile: a tool, not the
# interpreter under test).
while read -r wheel pin; do
  case "$wheel" in ''|'#'*) continue ;; esac
  have=""
  [ -f "$(dirname "$UPSTREAM")/$wheel" ] && have=$(sha256sum "$(dirname "$UPSTREAM")/$wheel" | awk '{print $1}')
  [ -n "$have" ] || fail "no $(dirname "$UPSTREAM")/$wheel ($DEPS says how to fetch it)"
  [ "$have" = "$pin" ] || fail "$wheel has sha256 $have, $DEPS pins $pin"
  python3 -m zipfile -e "$(dirname "$UPSTREAM")/$wheel" "$STAGE/pylib" || fail "cannot unpack $wheel"
done < "$DEPS"

STOCK_PYTHONPATH=${PYTHONPATH:-}
STAGE_ARGS=()
if [ -n "${TORCH_WHEEL:-}" ]; then
  STAGE_ARGS=(--wheel "$TORCH_WHEEL")
  for lib in ${NVIDIA_LIBS:-}; do STAGE_ARGS+=(--lib "$lib"); done
  "$PY" tests/gpu/stage_torch.py --dest "$STAGE/stock" "${STAGE_ARGS[@]}" > "$OUT/upstream-stage.log" 2>&1 \
    || fail "staging the stock reference failed (upstream-stage.log)"
  STOCK_PYTHONPATH="$STAGE/stock${STOCK_PYTHONPATH:+:$STOCK_PYTHONPATH}"
fi
"$PY" tests/gpu/stage_torch.py --bundle "$BUNDLE" --dest "$STAGE/site" "${STAGE_ARGS[@]}" \
  >> "$OUT/upstream-stage.log" 2>&1 || fail "staging the +um torch failed (upstream-stage.log)"
UM_PYTHONPATH="$STAGE/site${STOCK_PYTHONPATH:+:$STOCK_PYTHONPATH}"
if ! "$PY" -c "import pytest" 2>/dev/null; then
  STOCK_PYTHONPATH="$STOCK_PYTHONPATH${STOCK_PYTHONPATH:+:}$BUNDLE/pylib"
  UM_PYTHONPATH="$UM_PYTHONPATH:$BUNDLE/pylib"
fi
if [ -d "$STAGE/pylib" ]; then
  STOCK_PYTHONPATH="$STOCK_PYTHONPATH${STOCK_PYTHONPATH:+:}$STAGE/pylib"
  UM_PYTHONPATH="$UM_PYTHONPATH:$STAGE/pylib"
fi

# Which torch each run imports (staged here or the host's own: no path of the host goes into
# the record), and the +um run's cap: 80 % of free memory now.
PROBE='import sys, torch, json
f, t = torch.cuda.mem_get_info()
print(json.dumps({"torch": torch.__version__, "git": torch.version.git_version,
  "um": hasattr(torch.cuda, "um"), "gpu": torch.cuda.get_device_name(),
  "free": f, "total": t,
  "from": "staged" if torch.__file__.startswith(sys.argv[1]) else "installed"}))'
STOCK_INFO=$(PYTHONPATH="$STOCK_PYTHONPATH" "$PY" -c "$PROBE" "$STAGE") || fail "the stock torch does not import"
UM_INFO=$(PYTHONPATH="$UM_PYTHONPATH" "$PY" -c "$PROBE" "$STAGE") || fail "the +um torch does not import"
echo "stock: $STOCK_INFO"
echo "+um:   $UM_INFO"
case "$STOCK_INFO" in *'"um": false'*) ;; *) fail "the stock run would import a +um torch";; esac
case "$UM_INFO" in *'"um": true'*) ;; *) fail "the +um run would import a stock torch";; esac
FREE=$(PYTHONPATH="$STOCK_PYTHONPATH" "$PY" -c 'import torch; print(torch.cuda.mem_get_info()[0])')
CAP=$((FREE * 8 / 10))
# Upstream's imports (psutil, expecttest, ...) must be there: one clear line if not.
PYTHONPATH="$STOCK_PYTHONPATH" "$PY" -c "import ast, importlib.util, sys
tree = ast.parse(open('$STAGE/tests/test_cuda.py').read())
mods = {a.name.split('.')[0] for n in tree.body if isinstance(n, ast.Import) for a in n.names}
mods |= {n.module.split('.')[0] for n in tree.body if isinstance(n, ast.ImportFrom) and n.module}
missing = sorted(m for m in mods if importlib.util.find_spec(m) is None)
sys.exit(f'upstream_test_cuda.sh: modules upstream imports are missing here: {missing}' if missing else 0)" \
  || exit 2
# ... and those of torch's own test helpers, which the conftest imports first.
PYTHONPATH="$STOCK_PYTHONPATH" "$PY" -c "import torch.testing._internal.common_utils" 2> "$OUT/upstream-imports.log" \
  || fail "torch.testing._internal.common_utils does not import: $(tail -1 "$OUT/upstream-imports.log") (pin the wheel it lacks in $DEPS, beside the test file)"

source tests/gpu/owned.sh
run() {  # NAME PYTHONPATH [VAR=VALUE...]
  local name=$1 pp=$2
  shift 2
  (cd "$STAGE/tests" && owned "$OUT/upstream-$name.log" env PYTHONPATH="$pp" PYTHONUNBUFFERED=1 \
    UPSTREAM_CONFTEST_NOTES="$STAGE/notes-$name" "$@" \
    timeout -s INT -k 15 "$PER_RUN_S" "$PY" -m pytest test_cuda.py -k "$SUBSET" -p no:xdist \
    -p no:cacheprovider -q -rfE --junitxml="$OUT/upstream-$name.xml" -o junit_family=xunit2 \
    -o faulthandler_timeout=120)
  echo "pytest exit code ($name): $?" | tee -a "$OUT/upstream-$name.log"
}
start=$(date +%s)
run stock "$STOCK_PYTHONPATH"
run um "$UM_PYTHONPATH" PYTORCH_CUDA_UM_CONF="max_managed:$CAP"
secs=$(( $(date +%s) - start ))

"$PY" tests/gpu/upstream_compare.py --stock "$OUT/upstream-stock.xml" --um "$OUT/upstream-um.xml" \
  --out "$OUT/upstream-test_cuda-$VERSION.md" \
  --title "Upstream test_cuda.py, allocator subset: stock against +um torch $VERSION" \
  --source "$SOURCE" \
  --note "command: bash tests/gpu/upstream_test_cuda.sh $VERSION; TORCH_UM_COMMIT=${TORCH_UM_COMMIT:-(not set)}; $(date -u +%Y-%m-%dT%H:%M:%SZ)" \
  --note "pytest -k \"$SUBSET\" -p no:xdist, each run under timeout $PER_RUN_S s; both runs took $secs s" \
  --note "the upstream file unmodified; tests/gpu/upstream_conftest.py gives torch.testing._internal.common_utils the names a newer upstream file imports that the wheel lacks (TEST_CUDAMALLOCASYNC)" \
  --note "stock: $STOCK_INFO" \
  --note "+um: $UM_INFO; PYTORCH_CUDA_UM_CONF=max_managed:$CAP (80 % of $FREE bytes free at start)" \
  --note "the conftest, stock: $(cat "$STAGE/notes-stock" 2>/dev/null || echo nothing changed)" \
  --note "the conftest, +um: $(cat "$STAGE/notes-um" 2>/dev/null || echo nothing changed)" \
  --note "driver: $(nvidia-smi --query-gpu=driver_version --format=csv,noheader 2>/dev/null | head -1)"
