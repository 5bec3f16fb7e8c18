"""Loader in training frameworks: what each needs beyond the DataLoader
surface a ``Loader`` already has (docs/frameworks.md).

One module per framework, imported on demand (nothing here imports a
framework, so ``import loader`` never pulls one in):

- ``loader.integrations.accelerate``: ``prepare(accelerator, loader)`` (the
  gradient-accumulation end of an epoch, ``save_state``/``load_state`` of
  the loader's position) and ``skip_first_batches``.
- ``loader.integrations.transformers``: ``LoaderTrainer`` /
  ``LoaderTrainerMixin`` and ``LoaderStateCallback`` (the loader's position
  in every Trainer checkpoint, and Trainer's resume without re-reading data).
- ``loader.integrations.dcp``: ``DCPState``, the loader's position as one
  value for ``torch.distributed.checkpoint``.

Lightning needs no module: it saves and restores a train loader's
``state_dict`` in its checkpoints and calls ``sampler.set_epoch`` itself.
"""

from ._position import find_loader, skip_first_batches

__all__ = ["find_loader", "skip_first_batches"]
