"""The user-side Dataset classes of bench/python_dataset.py, in a module of
their own (as a user's would be) so Loader's workers import them by
reference and torch's DataLoader workers inherit them."""

from __future__ import annotations

import os

import numpy as np


class ImageFiles:
    """A folder of class folders of JPEGs, read the torchvision way: PIL
    decode, RandomResizedCrop(224), RandomHorizontalFlip, ToTensor
    (float32 CHW in [0, 1]); the label is the class folder's index."""

    def __init__(self, root: str) -> None:
        classes = sorted(d for d in os.listdir(root) if os.path.isdir(os.path.join(root, d)))
        self.files = [
            (os.path.join(root, c, f), label)
            for label, c in enumerate(classes)
            for f in sorted(os.listdir(os.path.join(root, c)))
        ]
        self._transform = None

    def __len__(self) -> int:
        return len(self.files)

    def __getstate__(self):
        return {"files": self.files, "_transform": None}

    def __getitem__(self, i: int):
        from PIL import Image

        if self._transform is None:
            from torchvision import transforms as T

            self._transform = T.Compose(
                [T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor()]
            )
        path, label = self.files[i]
        with Image.open(path) as im:
            image = im.convert("RGB")
        return self._transform(image), label


class Rows:
    """Rows of a float32 .npy file (1 KB each: 256 values), opened lazily
    with mmap in each worker, and an int label."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._rows = None
        self._len = int(np.load(path, mmap_mode="r").shape[0])

    def __len__(self) -> int:
        return self._len

    def __getstate__(self):
        return {"path": self.path, "_rows": None, "_len": self._len}

    def __getitem__(self, i: int):
        if self._rows is None:
            self._rows = np.load(self.path, mmap_mode="r")
        return self._rows[i], i % 10
