"""The global random number generators a worker seeds before each
``__getitem__``: Python's ``random``, numpy's legacy global ``RandomState``
and torch's CPU generator, each from the sample's seed (seed, epoch, index),
so a random augmentation draws the same numbers on any number of workers
and after a resume.

Seeding costs about 9 us per sample (``random.seed`` alone is 6), more
than a small sample takes to read, so a generator is seeded only once the
dataset has been seen drawing from it, checked per batch: at the start of a
batch every generator not seeded yet is put in a fixed sentinel state, and
at its end one draw tells whether any sample drew from it (an untouched
generator gives the sentinel's first draw; any draw moves it on). If one
did, that generator is seeded before every sample from then on and the
batch is read again, so every sample of every batch gets exactly the
numbers it would with every generator seeded before it: a sample that
draws nothing from a generator does not depend on its state. The cost is
one extra read of at most three batches per worker and ~10 us per batch.
Batches of one or two samples are seeded in full (the check would cost
more than it saves), and so are the first two batches of a worker, whose
second batch is timed: a dataset taking 200 us or more a sample (decode,
augmentations) stays seeded in full for good, since seeding is then a few
percent of a sample and reading a batch twice would cost more (and call a
heavy `__getitem__` twice). A library imported during a batch (torch, by a
dataset that imports it in ``__getitem__``) was not seeded for it: that
batch is read again too.
"""

from __future__ import annotations

import random
import sys
import time
from typing import Any, Callable, Optional

#: The state every unseeded generator is put in at the start of a batch.
_SENTINEL = 0x5EED_1E55_0ADE

#: Batches this small seed every generator before every sample.
_SMALL_BATCH = 2

#: Samples at least this slow (seconds) keep every generator seeded.
_HEAVY_SAMPLE = 200e-6

_NAMES = ("random", "numpy", "torch")


def seed_all(sample_seed: int) -> None:
    """Seeds Python's ``random``, numpy's global RNG and, when torch is
    imported, torch's CPU generator, as a worker does before a
    ``__getitem__`` that draws from them. ``torch.default_generator``
    rather than ``torch.manual_seed``, which also seeds every accelerator
    backend and costs a hundred times more per sample."""
    for name in _NAMES:
        fn = _seed_fn(name)
        if fn is not None:
            fn(sample_seed)


def _seed_fn(name: str) -> Optional[Callable[[int], Any]]:
    """The function that seeds generator ``name`` from a 64-bit sample
    seed; None when its library is not imported."""
    if name == "random":
        return random.seed
    module = sys.modules.get(name)
    if module is None:
        return None
    if name == "numpy":
        seed = module.random.seed
        return lambda s: seed(s & 0xFFFF_FFFF)
    return module.default_generator.manual_seed


class Rngs:
    """Which generators a worker seeds per sample, learnt per batch as the
    module docs say. ``enabled=False``: none, ever (``seed_rngs=False``)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        #: Generators seeded before every sample.
        self.seeded: set[str] = set()
        self._seeder: Optional[Callable[[int], None]] = None
        #: The first draw of each generator after the sentinel state, and
        #: how to set that state (random: setstate of a saved state is
        #: cheaper than seed).
        self._sentinel_draw: dict[str, Any] = {}
        self._random_state = None
        #: Generators put in the sentinel state for the batch being read,
        #: or None when that batch is not checked.
        self._armed: Optional[tuple[str, ...]] = None
        #: Libraries imported when the batch began.
        self._present: frozenset[str] = frozenset()
        #: Batches begun, and when and how long the one being read is (the
        #: second is timed); None until then, then whether samples are
        #: heavy enough to keep every generator seeded.
        self._batches = 0
        self._timing: Optional[tuple[float, int]] = None
        self._always: Optional[bool] = None

    def batched(self) -> None:
        """For a dataset read a batch at a time (``__getitems__``): its time
        per sample read one by one says nothing of its time read batched,
        so it is never taken as heavy and no batch is seeded in full
        before the check; a batch that draws is read again seeded, as for
        any dataset."""
        self._always = False

    def begin(self, batch_len: int) -> Optional[Callable[[int], None]]:
        """Called before a batch of ``batch_len`` samples is read: arms the
        check of the generators not seeded yet and returns the function to
        call with each sample's seed before its ``__getitem__`` (None: no
        seeding)."""
        self._armed = None
        if not self.enabled:
            return None
        self._present = frozenset(n for n in _NAMES if n == "random" or n in sys.modules)
        self._timing = None
        if batch_len > 0:
            self._batches += 1
        if batch_len <= _SMALL_BATCH or self._always is not False:
            # Seeded in full; checked only for a library imported during
            # the batch. The second batch is timed.
            if self._always is None and self._batches == 2 and batch_len > 0:
                self._timing = (time.perf_counter(), batch_len)
            self._armed = ()
            return seed_all
        watch = tuple(n for n in _NAMES if n not in self.seeded and n in self._present)
        for name in watch:
            self._put_sentinel(name)
        self._armed = watch
        return self._seeder

    def drawn(self) -> bool:
        """Called after the batch: whether a sample drew from a generator
        that was not seeded. Such generators are seeded from now on (the
        caller reads the batch again). A library imported during the batch
        counts as drawn from: its state at the start is unknown."""
        armed, self._armed = self._armed, None
        if armed is None:
            return False
        if self._timing is not None:
            began, n = self._timing
            self._always = (time.perf_counter() - began) / n >= _HEAVY_SAMPLE
        fresh = [n for n in _NAMES if n not in self._present and n in sys.modules]
        used = [n for n in armed if self._draw(n) != self._sentinel_draw[n]]
        if not (used or fresh):
            return False
        self.seeded.update(used)
        self.seeded.update(fresh)
        fns = [fn for fn in map(_seed_fn, sorted(self.seeded)) if fn is not None]
        if len(fns) == 1:
            self._seeder = fns[0]
        else:
            def seeder(s: int, fns: tuple = tuple(fns)) -> None:
                for fn in fns:
                    fn(s)

            self._seeder = seeder
        return True

    def _put_sentinel(self, name: str) -> None:
        if name not in self._sentinel_draw:
            _seed_fn(name)(_SENTINEL)
            if name == "random":
                self._random_state = random.getstate()
            self._sentinel_draw[name] = self._draw(name)
        if name == "random":
            random.setstate(self._random_state)
        else:
            _seed_fn(name)(_SENTINEL)

    @staticmethod
    def _draw(name: str) -> Any:
        if name == "random":
            return random.getrandbits(64)
        module = sys.modules[name]
        if name == "numpy":
            return module.random.random_sample()
        return bytes(module.default_generator.get_state().numpy())


def save_states() -> tuple:
    """The global generators' states, for ``restore_states``: the
    trainer's, which reading a sample (or running a sampler) in the
    trainer must leave as they were (they seed the user's model, not
    Loader's), and a stream's shard iterator's, which it draws from again
    when its shard is read next (``loader._stream``)."""
    numpy, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    return (
        random.getstate(),
        numpy.random.get_state() if numpy is not None else None,
        torch.default_generator.get_state() if torch is not None else None,
    )


def restore_states(saved: tuple) -> None:
    """Puts back what ``save_states`` saved. A library imported since
    (by the sample or the iterator that ran meanwhile) had no state then:
    its generator is left as it is, as whoever imported it left it, so a
    read that repeats repeats its draws too."""
    py, np_state, torch_state = saved
    random.setstate(py)
    numpy, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    if numpy is not None and np_state is not None:
        numpy.random.set_state(np_state)
    if torch is not None and torch_state is not None:
        torch.default_generator.set_state(torch_state)
