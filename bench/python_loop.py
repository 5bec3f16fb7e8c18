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

``--tokens FILE`` (uint16 windows of ``--context-length + 1`` ids), ``--npy FILE``
(rows of an array) and ``--shape`` (synthetic uint8 samples of another shape)
measure the small-batch matrix (``bench/matrix.py``); ``--transport grpc``
makes Loader stream every batch over gRPC. Each ``next()`` after the first is
timed: ``wait_p50_us`` and ``wait_p99_us`` are the trainer's wait for data.

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


def spec_of(args):
    """Loader's job for the data the flags name, and the key of its data tensor."""
    if args.images:
        dataset = {"image_folder": {"path": os.path.abspath(args.images)}}
        return dataset, ["decode", {"random_resized_crop": {"size": 224}}, "horizontal_flip"], "image"
    if args.tokens:
        return ({"tokens": {"path": os.path.abspath(args.tokens), "dtype": "uint16",
                            "context_length": args.context_length}}, [], "tokens")
    if args.npy:
        return {"npy": {"arrays": {"x": os.path.abspath(args.npy)}}}, [], "x"
    shape = [int(d) for d in args.shape.split(",")]
    return {"synthetic": {"num_samples": args.samples, "shape": shape, "dtype": "uint8"}}, [], "data"


def run_loader(args):
    import loader

    dataset, transforms, key = spec_of(args)
    spec = {
        "dataset": dataset,
        "transforms": transforms,
        "batch_size": args.batch_size,
        "epochs": args.epochs,
        "sampler": {"shuffle": True, "seed": 0},
    }
    dl = loader.Loader.local(spec, workers=args.workers, shared_memory=args.transport == "shm")
    labelled = key in ("data", "image")

    def batches():
        for epoch in range(args.epochs):
            dl.set_epoch(epoch)
            for batch in dl:
                t = batch.torch()
                yield t[key], (t["label"] if labelled else None)

    try:
        return loop(batches(), pixels=not args.images)
    finally:
        dl.close()


def run_torch(args):
    import numpy as np
    import torch
    from torch.utils.data import DataLoader, Dataset

    shape = tuple(int(d) for d in args.shape.split(","))

    class Synthetic(Dataset):
        def __len__(self):
            return args.samples

        def __getitem__(self, i):
            return torch.full(shape, i % 251, dtype=torch.uint8), i

    class Tokens(Dataset):
        """Windows of context_length + 1 ids, window i at token i * context_length
        (Loader's tokens dataset), from a memory-mapped file."""

        def __init__(self, path, ctx):
            self.ctx = ctx
            self.path = path
            self.n = (os.path.getsize(path) // 2 - 1) // ctx
            self.ids = None

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            if self.ids is None:  # opened in each worker
                self.ids = np.memmap(self.path, dtype=np.uint16, mode="r")
            # uint16, as Loader yields them: the same bytes on both sides.
            return torch.from_numpy(np.array(self.ids[i * self.ctx:(i + 1) * self.ctx + 1]))

    class Rows(Dataset):
        """Rows of a .npy array, memory-mapped (Loader's npy dataset)."""

        def __init__(self, path):
            self.path = path
            self.n = np.load(path, mmap_mode="r").shape[0]
            self.rows = None

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            if self.rows is None:
                self.rows = np.load(self.path, mmap_mode="r")
            return torch.from_numpy(np.array(self.rows[i]))

    if args.images:
        from torchvision import datasets, transforms as T

        data = datasets.ImageFolder(args.images, T.Compose(
            [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.PILToTensor()]))
    elif args.tokens:
        data = Tokens(args.tokens, args.context_length)
    elif args.npy:
        data = Rows(args.npy)
    else:
        data = Synthetic()
    dl = DataLoader(data, batch_size=args.batch_size, num_workers=args.workers, shuffle=True,
                    prefetch_factor=4, persistent_workers=args.epochs > 1)
    labelled = not (args.tokens or args.npy)

    def batches():
        for _ in range(args.epochs):
            for b in dl:
                yield (b[0], b[1]) if labelled else (b, None)

    return loop(batches(), pixels=not args.images)


def loop(batches, pixels=True):
    """The measured loop: workers start on the first next(), as for a user.
    The checksum covers the labels, and a byte of each sample when both
    systems produce the same pixels. Rates count from the first batch on;
    each later next() is timed (the trainer's wait for data)."""
    start = time.perf_counter()
    first = None
    n = checksum = first_n = 0
    nbytes = first_bytes = 0
    waits = []
    it = iter(batches)
    while True:
        asked = time.perf_counter()
        try:
            data, label = next(it)
        except StopIteration:
            break
        got = time.perf_counter()
        size = data.numel() * data.element_size()
        if label is not None:
            size += label.numel() * label.element_size()
        if first is None:
            first = got
            first_n, first_bytes = data.shape[0], size
        else:
            waits.append(got - asked)
        if label is not None:
            checksum += int(label.sum()) + (int(data.reshape(data.shape[0], -1)[:, -1].sum()) if pixels else 0)
        else:
            checksum += int(data.reshape(data.shape[0], -1)[:, -1].sum())
        n += data.shape[0]
        nbytes += size
    end = time.perf_counter()
    if first is None:
        sys.exit("no batch at all")
    waits.sort()
    q = (lambda f: waits[min(len(waits) - 1, round((len(waits) - 1) * f))] * 1e6 if waits else 0.0)
    return {"samples": n - first_n, "nbytes": nbytes - first_bytes, "seconds": end - first,
            "first_batch_s": first - start, "total_samples": n, "checksum": checksum,
            "batches": len(waits) + 1, "wait_p50_us": q(0.5), "wait_p99_us": q(0.99)}


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--system", choices=["loader", "torch"], required=True)
    p.add_argument("--samples", type=int, default=32000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--images", help="an image folder (class folders of JPEGs) instead of synthetic data")
    p.add_argument("--tokens", help="a flat uint16 token file, cut into windows of --context-length + 1 ids")
    p.add_argument("--context-length", type=int, default=2048)
    p.add_argument("--npy", help="a .npy array whose rows are the samples")
    p.add_argument("--shape", default=",".join(map(str, SHAPE)), help="shape of a synthetic uint8 sample")
    p.add_argument("--transport", choices=["shm", "grpc"], default="shm", help="Loader's transport")
    args = p.parse_args()
    import torch

    torch.set_num_threads(1)
    fn = run_loader if args.system == "loader" else run_torch
    r = fn(args)
    label = "loader.Loader.local" if args.system == "loader" else "torch DataLoader"
    report(label, r["samples"], r["nbytes"], r["seconds"], r["first_batch_s"],
           total_samples=r["total_samples"], checksum=r["checksum"], workers=args.workers,
           batches=r["batches"], wait_p50_us=r["wait_p50_us"], wait_p99_us=r["wait_p99_us"])


if __name__ == "__main__":
    main()
