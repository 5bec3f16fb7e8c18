"""A Loader as the train dataloader of a transformers ``Trainer``, with its
position in every checkpoint and an exact resume.

    from loader.integrations.transformers import LoaderTrainer

    dl = loader.Loader.local(train_ds, batch_size=8, shuffle=True, num_workers=4)
    trainer = LoaderTrainer(model=model, args=args, train_loader=dl)
    trainer.train()                              # max_steps past an epoch: fine
    trainer.train(resume_from_checkpoint=True)   # continues with the next batch

What Trainer already does with a Loader: it takes ``len()`` for the steps
of an epoch, calls ``set_epoch(epoch)`` before each epoch's ``iter()`` (so
every epoch is its own shuffle, and a resumed epoch its own), and rebuilds
Mapping batches with ``type(batch)({...})`` in ``_prepare_input``.

What it cannot do alone is resume mid-epoch. ``_inner_training_loop``
counts the batches of the resumed epoch already trained on
(``steps_trained_in_current_epoch``, from ``global_step``) and ``_run_epoch``
passes them to accelerate's ``skip_first_batches``, which rebuilds a torch
DataLoader from ``dataloader.dataset`` and reads every skipped batch. Here:

- ``LoaderStateCallback`` writes the loader's ``state_dict()`` into each
  checkpoint directory (``loader_state.json``; ``loader_state_<rank>.json``
  when there are several processes) at ``on_save``, and at
  ``on_train_begin`` of a resumed run loads it back: the loader then stands
  exactly where the checkpoint was taken.
- ``LoaderTrainerMixin.train`` runs Trainer's loop with its
  ``skip_first_batches`` answering a Loader with
  ``loader.integrations.skip_first_batches``: a jump to the batch Trainer
  counted, which is where the loaded state already stands (any other
  dataloader goes to accelerate's as before). Trainer's own counters
  (the step, the epoch's last, possibly short, accumulation window) stay
  as in the uninterrupted run, so the resumed run trains on the same
  batches with the same optimizer steps.
- ``ignore_data_skip=True`` keeps its meaning: Trainer starts the resumed
  epoch over from its first batch, and so does the loader (its state is
  not loaded; Trainer's ``set_epoch`` picks the epoch).

A checkpoint without a loader state (taken before the callback was there)
resumes from Trainer's counters: the loader jumps to the batch Trainer
would have skipped to, which is exact for the same dataset, batch size and
seed.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from typing import Any, Iterator, Optional

import transformers.trainer as _trainer_module
from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, get_last_checkpoint

from .. import Loader
from ._position import find_loader, position, skip_first_batches

__all__ = ["LoaderStateCallback", "LoaderTrainerMixin", "LoaderTrainer", "STATE_NAME"]

_log = logging.getLogger("loader.integrations")

#: The loader's state in a checkpoint directory (one process).
STATE_NAME = "loader_state.json"


def state_file(checkpoint_dir: str, args: Any) -> str:
    """This process's loader state in ``checkpoint_dir``: one file per
    process when there are several, as Trainer does for its RNG states."""
    if getattr(args, "world_size", 1) > 1:
        return os.path.join(checkpoint_dir, f"loader_state_{args.process_index}.json")
    return os.path.join(checkpoint_dir, STATE_NAME)


class LoaderStateCallback(TrainerCallback):
    """Saves the train loader's position with every checkpoint and loads it
    back when training resumes from one.

    ``dataloader``: the Loader (or a wrapper of one); by default the
    Trainer's train dataloader as the callback events pass it.
    ``resume_from``: the checkpoint directory the run resumes from, which
    ``LoaderTrainerMixin.train`` sets; otherwise the callback looks for
    ``checkpoint-<global_step>`` in ``output_dir`` (what
    ``resume_from_checkpoint=True`` picks)."""

    def __init__(self, dataloader: Any = None) -> None:
        self.dataloader = dataloader
        self.resume_from: Optional[str] = None

    def _loader(self, train_dataloader: Any) -> Optional[Loader]:
        return find_loader(self.dataloader if self.dataloader is not None else train_dataloader)

    def on_save(self, args, state, control, train_dataloader=None, **kwargs):
        loader = self._loader(train_dataloader)
        if loader is None:
            return
        directory = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        os.makedirs(directory, exist_ok=True)
        path = state_file(directory, args)
        # Whole or absent: a crash mid-write leaves no half file to resume from.
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(loader.state_dict(), f)
        os.replace(tmp, path)

    def on_train_begin(self, args, state, control, train_dataloader=None, **kwargs):
        resume_from, self.resume_from = self.resume_from, None
        if state.global_step == 0 or args.ignore_data_skip:
            # A new run, or one told to start the resumed epoch over: the
            # loader's next pass is the one Trainer's set_epoch picks.
            return
        loader = self._loader(train_dataloader)
        if loader is None:
            return
        directory = resume_from or os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        path = state_file(directory, args)
        if os.path.isfile(path):
            with open(path) as f:
                loader.load_state_dict(json.load(f))
            return
        # No state saved: where Trainer's counters say the run stood.
        per = len(loader)
        steps = max(math.ceil(per / args.gradient_accumulation_steps), 1)
        epoch, step = divmod(state.global_step, steps)
        _log.warning(
            "no loader state in %s: resuming at batch %d of epoch %d from Trainer's step count",
            directory, step * args.gradient_accumulation_steps, epoch,
        )
        position(loader, epoch, min(step * args.gradient_accumulation_steps, per))


@contextlib.contextmanager
def loader_skips() -> Iterator[None]:
    """Trainer's ``skip_first_batches`` (accelerate's, imported into
    ``transformers.trainer``) answering a Loader by moving it, for the
    duration of the block; any other dataloader gets accelerate's."""
    original = _trainer_module.skip_first_batches

    def skip(dataloader: Any, num_batches: int = 0) -> Any:
        if find_loader(dataloader) is not None:
            return skip_first_batches(dataloader, num_batches)
        return original(dataloader, num_batches)

    _trainer_module.skip_first_batches = skip
    try:
        yield
    finally:
        _trainer_module.skip_first_batches = original


class LoaderTrainerMixin:
    """Mix into a ``Trainer`` class (``class MyTrainer(LoaderTrainerMixin,
    Trainer)``, or any Trainer subclass such as trl's) to train on a
    Loader: ``train_loader=`` is returned by ``get_train_dataloader``
    (leave it out to return a Loader from your own override), a
    ``LoaderStateCallback`` is added, and ``train`` resumes it exactly."""

    def __init__(self, *args: Any, train_loader: Any = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.train_loader = train_loader
        self.loader_state_callback = LoaderStateCallback(train_loader)
        self.add_callback(self.loader_state_callback)

    def get_train_dataloader(self) -> Any:
        if self.train_loader is None:
            return super().get_train_dataloader()
        return self.train_loader

    def train(self, resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        if resume_from_checkpoint is True:
            # As Trainer resolves it, so the callback reads the same directory.
            resume_from_checkpoint = get_last_checkpoint(self.args.output_dir)
            if resume_from_checkpoint is None:
                raise ValueError(f"No valid checkpoint found in output directory ({self.args.output_dir})")
        if resume_from_checkpoint is False:
            resume_from_checkpoint = None
        self.loader_state_callback.resume_from = resume_from_checkpoint
        with loader_skips():
            return super().train(resume_from_checkpoint, *args, **kwargs)


class LoaderTrainer(LoaderTrainerMixin, Trainer):
    """``Trainer`` with ``train_loader=``: a Loader as its train dataloader,
    its position saved in every checkpoint and resumed exactly."""
