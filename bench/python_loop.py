"""One run of the same Python training-loop skeleton over Loader
(``loader.Loader.local``, the Python SDK) or over torch's DataLoader: one
JSON line out, the fields the anchors print. bench/run.py runs both systems
on the same data, repeats interleaved, in its "Python loop" scenarios
(``bench/run.sh --only "Python loop"``), and checks they saw the same data.

Both loops do what a trainer's loop does with a batch before the model: take
it as torch tensors and touch it (read the last byte of every sample and the
labels). Loader's tensors are zero-copy views of the shared-memory slot its
workers wrote (``batch.torch()``, DLPack); DataLoader's arrive through its
worker processes and ``/dev/shm`` as usual. Workers start on the first
``next()`` for both; samples/s counts from the first batch on.

    pip install ./python            # into an environment that has torch (+ torchvision)
    python bench/python_loop.py --system loader --samples 32000
    python bench/python_loop.py --system torch --images bench/data/imagenet-shaped --epochs 2

``--images DIR`` measures an image folder instead (class folders of JPEGs, as
``bench/make_images.py`` builds): decode, random-resized-crop to 224 and
horizontal flip, uint8 CHW out; torch uses torchvision's ``ImageFolder`` with
the same transforms (PIL). The crops differ, so the checksum covers only the
labels.
"""

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent / "anchors"))
from common import report  # noqa: E402

SHAPE = (3, 224, 224)


def run_loader(samples, batch_size, workers, images, epochs):
    import loader

    if images:
        dataset = {"image_folder": {"path": os.path.abspath(images)}}
        transforms = ["decode", {"random_resized_crop": {"size": 224}}, "horizontal_flip"]
        key = "image"
    else:
        dataset = {"synthetic": {"num_samples": samples, "shape": list(SHAPE), "dtype": "uint8"}}
        transforms = []
        key = "data"
    spec = {
        "dataset": dataset,
        "transforms": transforms,
        "batch_size": batch_size,
        "epochs": epochs,
        "sampler": {"shuffle": True, "seed": 0},
    }
    dl = loader.Loader.local(spec, workers=workers)

    def batches():
        for epoch in range(epochs):
            dl.set_epoch(epoch)
            for batch in dl:
                t = batch.torch()
                yield t[key], t["label"]

    try:
        return loop(batches(), pixels=not images)
    finally:
        dl.close()


def run_torch(samples, batch_size, workers, images, epochs):
    import torch
    from torch.utils.data import DataLoader, Dataset

    class Synthetic(Dataset):
        def __len__(self):
            return samples

        def __getitem__(self, i):
            return torch.full(SHAPE, i % 251, dtype=torch.uint8), i

    if images:
        from torchvision import datasets, transforms as T

        data = datasets.ImageFolder(images, T.Compose(
            [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.PILToTensor()]))
    else:
        data = Synthetic()
    dl = DataLoader(data, batch_size=batch_size, num_workers=workers, shuffle=True,
                    prefetch_factor=4, persistent_workers=epochs > 1)

    def batches():
        for _ in range(epochs):
            yield from dl

    return loop(batches(), pixels=not images)


def loop(batches, pixels=True):
    """The measured loop: workers start on the first next(), as for a user.
    The checksum covers the labels, and a byte of each sample when both
    systems produce the same pixels. Rates count from the first batch on."""
    start = time.perf_counter()
    first = None
    n = checksum = first_n = 0
    nbytes = first_bytes = 0
    for data, label in batches:
        size = data.numel() * data.element_size() + label.numel() * label.element_size()
        if first is None:
            first = time.perf_counter()
            first_n, first_bytes = data.shape[0], size
        checksum += int(label.sum()) + (int(data[:, -1, -1, -1].sum()) if pixels else 0)
        n += data.shape[0]
        nbytes += size
    end = time.perf_counter()
    if first is None:
        sys.exit("no batch at all")
    return {"samples": n - first_n, "nbytes": nbytes - first_bytes, "seconds": end - first,
            "first_batch_s": first - start, "total_samples": n, "checksum": checksum}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--system", choices=["loader", "torch"], required=True)
    p.add_argument("--samples", type=int, default=32000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--images", help="an image folder (class folders of JPEGs) instead of synthetic data")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    fn = run_loader if args.system == "loader" else run_torch
    r = fn(args.samples, args.batch_size, args.workers, args.images, args.epochs)
    label = "loader.Loader.local" if args.system == "loader" else "torch DataLoader"
    report(label, r["samples"], r["nbytes"], r["seconds"], r["first_batch_s"],
           total_samples=r["total_samples"], checksum=r["checksum"], workers=args.workers)


if __name__ == "__main__":
    main()
