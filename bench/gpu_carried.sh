#!/usr/bin/env bash
# The GPU checks on a machine that cannot build or download (the lent H200
# has no network): run from what bench/gpu_carry.sh built elsewhere into
# DIR (default .gpu): loaderctl (release, feature cuda), the SDK's wheel for
# that machine's Python, and the libjpeg the SDK links. The machine's own
# torch and numpy are used.
#
#   bench/gpu_carried.sh [DIR] [-- ARGS for bench/gpu_startup.py]
#
# Prints gpu_check.py's table, then gpu_startup.py's rows (JSON lines).
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.gpu}
shift || true
[ "${1:-}" = "--" ] && shift
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/loader-site "$dir"/loader-*.whl
export PYTHONPATH=/tmp/loader-site LD_LIBRARY_PATH="$PWD/$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" PYTHONUNBUFFERED=1
ctl="$dir/loaderctl"
nvidia-smi -L
python3 -c 'import torch, loader; print("torch", torch.__version__, "loader", loader.__file__)'
# The probe runs even when the check fails; the check's status is returned.
status=0
python3 bench/gpu_check.py --mode cuda --loaderctl "$ctl" || status=$?
python3 bench/gpu_startup.py --loaderctl "$ctl" "$@"
exit "$status"
