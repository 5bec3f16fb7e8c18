"""Iterating a local job: contents, len(), epochs and set_epoch, spec forms,
and one-line errors for bad input."""

import json

import numpy as np
import pytest

import loader
from conftest import alive, expected_data, synthetic


def test_local_job_yields_every_sample_with_its_contents():
    spec = synthetic(num_samples=100, shape=(3, 4), batch_size=16)
    with loader.Loader.local(spec, workers=2) as dl:
        assert len(dl) == 7
        seen = []
        for i, batch in enumerate(dl):
            assert batch.index_in_epoch == i and batch.epoch == 0 and batch.seq == i
            assert set(batch.keys()) == {"data", "label"} and "data" in batch
            data, label = batch["data"], batch["label"]
            assert isinstance(data, np.ndarray) and data.dtype == np.uint8
            assert data.shape == (len(batch.indices), 3, 4)
            assert label.dtype == np.int64 and label.tolist() == batch.indices
            for row, index in zip(data, batch.indices):
                assert row.tobytes() == expected_data(index, 12)
            seen.extend(batch.indices)
        assert sorted(seen) == list(range(100))
        assert dl.epoch == 1


def test_batch_is_a_read_only_mapping():
    with loader.Loader.local(synthetic(num_samples=8, batch_size=4), workers=1) as dl:
        batch = next(iter(dl))
        assert isinstance(batch, loader.Batch)
        from collections.abc import Mapping

        assert isinstance(batch, Mapping)
        assert batch["data"] is batch["data"], "arrays are cached"
        assert dict(batch.items()).keys() == {"data", "label"}
        assert list(batch) == ["data", "label"] and len(batch) == 2
        assert batch.get("nope") is None
        with pytest.raises(KeyError):
            batch["nope"]
        arr = batch["data"]
        assert not arr.flags.writeable
        with pytest.raises(ValueError):
            arr[0, 0, 0] = 1
        copy = np.array(arr)
        copy[0, 0, 0] = 1  # a copy is the user's own
        assert "Batch(epoch=0" in repr(batch)


def test_epochs_follow_set_epoch_like_distributed_sampler():
    spec = synthetic(num_samples=40, batch_size=8, epochs=3, shuffle=True, seed=7)
    with loader.Loader.local(spec, workers=2) as dl:
        assert (len(dl), dl.epochs) == (5, 3)
        orders = []
        for epoch in range(3):
            dl.set_epoch(epoch)
            batches = [(b.epoch, b.indices) for b in dl]
            assert len(batches) == len(dl)
            assert all(e == epoch for e, _ in batches)
            orders.append([i for _, idx in batches for i in idx])
        assert all(sorted(o) == list(range(40)) for o in orders)
        assert orders[0] != orders[1], "each epoch has its own permutation"
        with pytest.raises(loader.LoaderError, match="all 3 epochs"):
            iter(dl)
        # Repeating an epoch restarts there and repeats it exactly.
        dl.set_epoch(1)
        assert [i for b in dl for i in b.indices] == orders[1]
        with pytest.raises(ValueError, match="outside the job's 3 epochs"):
            dl.set_epoch(3)


def recording_starts(dl):
    """The worker pids of every start of ``dl`` from now on, in a list that
    grows as it starts. Each start of a local loader is a new coordinator
    and new worker processes, so one entry means nothing started twice."""
    starts = []
    start = dl._start

    def recorded(*args):
        native = start(*args)
        starts.append(native.worker_pids())
        return native

    dl._start = recorded
    return starts


@pytest.mark.parametrize("epoch", [0, 2])
def test_set_epoch_before_the_first_iteration_starts_there_once(epoch):
    spec = synthetic(num_samples=40, batch_size=8, epochs=4, shuffle=True, seed=7)
    with loader.Loader.local(spec, workers=2) as dl:
        reference = []
        for e in range(4):
            dl.set_epoch(e)
            reference.append([(b.epoch, b.seq, b.indices) for b in dl])
    with loader.Loader.local(spec, workers=2) as dl:
        starts = recording_starts(dl)
        dl.set_epoch(epoch)
        assert starts == [] and dl.worker_pids() == [], "set_epoch only records the epoch"
        assert [(b.epoch, b.seq, b.indices) for b in dl] == reference[epoch]
        assert len(starts) == 1, f"started {len(starts)} times: {starts}"
        pids = starts[0]
        assert len(pids) == 2 and dl.worker_pids() == pids and all(alive(p) for p in pids)
        # The next epoch in sequence continues on the same workers.
        dl.set_epoch(epoch + 1)
        assert [(b.epoch, b.seq, b.indices) for b in dl] == reference[epoch + 1]
        assert len(starts) == 1 and dl.worker_pids() == pids


def test_set_epoch_after_load_state_dict_starts_there_once():
    spec = synthetic(num_samples=40, batch_size=8, epochs=3, shuffle=True, seed=7)
    with loader.Loader.local(spec, workers=1) as dl:
        reference = [[(b.seq, b.indices) for b in (dl.set_epoch(e) or dl)] for e in range(3)]
        dl.set_epoch(1)
        next(iter(dl))
        state = dl.state_dict()  # mid-way through epoch 1
    for epoch in (0, 2):
        with loader.Loader.local(spec, workers=1) as dl:
            dl.load_state_dict(state)
            starts = recording_starts(dl)
            dl.set_epoch(epoch)
            assert [(b.seq, b.indices) for b in dl] == reference[epoch]
            assert len(starts) == 1, f"started {len(starts)} times: {starts}"


def test_break_then_for_starts_the_next_pass_whole():
    with loader.Loader.local(synthetic(num_samples=40, batch_size=8, epochs=3), workers=1) as dl:
        for batch in dl:
            if batch.index_in_epoch == 1:
                break
        assert [(b.epoch, b.index_in_epoch) for b in dl] == [(1, i) for i in range(5)]
        assert [b.epoch for b in dl] == [2] * 5


def test_spec_as_dict_file_or_text(tmp_path):
    spec = synthetic(num_samples=10, batch_size=5)
    path = tmp_path / "job.json"
    path.write_text(json.dumps(spec))
    yaml = tmp_path / "job.yaml"
    yaml.write_text(
        "dataset: {synthetic: {num_samples: 10, shape: [2], dtype: uint8}}\n"
        "batch_size: 5\n"
    )
    for job in (spec, str(path), path, json.dumps(spec), yaml):
        dl = loader.Loader.local(job, workers=1)
        assert len(dl) == 2
        assert [i for b in dl for i in b.indices] == list(range(10))
        dl.close()


def test_bad_input_is_a_one_line_error(tmp_path):
    bad = synthetic()
    bad["batch_size"] = 0
    with pytest.raises(ValueError) as e:
        loader.Loader.local(bad, workers=1)
    assert "batch_size" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ValueError, match="at least one worker"):
        loader.Loader.local(synthetic(), workers=0)
    with pytest.raises(ValueError, match="missing.json"):
        loader.Loader.local(str(tmp_path / "missing.json"), workers=1)
    with pytest.raises(ValueError, match="bogus"):
        loader.Loader.local({**synthetic(), "bogus": 1}, workers=1)
    with pytest.raises(ValueError, match="rank 2 is outside world size 2"):
        loader.Loader("127.0.0.1:1", synthetic(), rank=2, world_size=2)
    with pytest.raises(TypeError):
        loader.Loader.local(42, workers=1)
    dl = loader.Loader.local(synthetic(), workers=1)
    with pytest.raises(ValueError, match="invalid loader state"):
        dl.load_state_dict({"format": 1})
    dl.close()
    with pytest.raises(loader.LoaderError, match="closed"):
        iter(dl)


def test_unreachable_coordinator_is_a_loader_error():
    dl = loader.Loader("127.0.0.1:1", synthetic())
    with pytest.raises(loader.LoaderError) as e:
        next(iter(dl))
    assert "127.0.0.1:1" in str(e.value) and "\n" not in str(e.value)
