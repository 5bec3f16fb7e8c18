"""How fast Loader.local moves torch tensors of each layout a Dataset returns
into the batch: 3x224x224 samples, one worker, batch 64, samples/s after the
first batch, median of REPEATS runs per layout (interleaved).

    python bench/strided_tensors.py [REPEATS]

Layouts: ``permuted`` (uint8 CHW view of HWC bytes, what torchvision's
``PILToTensor()`` returns), ``permuted_contiguous`` (the dataset calls
``.contiguous()`` on it), ``crop`` (a float32 ``[:, 16:240, 16:240]`` view),
``crop_contiguous`` (the same, ``.contiguous()``), ``cached`` (one
contiguous uint8 tensor: the copy alone). The per-sample work is a view or a
copy, so the rate is the sample plan's cost. To compare builds, run it with
each build's ``loader`` first on ``PYTHONPATH``.
"""

from __future__ import annotations

import statistics
import sys
import time

import torch

import loader

_CHW = torch.rand(3, 256, 256)
_HWC = torch.randint(0, 256, (224, 224, 3), dtype=torch.uint8)
LAYOUTS = ["permuted", "permuted_contiguous", "crop", "crop_contiguous", "cached"]


class Images:
    """4,096 samples of one layout (see the module docs) and their index."""

    def __init__(self, layout: str, n: int = 4096) -> None:
        self.layout, self.n = layout, n
        self.cached = _HWC.permute(2, 0, 1).contiguous()

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if self.layout == "permuted":
            return _HWC.permute(2, 0, 1), i
        if self.layout == "permuted_contiguous":
            return _HWC.permute(2, 0, 1).contiguous(), i
        if self.layout == "crop":
            return _CHW[:, 16:240, 16:240], i
        if self.layout == "crop_contiguous":
            return _CHW[:, 16:240, 16:240].contiguous(), i
        return self.cached, i


def rate(layout: str) -> float:
    with loader.Loader.local(Images(layout), 1, batch_size=64) as dl:
        it = iter(dl)
        next(it)
        start, n = time.perf_counter(), 0
        for batch in it:
            n += batch[0].shape[0]
        return n / (time.perf_counter() - start)


def main() -> None:
    repeats = int(sys.argv[1]) if len(sys.argv) > 1 else 5
    runs: dict[str, list[float]] = {k: [] for k in LAYOUTS}
    for _ in range(repeats):
        for layout in LAYOUTS:
            runs[layout].append(rate(layout))
    print(f"loader from {loader.__file__}")
    for layout, v in runs.items():
        print(f"{layout:20s} median {statistics.median(v):8.0f} samples/s  runs {[round(x) for x in v]}")


if __name__ == "__main__":
    main()
