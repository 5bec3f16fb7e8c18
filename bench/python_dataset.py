"""Bring-your-own-Dataset benchmark: the same user Dataset classes
(bench/dataset_classes.py) through ``loader.Loader.local(dataset, ...)`` and
through ``torch.utils.data.DataLoader(dataset, ...)``, same workers, same
batch size, in one run, interleaved. Prints one markdown table row per
scenario with the median of each system's samples/s and the ratio.

    bench/python_dataset.py --images bench/data/imagenet-shaped --workers 2
    bench/python_dataset.py --only images --epochs 3 --repeats 8   # issue 22's image target


Scenarios:
- images: PIL decode + torchvision RandomResizedCrop(224) +
  RandomHorizontalFlip + ToTensor, batch 64 (``ImageFiles``);
- small samples: 1 KB float32 rows of a .npy file (mmap) + an int label,
  batch 256 (``Rows``; the file is made in bench/data/ on first use), with
  Loader's per-sample RNG seeding (the default) and without it
  (``seed_rngs=False``: ``Rows`` draws no random numbers).

Both loops take each batch as torch tensors and touch it (the last value of
every sample and the labels), as a trainer does before the model. Timing
starts at the first batch (worker start-up excluded for both); each run
is ``--epochs`` epochs of a fresh loader.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from dataset_classes import ImageFiles, Rows  # noqa: E402


def touch(batch) -> float:
    x, y = batch
    return float(x.reshape(x.shape[0], -1)[:, -1].sum()) + float(y.sum())


def run_torch(dataset, batch_size, workers, epochs) -> float:
    dl = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
        persistent_workers=True, drop_last=False,
    )
    return _time(dl, epochs, lambda e: None)


def run_loader(dataset, batch_size, workers, epochs, seed_rngs=True) -> float:
    import loader

    with loader.Loader.local(
        dataset, workers=workers, batch_size=batch_size, shuffle=True, seed=0, epochs=epochs,
        seed_rngs=seed_rngs,
    ) as dl:
        return _time(dl, epochs, dl.set_epoch)


def _time(dl, epochs, set_epoch) -> float:
    samples, started = 0, None
    for epoch in range(epochs):
        set_epoch(epoch)
        for batch in dl:
            if started is None:
                started = time.perf_counter()  # from the first batch on
                continue
            touch(batch)
            samples += batch[1].shape[0]
    return samples / (time.perf_counter() - started)


def rows_file(n: int) -> str:
    path = HERE / "data" / f"rows-{n}x256-f32.npy"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = np.random.default_rng(0).random((n, 256), dtype=np.float32)
        np.save(path, rows)
    return str(path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", default=str(HERE / "data" / "imagenet-shaped"))
    p.add_argument("--rows", type=int, default=200_000, help="samples of the small-sample dataset")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--only", choices=["images", "small"], default=None)
    args = p.parse_args()

    scenarios = []
    if args.only in (None, "images"):
        scenarios.append(("images: PIL + RandomResizedCrop(224) + flip + ToTensor, batch 64",
                          ImageFiles(args.images), 64, True))
    if args.only in (None, "small"):
        rows = Rows(rows_file(args.rows))
        scenarios.append(("small samples: 1 KB float32 rows, batch 256", rows, 256, True))
        scenarios.append(("small samples, Loader with seed_rngs=False", rows, 256, False))
    print(f"workers={args.workers} repeats={args.repeats} epochs={args.epochs} "
          f"cpus={os.cpu_count()} torch={torch.__version__}", flush=True)
    print("| scenario | torch DataLoader samples/s | Loader samples/s | Loader / torch |")
    print("| --- | ---: | ---: | ---: |")
    for name, dataset, batch, seed_rngs in scenarios:
        runs = {"torch": [], "loader": []}
        for _ in range(args.repeats):  # interleaved: load drifts hit both
            runs["torch"].append(run_torch(dataset, batch, args.workers, args.epochs))
            runs["loader"].append(run_loader(dataset, batch, args.workers, args.epochs, seed_rngs))
            print(f"  {name}: torch {runs['torch'][-1]:.0f}, loader {runs['loader'][-1]:.0f}",
                  file=sys.stderr, flush=True)
        t, l = statistics.median(runs["torch"]), statistics.median(runs["loader"])
        print(f"| {name} | {t:.0f} | {l:.0f} | {l / t:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
