#!/usr/bin/env bash
# The coordinator at scale: a release loader-server on loopback and the load
# harness (bench/scale, `scale-harness`) at 100, 1,000, 5,000 and 10,000
# simulated workers, one table row each (docs/benchmarks.md, "The
# coordinator at scale"). The coordinator's CPU time is measured from
# /proc (the harness shares the cores, so wall time says little).
#
#   bench/scale/run.sh                 # the table
#   bench/scale/run.sh --churn         # the same with churn (extra flags go to every run)
#   bench/scale/run.sh --journal       # restart time vs journal size instead
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -q -p loader-server -p loader-scale
server=target/release/loader-server
harness=target/release/scale-harness
out=$(mktemp -d)
trap 'kill $(cat "$out/pid" 2>/dev/null) 2>/dev/null || true; rm -rf "$out"' EXIT

# Starts the server with "$@", records its pid, prints its address.
start() {
  : >"$out/server.out"
  "$server" "$@" >"$out/server.out" 2>"$out/server.err" &
  echo $! >"$out/pid"
  for _ in $(seq 100); do grep -q '^listening' "$out/server.out" && break; sleep 0.05; done
  sed -n 's/^listening //p' "$out/server.out"
}

if [ "${1:-}" = --journal ]; then
  # A coordinator with a journal holding N jobs of 8 ranks (ImageNet-sized,
  # shuffled, every rank halfway through its epoch) is SIGKILLed and
  # restarted on the same port; "restart" is from the new process's start
  # until it serves every job again (the journal replayed).
  echo "| jobs | ranks | watermarks | journal MB | fill s | restart s | RSS after restart MB |"
  echo "| ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
  for jobs in 100 1000 5000; do
    rm -rf "$out/state"
    addr=$(start --listen 127.0.0.1:0 --state-dir "$out/state")
    t0=$(date +%s.%N)
    filled=$("$harness" --coordinator "http://$addr" --fill-journal "$jobs" --trainers 8)
    t1=$(date +%s.%N)
    kill -9 "$(cat "$out/pid")"
    while kill -0 "$(cat "$out/pid")" 2>/dev/null; do sleep 0.01; done
    t2=$(date +%s.%N)
    "$server" --listen "$addr" --state-dir "$out/state" >/dev/null 2>"$out/server.err" &
    echo $! >"$out/pid"
    "$harness" --coordinator "http://$addr" --wait-jobs "$jobs" --limit 60 >/dev/null
    t3=$(date +%s.%N)
    rss=$(ps -o rss= -p "$(cat "$out/pid")")
    mb=$(du -sm "$out/state" | cut -f1)
    printf '| %s | 8 | %s | %s | %.1f | %.3f | %d |\n' "$jobs" "$(echo "$filled" | sed 's/.*, \([0-9]*\) watermarks/\1/')" \
      "$mb" "$(echo "$t1 - $t0" | bc)" "$(echo "$t3 - $t2" | bc)" "$((rss / 1024))"
    kill "$(cat "$out/pid")" 2>/dev/null || true
    while kill -0 "$(cat "$out/pid")" 2>/dev/null; do sleep 0.01; done
  done
  exit 0
fi

header=--header
# workers trainers batches-per-trainer
for point in "100 10 2000" "1000 100 400" "5000 500 80" "10000 1000 40"; do
  read -r workers trainers batches <<<"$point"
  addr=$(start --listen 127.0.0.1:0)
  "$harness" --coordinator "http://$addr" --workers "$workers" --trainers "$trainers" \
    --batches "$batches" --channels 64 --limit 120 --server-pid "$(cat "$out/pid")" $header "$@" || true
  header=
  kill "$(cat "$out/pid")" 2>/dev/null || true
  while kill -0 "$(cat "$out/pid")" 2>/dev/null; do sleep 0.01; done
done
