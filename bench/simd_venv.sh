#!/usr/bin/env bash
# The Pillow-SIMD anchor for issue 54: a venv with the same torch and
# torchvision as the test venv and Pillow replaced by pillow-simd (what users
# install instead of a faster loader: SIMD resizes and filters, built from
# source with AVX2). bench/torchvision_native.py --anchor-python runs its
# DataLoader rows in it.
#
#   bench/simd_venv.sh                       # makes target/simd-venv
#   VENV=/tmp/v FROM=target/test-venv bench/simd_venv.sh
#
# FROM: the venv whose torch/torchvision versions to match (default
# target/test-venv; without it, the newest). TORCH_INDEX: a pip index for
# torch and torchvision (e.g. PyTorch's CPU-only one, about 1 GB instead of
# 6 with CUDA's libraries); default PyPI, the only registry this machine
# reaches. Needs a C compiler and libjpeg and zlib headers (Debian:
# libjpeg-dev zlib1g-dev), installed here when missing and apt-get works.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
venv=${VENV:-$root/target/simd-venv}
from=${FROM:-$root/target/test-venv}
python=${PYTHON:-python3}

# The wheels unpack to ~6.5 GB with CUDA's libraries; leave room for others.
free_gb=$(df -Pk "$(dirname "$venv")" | awk 'NR == 2 { print int($4 / 1048576) }')
if [ "$free_gb" -lt 22 ] && [ ! -x "$venv/bin/python" ]; then
  echo "simd_venv.sh: ${free_gb} GB free under $(dirname "$venv"); the venv takes ~7 GB and 15 GB should stay free" >&2
  exit 1
fi

if ! dpkg -s libjpeg-dev zlib1g-dev >/dev/null 2>&1; then
  apt-get install -y libjpeg-dev zlib1g-dev
fi

pins=(torch torchvision)
if [ -x "$from/bin/python" ]; then
  read -r torch_v vision_v < <("$from/bin/python" -c \
    'import torch, torchvision; print(torch.__version__.split("+")[0], torchvision.__version__.split("+")[0])')
  pins=("torch==$torch_v" "torchvision==$vision_v")
fi

[ -x "$venv/bin/python" ] || "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check)
index=()
[ -n "${TORCH_INDEX:-}" ] && index=(--index-url "$TORCH_INDEX")
"${pip[@]}" install --no-cache-dir "${index[@]}" "${pins[@]}" numpy

# torchvision brought Pillow; pillow-simd takes its place (same `PIL`
# package). -mavx2: its resize and filter kernels are compiled for AVX2 only
# when the compiler is told the target has it.
"${pip[@]}" uninstall -y pillow
CC="${CC:-cc} -mavx2" "${pip[@]}" install --no-cache-dir --no-binary pillow-simd pillow-simd

"$venv/bin/python" - <<'EOF'
import PIL, torch, torchvision
import torchvision.transforms  # noqa: F401  (refuses a Pillow it cannot use)
from PIL import features

# pillow-simd's versions end in .postN; Pillow's never do.
assert ".post" in PIL.__version__, f"PIL {PIL.__version__} is not pillow-simd"
print(f"{torch.__version__=} {torchvision.__version__=} {PIL.__version__=} "
      f"libjpeg_turbo={features.check_feature('libjpeg_turbo')}")
EOF
