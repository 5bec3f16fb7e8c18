#!/usr/bin/env bash
# The coordinator's CPU per batch while one trainer consumes: loader-server
# and two loader-workers, `loaderctl consume` (zero-compute 3x224x224 uint8,
# batch 64), the server's CPU read from /proc/<pid>/task/*/schedstat (ns)
# before and after. Prints one line per repeat: server µs/batch, the
# trainer's client_cpu_us_per_batch, samples/s.
# Usage: bench/floor/coordinator_cpu.sh [REPEATS] [SAMPLES] [shm|grpc]
# BIN=dir uses the loader binaries in dir instead of building target/release.
set -euo pipefail
cd "$(dirname "$0")/../.."
REPEATS=${1:-3}; SAMPLES=${2:-64000}; TRANSPORT=${3:-shm}
if [ -z "${BIN:-}" ]; then
  BIN=target/release
  cargo build --release --bins -p loader-ctl -p loader-server -p loader-worker >&2
fi
T=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$T"' EXIT
$BIN/loader-server --listen 127.0.0.1:0 >"$T/server.out" 2>"$T/server.err" &
SERVER=$!
for _ in $(seq 100); do grep -q listening "$T/server.out" 2>/dev/null && break; sleep 0.1; done
URL=http://$(grep -o 'listening [^ ]*' "$T/server.out" | awk '{print $2}')
for w in 1 2; do $BIN/loader-worker --coordinator "$URL" --listen 127.0.0.1:0 >/dev/null 2>"$T/w$w.err" & done
sleep 1.5
server_ns() { cat /proc/$SERVER/task/*/schedstat | awk '{s += $1} END {print s}'; }
for r in $(seq "$REPEATS"); do
  before=$(server_ns)
  out=$($BIN/loaderctl consume --coordinator "$URL" --job-name "coord-cpu-$r-$RANDOM" \
    --samples "$SAMPLES" --transport "$TRANSPORT" --json | tail -1)
  after=$(server_ns)
  python3 -c '
import json, sys
v = json.loads(sys.argv[1])
server = (int(sys.argv[3]) - int(sys.argv[2])) / 1000 / v["batches"]
trainer, rate = v["client_cpu_us_per_batch"], v["samples_per_s"]
print(f"server {server:6.1f} us/batch   trainer {trainer:7.1f} us/batch   {rate:8.0f} samples/s")
' "$out" "$before" "$after"
done
