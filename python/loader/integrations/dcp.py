"""A Loader's position in a ``torch.distributed.checkpoint`` (DCP)
checkpoint.

DCP saves a ``Stateful`` (``state_dict`` / ``load_state_dict``, which a
Loader has) by flattening its ``state_dict()`` into one entry per leaf, and
loads *in place*: it asks the object for a ``state_dict()`` to use as the
template, fills the template's keys from the checkpoint, then calls
``load_state_dict`` with it. A Loader's state has keys that come and go
(``yielded_above`` when batches were yielded out of order, ``ranks`` in a
merged state): a key the fresh loader's template lacks would be silently
left out on load, and the resumed loader would yield those batches again.

``DCPState(loader)`` stands for the loader in DCP's dict as one value, the
state's JSON text, so every field travels whatever the template holds::

    import torch.distributed.checkpoint as dcp
    from loader.integrations.dcp import DCPState

    dcp.save({"model": model.state_dict(), "loader": DCPState(dl)}, checkpoint_id=path)
    ...
    state = {"model": model.state_dict(), "loader": DCPState(dl)}
    dcp.load(state, checkpoint_id=path)   # dl continues where it was saved

Each rank saves its own loader's position under its own key (DCP dedups
equal keys across ranks): ``{f"loader_{rank}": DCPState(dl)}``, or merge the
ranks' states (``loader.merge_states``) into one entry.
"""

from __future__ import annotations

import json
from typing import Any

from .. import Loader
from ._position import find_loader

__all__ = ["DCPState"]

#: The one key of the adapter's state dict.
KEY = "loader_state_json"


class DCPState:
    """``loader`` (a ``Loader`` or a wrapper of one) as a DCP ``Stateful``
    of one string entry. During ``dcp.load`` DCP asks for a template first:
    that asks the loader for its state, which starts a loader that had not
    started (its workers stop again at ``load_state_dict``)."""

    def __init__(self, dataloader: Any) -> None:
        loader = find_loader(dataloader)
        if loader is None:
            raise TypeError(f"DCPState: expected a loader.Loader, not {type(dataloader).__name__}")
        self.loader: Loader = loader

    def state_dict(self) -> dict[str, str]:
        return {KEY: json.dumps(self.loader.state_dict(), sort_keys=True)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        text = state[KEY]
        if isinstance(text, bytes):
            text = text.decode()
        self.loader.load_state_dict(json.loads(text))
