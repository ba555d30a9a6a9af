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
# There: tests/gpu/host_extras.py joins the official wheel (checked against the bundle's pin)
# and the wheels of tests/gpu/host_extras.json (checked against theirs) and unpacks the
# extras; then this runs tests/gpu/run_on_device.sh with the +um torch and a stock reference both staged
# from that wheel (TORCH_WHEEL, NVIDIA_LIBS). Results go to $OUT as for run_on_device.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
VERSION=${1:?usage: run_version_on_device.sh VERSION}
BUNDLE=${BUNDLE:-.device/inject-$VERSION}
SHIP=${SHIP:-.device/ship}
WORK=${TMPDIR:-/tmp}/torch-um-$VERSION
PY=${PYTHON:-python3}
mkdir -p "$WORK"
# TORCH_WHEEL, NVIDIA_LIBS, EXTRA_PYTHONPATH (tests/gpu/host_extras.py)
ASSIGN=$("$PY" tests/gpu/host_extras.py "$VERSION" --bundle "$BUNDLE" --ship "$SHIP" --work "$WORK")
eval "$ASSIGN"
if [ -n "$EXTRA_PYTHONPATH" ]; then export PYTHONPATH="$EXTRA_PYTHONPATH${PYTHONPATH:+:$PYTHONPATH}"; fi
export BUNDLE TORCH_WHEEL NVIDIA_LIBS
if [ "$#" -gt 1 ]; then
  shift
  exec "$@"   # another command with the same staging, e.g. bash bench/run_on_device.sh ...
fi
bash tests/gpu/run_on_device.sh
