"""Torch tensors that are views of other tensors' storage (not contiguous):
torchvision's ``PILToTensor()`` CHW permute of HWC bytes, a slice with a
step, a transpose, a broadcast, an offset into a larger storage. The
worker's sample plan (``python/src/sample_plan.rs``) copies each in C order
straight from its storage; the batch must be byte for byte what
``default_collate`` makes of the same samples, and no sample may fall back
to the Python half's conversion. Every test starts real worker processes."""

from __future__ import annotations

import sys
import time

import numpy as np
import pytest

import loader
from loader._dataset import seeded_sample

torch = pytest.importorskip("torch", reason="torch is needed for torch tensors and default_collate")
from torch.utils.data import default_collate  # noqa: E402

#: Seconds any one test may iterate before it is stuck.
BOUND = 60

#: Shape of the ``random`` leaf: every sample has it, each with its own layout.
RANDOM_SHAPE = (2, 3, 4)

#: Samples the Python half of this process converted (``Source.convert``).
_converted = 0


def python_conversions() -> int:
    """How many samples this process's Python half has converted so far:
    the samples the worker's plan did not write. Counted once the first
    sample of the process is read (``Source.convert`` wrapped here, in the
    worker, calling through to the real one)."""
    source = sys.modules.get("loader._source")
    if source is None:
        return 0
    convert = source.Source.convert
    if not getattr(convert, "counted", False):

        def counted(self, index, sample):
            global _converted
            _converted += 1
            return convert(self, index, sample)

        counted.counted = True
        source.Source.convert = counted
    return _converted


def random_view(i: int):
    """An int32 tensor of ``RANDOM_SHAPE`` whose layout depends on ``i``:
    its dimensions permuted in storage, each taken with a step of 1 to 3
    from an offset into a larger base."""
    rng = np.random.default_rng(i)
    order = rng.permutation(len(RANDOM_SHAPE))
    steps = rng.integers(1, 4, size=len(RANDOM_SHAPE))
    starts = rng.integers(0, 3, size=len(RANDOM_SHAPE))
    sizes = [int(starts[d] + RANDOM_SHAPE[d] * steps[d]) for d in order]
    base = (torch.arange(int(np.prod(sizes)), dtype=torch.int32) * 7 + i).reshape(sizes)
    view = base[tuple(slice(int(starts[d]), None, int(steps[d])) for d in order)]
    view = view[tuple(slice(0, RANDOM_SHAPE[d]) for d in order)]
    return view.permute(*np.argsort(order).tolist())


class StridedViews:
    """Dict samples of non-contiguous tensors of every element size, a
    contiguous one and a 0-d one, and ``converted``: how many samples the
    Python half of this worker had converted before this one was read."""

    def __init__(self, n: int = 64) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        converted = python_conversions()
        hwc = (torch.arange(5 * 6 * 3) + i).to(torch.uint8).reshape(5, 6, 3)
        return {
            "chw": hwc.permute(2, 0, 1),  # what PILToTensor() returns
            "every_other_pixel": hwc[:, ::2, :],  # 3-byte runs, 6 bytes apart
            "columns": (torch.arange(4 * 10, dtype=torch.float32) + i).reshape(4, 10)[:, 1::2],
            "transposed": (torch.arange(12, dtype=torch.int16) - i).reshape(3, 4).t(),
            "broadcast": (torch.arange(3, dtype=torch.float64) * i).expand(2, 3),
            "offset": (torch.arange(30, dtype=torch.float16) + i).reshape(5, 6)[1:4, 2:],
            "flags": (torch.arange(8) % (i % 3 + 1) == 0).reshape(2, 4).t(),
            "random": random_view(i),
            "contiguous": torch.full((2, 2), i, dtype=torch.int64),
            "label": torch.tensor(i),
            "converted": converted,
        }


def snapshot(x):
    """A batch's structure with each leaf as (dtype, shape, bytes)."""
    if isinstance(x, dict):
        return {k: snapshot(v) for k, v in x.items()}
    assert isinstance(x, torch.Tensor), type(x)
    return (str(x.dtype), tuple(x.shape), x.numpy().tobytes())


def test_the_samples_are_views_of_every_layout():
    layouts = {tuple(random_view(i).stride()) for i in range(64)}
    sample = StridedViews()[3]
    assert len(layouts) > 10, layouts
    assert sample["chw"].stride() == (1, 18, 3)
    for name in ("chw", "every_other_pixel", "columns", "transposed", "broadcast", "offset", "flags"):
        assert not sample[name].is_contiguous(), name


def test_strided_tensors_batch_as_default_collate_without_the_python_conversion():
    dataset = StridedViews(64)
    got, started = [], time.monotonic()
    with loader.Loader.local(dataset, batch_size=4, workers=2) as dl:
        for batch in dl:
            got.append(snapshot(batch))
            assert time.monotonic() - started < BOUND, "stuck"
    want = [
        snapshot(default_collate([seeded_sample(dataset, i) for i in range(s, s + 4)]))
        for s in range(0, len(dataset), 4)
    ]
    assert len(got) == len(want) == 16
    for k, (g, w) in enumerate(zip(got, want)):
        converted = np.frombuffer(g.pop("converted")[2], dtype=np.int64)
        w.pop("converted")
        assert g == w, f"batch {k} differs from default_collate"
        assert not converted.any(), f"batch {k}: the Python half converted samples ({converted.tolist()} before each)"
