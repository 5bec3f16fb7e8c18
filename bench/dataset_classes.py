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


def _torch_iterable():
    from torch.utils.data import IterableDataset

    return IterableDataset


def _worker_split(items: list) -> list:
    """The items of this DataLoader worker (every one outside a worker)."""
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return items if info is None else items[info.id :: info.num_workers]


class TokenStream(_torch_iterable()):
    """A token stream as LM training scripts write it: .npy files of token
    ids, each worker reads its files (``get_worker_info()``) and yields
    windows of ``seq + 1`` ids. ``shards=True`` adds Loader's shard
    protocol (one file a shard: two methods, the lengths left to Loader
    to count)."""

    def __init__(self, files: list, seq: int = 2048) -> None:
        self.files = list(files)
        self.seq = seq

    def _read(self, path: str):
        tokens = np.load(path, mmap_mode="r")
        for start in range(0, len(tokens) - self.seq, self.seq):
            yield np.array(tokens[start : start + self.seq + 1], dtype=np.int64)

    def __iter__(self):
        for path in _worker_split(self.files):
            yield from self._read(path)


class ShardedTokenStream(TokenStream):
    """TokenStream with Loader's shard protocol: one file a shard."""

    def __loader_shards__(self) -> int:
        return len(self.files)

    def __loader_shard__(self, i: int):
        return self._read(self.files[i])


class ImageStream(_torch_iterable()):
    """A webdataset-style image stream: shards (lists of JPEG files) split
    by worker, each image decoded and augmented in the iterator
    (RandomResizedCrop(224), RandomHorizontalFlip, ToTensor), with its
    label. It gives Loader its shards and their lengths (a shard's file
    list is its length): nothing to count."""

    def __init__(self, root: str, shards: int = 16) -> None:
        files = ImageFiles(root).files
        self.shards = [files[i::shards] for i in range(shards)]
        self._transform = None

    def __getstate__(self):
        return {"shards": self.shards, "_transform": None}

    def _read(self, shard: list):
        from PIL import Image

        if self._transform is None:
            from torchvision import transforms as T

            self._transform = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor()])
        for path, label in shard:
            with Image.open(path) as im:
                image = im.convert("RGB")
            yield self._transform(image), label

    def __iter__(self):
        for shard in _worker_split(self.shards):
            yield from self._read(shard)

    def __loader_shards__(self) -> int:
        return len(self.shards)

    def __loader_shard__(self, i: int):
        return self._read(self.shards[i])

    def __loader_shard_lengths__(self) -> list:
        return [len(s) for s in self.shards]
