#!/usr/bin/env bash
# Builds what bench/gpu_carried.sh runs on a GPU machine with no network,
# into DIR (default .gpu, ignored by git; under the device tool's 64 MiB):
# loaderctl (release, feature cuda, stripped: 32 MB), the SDK's wheel
# (abi3, so this machine's CPython 3.11 builds one the lent machine's 3.12
# loads; stripped; its libjpeg not bundled), and this machine's
# libjpeg-turbo (the SDK links libjpeg.so.62; that machine's Ubuntu names
# it libjpeg.so.8). Needs maturin (MATURIN=path, else on PATH).
#
#   bench/gpu_carry.sh [DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.gpu}
mkdir -p "$dir/lib"
cargo build --release --features cuda -p loader-ctl --bin loaderctl
cp target/release/loaderctl "$dir/"
strip "$dir/loaderctl"
rm -f "$dir"/loader-*.whl
(cd python && "${MATURIN:-maturin}" build --release --strip --auditwheel skip --out "../$dir")
cp -L "$(ldconfig -p | awk '/libjpeg.so.62 .*x86-64/ {print $NF; exit}')" "$dir/lib/libjpeg.so.62"
du -sh "$dir"
