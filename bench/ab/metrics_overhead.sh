#!/usr/bin/env bash
# Metrics on vs off, same binary, same run, interleaved (order alternating
# per repeat): `loaderctl run` with its trainer, embedded coordinator and
# worker processes all serving /metrics (LOADER_METRICS_LISTEN reaches the
# workers), against everything off. One JSON line per run; summarize with
# bench/ab/summarize.py ("old" = off, "new" = on).
#   bench/ab/metrics_overhead.sh LOADERCTL REPEATS
set -euo pipefail
bin="$1"; repeats="${2:-8}"
scenario() {
  case "$1" in
    shm) echo "--batch-size 64 --samples 32000 --shape 3,224,224" ;;
    small) echo "--batch-size 256 --samples 640000 --shape 3,32,32" ;;
    tokens1) echo "--batch-size 1 --samples 100000 --shape 2049 --dtype uint16" ;;
  esac
}
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
      python3 -c 'import json,sys; v=json.loads(sys.argv[1]); print(json.dumps({"build": sys.argv[2], "scenario": sys.argv[3], "samples_per_s": v["samples_per_s"], "client_cpu_us_per_batch": v.get("client_cpu_us_per_batch")}))' "$out" "$b" "$s"
    done
  done
done
