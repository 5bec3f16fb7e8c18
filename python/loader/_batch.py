"""``Batch`` as Python code sees it: a ``Mapping`` of tensor name to
array, and, rebuilt by code written for dict batches, a plain dict."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._native import Batch

Mapping.register(Batch)


def _batch_from_mapping(cls: type, *args: Any, **kwargs: Any) -> dict:
    """``Batch(mapping)`` / ``type(batch)({...})``: a plain dict of what it
    is given, as code written for dict batches rebuilds one
    (transformers' ``_prepare_input`` does ``type(data)({k: ...})``). A
    ``Batch`` views a worker's memory; a rebuilt one holds whatever the
    caller made, so it is a dict."""
    return dict(*args, **kwargs)


# Set on the native type: its batches come from the loader, never from a
# constructor, so this is the only way one is "made" in Python.
Batch.__new__ = staticmethod(_batch_from_mapping)  # type: ignore[method-assign]
