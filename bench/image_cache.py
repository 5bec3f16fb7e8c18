"""Kept frames for a built-in image job (issue 36): samples/s of every
epoch with and without ``cache=``, same run, same data, plus what the cache
decided (its counters and, with RUST_LOG=info, the workers' log line).

    python bench/image_cache.py --images DIR [--epochs 10] [--workers 2] [--repeats 1]

The anchor: torchvision's ImageFolder with the same transforms through
torch's DataLoader, same workers and batch (--no-dataloader leaves it out).
The job: ``image_folder`` over DIR (bench/make_images.py makes one),
decode, random_resized_crop 224, horizontal_flip, batch 64, shuffled. The
cache's budget is --cache (default 4GiB: every frame of the default image
set fits). Each run's batches are checked equal to the uncached run's
(a hash of every batch's bytes).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import time

import numpy as np

import loader


def spec(root: str, epochs: int) -> dict:
    return {
        "dataset": {"image_folder": {"path": os.path.abspath(root)}},
        "transforms": ["decode", {"random_resized_crop": {"size": 224}}, "horizontal_flip"],
        "batch_size": 64,
        "epochs": epochs,
        "sampler": {"shuffle": True, "seed": 0},
    }


def run(args, cache) -> tuple[list[float], str, dict | None]:
    rates, digest = [], hashlib.sha256()
    more = {} if cache is None else {"cache": cache}
    with loader.Loader.local(spec(args.images, args.epochs), workers=args.workers, **more) as dl:
        for epoch in range(args.epochs):
            dl.set_epoch(epoch)
            started, n = time.perf_counter(), 0
            for batch in dl:
                image = np.asarray(batch["image"])
                digest.update(image.tobytes())
                n += image.shape[0]
            rates.append(n / (time.perf_counter() - started))
        stats = dl.cache_stats()
    return rates, digest.hexdigest(), stats


def dataloader_rate(args, epochs: int = 2) -> float:
    """The anchor: torchvision's ImageFolder with the same transforms
    through torch's DataLoader (same workers, batch 64), median samples/s of
    `epochs` epochs (it keeps nothing between epochs)."""
    import torch
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms as T

    folder = datasets.ImageFolder(
        os.path.abspath(args.images), transform=T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.PILToTensor()])
    )
    dl = DataLoader(folder, batch_size=64, shuffle=True, num_workers=args.workers, persistent_workers=True)
    rates = []
    for _ in range(epochs):
        started, n = time.perf_counter(), 0
        for images, _labels in dl:
            n += images.shape[0]
        rates.append(n / (time.perf_counter() - started))
    del dl
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
    return statistics.median(rates)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--images", required=True)
    p.add_argument("--epochs", type=int, default=10)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--cache", default="4GiB")
    p.add_argument("--no-dataloader", action="store_true", help="leave out the torchvision + DataLoader anchor")
    args = p.parse_args()
    plain, kept, stats = [], [], None
    for _ in range(args.repeats):
        rates, want, _ = run(args, None)
        plain.append(rates)
        rates, got, stats = run(args, args.cache)
        kept.append(rates)
        if got != want:
            raise SystemExit("the cached run's batches differ from the uncached run's")
    med = lambda runs, e: statistics.median(r[e] for r in runs)  # noqa: E731
    print("| epoch | samples/s, no cache | samples/s, cache | cache / no cache |")
    print("|---:|---:|---:|---:|")
    for e in range(args.epochs):
        a, b = med(plain, e), med(kept, e)
        print(f"| {e + 1} | {a:,.0f} | {b:,.0f} | {b / a:.2f}x |")
    later_plain = statistics.median(r for runs in plain for r in runs[1:])
    later_kept = statistics.median(r for runs in kept for r in runs[1:])
    first_kept = med(kept, 0)
    print(
        f"epochs 2-{args.epochs}, median: {later_kept:,.0f} samples/s with the cache against {later_plain:,.0f} without "
        f"({later_kept / later_plain:.2f}x) and {first_kept:,.0f} in the cache's epoch 1 ({later_kept / first_kept:.2f}x); "
        f"batches identical"
    )
    if not args.no_dataloader:
        theirs = dataloader_rate(args)
        print(
            f"torchvision ImageFolder + DataLoader, same transforms and workers: {theirs:,.0f} samples/s every epoch; "
            f"Loader {later_plain / theirs:.2f}x without the cache, {later_kept / theirs:.2f}x with it (epochs 2-{args.epochs})"
        )
    if stats:
        per = lambda k, n: stats[k] / max(1, stats[n]) / 1e3  # noqa: E731
        print(
            f"cache: on={stats['on']} ({stats['off_reason'] or 'kept on'}), hits {stats['hits']:,}, misses {stats['misses']:,}, "
            f"stored {stats['stored']:,} frames ({stats['stored_bytes'] / 1e9:.2f} GB); CPU per image: decode "
            f"{per('load_ns', 'loads_timed'):.0f} us, keep {per('store_ns', 'stores_timed'):.0f} us, cut {per('hit_ns', 'hits_timed'):.0f} us"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
