"""What a ``break`` costs: the first batch of the next pass after a loop
left early (Lightning's validation sanity check, ``limit_train_batches``),
for ``loader.Loader.local`` and for torch's ``DataLoader`` with
``persistent_workers=True``, on the same map-style dataset, same run.

A DataLoader abandons its iterator and starts a new one on the same
workers; a Loader starts the next pass whole on new workers (its old ones
stop meanwhile), so nothing of the abandoned pass leaks into the next.

    python bench/break_restart.py [--samples 4096] [--batch-size 64] [--workers 2] [--repeats 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import torch

import loader


class Indexed(torch.utils.data.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return {"i": i, "x": np.full(2, i, dtype=np.float32)}


def measure(dl, repeats: int) -> tuple[float, list[float]]:
    t = time.perf_counter()
    next(iter(dl))
    first = time.perf_counter() - t
    gaps = []
    for _ in range(repeats):
        for _batch in dl:
            break
        t = time.perf_counter()
        next(iter(dl))
        gaps.append(time.perf_counter() - t)
    return first, gaps


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=4096)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    a = p.parse_args()
    ds = Indexed(a.samples)
    for name in ("Loader.local", "DataLoader"):
        if name == "Loader.local":
            dl = loader.Loader.local(ds, a.batch_size, True, num_workers=a.workers)
        else:
            dl = torch.utils.data.DataLoader(ds, a.batch_size, True, num_workers=a.workers, persistent_workers=True)
        first, gaps = measure(dl, a.repeats)
        print(f"{name}: first batch {first * 1e3:.0f} ms; after a break: " + ", ".join(f"{g * 1e3:.0f}" for g in gaps) + " ms")
        if isinstance(dl, loader.Loader):
            dl.close()


if __name__ == "__main__":
    main()
