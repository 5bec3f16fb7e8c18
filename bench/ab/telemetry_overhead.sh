#!/usr/bin/env bash
# Telemetry on vs off, same binary, same run, interleaved (order alternating
# per repeat). "on": `loaderctl run` with its trainer, embedded coordinator
# and worker processes all serving /metrics (LOADER_METRICS_LISTEN reaches
# the workers) and exporting traces of 1% of batches over OTLP/gRPC to a
# live receiver (the otlp_sink example, started once for the run); "off":
# none of it. TRACE_RATIO changes the ratio; METRICS=0 leaves metrics off
# in "on" (tracing alone), TRACES=0 leaves tracing off (metrics alone). One JSON line per run; summarize with
# bench/ab/summarize.py ("old" = off, "new" = on).
#   bench/ab/telemetry_overhead.sh LOADERCTL REPEATS
set -euo pipefail
bin="$1"; repeats="${2:-8}"
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/scenarios.sh"
root="$(cd "$here/../.." && pwd)"

(cd "$root" && cargo build --quiet -p loader-e2e --example otlp_sink)
work=$(mktemp -d)
sink_out="$work/sink.out"
# The sink runs until its stdin (a fifo this script holds open) closes;
# then it prints how many spans it received.
mkfifo "$work/sink.in"
"$root/target/debug/examples/otlp_sink" 127.0.0.1:0 <"$work/sink.in" >"$sink_out" &
sink=$!
exec 3>"$work/sink.in"
finish() {
  exec 3>&-
  wait "$sink" 2>/dev/null || true
  sed -n 's/^spans /otlp sink received spans: /p' "$sink_out" >&2
  rm -rf "$work"
}
trap finish EXIT
for _ in $(seq 1 100); do grep -q '^listening ' "$sink_out" && break; sleep 0.1; done
endpoint="http://$(sed -n 's/^listening //p' "$sink_out")"
echo "otlp sink at $endpoint" >&2

for r in $(seq 1 "$repeats"); do
  for s in ${SCENARIOS:-shm small tokens1}; do
    if (( r % 2 )); then order=(old new); else order=(new old); fi
    for b in "${order[@]}"; do
      if [ "$b" = new ]; then
        metrics=()
        if [ "${METRICS:-1}" = 1 ]; then metrics=(--metrics-listen 127.0.0.1:0); fi
        # shellcheck disable=SC2046
        out=$( (if [ "${METRICS:-1}" = 1 ]; then export LOADER_METRICS_LISTEN=127.0.0.1:0; fi
                if [ "${TRACES:-1}" = 1 ]; then
                  export OTEL_EXPORTER_OTLP_ENDPOINT="$endpoint" OTEL_TRACES_SAMPLER_ARG="${TRACE_RATIO:-0.01}"
                fi
                "$bin" run --json --workers 2 "${metrics[@]}" $(scenario "$s")) 2>/dev/null)
      else
        # shellcheck disable=SC2046
        out=$(env -u LOADER_METRICS_LISTEN -u OTEL_EXPORTER_OTLP_ENDPOINT "$bin" run --json --workers 2 $(scenario "$s"))
      fi
      report "$out" "$b" "$s"
    done
  done
done
