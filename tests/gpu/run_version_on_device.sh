#!/usr/bin/env bash
# The GPU suite for a torch version the GPU host does not have installed (injection path).
#
#   bash tests/gpu/run_version_on_device.sh 2.14.1      # carry .device/inject-2.14.1 and the
#                                                      # parts in .device/ship
#   bash tests/gpu/run_version_on_device.sh 2.14.1 bash bench/run_on_device.sh step_time ...
#                                                      # a benchmark on the same staging
#
# Here, beforehand:
#   .venv/bin/python -m build_scripts bundle --torch-version 2.14.1 --python 3.12 \
#       --dest .device/inject-2.14.1
#   python3 tests/gpu/ship.py split <the pinned cp312 wheel> --dest .device/ship
#   python3 tests/gpu/ship.py split <each wheel of tests/gpu/host_extras.json> --dest .device/ship
# then carry the parts over back-to-back device calls (the host keeps them while warm).
#
# There: joins the official wheel (checked against the bundle's pin) and the wheels of
# tests/gpu/host_extras.json (checked against theirs), unpacks their libraries and packages, and
# runs tests/gpu/run_on_device.sh with the +um torch and a stock reference both staged
# from that wheel (TORCH_WHEEL, NVIDIA_LIBS). Results go to $OUT as for run_on_device.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=${1:?usage: run_version_on_device.sh VERSION}
BUNDLE=${BUNDLE:-.device/inject-$VERSION}
SHIP=${SHIP:-.device/ship}
WORK=${TMPDIR:-/tmp}/torch-um-$VERSION
PY=${PYTHON:-python3}
mkdir -p "$WORK"
[ -f "$BUNDLE/manifest.json" ] || { echo "no bundle at $BUNDLE (build_scripts bundle)"; exit 2; }
read -r WHEEL_NAME WHEEL_SHA < <("$PY" -c 'import json,sys; m=json.load(open(sys.argv[1])); print(m["built_for_wheel"], m["wheel_sha256"])' "$BUNDLE/manifest.json")
"$PY" tests/gpu/ship.py join "$SHIP/$WHEEL_NAME.parts.json" --out "$WORK" --sha256 "$WHEEL_SHA"
LIBS=""
PKGS="$WORK/pkgs"
while read -r FILE SHA MEMBER REL; do
  "$PY" tests/gpu/ship.py join "$SHIP/$FILE.parts.json" --out "$WORK" --sha256 "$SHA"
  # MEMBER "-": a Python package, unpacked whole onto PYTHONPATH; else one library file.
  "$PY" - "$WORK/$FILE" "$MEMBER" "$WORK/lib/$REL" "$PKGS" <<'PYEOF'
import os, shutil, sys, zipfile
wheel, member, target, pkgs = sys.argv[1:]
with zipfile.ZipFile(wheel) as zf:
    if member == "-":
        zf.extractall(pkgs)
        for root, _, names in os.walk(pkgs):
            for n in names:
                if ".so" in n:
                    os.chmod(os.path.join(root, n), 0o755)
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with zf.open(member) as src, open(target + ".partial", "wb") as dst:
            shutil.copyfileobj(src, dst)
        os.chmod(target + ".partial", 0o755)
        os.replace(target + ".partial", target)
PYEOF
  if [ "$MEMBER" != - ]; then LIBS="$LIBS $REL=$WORK/lib/$REL"; fi
done < <("$PY" -c 'import json,sys; [print(e["filename"], e["sha256"], e.get("member", "-"), e.get("lib", "-")) for e in json.load(open(sys.argv[1])).get(sys.argv[2], [])]' tests/gpu/host_extras.json "$VERSION")
if [ -d "$PKGS" ]; then export PYTHONPATH="$PKGS${PYTHONPATH:+:$PYTHONPATH}"; fi
export BUNDLE TORCH_WHEEL="$WORK/$WHEEL_NAME" NVIDIA_LIBS="${LIBS# }"
if [ "$#" -gt 1 ]; then
  shift
  exec "$@"   # another command with the same staging, e.g. bash bench/run_on_device.sh ...
fi
bash tests/gpu/run_on_device.sh
