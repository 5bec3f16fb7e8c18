#!/usr/bin/env bash
# Client CPU per batch on the shared-memory path next to this machine's
# floors, measured in the same minutes (repeats interleaved):
#   futex      one sleep + one wake-up per batch across processes, nothing else
#   socket     the same through a Unix socket: poll, read a report, write a grant
#   +fill      each of those with the "worker" writing 10 MB per batch first
#   loaderctl  `loaderctl consume --transport shm` against loader-server and two
#              loader-workers (zero-compute 3x224x224 uint8, batch 64)
# Prints the median of each. Usage: bench/floor/compare.sh [REPEATS] [SAMPLES]
# BIN=dir uses the loader binaries in dir instead of building target/release
# (to compare a build of another commit in the same minutes).
set -euo pipefail
cd "$(dirname "$0")/../.."
REPEATS=${1:-5}; SAMPLES=${2:-64000}
if [ -z "${BIN:-}" ]; then
  BIN=target/release
  cargo build --release --bins -p loader-ctl -p loader-server -p loader-worker >&2
fi
T=$(mktemp -d); trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$T"' EXIT
gcc -O2 -pthread -o "$T/ring_round" bench/floor/ring_round.c
gcc -O2 -o "$T/futex_round" bench/floor/futex_round.c
$BIN/loader-server --listen 127.0.0.1:0 >"$T/server.out" 2>"$T/server.err" &
for _ in $(seq 100); do grep -q listening "$T/server.out" 2>/dev/null && break; sleep 0.1; done
URL=http://$(grep -o 'listening [^ ]*' "$T/server.out" | awk '{print $2}')
for w in 1 2; do $BIN/loader-worker --coordinator "$URL" --listen 127.0.0.1:0 >/dev/null 2>"$T/w$w.err" & done
sleep 1.5
# Rounds as long as a batch takes here (measured by the first consume).
interval=700
for r in $(seq "$REPEATS"); do
  out=$($BIN/loaderctl consume --coordinator "$URL" --job-name "floor-$r-$RANDOM" --samples "$SAMPLES" --transport shm --json | tail -1)
  echo "loaderctl $(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["client_cpu_us_per_batch"])' "$out")" >>"$T/all"
  interval=$(python3 -c 'import json,sys; v=json.loads(sys.argv[1]); print(max(100, int(v["seconds"] / v["batches"] * 1e6)))' "$out")
  echo "futex $("$T/futex_round" 2000 "$interval" | awk '{print $2}')" >>"$T/all"
  echo "futex+fill $("$T/futex_round" 2000 "$interval" 10 | awk '{print $2}')" >>"$T/all"
  echo "socket $("$T/ring_round" 1 2000 "$interval" 4 | awk '{print $3}')" >>"$T/all"
  echo "socket+fill $("$T/ring_round" 1 2000 "$interval" 4 10 | awk '{print $3}')" >>"$T/all"
done
echo "batch interval ~${interval} us; client CPU per batch (us), median of $REPEATS:"
python3 - "$T/all" <<'PY'
import statistics, sys
runs = {}
for line in open(sys.argv[1]):
    parts = line.split()
    if len(parts) != 2:
        continue
    name, v = parts
    runs.setdefault(name, []).append(float(v))
for name in ["futex", "futex+fill", "socket", "socket+fill", "loaderctl"]:
    v = runs.get(name, [])
    print(f"  {name:12s} {statistics.median(v):6.1f}   ({', '.join(f'{x:.1f}' for x in v)})")
PY
