"""Iterable datasets for test_stream.py, at module level so workers
unpickle them by reference (and a deployment's workers import the
factories from PYTHONPATH)."""

from __future__ import annotations

import random
import time

import numpy as np

try:
    import torch
    from torch.utils.data import IterableDataset, get_worker_info
except ImportError:  # the protocol datasets need no torch
    torch = None
    IterableDataset = object

    def get_worker_info():
        return None


#: 7 uneven shards, one of them empty: 83 samples.
SIZES = (13, 2, 29, 0, 7, 21, 11)


def shard_base(i: int, sizes=SIZES) -> int:
    return sum(sizes[:i])


class Shardy:
    """Loader's shard protocol: shard i yields ids shard_base(i) ..; each
    sample carries its id, its shard and a draw from Python's and numpy's
    generators (an augmentation), and may sleep (a slow source)."""

    def __init__(self, sizes=SIZES, delay: float = 0.0, seekable: bool = False, fail_at: int = -1) -> None:
        self.sizes = tuple(sizes)
        self.delay = delay
        self.seekable = seekable
        self.fail_at = fail_at
        self.opened = 0

    def __iter__(self):
        for i in range(len(self.sizes)):
            yield from self.__loader_shard__(i)

    def __loader_shards__(self) -> int:
        return len(self.sizes)

    def __loader_shard__(self, i: int):
        base = shard_base(i, self.sizes)
        for k in range(self.sizes[i]):
            if base + k == self.fail_at:
                raise OSError(f"disk error at {base + k}")
            if self.delay:
                time.sleep(self.delay)
            yield {"id": np.int64(base + k), "shard": i, "noise": random.random() + np.random.rand()}


class CountedShardy(Shardy):
    """Shardy that gives its shards' lengths (Loader does not count)."""

    def __loader_shard_lengths__(self):
        return list(self.sizes)


class LoggedShardy(Shardy):
    """CountedShardy that logs every sample its iterators yield to a file
    (each worker appends), and cannot seek: what Loader reads to skip
    shows."""

    def __init__(self, log: str, **kw) -> None:
        super().__init__(**kw)
        self.log = log

    def __loader_shard__(self, i: int):
        for sample in super().__loader_shard__(i):
            with open(self.log, "a") as f:
                f.write(f"{int(sample['id'])}\n")
            yield sample

    def __loader_shard_lengths__(self):
        return list(self.sizes)


class SeekingShardy(Shardy):
    """Shardy that starts a shard where Loader asks (`start`), and counts
    in a file how many samples it yielded in all (to show no skip reads)."""

    def __init__(self, log: str, **kw) -> None:
        super().__init__(**kw)
        self.log = log

    def __loader_shard__(self, i: int, start: int = 0):
        base = shard_base(i, self.sizes)
        for k in range(start, self.sizes[i]):
            with open(self.log, "a") as f:
                f.write(f"{base + k}\n")
            yield {"id": np.int64(base + k), "shard": i, "noise": 0.0}

    def __loader_shard_lengths__(self):
        return list(self.sizes)


class WorkerSplit(IterableDataset):
    """Written for DataLoader: splits its ids by get_worker_info()."""

    def __init__(self, n: int = 50) -> None:
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        ids = range(self.n)
        if info is not None:
            ids = ids[info.id :: info.num_workers]
        for i in ids:
            yield {"id": torch.tensor(i), "x": torch.full((3,), float(i)) + torch.rand(3)}


def shardy(**kw) -> Shardy:
    """Factory of a deployment's spec."""
    return Shardy(**kw)
