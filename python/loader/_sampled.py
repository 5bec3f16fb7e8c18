"""A user's own sampler (``Loader.local(dataset, sampler=...)``: a
``WeightedRandomSampler``, a sampler written for DataLoader), run once per
pass, in the workers, as a pure function of (seed, pass).

Loader plans a job as positions 0..len(sampler) of each pass, in order;
position ``p`` of pass ``e`` is the ``p``-th index the sampler yields in
pass ``e``. Each worker runs the sampler itself when it first needs a pass
(and keeps the last few), with the job's seed and the pass number put
where a sampler draws from: ``set_epoch(e)`` when it has one, its
``generator`` reseeded, and Python's, numpy's and torch's global generators
seeded. Any worker so computes the same order for a pass, so a dead
worker's batches are made again identically and a state resumes exactly,
as for every other order. A sampler whose order is not a function of those
(it reads the clock, ``os.urandom``, a generator it keeps elsewhere) is
found out when the loader is made (it is run twice for pass 0) and said in
one warning: its passes are not reproducible, so a resume or a worker's
death may repeat or skip samples.
"""

from __future__ import annotations

import logging
from typing import Any

from ._rngs import restore_states, save_states, seed_all

_log = logging.getLogger("loader")

#: Passes a worker keeps the order of (the current one, and one either side).
_KEPT = 3

#: The ``index`` of ``sample_seed(seed, epoch, index)`` for a pass's seed:
#: no sample has it.
_PASS_INDEX = (1 << 64) - 1


def pass_order(sampler: Any, seed: int, epoch: int) -> list[int]:
    """The indices ``sampler`` yields in pass ``epoch`` of a job seeded
    ``seed``: the same in every process."""
    from . import _native

    pass_seed = _native.sample_seed(seed, epoch, _PASS_INDEX)
    seed_all(pass_seed)
    set_epoch = getattr(sampler, "set_epoch", None)
    if callable(set_epoch):
        set_epoch(epoch)
    generator = getattr(sampler, "generator", None)
    if generator is not None and callable(getattr(generator, "manual_seed", None)):
        generator.manual_seed(pass_seed & ((1 << 63) - 1))
    return [int(i) for i in sampler]


def check(sampler: Any, dataset_len: int, seed: int) -> int:
    """The number of positions of a pass (``len(sampler)``), after checking
    in the trainer that the sampler's pass 0 names indices of the dataset
    and comes out the same twice (warned once when not). The trainer's
    RNG states are left as they were."""
    try:
        n = len(sampler)
    except TypeError:
        raise TypeError(f"sampler: a {type(sampler).__name__} has no len(); Loader plans a pass of len(sampler) positions") from None
    if n <= 0:
        raise ValueError(f"sampler: a {type(sampler).__name__} of {n} samples draws nothing")
    saved = save_states()
    try:
        first, second = pass_order(sampler, seed, 0), pass_order(sampler, seed, 0)
    finally:
        restore_states(saved)
    if len(first) != n:
        raise ValueError(f"sampler: a {type(sampler).__name__} says len() is {n} but yields {len(first)} indices")
    bad = next((i for i in first if not 0 <= i < dataset_len), None)
    if bad is not None:
        raise ValueError(f"sampler: a {type(sampler).__name__} yields index {bad}, outside the dataset's {dataset_len} samples")
    if first != second:
        _log.warning(
            "sampler: a %s gives another order each time it runs with the same seed and epoch (it draws from something "
            "Loader does not seed): a worker's death or a resume may repeat or skip samples",
            type(sampler).__name__,
        )
    return n


class PassOrders:
    """The worker's half: position -> dataset index, by pass."""

    __slots__ = ("_sampler", "_seed", "_orders")

    def __init__(self, sampler: Any, seed: int) -> None:
        self._sampler = sampler
        self._seed = int(seed)
        self._orders: dict[int, list[int]] = {}

    def __len__(self) -> int:
        return len(self._sampler)

    def indices(self, positions: list, epoch: int) -> list[int]:
        order = self._orders.get(epoch)
        if order is None:
            order = pass_order(self._sampler, self._seed, epoch)
            self._orders[epoch] = order
            for old in sorted(self._orders)[:-_KEPT]:
                del self._orders[old]
        return [order[int(p)] for p in positions]
