#!/usr/bin/env bash
# Metrics on vs off, same binary, same run, interleaved (order alternating
# per repeat): `loaderctl run` with its trainer, embedded coordinator and
# worker processes all serving /metrics (LOADER_METRICS_LISTEN reaches the
# workers), against everything off. One JSON line per run; summarize with
# bench/ab/summarize.py ("old" = off, "new" = on).
#   bench/ab/metrics_overhead.sh LOADERCTL REPEATS
set -euo pipefail
bin="$1"; repeats="${2:-8}"
source "$(dirname "$0")/scenarios.sh"
for r in $(seq 1 "$repeats"); do
  for s in ${SCENARIOS:-shm small tokens1}; do
    if (( r % 2 )); then order=(old new); else order=(new old); fi
    for b in "${order[@]}"; do
      if [ "$b" = new ]; then
        # shellcheck disable=SC2046
        out=$(LOADER_METRICS_LISTEN=127.0.0.1:0 "$bin" run --json --workers 2 --metrics-listen 127.0.0.1:0 $(scenario "$s") 2>/dev/null)
      else
        # shellcheck disable=SC2046
        out=$(env -u LOADER_METRICS_LISTEN "$bin" run --json --workers 2 $(scenario "$s"))
      fi
      report "$out" "$b" "$s"
    done
  done
done
