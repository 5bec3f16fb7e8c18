#!/usr/bin/env bash
# The whole test suite, as the README gives it and CI runs it:
#   1. a Python virtualenv for the tests (numpy, pytest, Pillow, cloudpickle,
#      pyarrow for the Parquet files, Hugging Face datasets for the
#      streaming test, torch, torchvision) under
#      target/test-venv, so the Pillow pixel-agreement test has
#      its reference and the Python-dataset tests run against torch's
#      default_collate instead of skipping, moto's S3 server for the
#      object-storage tests (torch from PyPI, a few GB, once:
#      skipped when already importable), and the training frameworks the
#      integrations are tested with (lightning, accelerate, transformers,
#      torchdata);
#   2. deploy/ checked offline (deploy/check.sh, about 6 s once its own
#      virtualenv under target/deploy-venv exists, 20 s the first time): the
#      Helm chart linted, rendered with each of its ci/ values files and every
#      object validated against the Kubernetes schemas; the Dockerfile's
#      stages checked statically (no container engine here);
#   3. every Rust test (`cargo test --workspace`: unit, property and
#      end-to-end tests over real loader-server / loader-worker processes),
#      with the CUDA pin-memory stage built in (feature `cuda`): cudarc
#      loads libcuda at run time, so it builds and its tests run on a
#      machine with no CUDA (the SDK's device-path tests, loaderctl's
#      `--device` tests);
#   4. a short fuzzing run (issue 21): every libFuzzer target of fuzz/ built
#      on the stable toolchain and run 10 s from the committed corpus
#      (bench/fuzz.sh; read-only corpus, so the tree is left as it was);
#      a crash, panic or hang fails the suite;
#   5. the Python SDK's tests (python/test.sh: builds `pip install ./python`
#      into the same virtualenv and runs pytest).
# Needs cargo, Python >= 3.11 with venv, and PyPI. Extra args go to cargo test.
set -euo pipefail
root="$(cd "$(dirname "$0")" && pwd)"
cd "$root"

# Each phase's time goes to the log (CI's budget is read off it).
phase() { echo "test.sh: $1 took $((SECONDS - phase_start)) s (total $SECONDS s)" >&2; phase_start=$SECONDS; }
phase_start=$SECONDS

venv="$root/target/test-venv"
if [ ! -x "$venv/bin/python" ]; then
  mkdir -p "$root/target"
  python3 -m venv "$venv"
fi
# moto[server]: a real S3 API server (moto_server) for the object-storage
# tests, with boto3 to fill its buckets.
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check numpy pytest pillow cloudpickle pyarrow datasets "moto[server]"
if ! "$venv/bin/python" -c 'import torch' >/dev/null 2>&1; then
  # No pip cache: torch and its CUDA libraries are ~3 GB that would sit
  # in ~/.cache/pip a second time (CI once ran out of disk).
  # torchvision with it (one resolve, so their versions match): the sample
  # cache's ImageFolder test.
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check --no-cache-dir torch torchvision
fi
# The training frameworks loader.integrations is tested with (tiny models
# built from configs, nothing downloaded): after torch, so they take its
# version.
if ! "$venv/bin/python" -c "import lightning, accelerate, transformers, torchdata" >/dev/null 2>&1; then
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check lightning accelerate transformers torchdata
fi

phase "the test virtualenv"
deploy/check.sh
phase "deploy/check.sh"

export LOADER_PYTHON="$venv/bin/python"
# One build for every Rust test, the CUDA pin stage's included: a second
# `cargo test -p ...` with other features would rebuild most of the tree
# (features unify per invocation). The crates build without the feature in
# the fuzz build below (loader-client without default features).
cargo test --workspace --features loader-client/cuda,loader-ctl/cuda "$@"
phase "cargo test"
FUZZ_CORPUS_READONLY=1 bench/fuzz.sh 10
phase "the fuzz build and runs"
# The wheel for the tests is built in the dev profile: it shares most of
# the dependencies built above instead of building all of them again with
# optimizations (about 8 of CI's minutes); `pip install ./python` for use
# builds the release profile as pyproject.toml says.
MATURIN_PEP517_ARGS="--profile dev" LOADER_PY_VENV="$venv" python/test.sh
phase "the Python SDK's build and tests"
