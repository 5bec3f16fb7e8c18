"""Iterable-style datasets (``torch.utils.data.IterableDataset``, Hugging
Face ``datasets.IterableDataset``, any object with ``__iter__`` and no
``__getitem__``) read as shards of known length.

Loader delivers every sample exactly once, in an order fixed by the job,
whatever the number of workers and whoever dies: that takes positions, and
a stream has none. So a stream is cut into **shards** that can each be read
again from its start, and Loader counts each shard once (or is told the
counts); sample ``i`` of the job is then "the ``k``-th sample of shard
``s``", which any worker can produce. The job's sampler reads the shards
as a few lanes, each front to back (``loader-proto``'s ``Lanes``): a
worker keeps to one lane, so it reads each of its shards once, in order,
as a DataLoader worker reads its split.

Where the shards come from, first match wins:

- the dataset says: ``__loader_shards__()`` returns the number of shards
  and ``__loader_shard__(i)`` an iterable of shard ``i``'s samples (with a
  ``start`` keyword if it can begin at a sample: Loader then passes it
  instead of reading up to it); ``__loader_shard_lengths__()``, if given,
  returns their lengths and spares the count;
- a Hugging Face ``IterableDataset``: its ``n_shards`` (its files), each
  read as ``dataset.shard(n_shards, i)``;
- any other iterable dataset, written for DataLoader: shard ``w`` of
  ``num_workers`` is what ``iter(dataset)`` yields while
  ``torch.utils.data.get_worker_info()`` says worker ``w`` of
  ``num_workers``, so a dataset that splits its stream by worker (the
  common pattern) is split as under ``DataLoader(num_workers=...)``, and one
  that does not is read whole by each, as under DataLoader.

A shard must yield the same samples each time it is read (files, a seeded
generator): exactly-once rests on it, and a shard that comes up short is
reported, per missing sample, as a sample that cannot be read. Random
augmentations inside the iterator draw from generators seeded per shard
and epoch (``seed_rngs``), so a shard read again after a worker died
yields what it would have.

The shuffle of a stream: the shards' order changes every epoch, and the
samples of a shard are shuffled within consecutive windows of
``shuffle_buffer`` samples (the reader holds at most that many). Both are
functions of the seed and the epoch alone: the same with any number of
workers, and after a resume.
"""

from __future__ import annotations

import bisect
import inspect
import sys
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any, Callable, Optional

from . import _native
from ._rngs import restore_states, save_states, seed_all
from ._source import Raised, _last_line, make_from_factory

#: Samples a shuffled stream is shuffled within by default (as Hugging
#: Face's ``IterableDataset.shuffle``).
DEFAULT_SHUFFLE_BUFFER = 1000

#: Open shard iterators a worker keeps (one per lane it reads, and the
#: ranks' interleaved reads of one lane share one).
_CURSORS = 8


class StreamError(ValueError):
    """A stream Loader cannot shard (one line)."""


def is_hf_iterable(dataset: Any) -> bool:
    """A Hugging Face ``datasets.IterableDataset``."""
    return any(c.__module__.startswith("datasets.") and c.__name__ == "IterableDataset" for c in type(dataset).__mro__)


class Shards:
    """How to read a stream's shards: ``count`` of them, ``open(i, start)``
    an iterator over shard ``i`` from sample ``start`` (or from 0, when
    ``seeks`` is False), and the lengths if the dataset gave them."""

    def __init__(self, dataset: Any, num_workers: int) -> None:
        self.dataset = dataset
        self.num_workers = max(1, int(num_workers))
        self.kind = _kind(dataset)
        self.seeks = False
        if self.kind == "protocol":
            try:
                n = dataset.__loader_shards__()
            except Exception as e:
                raise StreamError(f"__loader_shards__() raised {_last_line(e)}") from None
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise StreamError(f"__loader_shards__() must return a number of shards >= 1, not {n!r}")
            self.count = n
            try:
                params = inspect.signature(dataset.__loader_shard__).parameters
            except (TypeError, ValueError):
                params = {}
            self.seeks = "start" in params
        elif self.kind == "hf":
            self.count = int(dataset.n_shards)
        else:
            self.count = self.num_workers

    def lengths(self) -> Optional[list[int]]:
        """The lengths the dataset gives (``__loader_shard_lengths__``), or
        None: they are counted."""
        fn = getattr(self.dataset, "__loader_shard_lengths__", None) if self.kind == "protocol" else None
        if fn is None:
            return None
        try:
            lengths = list(fn())
        except Exception as e:
            raise StreamError(f"__loader_shard_lengths__() raised {_last_line(e)}") from None
        if len(lengths) != self.count or not all(isinstance(n, int) and n >= 0 for n in lengths):
            raise StreamError(
                f"__loader_shard_lengths__() must return {self.count} counts >= 0 (one per shard), not {lengths!r}"
            )
        return lengths

    def open(self, i: int, start: int) -> Iterator[Any]:
        """Shard ``i``'s samples from ``start`` if the dataset seeks, else
        from its first (the caller skips)."""
        _set_worker_info(self.dataset, i if self.kind == "workers" else None, self.num_workers)
        if self.kind == "protocol":
            it = self.dataset.__loader_shard__(i, start=start) if self.seeks and start else self.dataset.__loader_shard__(i)
        elif self.kind == "hf":
            it = self.dataset.shard(num_shards=self.count, index=i, contiguous=True)
        else:
            it = self.dataset
        return iter(it)

    def enter(self, i: int) -> None:
        """Called before each read of shard ``i``'s iterator: what
        ``get_worker_info()`` answers while it runs."""
        _set_worker_info(self.dataset, i if self.kind == "workers" else None, self.num_workers)

    def count_shard(self, i: int) -> int:
        """Samples in shard ``i``: reads it once."""
        n = 0
        with _worker_info_kept():
            try:
                it = self.open(i, 0)
                self.enter(i)
                for _ in it:
                    n += 1
            except Exception as e:
                raise StreamError(f"shard {i} raised after {n} samples while Loader counted it: {_last_line(e)}") from None
        return n


def _kind(dataset: Any) -> str:
    if hasattr(dataset, "__loader_shards__") and hasattr(dataset, "__loader_shard__"):
        return "protocol"
    if is_hf_iterable(dataset) and hasattr(dataset, "shard") and hasattr(dataset, "n_shards"):
        return "hf"
    return "workers"


class ShardCounter:
    """A map-style dataset whose sample ``i`` is the length of shard ``i``:
    Loader's own workers count a stream's shards with it, in parallel."""

    def __init__(self, shards: Shards) -> None:
        self.shards = shards

    def __len__(self) -> int:
        return self.shards.count

    def __getitem__(self, i: int) -> Any:
        import numpy

        return numpy.int64(self.shards.count_shard(int(i)))

    def __loader_schema_sample__(self) -> Any:
        """What a sample looks like, without counting a shard for it."""
        import numpy

        return numpy.int64(0)


class _Cursor:
    """An open shard: its iterator, the offset of the sample it yields
    next, samples it read ahead in the current shuffle window, and the
    state of the random generators its iterator draws from."""

    __slots__ = ("it", "next", "epoch", "ahead", "rngs", "broken")

    def __init__(self, it: Iterator[Any], start: int, epoch: int) -> None:
        self.it = it
        self.next = start
        self.epoch = epoch
        self.ahead: dict[int, Any] = {}
        #: The generators' state for this iterator while another one has
        #: them (None while it has them, or without seeding).
        self.rngs: Any = None
        #: Why the iterator cannot go on (it raised, or ended early).
        self.broken: Optional[str] = None


class StreamView:
    """A stream as a map-style dataset: sample ``i`` is sample ``i -
    first[s]`` of shard ``s``. Read through ``read_batch``, which keeps
    each shard's iterator open between batches, so consecutive reads of a
    shard cost one step each; reading backwards opens the shard again."""

    #: ``loader._source`` reads a stream view through ``read_batch``.
    __loader_stream__ = True

    def __init__(
        self, shards: Shards, lengths: Sequence[int], shuffle_buffer: int, seed: int, seed_rngs: bool, keep_ahead: int = 0
    ) -> None:
        self.shards = shards
        self.lengths = [int(n) for n in lengths]
        self.first = []
        total = 0
        for n in self.lengths:
            self.first.append(total)
            total += n
        self.total = total
        self.window = int(shuffle_buffer)
        self.seed = int(seed)
        self.seed_rngs = bool(seed_rngs)
        #: Samples a cursor keeps when it reads past them: a shuffle
        #: window's, and, for a job of several ranks, the other ranks'
        #: samples of a lane's turn (a rank's batch takes every W-th
        #: sample of it), which the same worker reads next.
        self.keep = max(self.window, int(keep_ahead))
        self._cursors: OrderedDict[int, _Cursor] = OrderedDict()
        self._current: Optional[int] = None

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_cursors"] = OrderedDict()
        state["_current"] = None
        return state

    def __len__(self) -> int:
        return self.total

    def __getitem__(self, index: int) -> Any:
        """Sample ``index`` (epoch 0); for a look at a sample outside a
        job (the trainer sizes its ring from sample 0)."""
        with _worker_info_kept():
            sample = next(iter(self.read_batch([int(index)], 0)))
            self._cursors.clear()
            self._current = None
        if isinstance(sample, Raised):
            raise StreamError(sample.reason)
        return sample

    def locate(self, index: int) -> tuple[int, int]:
        """``(shard, offset)`` of sample ``index``: the last shard starting
        at or before it (an empty shard starts where the next one does)."""
        s = bisect.bisect_right(self.first, index) - 1
        return s, index - self.first[s]

    def read_batch(self, indices: Sequence[int], epoch: int) -> Iterator[Any]:
        """The samples ``indices`` of ``epoch``, one at a time, or
        ``Raised`` for one the stream could not give."""
        for index in indices:
            shard, offset = self.locate(int(index))
            yield self._read(shard, offset, epoch)

    def _read(self, shard: int, offset: int, epoch: int) -> Any:
        cursor = self._cursors.get(shard)
        if cursor is not None:
            self._cursors.move_to_end(shard)
            # Another epoch's iterator (its draws differ) is of no use.
            if cursor.epoch == epoch and offset in cursor.ahead:
                return cursor.ahead.pop(offset)
            if cursor.next > offset or cursor.epoch != epoch:
                cursor = None
        if cursor is None:
            cursor = self._open(shard, offset, epoch)
        if cursor.broken is not None:
            return Raised(cursor.broken)
        self._switch(shard, cursor)
        self.shards.enter(shard)
        it, ahead, keep = cursor.it, cursor.ahead, self.keep
        try:
            while cursor.next < offset:
                sample = next(it)
                if keep:
                    # Offsets come in ascending: the first is the oldest.
                    ahead[cursor.next] = sample
                    if len(ahead) > keep:
                        del ahead[next(iter(ahead))]
                cursor.next += 1
            sample = next(it)
            cursor.next += 1
            return sample
        except StopIteration:
            cursor.broken = (
                f"shard {shard} ended after {cursor.next} samples, where Loader counted "
                f"{self.lengths[shard]}: a shard must yield the same samples each time it is read"
            )
        except Exception as e:
            cursor.broken = f"shard {shard}, sample {cursor.next}: {_last_line(e)}"
        return Raised(cursor.broken)

    def _open(self, shard: int, offset: int, epoch: int) -> _Cursor:
        old = self._cursors.pop(shard, None)
        if old is not None:
            _close(old.it)
        while len(self._cursors) >= _CURSORS:
            _, evicted = self._cursors.popitem(last=False)
            _close(evicted.it)
        # Where the iterator starts: a seeking dataset starts at the
        # offset (the start of its shuffle window, so the window's earlier
        # samples are there too).
        start = 0
        if self.shards.seeks:
            start = offset - offset % self.window if self.window else offset
        if self.seed_rngs:
            # The generators get this shard's seed for the epoch; the
            # iterator they held keeps its state for later.
            self._switch(None, None)
            seed_all(_native.sample_seed(self.seed, epoch, self.first[shard] + start))
        try:
            it = self.shards.open(shard, start)
        except Exception as e:
            cursor = _Cursor(iter(()), start, epoch)
            cursor.broken = f"shard {shard} cannot be opened: {_last_line(e)}"
            return cursor
        cursor = _Cursor(it, start, epoch)
        self._cursors[shard] = cursor
        self._current = shard
        return cursor

    def _switch(self, shard: Optional[int], cursor: Optional[_Cursor]) -> None:
        """Makes the random generators hold ``cursor``'s state, saving the
        state of the cursor that had them: each shard's iterator draws its
        own sequence, however its reads interleave with other shards'."""
        if not self.seed_rngs or self._current == shard:
            return
        current = self._cursors.get(self._current) if self._current is not None else None
        if current is not None:
            current.rngs = save_states()
        if cursor is not None and cursor.rngs is not None:
            restore_states(cursor.rngs)
            cursor.rngs = None
        self._current = shard


def _close(it: Any) -> None:
    close = getattr(it, "close", None)
    if close is not None:
        try:
            close()
        except Exception:
            pass


class _worker_info_kept:
    """Keeps what ``get_worker_info()`` answers in this process across a
    read of a shard outside a worker (the trainer's)."""

    def __enter__(self) -> None:
        torch = sys.modules.get("torch")
        self._info = None
        self._module = None
        if torch is not None:
            try:
                from torch.utils.data._utils import worker as torch_worker
            except ImportError:
                return
            self._module = torch_worker
            self._info = torch_worker._worker_info

    def __exit__(self, *exc: Any) -> None:
        if self._module is not None:
            self._module._worker_info = self._info


def _set_worker_info(dataset: Any, worker: Optional[int], num_workers: int) -> None:
    """What ``torch.utils.data.get_worker_info()`` answers: worker
    ``worker`` of ``num_workers`` for a DataLoader-style stream's shard,
    None (as in the main process) for a shard Loader names itself, which
    must not split again (Hugging Face's iterator splits by it)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    try:
        from torch.utils.data._utils import worker as torch_worker
    except ImportError:
        return
    if worker is None:
        torch_worker._worker_info = None
    else:
        torch_worker._worker_info = torch_worker.WorkerInfo(
            id=worker, num_workers=num_workers, seed=worker, dataset=dataset
        )


def count_lengths(shards: Shards, run: Callable[[ShardCounter, int], list[int]]) -> list[int]:
    """The shards' lengths: the dataset's, or counted by ``run`` (which
    reads a ``ShardCounter`` with some workers and returns its samples)."""
    given = shards.lengths()
    if given is not None:
        return given
    lengths = [int(n) for n in run(ShardCounter(shards), shards.count)]
    if len(lengths) != shards.count:
        raise StreamError(f"counted {len(lengths)} shards of {shards.count}")
    if sum(lengths) == 0:
        raise StreamError(f"the stream is empty: its {shards.count} shards yielded no sample")
    return lengths


def from_factory(
    factory: str, args: dict, lengths: list, num_workers: int, shuffle_buffer: int, seed: int, seed_rngs: bool = True, keep_ahead: int = 0
) -> StreamView:
    """A deployment's stream (``python: {factory: ...}`` making an
    iterable dataset), as the SDK rewrote its spec: the factory's dataset
    with the lengths the trainer counted."""
    shards = Shards(make_from_factory(factory, args), num_workers)
    return StreamView(shards, lengths, shuffle_buffer, seed, seed_rngs, keep_ahead)


def counted_in_process(shards: Shards) -> list[int]:
    """The shards' lengths, counted one after another here (a deployment's
    trainer: its workers are not its own to run a counting job on)."""
    with _worker_info_kept():
        return count_lengths(shards, lambda counter, n: [counter.shards.count_shard(i) for i in range(n)])
