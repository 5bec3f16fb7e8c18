"""Any ``collate_fn`` output, as DataLoader carries it: a batch that is not
plain dicts, tuples and lists of arrays and numbers (a dataclass, a named
tuple, a custom class, strings, ``None``) travels as a pickle whose arrays
and tensors are left out of it and written as the batch's tensors, so they
stay zero-copy views of the batch's memory in the trainer, as every other
batch's are.

The batch then holds ``PICKLE`` (uint8: the pickle, whose persistent ids
name the leaves) and ``#0``, ``#1``, ... (the leaves, in the order the
pickle met them). Only a loader over a Python dataset unpickles, and only
what its own workers made from the dataset and ``collate_fn`` it gave
them: the same trust DataLoader's workers have.
"""

from __future__ import annotations

import io
import pickle
import sys
from typing import Any, Callable

#: The name of the tensor holding the pickle.
PICKLE = "#pickle"

#: Persistent ids of leaves: ``(MARK, i, kind)``; kind is "numpy" or "torch".
_MARK = "loader.leaf"


def names(leaves: int) -> list[str]:
    """The tensor names of a pickled batch with ``leaves`` leaves."""
    return [PICKLE] + [f"#{i}" for i in range(leaves)]


def is_pickled(tensor_names: Any) -> bool:
    return PICKLE in tensor_names


def pack(batch: Any, leaf: Callable[[Any], Any], np: Any) -> list:
    """``batch`` as ``(name, array)`` pairs: the pickle first, then its
    leaves. ``leaf(obj)`` returns ``(array, dtype)`` for an array or tensor
    the batch may hold, or None for anything to pickle inline."""
    leaves: list = []

    class _Pickler(pickle.Pickler):
        def persistent_id(self, obj: Any) -> Any:
            kind = "torch" if _is_torch_tensor(obj) else "numpy" if isinstance(obj, np.ndarray) else None
            if kind is None:
                return None
            made = leaf(obj)
            if made is None:
                return None
            leaves.append(made)
            return (_MARK, len(leaves) - 1, kind)

    out = io.BytesIO()
    _Pickler(out, protocol=pickle.HIGHEST_PROTOCOL).dump(batch)
    data = np.frombuffer(out.getbuffer(), dtype=np.uint8)
    return [(PICKLE, (data, "uint8"))] + [(f"#{i}", made) for i, made in enumerate(leaves)]


def unpack(batch: Any, torch_available: bool) -> Any:
    """The object ``pack`` made, from a ``Batch``: its leaves are the
    batch's own arrays (numpy) or tensors (torch, through DLPack)."""
    arrays = batch.numpy()
    tensors = batch.torch() if torch_available else None

    class _Unpickler(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> Any:
            if not (isinstance(pid, tuple) and len(pid) == 3 and pid[0] == _MARK):
                raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
            name = f"#{int(pid[1])}"
            if pid[2] == "torch" and tensors is not None:
                return tensors[name]
            return arrays[name]

    return _Unpickler(io.BytesIO(memoryview(arrays[PICKLE]).cast("B"))).load()


def _is_torch_tensor(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)
