#!/usr/bin/env bash
# The GPU path's device check, for one GPU machine with no internet and maybe no sglang/ray:
#   bash gpu/scripts/device_check.sh OUT
# Runs gpu/scripts/device_check.py under its own timeout (9 minutes: one lent GPU's ten-minute command), writes OUT/device_check.json and
# OUT/device_check.log, and exits non-zero when a check failed or the time ran out.
set -uo pipefail
if [ "$#" -ne 1 ]; then
  echo "usage: bash gpu/scripts/device_check.sh OUT" >&2
  exit 2
fi
out="$1"
mkdir -p "$out"
cd "$(dirname "$0")/../.."
python="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
nvidia-smi -L 2>&1 | tee "$out/device_check.log"
timeout --kill-after=15 540 "$python" gpu/scripts/device_check.py "$out" 2>&1 | tee -a "$out/device_check.log"
code=${PIPESTATUS[0]}
[ "$code" -eq 124 ] && echo "[device-check] timed out after 540 s" | tee -a "$out/device_check.log"
exit "$code"
