"""Python datasets in Loader's workers (``Loader.local(dataset, ...)``):
default_collate's structure and values, identical batches on any number of
workers and after a resume, one-line errors, the corrupt policy, and a
worker killed mid-epoch. Every test starts real worker processes."""

from __future__ import annotations

import json
import os
import signal
import time

import numpy as np
import pytest

import loader
from loader._dataset import seeded_sample
from sample_datasets import (
    Locked, MixedNumbers, NumpyRows, Occasional, Ragged, Raising, Slow, TorchAugmented, Variable,
    failing_collate, pad_collate,
)

torch = pytest.importorskip("torch", reason="torch is needed for default_collate and torch datasets")
from torch.utils.data import default_collate  # noqa: E402

#: Seconds any one test may iterate before it is stuck.
BOUND = 60


def snapshot(x):
    """A batch's structure with each leaf as (dtype, shape, bytes): the
    leaves are copied, so the batch's slot can go back to the workers."""
    if isinstance(x, dict):
        return {k: snapshot(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [snapshot(v) for v in x]
    assert isinstance(x, torch.Tensor), type(x)
    return (str(x.dtype), tuple(x.shape), x.numpy().tobytes())


def collect(dl, limit=None):
    out, started = [], time.monotonic()
    for batch in dl:
        out.append(snapshot(batch))
        assert time.monotonic() - started < BOUND, "stuck"
        if limit is not None and len(out) == limit:
            break
    return out


def expected(dataset, batch_size, seed=0, epoch=0):
    """What DataLoader(dataset, batch_size) with default_collate gives, with
    each sample drawn under the seeds a Loader worker uses."""
    n = len(dataset)
    return [
        snapshot(default_collate([seeded_sample(dataset, i, seed=seed, epoch=epoch)
                                  for i in range(s, min(n, s + batch_size))]))
        for s in range(0, n, batch_size)
    ]


@pytest.mark.parametrize("make", [lambda: NumpyRows(50), lambda: TorchAugmented(44)], ids=["numpy", "torch"])
def test_batches_have_default_collates_structure_and_values(make):
    dataset = make()
    with loader.Loader.local(dataset, workers=2, batch_size=8, seed=5) as dl:
        assert len(dl) == 7 if len(dataset) == 50 else 6
        got = collect(dl)
    assert got == expected(dataset, 8, seed=5)


@pytest.mark.parametrize("make", [lambda: NumpyRows(90), lambda: TorchAugmented(70)], ids=["numpy", "torch"])
def test_same_bytes_on_1_and_3_workers_and_after_a_mid_epoch_resume(make):
    dataset = make()
    args = dict(batch_size=8, shuffle=True, seed=11, epochs=2)

    def every_epoch(dl):
        out = []
        for epoch in range(dl.epoch, dl.epochs):
            dl.set_epoch(epoch)
            out.extend(collect(dl))
        return out

    with loader.Loader.local(dataset, workers=1, **args) as dl:
        one = every_epoch(dl)
    with loader.Loader.local(dataset, workers=3, **args) as dl:
        three = every_epoch(dl)
    assert one == three
    assert len(one) == 2 * len(dl)
    # Epochs differ (the permutation and the RNG seeds depend on the epoch).
    assert one[: len(dl)] != one[len(dl):]

    with loader.Loader.local(dataset, workers=2, **args) as first:
        head = collect(first, limit=5)
        state = json.loads(json.dumps(first.state_dict()))
    with loader.Loader.local(dataset, workers=3, **args) as second:
        second.load_state_dict(state)
        rest = every_epoch(second)
    assert head + rest == one


@pytest.mark.parametrize("batch_size", [2, 16])
def test_generators_drawn_from_now_and_then_give_every_sample_its_seeded_numbers(batch_size):
    # Workers seed a generator only once they saw the dataset draw from it
    # (the batch is read again then), and write strided rows through the
    # Python conversion: every sample is still what it is with every
    # generator seeded before it, on 1 and 3 workers.
    dataset = Occasional(120)
    want = expected(dataset, batch_size, seed=3)
    for workers in (1, 3):
        with loader.Loader.local(dataset, workers=workers, batch_size=batch_size, seed=3) as dl:
            assert collect(dl) == want, f"{workers} workers"


def padded(dataset, batch_size, seed, skip=()):
    """What DataLoader(dataset, batch_size, collate_fn=pad_collate) gives,
    through default_collate's conversion of the leaves to tensors, each
    sample drawn under a Loader worker's seeds; samples in ``skip`` left out."""
    n = len(dataset)
    out = []
    for s in range(0, n, batch_size):
        idx = [i for i in range(s, min(n, s + batch_size)) if i not in skip]
        batch = pad_collate([seeded_sample(dataset, i, seed=seed) for i in idx])
        out.append(snapshot({
            "x": torch.as_tensor(batch["x"]),
            "lengths": torch.as_tensor(batch["lengths"]),
            # A list of numbers stays a list: one 0-d tensor per number.
            "labels": [torch.as_tensor(label) for label in batch["labels"]],
        }))
    return out


def test_a_collate_fn_runs_in_the_workers_and_its_batches_may_change_shape():
    dataset = Variable(48)
    want = padded(dataset, 8, seed=4, skip={9})
    # Shapes vary from batch to batch; the lengths say so.
    assert len({b["x"][1] for b in want}) > 1
    for workers in (1, 3):
        with loader.Loader.local(
            dataset, workers=workers, batch_size=8, seed=4, collate_fn=pad_collate, on_corrupt="skip"
        ) as dl:
            assert collect(dl) == want, f"{workers} workers"


def test_a_collate_fn_that_raises_fails_the_job_in_one_line():
    with loader.Loader.local(Variable(16), workers=1, batch_size=4, collate_fn=failing_collate) as dl:
        with pytest.raises(loader.LoaderError) as e:
            collect(dl)
    message = str(e.value)
    assert "collate_fn raised on a batch of 4 samples: RuntimeError: cannot pad 4 rows" in message, message
    assert "\n" not in message


def test_a_factory_spec_is_imported_by_the_workers(monkeypatch):
    # As a deployment's workers would: the factory's module on PYTHONPATH.
    here = os.path.dirname(os.path.abspath(__file__))
    monkeypatch.setenv("PYTHONPATH", here)
    spec = {
        "dataset": {"python": {"factory": "sample_datasets:make_numpy_rows", "args": {"n": 30, "dim": 3}}},
        "batch_size": 10,
    }
    with loader.Loader.local(spec, workers=2) as dl:
        assert len(dl) == 3  # num_samples from the factory's dataset
        got = collect(dl)
    assert got == expected(NumpyRows(30, 3), 10)


def test_a_dataset_that_cannot_be_pickled_is_a_one_line_error():
    with pytest.raises(TypeError) as e:
        loader.Loader.local(Locked(), workers=1)
    message = str(e.value)
    assert "\n" not in message
    assert message.startswith("the dataset cannot be pickled to the workers (Locked)"), message
    assert "lock" in message


def test_mismatched_shapes_name_the_key_index_and_shapes():
    with loader.Loader.local(Ragged(40, odd=13), workers=2, batch_size=8) as dl:
        with pytest.raises(loader.LoaderError) as e:
            collect(dl)
    message = str(e.value)
    assert "\n" not in message
    assert '["x"] of sample 13 has shape [5] float32, sample 0 has [4] float32' in message, message


def test_an_exception_in_getitem_fails_the_job_naming_index_and_last_line():
    with loader.Loader.local(Raising(40, bad=[9]), workers=2, batch_size=4) as dl:
        with pytest.raises(loader.LoaderError) as e:
            collect(dl)
    message = str(e.value)
    assert "\n" not in message
    assert "index 9" in message and "ValueError: second line of the message" in message, message


def test_an_exception_in_getitem_under_skip_leaves_the_sample_out():
    bad = [0, 9, 10, 33]
    with loader.Loader.local(Raising(40, bad=bad), workers=3, batch_size=4, on_corrupt="skip") as dl:
        got = [b["i"].tolist() for b in dl]
        # The workers lived on: a second epoch-sized pass is not needed,
        # but they still answer.
        assert all(loader_alive(p) for p in dl.worker_pids())
    assert len(got) == 10
    assert sorted(i for batch in got for i in batch) == [i for i in range(40) if i not in bad]
    assert got[2] == [8, 11]  # batch 2 held 8..11; 9 and 10 were skipped


def loader_alive(pid: int) -> bool:
    from conftest import alive

    return alive(pid)


def test_worker_sigkill_mid_epoch_still_delivers_each_sample_once():
    with loader.Loader.local(Slow(240), workers=3, batch_size=8, prefetch=2) as dl:
        seen, pids, started = [], None, time.monotonic()
        for k, batch in enumerate(dl):
            if pids is None:
                pids = dl.worker_pids()
            seen.extend(batch["i"].tolist())
            if k == 4:
                os.kill(pids[0], signal.SIGKILL)
            assert time.monotonic() - started < BOUND, "stuck after the worker died"
    assert seen == list(range(240))


def test_dataset_arguments_are_refused_with_a_job_spec():
    spec = {"dataset": {"synthetic": {"num_samples": 8, "shape": [2], "dtype": "uint8"}}, "batch_size": 4}
    with pytest.raises(TypeError, match="batch_size: only for a dataset"):
        loader.Loader.local(spec, batch_size=4)


def test_a_dataset_defined_in_main_goes_by_value(child):
    pytest.importorskip("cloudpickle")
    script = """
import numpy as np
import loader

class Squares:
    def __len__(self):
        return 20
    def __getitem__(self, i):
        return np.array([i * i], dtype=np.int64)

with loader.Loader.local(Squares(), workers=2, batch_size=6) as dl:
    print("sum", sum(int(b.sum()) for b in dl), flush=True)
"""
    c = child(script)
    assert int(c.expect("sum", timeout=BOUND)) == sum(i * i for i in range(20))
    assert c.wait(BOUND) == 0, c.stderr()


def test_seed_rngs_false_serves_the_same_deterministic_samples():
    with loader.Loader.local(Raising(40, bad=[]), workers=2, batch_size=8, seed_rngs=False) as dl:
        got = [b["i"].tolist() for b in dl]
    assert got == [list(range(s, s + 8)) for s in range(0, 40, 8)]


def test_a_number_of_another_type_is_a_mismatch_not_a_reinterpretation():
    with loader.Loader.local(MixedNumbers(24, odd=5), workers=1, batch_size=4) as dl:
        with pytest.raises(loader.LoaderError) as e:
            collect(dl)
    assert '["y"] of sample 5 has shape [] float64, sample 0 has [] int64' in str(e.value), str(e.value)


@pytest.mark.parametrize("context", [None, "spawn"], ids=["forked", "spawned"])
def test_get_worker_info_and_worker_init_fn_answer_as_in_dataloader_workers(context):
    from sample_datasets import WorkerInfoRows, mark_worker

    with loader.Loader.local(
        WorkerInfoRows(64), workers=2, batch_size=4, seed=7, worker_init_fn=mark_worker, multiprocessing_context=context
    ) as dl:
        rows = np.concatenate([np.asarray(b) for b in dl])
    assert sorted(rows[:, 0]) == list(range(64))
    ids = set(rows[:, 1].tolist())
    assert ids <= {0, 1} and ids, ids
    assert (rows[:, 2] == 2).all(), "num_workers"
    assert (rows[:, 3] == 7 + rows[:, 1]).all(), "seed: the job's seed plus the id"
    assert (rows[:, 4] == 1).all(), "dataset: the worker's own copy, the one asked"
    assert (rows[:, 5] == 100 + rows[:, 1]).all(), "worker_init_fn(worker_id) ran in each worker before its samples"


def test_a_worker_init_fn_that_is_not_callable_is_refused_at_once():
    from sample_datasets import WorkerInfoRows

    with pytest.raises(TypeError, match="worker_init_fn must be callable"):
        loader.Loader.local(WorkerInfoRows(8), workers=1, worker_init_fn=3)
