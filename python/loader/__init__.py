"""Loader's Python trainer SDK: a drop-in for ``torch.utils.data.DataLoader``
fed by Loader workers.

    import loader

    spec = {"dataset": {"synthetic": {"num_samples": 10_000, "shape": [3, 224, 224],
                                      "dtype": "uint8"}},
            "batch_size": 64, "sampler": {"shuffle": True, "seed": 0}}
    dl = loader.Loader.local(spec, num_workers=2)  # like DataLoader(num_workers=2)
    for epoch in range(3):
        for batch in dl:                           # one pass: len(dl) batches
            x = batch.torch()["data"]              # zero-copy torch tensor
            y = batch["label"]                     # zero-copy numpy array

Batches view the memory the workers wrote (a shared-memory slot, or the gRPC
frame of a remote worker) without copying. The slot is reused once the batch
and every array or tensor made from it are freed: keep only what you need
past a training step, or copy it.

Passes: as with a DataLoader, every ``for batch in loader`` is the next
pass (epoch) over the data, any number of times (a job spec's ``"epochs"``
or ``Loader.local(..., epochs=N)`` sets a bound), and a loop left early with
``break`` loses nothing of the next pass: it starts whole. ``len(loader)``
is the batches of one pass. ``set_epoch(e)`` (or ``loader.sampler
.set_epoch(e)``, as Lightning and accelerate call it) chooses the pass the
next ``for`` yields; the order of pass ``e`` depends only on (seed, e), so
a repeated or resumed pass repeats exactly. After ``load_state_dict`` the
next ``for`` yields the rest of the saved pass, and later ones go on.

Layout (one module per concern, as ``torch.utils.data`` keeps them):
``_loader`` the ``Loader`` class; ``_local`` the job ``Loader.local``
builds (one builder per kind of job); ``_lifecycle`` closing loaders at
exit and on SIGTERM; ``_options`` the loader options; ``_job`` spec
encoding; ``_ring`` ring sizing; ``_frames`` an image job's kept frames;
``_passes`` passes and the sampler stand-ins; ``_batch`` ``Batch`` as a
``Mapping``; ``_dataset``/``_stream``/``_mix`` Python datasets, streams and
mixtures; ``_source``, ``_cache``, ``_rngs``, ``_template``, ``_worker`` the
workers' side.
"""

from __future__ import annotations

from . import _batch  # noqa: F401  (Batch as a Mapping, rebuilt as a dict)
from ._job import UNBOUNDED_EPOCHS
from ._loader import Loader
from ._local import _hinted  # noqa: F401  (the once-per-process hint; tests reset it)
from ._mix import Mix
from ._native import Batch, LoaderError, TensorView
from ._options import DEFAULT_OPTIONS, DEFAULT_PREFETCH

__all__ = ["Loader", "Batch", "TensorView", "LoaderError", "Mix", "merge_states", "UNBOUNDED_EPOCHS"]

#: ``Loader.merge_states``, at module level: ``loader.merge_states([...])``.
merge_states = Loader.merge_states
