"""PyTorch DataLoader on an ImageNet-shaped folder, the way torchvision's
ImageNet example reads it: ImageFolder (PIL decode), RandomResizedCrop(224)
and RandomHorizontalFlip, PILToTensor (uint8, 3x224x224), int64 labels,
batch 64, shuffled, num_workers worker processes (kept across epochs)."""

import argparse

import torch
from torch.utils.data import DataLoader
from torchvision import datasets, transforms

from common import Timer, report


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--path", required=True)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    a = p.parse_args()
    torch.set_num_threads(1)
    pipeline = transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.PILToTensor(),
    ])
    ds = datasets.ImageFolder(a.path, transform=pipeline)
    loader = DataLoader(ds, batch_size=a.batch_size, shuffle=True, num_workers=a.workers,
                        persistent_workers=True, prefetch_factor=4)
    # Workers are started by the first iter(): part of the first batch, as a
    # user of DataLoader sees it.
    t = Timer()
    samples = nbytes = 0
    for _ in range(a.epochs):
        for data, label in loader:
            t.batch()
            samples += data.shape[0]
            nbytes += data.numel() * data.element_size() + label.numel() * label.element_size()
    report("torch DataLoader", samples, nbytes, t.elapsed(), t.first, workers=a.workers)


if __name__ == "__main__":
    main()
