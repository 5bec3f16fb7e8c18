"""``loader.Mix``: a weighted mixture of datasets as one job (docs/mixtures.md).

    mix = loader.Mix({"web": web_ds, "code": {"tokens": {...}}},
                     weights={"web": 0.7, "code": 0.3})
    dl = loader.Loader.local(mix, batch_size=64, shuffle=True, seed=0)

Each source is a map-style dataset (``__len__`` and ``__getitem__``, run in
the workers like ``Loader.local(dataset)``) or a spec's dataset entry
(``{"tokens": {...}}``, ``{"image_folder": {...}}``, ...). Which source and
which of its samples each position of the stream draws is a pure function
of (seed, position): every global batch holds each source's share within
one sample, each source walks its own shuffled order once per pass, and the
same batches come out on any number of workers and ranks. Samples of every
source must collate together (same tensors, dtypes and shapes).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Optional, Union

from . import _dataset

__all__ = ["Mix"]


class Mix:
    """A weighted mixture of ``sources`` (name -> dataset or spec entry).

    ``weights``: a mapping name -> weight, or a sequence in ``sources``'
    order (default: equal); each source's share is its weight over their
    sum, and a weight of 0 leaves a source out. ``samples_per_epoch``:
    positions per epoch (default: until the source with the largest weight
    has been drawn once whole). ``source_field``: a name to add to every
    sample the int64 index of its source (in ``sources``' order); with
    Python datasets the samples must then be dicts, which get that key.
    """

    __slots__ = ("sources", "weights", "samples_per_epoch", "source_field")

    def __init__(
        self,
        sources: Union[Mapping[str, Any], Sequence[tuple[str, Any]]],
        weights: Union[Mapping[str, float], Sequence[float], None] = None,
        *,
        samples_per_epoch: Optional[int] = None,
        source_field: Optional[str] = None,
    ) -> None:
        pairs = list(sources.items()) if isinstance(sources, Mapping) else [tuple(p) for p in sources]
        if not pairs:
            raise ValueError("Mix needs at least one source")
        names = [str(name) for name, _ in pairs]
        if len(set(names)) != len(names):
            raise ValueError(f"Mix: source names must be unique, got {names}")
        if weights is None:
            given = [1.0] * len(pairs)
        elif isinstance(weights, Mapping):
            unknown = sorted(set(weights) - set(names))
            if unknown:
                raise ValueError(f"Mix: weights name unknown sources {unknown}; the sources are {names}")
            given = [weights.get(name, 0.0) for name in names]
        else:
            given = list(weights)
            if len(given) != len(pairs):
                raise ValueError(f"Mix: {len(given)} weights for {len(pairs)} sources")
        for name, dataset in pairs:
            if not (_dataset.is_dataset(dataset) or isinstance(dataset, Mapping)):
                raise TypeError(
                    f"Mix source {name!r}: a map-style dataset or a spec's dataset entry, "
                    f"not {type(dataset).__name__}"
                )
        self.sources: list[tuple[str, Any]] = [(n, d) for n, (_, d) in zip(names, pairs)]
        self.weights: list[float] = [float(w) for w in given]
        self.samples_per_epoch = None if samples_per_epoch is None else int(samples_per_epoch)
        self.source_field = source_field

    def __repr__(self) -> str:
        parts = ", ".join(f"{n}={w:g}" for (n, _), w in zip(self.sources, self.weights))
        return f"Mix({parts})"

    def python_sources(self) -> list[Any]:
        """The sources that are Python datasets, in order."""
        return [d for _, d in self.sources if _dataset.is_dataset(d)]

    def yields_structure(self) -> bool:
        """Whether batches come in ``default_collate``'s structure: the
        first source is a Python dataset."""
        return _dataset.is_dataset(self.sources[0][1])

    def job_spec(self, **settings: Any) -> dict:
        """The job (spec-file schema) under ``settings`` (those of
        ``loader._dataset.job_spec``: batch_size, shuffle, seed, drop_last,
        epochs, on_corrupt, seed_rngs): Python sources pickled as
        ``Loader.local(dataset)`` pickles one (``written_pickles`` lists
        the files, for release when the loader closes)."""
        entries = []
        try:
            for (name, dataset), weight in zip(self.sources, self.weights):
                if _dataset.is_dataset(dataset):
                    entry = _dataset.job_spec(dataset, **settings)["dataset"]
                else:
                    entry = dict(dataset)
                entries.append({"name": name, "weight": weight, "dataset": entry})
        except BaseException:
            for path in _dataset.written_pickles({"dataset": {"mix": {"sources": entries}}}):
                _dataset.release_pickle(path)
            raise
        mix: dict[str, Any] = {"sources": entries}
        if self.samples_per_epoch is not None:
            mix["samples_per_epoch"] = self.samples_per_epoch
        if self.source_field:
            # A Python first source's tensors are named by their path in the
            # sample (JSON): the field is a top-level key.
            mix["source_field"] = json.dumps([self.source_field]) if self.yields_structure() else self.source_field
        around = {k: v for k, v in settings.items() if k != "seed_rngs"}
        return _dataset.job_around({"mix": mix}, **around)
