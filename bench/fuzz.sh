#!/usr/bin/env bash
# Coverage-guided fuzzing on the stable toolchain (issue 21); see
# fuzz/README.md.
#
#   bench/fuzz.sh SECONDS [TARGET...]   # build, then run each target SECONDS
#   bench/fuzz.sh --build               # build only
#   bench/fuzz.sh --seeds               # (re)write the binary seed inputs
#
# Targets: batch_header spec_yaml spec_json ring_messages rpc_requests (all
# by default), one after another; FUZZ_JOBS=2 runs two at once. Each run
# starts from and adds to fuzz/corpus/<target>/ (kept in the repository),
# which is minimized (-merge=1) at the end so it stays small
# (FUZZ_CORPUS_READONLY=1, as test.sh runs it: the corpus is read, new
# inputs go to a scratch directory, nothing is merged); a crash, panic,
# hang (-timeout=10) or out-of-memory (-rss_limit_mb=2048) writes its input
# to fuzz/artifacts/<target>/ (ignored) and fails the script. Prints one
# line per target: seconds, executions, corpus files, result. Everything
# runs under `nice -n 19`.
#
# No nightly: libfuzzer-sys builds libFuzzer with the system C++ compiler,
# and rustc's stable codegen flags add the SanitizerCoverage instrumentation
# cargo-fuzz would add (no AddressSanitizer: see fuzz/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
root="$PWD"
fuzz="$root/fuzz"

all=(batch_header spec_yaml spec_json ring_messages rpc_requests)
triple=x86_64-unknown-linux-gnu
# What cargo-fuzz passes (minus -Zsanitizer, which needs nightly): edge
# coverage with inline 8-bit counters and a PC table (libFuzzer's
# -print_pcs / feature tracking), comparison tracing (so a magic number or
# a length check is solved), and `cfg(fuzzing)`. Release code with debug
# assertions and overflow checks (also set in fuzz/Cargo.toml's profile).
# `--target` is explicit so none of this applies to build scripts and
# proc macros.
export RUSTFLAGS="--cfg fuzzing -Cpasses=sancov-module -Cllvm-args=-sanitizer-coverage-level=4 -Cllvm-args=-sanitizer-coverage-inline-8bit-counters -Cllvm-args=-sanitizer-coverage-pc-table -Cllvm-args=-sanitizer-coverage-trace-compares -Cdebug-assertions -Coverflow-checks"
export CARGO_TARGET_DIR="$fuzz/target"
bin="$CARGO_TARGET_DIR/$triple/release"

build() {
  # --locked: fuzz/Cargo.lock is committed. A dependency added to proto,
  # client, server or worker makes it stale; then say how to fix it.
  if ! (cd "$fuzz" && nice -n 19 cargo build --locked --release --target "$triple" --bins); then
    echo "bench/fuzz.sh: the fuzz targets did not build; if cargo said the lock file needs updating, run (cd fuzz && cargo update --workspace) and commit fuzz/Cargo.lock" >&2
    return 1
  fi
}

case "${1:-}" in
  --build)
    build
    exit 0
    ;;
  --seeds)
    build
    nice -n 19 "$bin/seeds"
    exit 0
    ;;
  ''|-h|--help)
    sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac

seconds="$1"
shift
if ! [[ "$seconds" =~ ^[0-9]+$ ]] || [ "$seconds" -lt 1 ]; then
  echo "bench/fuzz.sh: SECONDS must be a positive whole number, got '$seconds'" >&2
  exit 2
fi
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all[@]}")
for t in "${targets[@]}"; do
  if [[ ! " ${all[*]} " =~ " $t " ]]; then
    echo "bench/fuzz.sh: unknown target '$t' (targets: ${all[*]})" >&2
    exit 2
  fi
done

build

logs="$fuzz/target/logs"
mkdir -p "$logs"

# One target: fuzz for the budget, then minimize its corpus in place.
run_one() {
  local t="$1" corpus="$fuzz/corpus/$1" artifacts="$fuzz/artifacts/$1"
  local log="$logs/$t.log" rc=0 dirs
  mkdir -p "$corpus" "$artifacts"
  dirs=("$corpus")
  if [ "${FUZZ_CORPUS_READONLY:-0}" = 1 ]; then
    # libFuzzer adds new inputs to its first directory: a scratch one.
    rm -rf "$fuzz/target/scratch-$t"
    mkdir -p "$fuzz/target/scratch-$t"
    dirs=("$fuzz/target/scratch-$t" "$corpus")
  fi
  # -max_len 4096 is libFuzzer's default; named so every run is the same.
  nice -n 19 "$bin/$t" "${dirs[@]}" \
    -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" >"$log" 2>&1 || rc=$?
  local runs cov
  runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -1)
  cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*$')
  local result=ok
  if [ "$rc" -ne 0 ]; then
    result="FAILED (exit $rc; input in fuzz/artifacts/$t/, log $log)"
  elif [ "${FUZZ_CORPUS_READONLY:-0}" != 1 ]; then
    # Keep only inputs that add coverage: merge into a fresh directory, then
    # swap it in. Edges only (-use_counters=0): an input that only changes
    # how often an edge runs is not kept, so the committed corpus stays
    # small; the next run finds those again in seconds.
    local merged="$fuzz/target/merge-$t"
    rm -rf "$merged"
    mkdir -p "$merged"
    if nice -n 19 "$bin/$t" -merge=1 -use_counters=0 -timeout=10 -rss_limit_mb=2048 -max_len=4096 \
        "$merged" "$corpus" >"$logs/$t.merge.log" 2>&1; then
      rm -rf "$corpus"
      mv "$merged" "$corpus"
    else
      result="FAILED (corpus merge; log $logs/$t.merge.log)"
      rc=1
    fi
  fi
  local files
  files=$(find "$corpus" -type f | wc -l)
  printf '%-14s %6ss %12s execs %6s cov %5s corpus files  %s\n' \
    "$t" "$seconds" "${runs:-?}" "${cov:-?}" "$files" "$result" >"$logs/$t.line"
  cat "$logs/$t.line"
  return "$rc"
}

jobs="${FUZZ_JOBS:-1}"
failed=0
pids=()
for t in "${targets[@]}"; do
  if [ "$jobs" -le 1 ]; then
    run_one "$t" || failed=1
  else
    run_one "$t" &
    pids+=($!)
    if [ ${#pids[@]} -ge "$jobs" ]; then
      wait "${pids[0]}" || failed=1
      pids=("${pids[@]:1}")
    fi
  fi
done
for p in "${pids[@]}"; do
  wait "$p" || failed=1
done
if [ "$failed" -ne 0 ]; then
  echo "bench/fuzz.sh: a target failed; its input is under fuzz/artifacts/ (reproduce: $bin/TARGET INPUT)" >&2
  exit 1
fi
