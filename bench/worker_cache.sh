#!/usr/bin/env bash
# Kept frames in workers started on their own (`loader-worker --cache`):
# a loader-server, N loader-workers with the given flags, and one
# `loaderctl consume` trainer over an image folder; prints the trainer's
# samples/s by epoch and the workers' CPU seconds (user + sys).
#   [EPOCHS=3] bench/worker_cache.sh BIN_DIR IMAGE_DIR NWORKERS [worker flags, e.g. --cache 4GiB]
# Needs `cargo build --release --features loader-ctl/cuda --bins` (BIN_DIR=target/release).
set -euo pipefail
bin="$1"; images="$2"; n="$3"; shift 3
tmp=$(mktemp -d)
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"; }
trap cleanup EXIT
"$bin/loader-server" --listen 127.0.0.1:0 > "$tmp/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 100); do grep -q '^listening' "$tmp/server.log" && break; sleep 0.05; done
url=http://$(awk '/^listening/ {print $2}' "$tmp/server.log")
workers=()
for i in $(seq 1 "$n"); do
  "$bin/loader-worker" --coordinator "$url" --listen 127.0.0.1:0 "$@" > "$tmp/worker$i.log" 2>&1 &
  pids+=($!); workers+=($!)
done
sleep 1
"$bin/loaderctl" consume --coordinator "$url" --json --dataset imagefolder --path "$images" \
  --epochs "${EPOCHS:-3}" --batch-size 64 > "$tmp/trainer.out"
python3 - "$tmp/trainer.out" <<'PY'
import json, sys
r = [json.loads(l) for l in open(sys.argv[1]) if l.startswith("{")][-1]
print("samples/s", round(r["samples_per_s"]), "by epoch", [round(x) for x in r.get("epochs_samples_per_s", [])])
PY
ticks=0
for p in "${workers[@]}"; do ticks=$((ticks + $(awk '{print $14+$15}' "/proc/$p/stat"))); done
echo "worker CPU s $(python3 -c "import os; print(round($ticks / os.sysconf('SC_CLK_TCK'), 1))")"
