"""Map-style datasets for test_dataset.py, at module level so workers
unpickle them by reference (the trainer's sys.path travels with them)."""

from __future__ import annotations

import random
import threading
import time

import numpy as np


class NumpyRows:
    """Dict samples: a float32 row with numpy and Python random noise (so
    the seeding shows), the index, a Python float and a bool."""

    def __init__(self, n: int = 100, dim: int = 6) -> None:
        self.n, self.dim = n, dim

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        x = np.arange(self.dim, dtype=np.float32) + i + np.random.rand(self.dim).astype(np.float32)
        return {"x": x, "i": i, "noise": random.random(), "even": i % 2 == 0}


class TorchAugmented:
    """Tuple samples of torch tensors with random transforms (torchvision
    style: a random crop offset and a random flip from torch's RNG)."""

    def __init__(self, n: int = 60) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import torch

        image = torch.arange(3 * 10 * 10, dtype=torch.float32).reshape(3, 10, 10) + i
        top, left = (int(v) for v in torch.randint(0, 3, (2,)))
        crop = image[:, top : top + 8, left : left + 8]
        if torch.rand(()) < 0.5:
            crop = torch.flip(crop, dims=[2])
        return crop, torch.tensor(i), [np.int32(i * 2), float(i) / 2]


class Raising:
    """Raises in ``__getitem__`` for the indices in ``bad``."""

    def __init__(self, n: int = 40, bad=(7,)) -> None:
        self.n, self.bad = n, frozenset(bad)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i in self.bad:
            raise ValueError(f"cannot decode sample {i}\nsecond line of the message")
        return {"i": np.int64(i)}


class Ragged:
    """Sample ``odd`` has a longer row than the others."""

    def __init__(self, n: int = 40, odd: int = 13) -> None:
        self.n, self.odd = n, odd

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return {"x": np.zeros(5 if i == self.odd else 4, dtype=np.float32)}


class Locked:
    """Holds a lock: neither pickle nor cloudpickle can send it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int):
        return np.zeros(2)


class Slow:
    """Indexed samples that take a little while, so a worker can be killed
    with batches still to come."""

    def __init__(self, n: int = 240, delay: float = 0.002) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        time.sleep(self.delay)
        return {"i": i, "x": np.full(16, i, dtype=np.uint8)}


def make_numpy_rows(n: int, dim: int = 6) -> NumpyRows:
    """The factory a ``python: {factory: ...}`` spec names."""
    return NumpyRows(n, dim)


class MixedNumbers:
    """An int label, except a float at index ``odd``."""

    def __init__(self, n: int = 24, odd: int = 5) -> None:
        self.n, self.odd = n, odd

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return {"y": 0.5 if i == self.odd else i}


class Occasional:
    """Draws from each generator only now and then (``random`` at indices
    3 mod 17, numpy at 5 mod 23, torch — imported on first use — at 7 mod
    29), and returns a strided (not C-contiguous) row at every fifth index:
    the worker learns which generators to seed as it goes, and writes
    samples both by its plan and through the Python conversion."""

    def __init__(self, n: int = 120) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        noise = 0.0
        if i % 17 == 3:
            noise += random.random()
        if i % 23 == 5:
            noise += float(np.random.rand())
        if i % 29 == 7:
            import torch

            noise += float(torch.rand(()))
        row = np.arange(8, dtype=np.float64) + i
        if i % 5 == 0:
            row = np.arange(16, dtype=np.float64)[::2] + i
        return row, noise, i


class Variable:
    """Rows of length 1 + index % 7 (so no two neighbours match), with
    random noise; index 9 raises."""

    def __init__(self, n: int = 50) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if i == 9:
            raise ValueError("sample 9 is unreadable")
        return np.arange(1 + i % 7, dtype=np.float32) + i + np.random.rand(), i


def pad_collate(samples):
    """A padding collate_fn: rows padded with -1 to the batch's longest,
    their lengths, and the labels."""
    longest = max(len(row) for row, _ in samples)
    out = np.full((len(samples), longest), -1.0, dtype=np.float32)
    for k, (row, _) in enumerate(samples):
        out[k, : len(row)] = row
    return {
        "x": out,
        "lengths": np.array([len(row) for row, _ in samples], dtype=np.int64),
        "labels": [label for _, label in samples],
    }


def failing_collate(samples):
    raise RuntimeError(f"cannot pad {len(samples)} rows")


class ThreadCounts:
    """Each sample: the intra-op threads torch runs with in the worker that
    read it, and ``OMP_NUM_THREADS`` there (-1 when unset)."""

    def __init__(self, n: int = 16) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import os

        import torch

        return {"torch": torch.get_num_threads(), "omp": int(os.environ.get("OMP_NUM_THREADS", "-1"))}


class SlowTorch:
    """Samples made by torch ops that take a little while (as a transform
    pipeline's do), and a random draw: a worker is inside ``__getitem__``
    (and its batch generator) most of the time."""

    def __init__(self, n: int = 240, delay: float = 0.004) -> None:
        self.n, self.delay = n, delay

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import torch

        time.sleep(self.delay)
        x = torch.full((3, 8, 8), float(i)) * torch.rand(1)
        return x.float(), i


class Batched:
    """A dataset with DataLoader's batched fetch (``__getitems__``, as
    Hugging Face ``datasets`` have): each sample says which way it was
    read, and with ``draws`` it adds a number from numpy's global RNG."""

    def __init__(self, n: int = 96, draws: bool = False) -> None:
        self.n, self.draws = n, draws

    def __len__(self) -> int:
        return self.n

    def _sample(self, i: int, via: int):
        extra = np.random.random() if self.draws else 0.0
        return {"i": np.int64(i), "via": via, "x": np.full(4, i, dtype=np.float32) + extra}

    def __getitem__(self, i: int):
        return self._sample(i, 0)

    def __getitems__(self, indices):
        return [self._sample(i, 1) for i in indices]


class Windows:
    """Dict samples shaped like the ``tokens`` dataset's with context 1:
    ``{"tokens": [base + i, base + i + 1]}`` as uint32, so a mixture's
    batch says which source and which sample each row is."""

    def __init__(self, n: int, base: int = 0, width: int = 2) -> None:
        self.n, self.base, self.width = n, base, width

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return {"tokens": np.arange(self.base + i, self.base + i + self.width, dtype=np.uint32)}


class CachedPhotos:
    """A dataset split for the sample cache (``loader_load`` /
    ``loader_transform``): a deterministic "decoded" PIL image per index
    (slow to make: ``load_s`` seconds), then a random crop and flip drawn
    from Python's and numpy's RNGs, and the label. Counts its loads in
    ``loads_dir`` (one file per load) when given, so a test sees which
    indexes were loaded rather than read from the cache."""

    def __init__(self, n: int = 48, size: int = 40, load_s: float = 0.002, loads_dir=None) -> None:
        self.n, self.size, self.load_s, self.loads_dir = n, size, load_s, loads_dir

    def __len__(self) -> int:
        return self.n

    def loader_load(self, i: int):
        from PIL import Image

        time.sleep(self.load_s)
        if self.loads_dir is not None:
            import os

            open(os.path.join(self.loads_dir, f"{i}-{os.getpid()}-{time.monotonic_ns()}"), "w").close()
        pixels = (np.arange(self.size * self.size * 3, dtype=np.uint32).reshape(self.size, self.size, 3) * (i + 7)) % 251
        image = Image.fromarray(pixels.astype(np.uint8), "RGB")
        image.info["index"] = i  # kept with the pixels
        return image

    def loader_transform(self, image, i: int):
        assert image.info["index"] == i
        left, top = random.randrange(8), int(np.random.randint(8))
        crop = image.crop((left, top, left + 24, top + 24))
        if random.random() < 0.5:
            from PIL import Image

            crop = crop.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return np.asarray(crop).copy(), i

    def __getitem__(self, i: int):
        return self.loader_transform(self.loader_load(i), i)


class CachedArrays:
    """A dataset split for the sample cache whose loaded half is a numpy
    array (stored pickled, out of band) that the transform changes in
    place: the copy read back must be writable and the cache's own bytes
    must not change."""

    def __init__(self, n: int = 40, load_s: float = 0.002) -> None:
        self.n, self.load_s = n, load_s

    def __len__(self) -> int:
        return self.n

    def loader_load(self, i: int):
        time.sleep(self.load_s)
        return {"x": np.full(16, i, dtype=np.float32), "tag": f"row-{i}"}

    def loader_transform(self, loaded, i: int):
        x = loaded["x"]
        x += np.random.rand(16).astype(np.float32)  # in place
        assert loaded["tag"] == f"row-{i}"
        return x, i

    def __getitem__(self, i: int):
        return self.loader_transform(self.loader_load(i), i)


class CheapCached:
    """A split dataset whose load costs nothing (a row of a table in
    memory): reading it back from the cache cannot pay."""

    def __init__(self, n: int = 4000) -> None:
        self.n = n
        self.table = np.arange(n * 4, dtype=np.int64).reshape(n, 4)

    def __len__(self) -> int:
        return self.n

    def loader_load(self, i: int):
        return self.table[i]

    def loader_transform(self, row, i: int):
        return row + 1, i

    def __getitem__(self, i: int):
        return self.loader_transform(self.loader_load(i), i)


class WorkerInfoRows:
    """Samples saying what ``torch.utils.data.get_worker_info()`` answered
    in the worker that made them, as a dataset that opens a handle per
    worker or splits work by worker asks: (index, id, num_workers, seed,
    whether ``dataset`` is this object, the worker_init_fn's mark)."""

    #: Set by ``mark_worker`` (a worker_init_fn) in the worker.
    marked = -1

    def __init__(self, n: int = 64) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import torch

        info = torch.utils.data.get_worker_info()
        if info is None:
            return np.array([i, -1, -1, -1, -1, WorkerInfoRows.marked], dtype=np.int64)
        same = int(info.dataset is self)
        return np.array([i, info.id, info.num_workers, info.seed, same, WorkerInfoRows.marked], dtype=np.int64)


def mark_worker(worker_id: int) -> None:
    """A worker_init_fn: records its argument where the samples show it."""
    WorkerInfoRows.marked = 100 + worker_id


class Indexed:
    """Samples that say their index: ``{"i": i, "x": float32[2]}``."""

    def __init__(self, n: int = 40) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        return {"i": i, "x": np.full(2, i, dtype=np.float32)}


#: Normalize's mean and std of torchvision_folder's pipeline.
FOLDER_MEAN, FOLDER_STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def torchvision_train_folder(root: str, size: int = 32):
    """torchvision's ImageFolder over ``root`` with train transforms
    (RandomResizedCrop, RandomHorizontalFlip, PILToTensor): random draws
    per sample, for the shared-stream test of test_native_deployment.py."""
    from torchvision import datasets, transforms as T

    return datasets.ImageFolder(root, transform=T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.PILToTensor()]))


def torchvision_folder(root: str, size: int = 32, jitter: bool = False):
    """torchvision's ImageFolder over ``root`` with eval transforms (Resize,
    CenterCrop, ToTensor, Normalize), the factory of a deployment's
    ``python: {factory: ..., native_transforms: true}`` entry
    (test_native_deployment.py); ``jitter`` adds a ColorJitter, which keeps
    it in Python."""
    from torchvision import datasets, transforms as T

    steps = [T.Resize(size + size // 4), T.CenterCrop(size)]
    if jitter:
        steps.append(T.ColorJitter(brightness=0.2))
    steps += [T.ToTensor(), T.Normalize(FOLDER_MEAN, FOLDER_STD)]
    return datasets.ImageFolder(root, transform=T.Compose(steps))
