"""What training frameworks look for on a DataLoader besides iterating it:
``dataloader.sampler.set_epoch`` and ``dataloader.batch_sampler.sampler
.set_epoch`` (Lightning, accelerate), ``batch_size``, ``drop_last`` and
``dataset`` (accelerate's ``skip_first_batches``, transformers' Trainer).

A Loader has no sampler to run: it plans each pass from (seed, epoch,
position). These objects stand where a DataLoader's sampler stands and
forward ``set_epoch`` to the loader, so a framework that reshuffles by
calling it gets the pass it asked for. ``Pass`` is the iterator
``iter(loader)`` returns: one pass's batches.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

# `loader: Any` below is the Loader these stand for: the Loader module
# imports this one, so naming its class here would tie the two in a circle.


class EpochSampler:
    """``loader.sampler``: ``set_epoch(e)`` makes the next pass epoch
    ``e``; ``len()`` is the samples of one pass for this rank. Iterating
    it is refused: Loader's indices are made in its workers."""

    __slots__ = ("_loader",)

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)

    @property
    def epoch(self) -> int:
        return self._loader.epoch

    def __len__(self) -> int:
        loader = self._loader
        return len(loader) * int(loader.batch_size or 1)

    def __iter__(self) -> Iterator[int]:
        raise TypeError(
            "a Loader's sampler is planned in its workers from (seed, epoch, position); "
            "batch.indices says which samples each batch holds"
        )

    def __repr__(self) -> str:
        return f"<loader sampler of {self._loader!r}>"


class EpochBatchSampler:
    """``loader.batch_sampler``: its ``sampler`` (an ``EpochSampler``),
    ``batch_size``, ``drop_last`` and ``len()`` (batches of one pass)."""

    __slots__ = ("_loader", "sampler")

    def __init__(self, loader: Any) -> None:
        self._loader = loader
        self.sampler = EpochSampler(loader)

    def set_epoch(self, epoch: int) -> None:
        self._loader.set_epoch(epoch)

    @property
    def batch_size(self) -> Optional[int]:
        return self._loader.batch_size

    @property
    def drop_last(self) -> bool:
        return self._loader.drop_last

    def __len__(self) -> int:
        return len(self._loader)

    def __iter__(self) -> Iterator[Any]:
        return iter(self.sampler)


class SpecDataset:
    """``loader.dataset`` of a job spec (the dataset lives in the workers):
    its size, for frameworks that take ``len(dataloader.dataset)``."""

    __slots__ = ("_n",)

    def __init__(self, num_samples: int) -> None:
        self._n = int(num_samples)

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, index: int) -> Any:
        raise TypeError("the samples of a job spec's dataset are read in Loader's workers, not in the trainer")

    def __repr__(self) -> str:
        return f"<dataset of a Loader job: {self._n} samples>"


class Pass:
    """The iterator of one pass. A class, not a generator: an exception
    raised while waiting (KeyboardInterrupt, a ``timeout``) leaves it
    usable, and the next ``next()`` yields the batch that was being waited
    for. Once a newer ``iter()`` began another pass it is exhausted, as a
    DataLoader's old iterator is of no use then."""

    __slots__ = ("_loader", "_end", "_pass")

    def __init__(self, loader: Any, end: int, pass_: int) -> None:
        self._loader = loader
        self._end = end
        self._pass = pass_

    def __iter__(self) -> "Pass":
        return self

    def __len__(self) -> int:
        return max(0, self._end - self._loader._yielded) if self._pass == self._loader._pass else 0

    def __next__(self) -> Any:
        loader = self._loader
        if loader._yielded >= self._end or loader._pass != self._pass:
            raise StopIteration
        batch = loader._next()
        if batch is None:
            raise StopIteration
        return batch
