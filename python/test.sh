#!/usr/bin/env bash
# Builds the Python SDK, installs it into a virtualenv with numpy and pytest,
# and runs its tests; exits with pytest's status. Needs only cargo, Python
# >= 3.11 and PyPI. Torch tests run when torch is importable in the venv
# (LOADER_PY_VENV=/path/to/venv with torch installed, as ../test.sh makes
# it), else skip saying why.
#
#   python/test.sh            # from anywhere; extra args go to pytest
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

python=${PYTHON:-}
if [ -z "$python" ]; then
  for candidate in python3.13 python3.12 python3.11 python3; do
    if command -v "$candidate" >/dev/null 2>&1 &&
      "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
      python=$candidate
      break
    fi
  done
fi
if [ -z "$python" ]; then
  echo "python/test.sh: Python >= 3.11 is required" >&2
  exit 1
fi

venv=${LOADER_PY_VENV:-$here/.venv}
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
# grpcio-reflection: test_reflection.py asks reflection as most tools do.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check numpy pytest grpcio grpcio-reflection
# Always rebuilds from this tree (cargo's incremental build keeps it quick).
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check --force-reinstall --no-deps "$here"
cd "$here/tests"
exec "$venv/bin/python" -m pytest -q "$@"
