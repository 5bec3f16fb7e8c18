#!/usr/bin/env bash
# TLS cost on the gRPC path (issue 21): the same coordinator + 2 workers +
# `loaderctl consume --transport grpc` on loopback, plaintext vs TLS with
# client certificates (mutual TLS) and tokens, interleaved (order alternating
# per repeat), in the same run. "old" = plaintext, "new" = TLS; summarize
# with bench/ab/summarize.py. Certificates: a throwaway CA made with openssl.
#   bench/ab/tls_overhead.sh BIN_DIR REPEATS      (BIN_DIR: target/release)
# SCENARIOS: grpc (3x224x224 b64) and grpcsmall (3x32x32 b256) by default.
# WORKERS (default 2): worker processes; on a 2-core machine, 2 workers and
# the trainer oversubscribe the cores, 1 worker gives each side a core.
set -euo pipefail
bin="$(cd "$1" && pwd)"; repeats="${2:-6}"
here="$(cd "$(dirname "$0")" && pwd)"
source "$here/scenarios.sh"
work=$(mktemp -d)
pids=()
finish() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap finish EXIT

# A CA, and one certificate (server and client use) for 127.0.0.1.
(
  cd "$work"
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 1 -subj /CN=bench-ca \
    -keyout ca.key -out ca.pem 2>/dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj /CN=bench -keyout node.key -out node.csr 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n' >ext
  openssl x509 -req -in node.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 1 -extfile ext -out node.pem 2>/dev/null
  for r in worker trainer admin; do openssl rand -hex 32 >"$r.token"; chmod 600 "$r.token"; done
)

# Starts a coordinator and $WORKERS workers with the current environment; sets
# $url. Each prints `listening ADDR` first.
start() {
  local out="$work/server.$1"
  "$bin/loader-server" --listen 127.0.0.1:0 >"$out" 2>/dev/null &
  pids+=($!)
  for _ in $(seq 1 100); do grep -q '^listening ' "$out" && break; sleep 0.05; done
  local addr; addr=$(sed -n 's/^listening //p' "$out")
  url="$2://$addr"
  for _ in $(seq 1 "${WORKERS:-2}"); do
    "$bin/loader-worker" --coordinator "$url" --listen 127.0.0.1:0 >/dev/null 2>&1 &
    pids+=($!)
  done
  sleep 1
}
stop() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  pids=()
}

grpcflags() {
  case "$1" in
    grpc) echo "--batch-size 64 --samples 16000 --shape 3,224,224 --transport grpc" ;;
    grpcsmall) echo "--batch-size 256 --samples 320000 --shape 3,32,32 --transport grpc" ;;
    *) echo "unknown scenario $1" >&2; return 1 ;;
  esac
}

for r in $(seq 1 "$repeats"); do
  for s in ${SCENARIOS:-grpc grpcsmall}; do
    if (( r % 2 )); then order=(old new); else order=(new old); fi
    for b in "${order[@]}"; do
      if [ "$b" = new ]; then
        export LOADER_TLS_CERT="$work/node.pem" LOADER_TLS_KEY="$work/node.key" \
          LOADER_TLS_CLIENT_CA="$work/ca.pem" LOADER_TLS_CA="$work/ca.pem" \
          LOADER_WORKER_TOKEN_FILE="$work/worker.token" LOADER_TRAINER_TOKEN_FILE="$work/trainer.token" \
          LOADER_ADMIN_TOKEN_FILE="$work/admin.token"
        start "$r$s$b" https
      else
        unset LOADER_TLS_CERT LOADER_TLS_KEY LOADER_TLS_CLIENT_CA LOADER_TLS_CA \
          LOADER_WORKER_TOKEN_FILE LOADER_TRAINER_TOKEN_FILE LOADER_ADMIN_TOKEN_FILE
        start "$r$s$b" http
      fi
      # shellcheck disable=SC2046
      out=$("$bin/loaderctl" consume --coordinator "$url" --json $(grpcflags "$s"))
      stop
      report "$out" "$b" "$s"
    done
  done
done
