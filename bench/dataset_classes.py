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


class ImageNetPaths:
    """Shaped like torchvision's ``ImageFolder`` over ImageNet's train set:
    ``samples`` (and ``imgs``, the same list) of ``(path, class_index)``
    pairs and ``targets``, held in Python lists, with fake paths
    (``/data/train/n01440764/n01440764_10026.JPEG``): no files. Its
    ``__getitem__`` reads the pair as ImageFolder does (so the list's
    objects are touched, the copy-on-read of pytorch#13246) and returns a
    small array derived from it instead of an image. bench/dataset_rss.py
    measures the workers' memory over it."""

    def __init__(self, n: int = 1_281_167, classes: int = 1000) -> None:
        per = -(-n // classes)
        self.classes = [f"n{1440764 + 1000 * c:08d}" for c in range(classes)]
        self.class_to_idx = {c: i for i, c in enumerate(self.classes)}
        self.samples = [
            (f"/data/train/{wnid}/{wnid}_{10026 + 7 * k}.JPEG", label)
            for label, wnid in enumerate(self.classes)
            for k in range(per)
        ][:n]
        self.imgs = self.samples
        self.targets = [label for _, label in self.samples]

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, target = self.samples[i]
        return np.full(16, len(path) + target, dtype=np.float32), target
