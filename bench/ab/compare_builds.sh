#!/usr/bin/env bash
# Same-run A/B of two builds of loaderctl: interleaved runs, the order
# alternating per repeat, one JSON line per run on stdout (build, scenario,
# samples_per_s, client_cpu_us_per_batch). Summarize with
# bench/ab/summarize.py. Scenarios (SCENARIOS, default "shm grpc images"):
# zero-compute 3x224x224 over shared memory and gRPC, the image pipeline,
# and two small-batch cells (3x32x32 at batch 256; 2049 uint16 at batch 1).
#   [SCENARIOS="..."] bench/ab/compare_builds.sh OLD_LOADERCTL NEW_LOADERCTL REPEATS IMAGE_DIR
set -euo pipefail
old="$1"; new="$2"; repeats="${3:-4}"; images="${4:-bench/data/imagenet-shaped}"
common=(run --json --workers 2)
source "$(dirname "$0")/scenarios.sh"
export IMAGES="$images"
for r in $(seq 1 "$repeats"); do
  for s in ${SCENARIOS:-shm grpc images}; do
    if (( r % 2 )); then order=(old new); else order=(new old); fi
    for b in "${order[@]}"; do
      bin="$old"; [ "$b" = new ] && bin="$new"
      # shellcheck disable=SC2046
      out=$("$bin" "${common[@]}" $(scenario "$s"))
      report "$out" "$b" "$s"
    done
  done
done
