"""Datasets of any size: the pickled dataset travels as a blob beside the job
spec (written into the host's blob directory, uploaded to the coordinator in
1 MiB chunks, fetched once per worker host), not inside it. Each test
bounds its own time and stops what it started."""

from __future__ import annotations

import hashlib
import os
import pathlib
import pickle
import re
import subprocess
import sys
import time

import numpy as np
import pytest

import loader
from loader import _native
from conftest import read_line

TESTS = pathlib.Path(__file__).resolve().parent

SERVER = pathlib.Path(
    os.environ.get("LOADER_SERVER", TESTS.parents[1] / "target" / "debug" / "loader-server")
)

#: 50,000 rows of 4 KiB: a ~205 MB array, so a ~205 MB pickle.
ROWS, ROW_BYTES = 50_000, 4096


class BigArray:
    """A map-style dataset holding one large array in memory (as a dataset
    of decoded features or tokens does): its pickle is the array's size.
    Each sample is one row and its index."""

    def __init__(self, rows: int = ROWS, row_bytes: int = ROW_BYTES, seed: int = 3) -> None:
        self.data = np.random.default_rng(seed).integers(0, 256, size=(rows, row_bytes), dtype=np.uint8)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int):
        return {"row": self.data[i], "index": i}


@pytest.fixture(scope="module")
def big() -> BigArray:
    return BigArray()


def check_every_sample(batches, dataset: BigArray) -> None:
    """Every index exactly once, each with its row's bytes."""
    seen = np.zeros(len(dataset), dtype=np.int64)
    for batch in batches:
        index = np.asarray(batch["index"])
        rows = np.asarray(batch["row"])
        assert rows.shape == (len(index), dataset.data.shape[1])
        assert np.array_equal(rows, dataset.data[index]), "a row arrived with other bytes"
        np.add.at(seen, index, 1)
    assert (seen == 1).all(), f"{int((seen == 0).sum())} samples missing, {int((seen > 1).sum())} repeated"


def blobs_in(directory: str) -> set[str]:
    return {n for n in os.listdir(directory) if re.fullmatch(r"[0-9a-f]{64}", n)}


def test_a_dataset_that_pickles_to_200_mb_runs_on_local_workers(big):
    directory = _native.blob_dir()
    before = blobs_in(directory)
    started = time.monotonic()
    with loader.Loader.local(big, workers=2, batch_size=1000, shuffle=True, ready_timeout=60.0) as dl:
        written = blobs_in(directory) - before
        assert len(written) == 1, written
        (sha,) = written
        assert os.path.getsize(os.path.join(directory, sha)) > ROWS * ROW_BYTES
        check_every_sample(dl, big)
    # The trainer removes the file it wrote when the loader closes.
    assert sha not in blobs_in(directory)
    assert time.monotonic() - started < 120


def test_loaders_of_one_dataset_share_its_file_until_the_last_closes():
    small = BigArray(rows=64, row_bytes=16)
    directory = _native.blob_dir()
    before = blobs_in(directory)
    first = loader.Loader.local(small, workers=1, batch_size=16)
    second = loader.Loader.local(small, workers=1, batch_size=16)
    try:
        (sha,) = blobs_in(directory) - before
        first.close()
        assert sha in blobs_in(directory), "the second loader still needs it"
        check_every_sample(second, small)
    finally:
        first.close()
        second.close()
    assert sha not in blobs_in(directory)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.skipif(not SERVER.exists(), reason=f"no loader-server at {SERVER} (cargo build --workspace builds it)")
def test_a_pickle_file_spec_runs_on_a_remote_worker_that_fetches_it(big, tmp_path):
    # A spec written by hand: the dataset pickled plainly into a file of
    # the trainer's; the worker imports its class from PYTHONPATH.
    pickled = tmp_path / "dataset.pkl"
    with open(pickled, "wb") as f:
        pickle.dump(big, f, protocol=pickle.HIGHEST_PROTOCOL)
    sha = hashlib.sha256(pickled.read_bytes()).hexdigest()
    worker_blobs = tmp_path / "worker-blobs"  # a fresh host: it must fetch
    spec = {
        "dataset": {"python": {"pickle_file": str(pickled), "num_samples": len(big)}},
        "batch_size": 1000,
        "sampler": {"shuffle": True, "seed": 1},
    }
    server = subprocess.Popen(
        [str(SERVER), "--listen", "127.0.0.1:0", "--lease-ttl-ms", "3000"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    worker = None
    try:
        url = "http://" + read_line(server, "listening ", 30)
        env = dict(os.environ, LOADER_BLOB_DIR=str(worker_blobs), PYTHONPATH=str(TESTS))
        worker = subprocess.Popen(
            [sys.executable, "-m", "loader._worker", "--coordinator", url, "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env, cwd=str(tmp_path),
        )
        read_line(worker, "listening ", 60)
        with loader.Loader(url, spec, shared_memory=False, coordinator_timeout=60.0) as dl:
            check_every_sample(dl, big)
        # The worker fetched the blob into its host's directory, whole.
        fetched = worker_blobs / sha
        assert fetched.exists(), sorted(os.listdir(worker_blobs))
        assert fetched.stat().st_size == pickled.stat().st_size
        assert fetched.stat().st_mode & 0o777 == 0o400
    finally:
        if worker is not None:
            stop(worker)
        stop(server)
