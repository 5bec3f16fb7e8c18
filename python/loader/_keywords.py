"""DataLoader's keywords, as ``Loader.local`` takes them: each is either
translated into what Loader does (a recognised sampler into ``shuffle``,
``seed`` and ``drop_last``; ``generator`` into the seed; ``num_workers``
into workers; ``pin_memory`` into the pin stage; ``prefetch_factor`` into
the prefetch window; ``timeout`` into a per-batch wait limit) or refused in
one line that names it and says why.

Loader plans every order itself, from (seed, epoch, position), so that any
worker can make any batch, a dead worker's batches are made again
identically, and a state resumes exactly on any number of workers or ranks.
A sampler is therefore read for what it *means* (sequential, shuffled with
this seed, this rank of that many) rather than run. Samplers whose meaning
is not one of those (weights, a user's own index list) are refused by name
for now: docs/migrating-from-dataloader.md says what to use instead.
"""

from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from typing import Any, Optional

from ._dataset import is_dataset, is_iterable_dataset

_log = logging.getLogger("loader")

#: Loader.local's worker count when neither ``num_workers`` nor
#: ``workers`` is given (DataLoader's 0 would be one worker here).
DEFAULT_WORKERS = 2


@dataclass
class Settings:
    """What DataLoader's keywords came to: the job's sampling settings (None
    where not given: the caller applies its defaults), the worker count and
    the loader options they set."""

    batch_size: Optional[int] = None
    shuffle: Optional[bool] = None
    seed: Optional[int] = None
    drop_last: Optional[bool] = None
    workers: int = DEFAULT_WORKERS
    #: Seconds ``next`` may wait for one batch (0: no limit).
    timeout: float = 0.0
    #: A sampler Loader runs in its workers once per pass
    #: (``loader._sampled``), or None.
    sampler: Any = None
    options: dict = field(default_factory=dict)


def translate(
    *,
    dataset: Any,
    batch_size: Optional[int],
    shuffle: Optional[bool],
    sampler: Any,
    batch_sampler: Any,
    num_workers: Optional[int],
    workers: Optional[int],
    pin_memory: bool,
    pin_memory_device: str,
    drop_last: Optional[bool],
    timeout: float,
    generator: Any,
    seed: Optional[int],
    prefetch_factor: Optional[int],
    persistent_workers: bool,
    in_order: Optional[bool],
    options: dict,
) -> Settings:
    """DataLoader's keywords (and Loader's equivalents) as ``Settings``;
    a conflict or an unsupported value raises ``TypeError``/``ValueError``
    naming the keyword."""
    out = Settings(batch_size=batch_size, shuffle=shuffle, seed=seed, drop_last=drop_last, options=dict(options))
    if not _is_dataset(dataset):
        for name, value in (("sampler", sampler), ("batch_sampler", batch_sampler), ("generator", generator)):
            if value is not None:
                raise TypeError(f"{name}: only for a dataset; a job spec sets its sampler itself")
    out.workers = _workers(num_workers, workers)
    if batch_sampler is not None:
        # DataLoader's rule: batch_sampler excludes the others.
        clash = [
            name
            for name, given in (
                ("batch_size", batch_size not in (None, 1)),
                ("shuffle", bool(shuffle)),
                ("sampler", sampler is not None),
                ("drop_last", bool(drop_last)),
            )
            if given
        ]
        if clash:
            raise ValueError(f"batch_sampler option is mutually exclusive with {', '.join(clash)} (as in DataLoader)")
        sampler, out.batch_size, out.drop_last = _batch_sampler(batch_sampler)
    if sampler is not None:
        if shuffle is not None and shuffle is not False:
            raise ValueError("sampler option is mutually exclusive with shuffle (as in DataLoader)")
        out.shuffle, sampler_seed, out.sampler = _sampler(sampler, dataset)
        if sampler_seed is not None:
            if seed is not None and int(seed) != sampler_seed:
                raise TypeError(f"seed={seed}: the sampler is seeded {sampler_seed}; give one of them")
            out.seed = sampler_seed
    if generator is not None:
        generator_seed = _generator_seed(generator)
        if out.seed is not None and out.seed != generator_seed:
            raise TypeError("generator: give it or seed=, not both (the generator's initial_seed() seeds the job)")
        out.seed = generator_seed
    out.timeout = _timeout(timeout)
    if prefetch_factor is not None:
        if "prefetch" in options:
            raise TypeError("prefetch_factor: give it or prefetch=, not both (the same window)")
        factor = int(prefetch_factor)
        if factor < 1:
            raise ValueError(f"prefetch_factor must be at least 1, not {prefetch_factor}")
        out.options["prefetch"] = factor
    if not isinstance(persistent_workers, bool):
        raise TypeError(f"persistent_workers must be a bool, not {type(persistent_workers).__name__}")
    if in_order is not None:
        if "in_order" in options:
            raise TypeError("in_order: given twice")
        out.options["in_order"] = bool(in_order)
    _pin(pin_memory, pin_memory_device, out.options)
    return out


def _workers(num_workers: Optional[int], workers: Optional[int]) -> int:
    if num_workers is not None and workers is not None:
        raise TypeError("num_workers and workers are the same setting: give one")
    if num_workers is None:
        return DEFAULT_WORKERS if workers is None else int(workers)
    n = int(num_workers)
    if n < 0:
        raise ValueError(f"num_workers option should be non-negative, not {num_workers} (as in DataLoader)")
    if n == 0:
        # DataLoader loads in the trainer itself then; Loader's samples are
        # always made in worker processes, so one worker does it.
        _log.info("num_workers=0: Loader makes samples in worker processes only; using one worker")
        return 1
    return n


def _batch_sampler(batch_sampler: Any) -> tuple[Any, int, bool]:
    torch = _torch()
    if torch is not None and type(batch_sampler) is torch.utils.data.BatchSampler:
        return batch_sampler.sampler, int(batch_sampler.batch_size), bool(batch_sampler.drop_last)
    raise TypeError(
        f"batch_sampler: a {type(batch_sampler).__name__} cannot be planned by Loader, whose batches all "
        "hold batch_size samples; give torch's BatchSampler over any sampler, or sampler= with batch_size= and drop_last="
    )


def _sampler(sampler: Any, dataset: Any) -> tuple[bool, Optional[int], Any]:
    """``(shuffle, seed or None, sampler to run or None)``: a sampler whose
    meaning Loader's own orders have (sequential, shuffled, one rank of
    one) becomes them; any other is run in the workers once per pass
    (``loader._sampled``)."""
    torch = _torch()
    data = torch.utils.data if torch is not None else None
    if data is not None and isinstance(sampler, data.DistributedSampler):
        if sampler.num_replicas != 1 or sampler.rank != 0:
            raise ValueError(
                f"sampler: a DistributedSampler for rank {sampler.rank} of {sampler.num_replicas}: "
                "Loader.local is one rank; read a deployment with Loader(coordinator, job, rank=, world_size=), "
                "whose ranks get exactly DistributedSampler's split"
            )
        if type(sampler) is data.DistributedSampler:
            _same_length(sampler.dataset, dataset, "DistributedSampler")
            return bool(sampler.shuffle), int(sampler.seed), None
    if data is not None and isinstance(sampler, data.RandomSampler) and _plain_random(sampler, data):
        _same_length(sampler.data_source, dataset, "RandomSampler")
        # accelerate's SeedableRandomSampler keeps its seed as initial_seed.
        seed = getattr(sampler, "initial_seed", None)
        if seed is None and sampler.generator is not None:
            seed = _generator_seed(sampler.generator)
        return True, None if seed is None else int(seed), None
    if data is not None and type(sampler) is data.SequentialSampler:
        _same_length(sampler.data_source, dataset, "SequentialSampler")
        return False, None, None
    if not is_dataset(dataset):
        raise TypeError(
            f"sampler: a {type(sampler).__name__} runs over a map-style dataset; an iterable one is read "
            "as shards (shuffle=, shuffle_buffer=)"
        )
    return False, None, sampler


def _plain_random(sampler: Any, data: Any) -> bool:
    """A RandomSampler that draws each sample once per pass (Loader's own
    shuffle), not with replacement or a different count."""
    if sampler.replacement:
        return False
    drawn = getattr(sampler, "_num_samples", None)
    return drawn is None or drawn == len(sampler.data_source)


def _same_length(source: Any, dataset: Any, what: str) -> None:
    try:
        same = source is dataset or len(source) == len(dataset)
    except TypeError:
        return
    if not same:
        raise ValueError(f"sampler: the {what} is over {len(source)} samples, the dataset holds {len(dataset)}")


def _generator_seed(generator: Any) -> int:
    seed = getattr(generator, "initial_seed", None)
    if not callable(seed):
        raise TypeError(f"generator must be a torch.Generator, not {type(generator).__name__}")
    # Loader's seeds are unsigned 64-bit; torch's initial seeds fit.
    return int(seed()) & ((1 << 64) - 1)


def _timeout(timeout: Any) -> float:
    try:
        value = float(timeout)
    except (TypeError, ValueError):
        raise TypeError(f"timeout must be a number of seconds, not {type(timeout).__name__}") from None
    if value < 0 or value != value:
        raise ValueError(f"timeout option should be non-negative, not {timeout} (as in DataLoader)")
    return value


def _pin(pin_memory: bool, pin_memory_device: str, options: dict) -> None:
    """``pin_memory=True``: batches go through Loader's pin stage, copied
    to the GPU straight from the shared-memory ring (``device="auto"``,
    or ``pin_memory_device``), so they arrive as CUDA tensors; without a
    usable GPU they stay in host memory, with one warning, as DataLoader
    warns."""
    if pin_memory_device and not pin_memory:
        raise TypeError("pin_memory_device: give pin_memory=True too (as in DataLoader)")
    if not pin_memory:
        return
    if "device" in options:
        raise TypeError("pin_memory: give it or device=, not both (pin_memory=True is device='auto')")
    options["device"] = pin_memory_device or "auto"


def _is_dataset(obj: Any) -> bool:
    """A dataset object, as opposed to a job spec (a dict, a path, spec
    text) or a ``loader.Mix``."""
    return is_dataset(obj) or is_iterable_dataset(obj)


def _torch() -> Any:
    return sys.modules.get("torch")
