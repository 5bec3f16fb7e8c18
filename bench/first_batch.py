"""Time to first batch of a cheap torch Dataset (a module that imports
torch; each sample one small tensor), the start-up cost alone: seconds from
``Loader.local(dataset, ...)`` / ``DataLoader(dataset, ...)`` to the first
batch in hand, for three loaders in a row in one process (the first pays
for the worker template), 2 workers, batch 64. DataLoader not persistent,
so each of its loaders forks its workers again.

    python bench/first_batch.py            # prints one line per loader
"""

from __future__ import annotations

import time

import torch

import loader


class Cheap(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return 10_000

    def __getitem__(self, i: int):
        return torch.full((3, 32, 32), i % 255, dtype=torch.uint8), i


def main() -> None:
    ds = Cheap()
    for k in range(3):
        t0 = time.perf_counter()
        dl = loader.Loader.local(ds, workers=2, batch_size=64, shuffle=True)
        next(iter(dl))
        t1 = time.perf_counter()
        dl.close()
        print(f"Loader.local, loader {k + 1} of the process: first batch {t1 - t0:.3f} s, close {time.perf_counter() - t1:.3f} s", flush=True)
    for k in range(3):
        t0 = time.perf_counter()
        dl = torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True, num_workers=2)
        it = iter(dl)
        next(it)
        t1 = time.perf_counter()
        del it
        print(f"DataLoader, loader {k + 1} of the process: first batch {t1 - t0:.3f} s, close {time.perf_counter() - t1:.3f} s", flush=True)


if __name__ == "__main__":
    main()
