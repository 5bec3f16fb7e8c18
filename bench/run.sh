#!/usr/bin/env bash
# One command for every benchmark: builds Loader (release), creates bench/.venv
# with torch, torchvision and tensorflow-cpu (a few GB, once), installs the
# Python SDK (./python) into it, then runs bench/run.py, which writes
# docs/benchmarks.md and docs/benchmarks.png.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bins -p loader-ctl -p loader-server -p loader-worker
if [ ! -x bench/.venv/bin/python ]; then
  python3 -m venv bench/.venv
fi
bench/.venv/bin/pip install -q --upgrade pip
bench/.venv/bin/pip install -q -r bench/requirements.txt
# The Python SDK of this tree, for the "Python loop" scenarios (pip builds it
# with cargo, release profile; its dependency numpy is in requirements.txt).
bench/.venv/bin/pip install -q --force-reinstall --no-deps ./python
exec bench/.venv/bin/python bench/run.py "$@"
