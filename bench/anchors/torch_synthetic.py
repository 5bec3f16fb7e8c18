"""PyTorch DataLoader on zero-compute samples: each sample is a 3x224x224
uint8 tensor filled with (index % 251), like Loader's synthetic dataset, so
the work measured is the transport: default collate in the workers, then
pickling through shared memory to the trainer."""

import argparse

import torch
from torch.utils.data import DataLoader, Dataset

from common import Timer, report


class Synthetic(Dataset):
    def __init__(self, n, shape):
        self.n = n
        self.shape = shape

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return torch.full(self.shape, i % 251, dtype=torch.uint8), i


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=32000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--shape", default="3,224,224")
    a = p.parse_args()
    shape = tuple(int(x) for x in a.shape.split(","))
    torch.set_num_threads(1)
    loader = DataLoader(Synthetic(a.samples, shape), batch_size=a.batch_size,
                        num_workers=a.workers, shuffle=True, persistent_workers=False,
                        prefetch_factor=4)
    # Workers are started by iter(): that is part of the first batch, as a
    # user of DataLoader sees it.
    t = Timer()
    samples = nbytes = 0
    for data, label in loader:
        t.batch()
        samples += data.shape[0]
        nbytes += data.numel() * data.element_size() + label.numel() * label.element_size()
    report("torch DataLoader", samples, nbytes, t.elapsed(), t.first, workers=a.workers)


if __name__ == "__main__":
    main()
