"""The shared-memory ring of a ``Loader.local`` job that the Rust SDK
cannot size from its spec alone: a Python dataset's, whose batch only its
first sample tells, and a built-in dataset's whose batches outgrow the
default slot (a batch of 64 float32 224x224 images is 38.5 MB), where the
SDK alone would stream every batch over gRPC. The batch's bytes come from
the batch layout and the window and slots from the native module's rule
(``python/src/ring.rs``); nothing here knows the layout's constants."""

from __future__ import annotations

import json
import mmap
from typing import Any, Optional

from . import _native
from ._dataset import seeded_sample
from ._options import DEFAULT_PREFETCH
from ._rngs import restore_states, save_states
from ._source import _flatten

#: Room a slot keeps beyond the batch of sample 0: a batch may be larger
#: than one made of sample 0 (a collate_fn that pads to the batch's longest
#: sample), and one that outgrows its slot travels over gRPC instead.
_LARGER_THAN_SAMPLE_0 = 64 << 10


def size_for_dataset(
    options: dict, dataset: Any, batch_size: int, workers: int, collate_fn: Any, source_field: Optional[str] = None
) -> None:
    """Sizes the ring (and the prefetch window) of a Python dataset's job
    from its first sample, unless the options set them or use no shared
    memory. ``source_field``: the tensor a mixture adds to its samples."""
    if "ring" in options or not options.get("shared_memory", True):
        return
    ring = ring_for(dataset, batch_size, options.get("prefetch", DEFAULT_PREFETCH), workers, collate_fn, source_field)
    if ring is not None:
        _set(options, ring)


def size_for_spec(options: dict, spec: bytes, workers: int) -> None:
    """Sizes the ring of a built-in dataset's job whose batches outgrow the
    default slot, unless the options set it or use no shared memory."""
    if "ring" in options or not options.get("shared_memory", True):
        return
    batch = _native.batch_bytes(spec)
    if batch is None or batch <= _native.DEFAULT_SLOT_SIZE:
        return
    _set(options, ring_for_batch(batch, options.get("prefetch", DEFAULT_PREFETCH), workers))


def ring_for(
    dataset: Any, batch_size: int, prefetch: int, workers: int, collate_fn: Any = None, source_field: Optional[str] = None
) -> Optional[tuple[int, int, int]]:
    """``(prefetch, slots, slot_bytes)`` for a Python dataset's job: the
    batch laid out as the workers will lay it out, from sample 0 (read
    here with the seeds a worker would use, the trainer's generators left
    as they were), or from ``collate_fn`` of ``batch_size`` copies of it.
    None when that fails (the workers then report it)."""
    import numpy

    leaves: list = []
    saved = save_states()
    try:
        sample = seeded_sample(dataset, 0)
        if collate_fn is None:
            _flatten(sample, [], leaves, numpy)
        else:
            _flatten(collate_fn([sample] * batch_size), [], leaves, numpy)
    except Exception:
        return None
    finally:
        restore_states(saved)
    # A sample's leaves gain the batch dimension; collate_fn's have it.
    lead = [batch_size] if collate_fn is None else []
    tensors = [(json.dumps(path), dtype, lead + list(array.shape)) for path, array, dtype in leaves]
    if source_field:
        tensors.append((source_field, "int64", [batch_size]))
    batch = _native.batch_len(batch_size, tensors)
    return None if batch is None else ring_for_batch(batch + _LARGER_THAN_SAMPLE_0, prefetch, workers)



def ring_for_batch(batch: int, prefetch: int, workers: int) -> tuple[int, int, int]:
    """``(prefetch, slots, slot_bytes)`` for batches of ``batch`` bytes
    (the native module's rule: ``ring_for_batch`` in python/src/ring.rs)."""
    return _native.ring_for_batch(batch, prefetch, workers, mmap.PAGESIZE)


def _set(options: dict, ring: tuple[int, int, int]) -> None:
    window, slots, slot_bytes = ring
    options["ring"] = (slots, slot_bytes)
    options.setdefault("prefetch", window)
