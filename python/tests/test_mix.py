"""``loader.Mix``: a Python dataset mixed with a built-in tokens source in
real worker processes. Each row says which source and which sample it is,
so the proportions of every batch and each source's passes are read off
what the trainer got. Each test bounds its own time."""

from __future__ import annotations

import collections

import numpy as np
import pytest

import loader
from sample_datasets import NumpyRows, Windows

BASE = 1_000_000


def token_file(tmp_path, n: int, base: int = BASE) -> str:
    """A uint32 token file whose window i (context 1) starts with base + i."""
    path = tmp_path / f"tokens-{n}-{base}.bin"
    np.arange(base, base + n + 1, dtype=np.uint32).tofile(path)
    return str(path)


def tokens_entry(path: str) -> dict:
    return {"tokens": {"path": path, "dtype": "uint32", "context_length": 1}}


def rows(batch) -> list[tuple[int, int]]:
    """(source by content, index) of each row of a collated batch."""
    first = np.asarray(batch["tokens"])[:, 0].tolist()
    return [(int(t >= BASE), int(t % BASE)) for t in first]


def test_a_python_dataset_mixed_with_a_tokens_file(tmp_path):
    small, large = 300, 2_000
    mix = loader.Mix(
        {"py": Windows(small), "file": tokens_entry(token_file(tmp_path, large))},
        weights={"py": 0.25, "file": 0.75},
        samples_per_epoch=1_600,
        source_field="source",
    )
    seen = []
    with loader.Loader.local(mix, workers=2, batch_size=32, shuffle=True, seed=3, epochs=2) as dl:
        assert len(dl) == 50
        for epoch in range(2):
            dl.set_epoch(epoch)
            for batch in dl:
                assert set(batch) == {"tokens", "source"}, "default_collate's dict, with the source field"
                got = rows(batch)
                assert np.asarray(batch["source"]).tolist() == [k for k, _ in got], "the field names the row's source"
                count = collections.Counter(k for k, _ in got)
                assert abs(count[0] - 8) <= 1 and abs(count[1] - 24) <= 1, f"a batch of 32 at 1:3, got {count}"
                seen += got
    assert len(seen) == 3_200
    # The Python source (300 samples) drew 800 times: two whole passes and
    # a part, each sample once per pass.
    py = [i for k, i in seen if k == 0]
    assert len(py) == 800
    by_count = collections.Counter(collections.Counter(py).values())
    assert set(by_count) <= {2, 3} and by_count[3] == 800 - 2 * small, by_count
    assert sorted(set(py)) == list(range(small))
    files = [i for k, i in seen if k == 1]
    assert max(collections.Counter(files).values()) == 2 and len(files) == 2_400


def test_the_same_batches_on_one_and_three_workers(tmp_path):
    path = token_file(tmp_path, 500)
    runs = []
    for workers in (1, 3):
        mix = loader.Mix({"py": Windows(120), "file": tokens_entry(path)}, weights=[1, 2])
        with loader.Loader.local(mix, workers=workers, batch_size=16, shuffle=True, seed=9) as dl:
            runs.append([rows(b) for b in dl])
    assert runs[0] == runs[1]
    # The default epoch: until the larger-weight source was drawn once
    # whole (500 at 2/3: 750 positions).
    assert sum(len(b) for b in runs[0]) == 750


def test_built_in_sources_alone_yield_batches(tmp_path):
    a, b = token_file(tmp_path, 400, base=0), token_file(tmp_path, 400)
    mix = loader.Mix({"a": tokens_entry(a), "b": tokens_entry(b)}, samples_per_epoch=256)
    with loader.Loader.local(mix, workers=2, batch_size=64) as dl:
        batches = list(dl)
    assert len(batches) == 4
    for batch in batches:
        first = np.asarray(batch["tokens"])[:, 0]
        assert (first >= BASE).sum() == 32, "half of every batch from each file"


def test_sources_that_do_not_collate_fail_in_one_line(tmp_path):
    mix = loader.Mix({"narrow": Windows(50), "wide": Windows(50, width=3)})
    with loader.Loader.local(mix, workers=1, batch_size=8) as dl:
        with pytest.raises(loader.LoaderError) as e:
            next(iter(dl))
    message = str(e.value)
    assert "`narrow` and `wide` do not collate" in message and "\n" not in message, message


def test_bad_mixtures_are_refused_before_anything_starts(tmp_path):
    with pytest.raises(ValueError, match="unknown sources"):
        loader.Mix({"a": Windows(5)}, weights={"b": 1.0})
    with pytest.raises(ValueError, match="2 weights for 1 sources"):
        loader.Mix({"a": Windows(5)}, weights=[1, 2])
    with pytest.raises(TypeError, match="map-style dataset or a spec's dataset entry"):
        loader.Mix({"a": 42})
    with pytest.raises(ValueError, match="at least one source"):
        loader.Mix({})
    with pytest.raises(ValueError, match=r"weight: must be a finite number >= 0"):
        with loader.Loader.local(loader.Mix({"a": Windows(5), "b": NumpyRows(5)}, weights=[1, -1]), workers=1):
            pass


def test_new_weights_at_a_resume(tmp_path):
    a, b = token_file(tmp_path, 600, base=0), token_file(tmp_path, 600)
    sources = {"a": tokens_entry(a), "b": tokens_entry(b)}
    args = dict(workers=2, batch_size=20, shuffle=True, seed=4)
    before = []
    with loader.Loader.local(loader.Mix(sources, weights=[0.5, 0.5], samples_per_epoch=400), **args) as dl:
        for batch in dl:
            before.append(rows(batch))
            if len(before) == 7:
                break
        state = dl.state_dict()
    after = []
    with loader.Loader.local(loader.Mix(sources, weights=[0.2, 0.8], samples_per_epoch=400), **args) as dl:
        dl.load_state_dict(state)
        for batch in dl:
            after.append(rows(batch))
    assert len(before) + len(after) == 20, "the epoch finishes from where it stopped"
    assert all(sum(k for k, _ in b) == 10 for b in before), "half and half before"
    assert all(sum(k for k, _ in b) == 16 for b in after), "4 of 20 from a, 16 from b after the resume"
    for k in (0, 1):
        drawn = [i for b in before + after for s, i in b if s == k]
        assert len(drawn) == len(set(drawn)), f"source {k}: nothing twice within its first pass"
