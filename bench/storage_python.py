"""One run of bench/storage.py's image job the way a PyTorch user writes
it: through the Python SDK (``loader.Loader.local``, a folder path or an
``s3://`` URL), or, as the anchor, torchvision's ``ImageFolder`` with
torch's ``DataLoader`` over the local folder, the same transforms, batch
and workers. Prints one JSON line: samples/s of each epoch (the first
counted from the loader's construction: start-up included) and the
seconds to the first batch.

    python bench/storage_python.py loader s3://bench/images 3 2 0
    python bench/storage_python.py dataloader /data/images 3 2 0

Arguments: which (loader or dataloader), the folder or URL, epochs,
workers, the shuffle seed (-1: dataset order). For ``s3://`` the AWS variables of the
environment name the store (bench/storage.py sets them).
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Callable, Iterable


def timed(epochs: int, started: float, sizes: Callable[[int], Iterable[int]]) -> tuple[list[float], float]:
    """Samples/s of each epoch, `sizes(epoch)` giving its batches' sample
    counts as they arrive (the first epoch counted from `started`), and
    the seconds from `started` to the first batch."""
    rates, first = [], None
    for epoch in range(epochs):
        n = 0
        for size in sizes(epoch):
            n += size
            if first is None:
                first = time.perf_counter() - started
        now = time.perf_counter()
        rates.append(n / (now - started))
        started = now
    return rates, first or 0.0


def loader_run(path: str, epochs: int, workers: int, seed: int) -> tuple[list[float], float]:
    import numpy as np

    import loader

    spec = {
        "dataset": {"image_folder": {"path": path if "://" in path else os.path.abspath(path)}},
        # `loaderctl run --dataset imagefolder`'s transforms.
        "transforms": ["decode", {"random_resized_crop": {"size": 224}}, "horizontal_flip"],
        "batch_size": 64,
        "epochs": epochs,
    }
    if seed >= 0:
        spec["sampler"] = {"shuffle": True, "seed": seed}
    started = time.perf_counter()
    with loader.Loader.local(spec, num_workers=workers) as dl:

        def sizes(epoch: int) -> Iterable[int]:
            dl.set_epoch(epoch)
            return (np.asarray(batch["image"]).shape[0] for batch in dl)

        return timed(epochs, started, sizes)


def dataloader_run(path: str, epochs: int, workers: int, seed: int) -> tuple[list[float], float]:
    import torch
    from torch.utils.data import DataLoader
    from torchvision import datasets, transforms as T

    torch.manual_seed(max(seed, 0))
    started = time.perf_counter()
    folder = datasets.ImageFolder(
        os.path.abspath(path), transform=T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.PILToTensor()])
    )
    dl = DataLoader(folder, batch_size=64, shuffle=seed >= 0, num_workers=workers, persistent_workers=True)
    return timed(epochs, started, lambda _epoch: (images.shape[0] for images, _labels in dl))


def main() -> int:
    if len(sys.argv) != 6 or sys.argv[1] not in ("loader", "dataloader"):
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    which, path, epochs, workers, seed = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
    run = loader_run if which == "loader" else dataloader_run
    rates, first = run(path, epochs, workers, seed)
    print(json.dumps({"epochs_samples_per_s": rates, "first_batch_s": first}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
