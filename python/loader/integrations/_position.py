"""Where a loader's next pass starts, for the framework glue that has to
move it: accelerate's ``skip_first_batches`` and Trainer's resume both say
"skip the first n batches of the epoch about to start".

A Loader has no batches to skip through: a pass's order is a pure function
of (seed, epoch), so starting the pass at batch n is a jump, not a read.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

from .. import Loader

_log = logging.getLogger("loader.integrations")


def find_loader(obj: Any) -> Optional[Loader]:
    """The ``Loader`` behind ``obj``: itself, or the one a wrapper of this
    package holds (``.loader``); None for anything else, such as a torch
    DataLoader, which the callers then leave to the framework."""
    for _ in range(4):
        if isinstance(obj, Loader):
            return obj
        obj = getattr(obj, "loader", None)
        if obj is None:
            return None
    return None


def next_pass(loader: Loader) -> int:
    """The epoch the loader's next ``iter()`` yields (``Loader._next_pass``)."""
    return loader._next_pass()


def position(loader: Loader, epoch: int, batch: int) -> None:
    """Makes batch ``batch`` of pass ``epoch`` the next one the loader
    yields, its next ``iter()`` continuing that pass (later ones go on)."""
    per = len(loader)
    if not 0 <= batch <= per:
        raise ValueError(f"batch {batch} is outside a pass of {per} batches")
    loader._restart_at(epoch * per + batch)
    # Finish this pass at the next iter() instead of starting the next one.
    loader._resumed = True


def skip_first_batches(dataloader: Any, num_batches: int = 0) -> Any:
    """Makes the loader's next pass start at its batch ``num_batches``, and
    returns the loader given (accelerate's and Trainer's
    ``dl = skip_first_batches(dl, n)`` works as written). Nothing is read:
    the loader jumps there.

    The pass is the one the next ``iter()`` would yield: after
    ``load_state_dict`` (or ``accelerator.load_state``) the saved one, so
    skipping the saved position's own batch count is a no-op. Later
    ``for`` loops yield the next passes, whole, so the loader itself serves
    the following epochs (accelerate's returns a new DataLoader for the
    first epoch only).

    Anything that is not a Loader (or a wrapper of one) raises
    ``TypeError``: use the framework's own function for it.
    """
    loader = find_loader(dataloader)
    if loader is None:
        raise TypeError(
            f"skip_first_batches: {type(dataloader).__name__} is not a loader.Loader "
            f"(use accelerate.skip_first_batches for a torch DataLoader)"
        )
    n = int(num_batches)
    epoch = next_pass(loader)
    per = len(loader)
    at = loader._yielded - epoch * per
    if loader._resumed and 0 < at < per and at != n:
        _log.warning(
            "skip_first_batches(%d): the loader's loaded state stands at batch %d of epoch %d; "
            "moving it to batch %d as asked",
            n, at, epoch, n,
        )
    position(loader, epoch, n)
    return dataloader
