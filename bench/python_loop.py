"""The same Python training-loop skeleton over Loader (``loader.Loader.local``,
the Python SDK) and over torch's DataLoader, on the same data, in one run.

Both loops do what a trainer's loop does with a batch before the model: take
it as torch tensors and touch it (read the last byte of every sample and the
labels). Loader's tensors are zero-copy views of the shared-memory slot its
workers wrote (``batch.torch()``, DLPack); DataLoader's arrive through its
worker processes and ``/dev/shm`` as usual. Each system runs in a process of
its own, repeats interleaved; medians and the ratio are printed.

    pip install ./python            # into an environment that has torch (+ torchvision)
    python bench/python_loop.py --samples 32000 --repeats 3
    python bench/python_loop.py --images bench/data/imagenet-shaped --repeats 3

``--images DIR`` measures an image folder instead (class folders of JPEGs, as
``bench/make_images.py`` builds): decode, random-resized-crop to 224 and
horizontal flip, uint8 CHW out; torch uses torchvision's ``ImageFolder`` with
the same transforms (PIL). The crops differ, so only the labels are compared.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SHAPE = (3, 224, 224)


def run_loader(samples, batch_size, workers, images):
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
        "epochs": 1,
        "sampler": {"shuffle": True, "seed": 0},
    }
    dl = loader.Loader.local(spec, workers=workers)

    def batches():
        for batch in dl:
            t = batch.torch()
            yield t[key], t["label"]

    try:
        return loop(batches(), pixels=not images)
    finally:
        dl.close()


def run_torch(samples, batch_size, workers, images):
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
                    prefetch_factor=4)
    return loop(iter(dl), pixels=not images)


def loop(batches, pixels=True):
    """The measured loop: workers start on the first next(), as for a user.
    The checksum covers the labels, and a byte of each sample when both
    systems produce the same pixels."""
    start = time.perf_counter()
    first = None
    n = checksum = 0
    for data, label in batches:
        if first is None:
            first = time.perf_counter()
            first_n = data.shape[0]
        checksum += int(label.sum()) + (int(data[:, -1, -1, -1].sum()) if pixels else 0)
        n += data.shape[0]
    end = time.perf_counter()
    steady = (n - first_n) / (end - first) if end > first else 0.0
    return {"samples": n, "seconds": end - start, "first_batch_s": first - start,
            "samples_per_s": steady, "checksum": checksum}


def child(args):
    import torch

    torch.set_num_threads(1)
    fn = run_loader if args.system == "loader" else run_torch
    result = fn(args.samples, args.batch_size, args.workers, args.images)
    print(json.dumps(result), flush=True)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=32000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--images", help="an image folder (class folders of JPEGs) instead of synthetic data")
    p.add_argument("--system", choices=["loader", "torch"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.system:
        return child(args)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    results = {"loader": [], "torch": []}
    for r in range(args.repeats):
        for system in results:
            cmd = [sys.executable, __file__, "--system", system, "--samples", str(args.samples),
                   "--batch-size", str(args.batch_size), "--workers", str(args.workers)]
            if args.images:
                cmd += ["--images", args.images]
            out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
            if out.returncode != 0:
                sys.exit(f"{system} failed: {out.stderr.strip()[-2000:]}")
            res = json.loads(out.stdout.strip().splitlines()[-1])
            results[system].append(res)
            print(f"repeat {r + 1} {system:6}: {res['samples_per_s']:>10,.0f} samples/s, "
                  f"first batch {res['first_batch_s'] * 1e3:.0f} ms", flush=True)
    sums = {s: {r["checksum"] for r in rs} for s, rs in results.items()}
    if len(sums["loader"] | sums["torch"]) != 1:
        sys.exit(f"the loops saw different data: {sums}")
    med = {s: statistics.median(r["samples_per_s"] for r in rs) for s, rs in results.items()}
    first = {s: statistics.median(r["first_batch_s"] for r in rs) for s, rs in results.items()}
    mb = lambda s: med[s] * (SHAPE[0] * SHAPE[1] * SHAPE[2] + 8) / 1e6  # noqa: E731
    what = (f"image folder {args.images} (decode, random-resized-crop 224, flip)" if args.images
            else f"synthetic {'x'.join(map(str, SHAPE))} uint8, {args.samples} samples")
    print(f"\n{what}, batch {args.batch_size}, {args.workers} workers, "
          f"medians of {args.repeats}:")
    print("| loop | samples/s | MB/s | first batch | vs torch DataLoader |")
    print("| --- | ---: | ---: | ---: | ---: |")
    for s, label in (("loader", "loader.Loader.local (Python SDK)"), ("torch", "torch DataLoader")):
        print(f"| {label} | {med[s]:,.0f} | {mb(s):,.0f} | {first[s] * 1e3:.0f} ms | "
              f"{med[s] / med['torch']:.2f}x |")


if __name__ == "__main__":
    main()
