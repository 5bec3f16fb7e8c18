#!/usr/bin/env bash
# The GPU check of the pin-memory stage (issue 18), in one command on any
# machine with an NVIDIA GPU (driver installed; no CUDA toolkit needed:
# Loader loads libcuda at run time, torch brings its own runtime):
#
#   bench/gpu_check.sh          # (1) correctness, (2) H2D GB/s vs torch
#                               # pin_memory and a raw pinned copy, (3) GPU
#                               # idle per step; prints one table
#   bench/gpu_check.sh --host   # (1) only, on the device path's host backend
#                               # (device="host"): for machines with no GPU
#
# With no GPU (nvidia-smi lists none) it says so and runs --host. It builds
# what it needs: loaderctl (release, feature cuda) and bench/.venv-gpu with
# torch from PyPI (GPU mode) and this tree's Python SDK. Exits non-zero when
# a check fails.
set -euo pipefail
cd "$(dirname "$0")/.."

mode=cuda
case "${1:-}" in
  --host) mode=host ;;
  "") ;;
  *) echo "usage: bench/gpu_check.sh [--host]" >&2; exit 2 ;;
esac
if [ "$mode" = cuda ] && ! { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU '; }; then
  echo "gpu_check: no NVIDIA GPU on this machine (nvidia-smi lists none); running the correctness part on the host backend (--host)" >&2
  mode=host
fi

cargo build --release --features cuda -p loader-ctl --bin loaderctl
venv=bench/.venv-gpu
if [ ! -x "$venv/bin/python" ]; then
  python3 -m venv "$venv"
fi
"$venv/bin/pip" install -q --disable-pip-version-check numpy
if [ "$mode" = cuda ]; then
  "$venv/bin/pip" install -q --disable-pip-version-check torch
fi
# The Python SDK of this tree (its wheel is built with the feature cuda).
"$venv/bin/pip" install -q --disable-pip-version-check --force-reinstall --no-deps ./python
if [ "$mode" = cuda ]; then
  nvidia-smi -L >&2
fi
exec "$venv/bin/python" bench/gpu_check.py --mode "$mode" --loaderctl target/release/loaderctl
