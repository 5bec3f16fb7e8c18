"""A Loader in an accelerate training loop.

``accelerator.prepare`` wraps only torch DataLoaders (a Loader comes back
unchanged), and what its wrapper adds is needed here too:

- **The end of the epoch for gradient accumulation.** ``accelerator
  .accumulate()`` syncs gradients every ``gradient_accumulation_steps``
  batches *and* at the last batch of the dataloader, so a pass whose length
  is not a multiple of the steps still ends on an optimizer step. It learns
  where the pass ends from the dataloader registered with
  ``accelerator.gradient_state`` while it is iterated (its
  ``end_of_dataloader``). accelerate's wrapper finds the end by fetching one
  batch ahead; a Loader knows it from its position, so nothing is held
  back: the batch just taken is the last when ``_yielded`` is a multiple of
  ``len(loader)``.
- **Checkpoints.** ``accelerator.save_state`` / ``load_state`` save the
  objects given to ``register_for_checkpointing``; the wrapper registers
  itself, so the loader's position goes into every checkpoint and comes back
  with ``load_state``: the next ``for`` yields the rest of the saved pass.
- **Device placement**, as accelerate's wrapper does (``send_to_device``),
  unless ``device_placement=False``.

``accelerator.skip_first_batches`` (and accelerate's function) rebuild a
torch DataLoader from ``dataloader.dataset`` and would read the loader's
dataset in this process: use ``skip_first_batches`` from here, which moves
the loader instead (and is a no-op after ``load_state``).

    from loader.integrations.accelerate import prepare, skip_first_batches

    model, optimizer = accelerator.prepare(model, optimizer)
    dl = prepare(accelerator, loader.Loader.local(ds, batch_size=32, shuffle=True))
    for epoch in range(epochs):
        for batch in dl:
            with accelerator.accumulate(model):
                ...
"""

from __future__ import annotations

from typing import Any, Iterator, Optional

from .. import Loader
from ._position import find_loader, skip_first_batches

__all__ = ["prepare", "PreparedLoader", "skip_first_batches"]


def prepare(
    accelerator: Any, dataloader: Loader, *, device_placement: Optional[bool] = None, non_blocking: bool = False
) -> "PreparedLoader":
    """``dataloader`` ready for ``accelerator``'s loop: registered with its
    gradient state while iterated, saved and restored by its
    ``save_state``/``load_state``, batches moved to its device
    (``device_placement``, default the accelerator's). Call it once per
    loader: each call registers another object for checkpointing."""
    prepared = PreparedLoader(accelerator, dataloader, device_placement=device_placement, non_blocking=non_blocking)
    accelerator.register_for_checkpointing(prepared)
    return prepared


class PreparedLoader:
    """A Loader as accelerate's ``DataLoaderShard`` presents a DataLoader:
    ``end_of_dataloader`` / ``remainder`` for ``accelerator.gradient_state``
    (what ``DataLoaderStateMixin`` keeps), and the loader's own surface
    (``len``, ``set_epoch``, ``sampler``, ``batch_sampler``, ``dataset``,
    ``batch_size``, ``state_dict``, ``load_state_dict``) delegated."""

    def __init__(
        self, accelerator: Any, dataloader: Loader, *, device_placement: Optional[bool] = None, non_blocking: bool = False
    ) -> None:
        loader = find_loader(dataloader)
        if loader is None:
            raise TypeError(f"prepare: expected a loader.Loader, not {type(dataloader).__name__}")
        self.loader = loader
        self.gradient_state = accelerator.gradient_state
        place = accelerator.device_placement if device_placement is None else device_placement
        self.device = accelerator.device if place else None
        self._non_blocking = non_blocking
        self._processes = max(int(getattr(accelerator, "num_processes", 1) or 1), 1)
        self.end_of_dataloader = False
        self.remainder = -1

    # -- What accelerate's gradient state reads -----------------------------

    def _begin(self) -> None:
        """``DataLoaderStateMixin.begin``: the padding of the epoch's last
        global batch (``remainder``, which ``gather_for_metrics`` drops) and
        the registration that makes this the active dataloader."""
        self.end_of_dataloader = False
        self.remainder = -1
        loader = self.loader
        if not loader.drop_last and loader.batch_size:
            try:
                self.remainder = len(loader.dataset) % (loader.batch_size * self._processes)
            except TypeError:
                pass
        self.gradient_state._add_dataloader(self)

    def _end(self) -> None:
        self.gradient_state._remove_dataloader(self)

    def __iter__(self) -> Iterator[Any]:
        # The pass is chosen now, at iter(), as a DataLoader's is; the
        # generator below only runs at the first next().
        return self._batches(iter(self.loader))

    def _batches(self, batches: Iterator[Any]) -> Iterator[Any]:
        loader = self.loader
        per = len(loader)
        self._begin()
        try:
            send = None
            if self.device is not None:
                from accelerate.utils import send_to_device as send
            for batch in batches:
                # Absolute position: the last batch of a pass, resumed or not.
                self.end_of_dataloader = per > 0 and loader._yielded % per == 0
                if send is not None:
                    batch = send(batch, self.device, non_blocking=self._non_blocking)
                yield batch
        finally:
            # Left by a break, an exception or the end: no longer active.
            self._end()

    # -- The loader's surface -----------------------------------------------

    def __len__(self) -> int:
        return len(self.loader)

    def set_epoch(self, epoch: int) -> None:
        self.loader.set_epoch(epoch)

    @property
    def sampler(self) -> Any:
        return self.loader.sampler

    @property
    def batch_sampler(self) -> Any:
        return self.loader.batch_sampler

    @property
    def dataset(self) -> Any:
        return self.loader.dataset

    @property
    def batch_size(self) -> Optional[int]:
        return self.loader.batch_size

    @property
    def drop_last(self) -> bool:
        return self.loader.drop_last

    @property
    def total_batch_size(self) -> int:
        """Samples per step over all processes (accelerate's name)."""
        return int(self.loader.batch_size or 1) * self._processes

    def state_dict(self) -> dict:
        return self.loader.state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.loader.load_state_dict(state)

    def close(self) -> None:
        self.loader.close()

    def __repr__(self) -> str:
        return f"<accelerate-prepared {self.loader!r}>"
