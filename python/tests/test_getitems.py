"""Datasets with DataLoader's batched fetch (``__getitems__``, as Hugging
Face ``datasets`` implement it) are read one call per batch, as DataLoader
reads them, unless they draw random numbers: then each sample is read
seeded, exactly as without ``__getitems__``."""

from __future__ import annotations

import numpy as np

import loader
from loader._dataset import seeded_sample
from sample_datasets import Batched


def _all(dl):
    out = {}
    for batch in dl:
        for k, i in enumerate(batch["i"].tolist()):
            out[i] = (int(batch["via"][k]), batch["x"][k].numpy().copy())
    return out


def test_a_dataset_with_getitems_is_read_a_batch_at_a_time():
    with loader.Loader.local(Batched(), workers=2, batch_size=8, shuffle=True) as dl:
        got = _all(dl)
    assert sorted(got) == list(range(96))
    for i, (_, x) in got.items():
        assert np.array_equal(x, np.full(4, i, dtype=np.float32))
    assert {via for via, _ in got.values()} == {1}, "every batch came from __getitems__"


def test_a_dataset_with_getitems_that_draws_is_seeded_per_sample():
    ds = Batched(draws=True)
    with loader.Loader.local(ds, workers=2, batch_size=8, shuffle=True, seed=3) as dl:
        got = _all(dl)
    assert sorted(got) == list(range(96))
    for i, (_, x) in got.items():
        want = seeded_sample(ds, i, seed=3, epoch=0)["x"]
        assert np.array_equal(x, want), f"sample {i}: {x} != {want}"
