#!/usr/bin/env bash
# The coordinator at scale: a release loader-server on loopback and the load
# harness (bench/scale, `scale-harness`) at 100, 1,000, 5,000 and 10,000
# simulated workers, one table row each (docs/benchmarks.md, "The
# coordinator at scale"). The coordinator's CPU time is measured from
# /proc (the harness shares the cores, so wall time says little).
#
#   bench/scale/run.sh                 # the table
#   bench/scale/run.sh --churn         # the same with churn (extra flags go to every run)
set -euo pipefail
cd "$(dirname "$0")/../.."
cargo build --release -q -p loader-server -p loader-scale
server=target/release/loader-server
harness=target/release/scale-harness
out=$(mktemp -d)
trap 'kill $(cat "$out/pid" 2>/dev/null) 2>/dev/null || true; rm -rf "$out"' EXIT

header=--header
# workers trainers batches-per-trainer
for point in "100 10 2000" "1000 100 400" "5000 500 80" "10000 1000 40"; do
  read -r workers trainers batches <<<"$point"
  "$server" --listen 127.0.0.1:0 >"$out/server.out" 2>"$out/server.err" &
  echo $! >"$out/pid"
  for _ in $(seq 100); do grep -q '^listening' "$out/server.out" && break; sleep 0.05; done
  addr=$(sed -n 's/^listening //p' "$out/server.out")
  "$harness" --coordinator "http://$addr" --workers "$workers" --trainers "$trainers" \
    --batches "$batches" --channels 64 --limit 120 --server-pid "$(cat "$out/pid")" $header "$@" || true
  header=
  kill "$(cat "$out/pid")" 2>/dev/null || true
  wait "$(cat "$out/pid")" 2>/dev/null || true
done
