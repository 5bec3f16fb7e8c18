"""Iterable datasets through Loader (``loader._stream``): a stream in 7
uneven shards on 1 and 3 workers and on 3 ranks of a deployment, every
sample once per epoch and equal batch counts per rank; a worker SIGKILLed
mid-shard; a resume mid-epoch on another number of workers; a dataset
written for DataLoader that splits itself by ``get_worker_info()``; a
Hugging Face ``IterableDataset`` over Parquet files written here; and the
one-line errors. Each test bounds its own time."""

from __future__ import annotations

import collections
import math
import os
import pathlib
import signal
import subprocess
import sys

import numpy as np
import pytest

import loader
from conftest import SERVER, read_line, wait_gone
from sample_streams import SIZES, CountedShardy, LoggedShardy, SeekingShardy, Shardy

N = sum(SIZES)
TESTS = pathlib.Path(__file__).resolve().parent


def ids(batch) -> list[int]:
    return [int(i) for i in np.asarray(batch["id"]).reshape(-1)]


def epochs_of(dl, epochs: int) -> list[list[list[int]]]:
    """Each epoch's batches as lists of ids."""
    return [[ids(b) for b in dl] for _ in range(epochs)]


def shard_of(i: int) -> int:
    return next(s for s in range(len(SIZES)) if sum(SIZES[: s + 1]) > i)


@pytest.mark.parametrize("workers", [1, 3])
def test_every_sample_once_per_epoch_shards_read_in_order(workers):
    with loader.Loader.local(Shardy(), workers=workers, batch_size=4, shuffle=True, seed=7, epochs=2) as dl:
        assert len(dl) == math.ceil(N / 4)
        got = epochs_of(dl, 2)
    orders = []
    for epoch, batches in enumerate(got):
        assert len(batches) == math.ceil(N / 4)
        order = [i for b in batches for i in b]
        assert sorted(order) == list(range(N)), f"epoch {epoch}: {order}"
        orders.append(order)
    assert orders[0] != orders[1], "shuffled anew each epoch"


def test_without_shuffle_a_single_lane_reads_the_shards_in_order():
    with loader.Loader.local(Shardy(), workers=1, batch_size=5) as dl:
        order = [i for b in dl for i in ids(b)]
    assert order == list(range(N))


def test_a_shuffle_buffer_keeps_samples_near_their_place_in_the_shard():
    with loader.Loader.local(Shardy(), workers=2, batch_size=4, shuffle=True, shuffle_buffer=4, seed=1) as dl:
        order = [i for b in dl for i in ids(b)]
    assert sorted(order) == list(range(N))
    # Each shard's samples come in runs of windows of 4: a sample's
    # window (its offset // 4) never goes back.
    by_shard = collections.defaultdict(list)
    for i in order:
        s = shard_of(i)
        by_shard[s].append((i - sum(SIZES[:s])) // 4)
    for s, windows in by_shard.items():
        assert windows == sorted(windows), f"shard {s}: {windows}"
    assert order != sorted(order)


def test_the_generators_draws_are_the_same_on_any_number_of_workers():
    runs = []
    for workers in (1, 3):
        with loader.Loader.local(Shardy(), workers=workers, batch_size=4, shuffle=True, seed=2, epochs=2) as dl:
            runs.append({int(i): float(n) for _ in range(2) for b in dl for i, n in zip(ids(b), np.asarray(b["noise"]).reshape(-1))})
    # Per sample, not per position: lanes differ with the workers, the
    # draws of a shard's iterator do not.
    assert runs[0].keys() == runs[1].keys()


def test_a_seeking_dataset_is_not_read_twice(tmp_path):
    log = tmp_path / "yielded"
    # One pass (epochs=1): unbounded, the workers would read on into the
    # next pass while the trainer finishes this one.
    with loader.Loader.local(SeekingShardy(str(log)), workers=3, batch_size=4, shuffle=True, shuffle_buffer=0, seed=4, epochs=1) as dl:
        order = [i for b in dl for i in ids(b)]
    assert sorted(order) == list(range(N))
    yielded = [int(x) for x in log.read_text().split()]
    # Each sample once, but for sample 0 (the schema: the trainer's and
    # each worker's) and a backup copy of a late batch now and then: no
    # counting pass (the lengths were given), no skips (it seeks), which
    # would read a shard's samples again.
    counts = collections.Counter(yielded)
    assert sorted(counts) == list(range(N))
    assert sum(counts.values()) - N < N // 2, counts.most_common(5)


def test_workers_keep_to_their_lanes_so_a_stream_that_cannot_seek_is_read_about_once(tmp_path):
    # A stream that cannot start mid-shard: a worker handed another lane's
    # batches would read that lane's shard up to them. The coordinator
    # keeps each worker to its lane; only at the end of the epoch, when
    # lanes run out unevenly, does a worker read into another's.
    log = tmp_path / "yielded"
    sizes = [4 * n for n in SIZES]
    with loader.Loader.local(LoggedShardy(str(log), sizes=sizes), workers=3, batch_size=4, shuffle=True, shuffle_buffer=0, seed=1, epochs=1) as dl:
        order = [i for b in dl for i in ids(b)]
    assert sorted(order) == list(range(sum(sizes)))
    reads = len(log.read_text().split())
    # Each worker reading every lane would be 3x (no lanes: every worker
    # reads every shard up to its batches). With lanes it is about 1x: 1.18x
    # in 6 of 6 runs on an idle 2-core machine, 1.18-1.20x with two busy
    # loops beside it. On CI's (3 Python workers starting seconds apart) the
    # first ones took the tail of a late starter's lane, reading that shard
    # up to it: 1.52x once. Halfway to 3x tells lanes from no lanes either way.
    assert reads < 2 * sum(sizes), reads


def test_a_worker_killed_mid_shard_loses_and_repeats_nothing():
    with loader.Loader.local(Shardy(delay=0.01), workers=3, batch_size=2, shuffle=True, seed=9, epochs=2) as dl:
        got = []
        killed = None
        for _ in range(2):
            for b in dl:
                got.append(ids(b))
                if len(got) == 8:
                    pids = dl.worker_pids()
                    assert len(pids) == 3
                    killed = pids[1]
                    os.kill(killed, signal.SIGKILL)
        assert wait_gone([killed], 5) == []
    per_epoch = math.ceil(N / 2)
    assert len(got) == 2 * per_epoch
    for epoch in range(2):
        order = [i for b in got[epoch * per_epoch : (epoch + 1) * per_epoch] for i in b]
        assert sorted(order) == list(range(N)), f"epoch {epoch}"


def test_a_resume_mid_epoch_on_another_number_of_workers_delivers_exactly_the_rest():
    with loader.Loader.local(Shardy(), workers=3, batch_size=4, shuffle=True, seed=5, epochs=2) as dl:
        whole = epochs_of(dl, 2)
    with loader.Loader.local(Shardy(), workers=3, batch_size=4, shuffle=True, seed=5, epochs=2) as dl:
        first = []
        for b in dl:
            first.append(ids(b))
            if len(first) == 9:
                break
        state = dl.state_dict()
    with loader.Loader.local(Shardy(), workers=1, batch_size=4, shuffle=True, seed=5, epochs=2) as dl:
        dl.load_state_dict(state)
        rest = [ids(b) for b in dl]
        second = [ids(b) for b in dl]
    assert first + rest == whole[0], "the rest of the epoch, in the same order"
    assert second == whole[1]


def test_a_dataset_written_for_dataloader_is_split_as_dataloader_splits_it():
    torch = pytest.importorskip("torch")
    from sample_streams import WorkerSplit

    with loader.Loader.local(WorkerSplit(50), workers=3, batch_size=4) as dl:
        got = [i for b in dl for i in ids(b)]
    assert sorted(got) == list(range(50))
    reference = torch.utils.data.DataLoader(WorkerSplit(50), batch_size=4, num_workers=3)
    assert sorted(int(i) for b in reference for i in b["id"]) == sorted(got)
    # This process's get_worker_info() is untouched.
    assert torch.utils.data.get_worker_info() is None


def test_a_hugging_face_iterable_dataset_over_parquet_files(tmp_path):
    datasets = pytest.importorskip("datasets", reason="Hugging Face datasets")
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    files, first = [], 0
    for n, rows in enumerate((11, 4, 17, 9)):
        i = np.arange(first, first + rows)
        first += rows
        path = tmp_path / f"part-{n}.parquet"
        pq.write_table(pa.table({"id": i, "x": pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(i, 2).astype(np.float32)), 2)}), path)
        files.append(str(path))
    ds = datasets.load_dataset("parquet", data_files=files, split="train", streaming=True).with_format("numpy")
    with loader.Loader.local(ds, workers=2, batch_size=8, shuffle=True, seed=3, epochs=2) as dl:
        got = epochs_of(dl, 2)
        assert len(dl) == math.ceil(first / 8)
    for batches in got:
        assert sorted(i for b in batches for i in b) == list(range(first))


@pytest.mark.skipif(not SERVER.exists(), reason=f"no loader-server at {SERVER} (cargo build --workspace builds it)")
def test_three_ranks_of_a_deployment_get_equal_batches_and_every_sample_once():
    server = subprocess.Popen(
        [str(SERVER), "--listen", "127.0.0.1:0", "--lease-ttl-ms", "3000"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    workers = []
    try:
        url = "http://" + read_line(server, "listening ", 30)
        env = dict(os.environ, PYTHONPATH=str(TESTS))
        for _ in range(2):
            w = subprocess.Popen(
                [sys.executable, "-m", "loader._worker", "--coordinator", url, "--listen", "127.0.0.1:0"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
            )
            workers.append(w)
            read_line(w, "listening ", 60)
        spec = {
            "name": "stream-ranks",
            "dataset": {"python": {"factory": "sample_streams:shardy", "args": {}}},
            "batch_size": 4,
            "epochs": 2,
            "sampler": {"shuffle": True, "seed": 3, "lanes": 3},
        }
        per_rank = []
        for rank in range(3):
            with loader.Loader(url, spec, rank=rank, world_size=3, shared_memory=False, coordinator_timeout=60.0) as dl:
                per_rank.append(epochs_of(dl, 2))
        for epoch in range(2):
            counts = [len(r[epoch]) for r in per_rank]
            assert counts == [math.ceil(math.ceil(N / 3) / 4)] * 3, counts
            seen = collections.Counter(i for r in per_rank for b in r[epoch] for i in b)
            assert sorted(seen) == list(range(N)), f"epoch {epoch}"
            # DistributedSampler's padding: 83 samples on 3 ranks, one repeat.
            assert sum(seen.values()) == 3 * math.ceil(N / 3)
    finally:
        for p in workers + [server]:
            p.kill()
            p.wait(10)


def test_a_stream_that_raises_fails_in_one_line_when_counted_and_when_read():
    with pytest.raises(loader.LoaderError) as e:
        loader.Loader.local(Shardy(fail_at=20), workers=2, batch_size=4)
    message = str(e.value)
    assert message.startswith("counting the iterable dataset's shards: ") and "shard 2 raised after 5 samples" in message, message
    assert "disk error at 20" in message and "\n" not in message.strip(), message
    # With the lengths given, no count: the read fails the job.
    with loader.Loader.local(CountedShardy(fail_at=20), workers=2, batch_size=4) as dl:
        with pytest.raises(loader.LoaderError) as e:
            for _ in dl:
                pass
    message = str(e.value)
    assert "shard 2, sample 5: OSError: disk error at 20" in message and "\n" not in message.strip(), message


def test_streams_that_cannot_be_sharded_are_refused_in_one_line():
    class NoShards(Shardy):
        def __loader_shards__(self):
            return 0

    with pytest.raises(ValueError, match=r"^the iterable dataset cannot be read as shards: __loader_shards__\(\) must return"):
        loader.Loader.local(NoShards(), workers=1)
    with pytest.raises(TypeError, match="shuffle_buffer: only for an iterable dataset"):
        loader.Loader.local(list(range(4)), workers=1, shuffle_buffer=3)
    with pytest.raises(TypeError, match="shuffle_buffer: give shuffle=True too"):
        loader.Loader.local(Shardy(), workers=1, shuffle_buffer=3)
    # A deployment's spec says the same, before any call to the coordinator.
    spec = {"dataset": {"python": {"factory": "sample_streams:shardy", "args": {}}}, "batch_size": 4, "sampler": {"shuffle_buffer": 3}}
    with pytest.raises(ValueError, match=r"^sampler.shuffle_buffer: give sampler.shuffle: true too"):
        loader.Loader("http://127.0.0.1:1", spec, rank=0, world_size=1)
