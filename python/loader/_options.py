"""The loader's options (the keywords of ``Loader`` and ``Loader.local``)
as the Rust SDK's ``LoaderOptions``: their defaults, read from it, and
their check, done by it, so an option exists in one place."""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from typing import Any

from . import _native

#: Every option ``Loader`` takes, with its default: the Rust SDK's
#: ``LoaderOptions``, read from it (``ring`` as ``[slots, slot_bytes]``,
#: ``coordinator_timeout`` in seconds).
DEFAULT_OPTIONS: dict[str, Any] = json.loads(_native.default_options())

#: Credits per worker stream unless told otherwise (as in the Rust SDK).
DEFAULT_PREFETCH: int = DEFAULT_OPTIONS["prefetch"]


def checked_json(options: Mapping[str, Any]) -> str:
    """``options`` as the JSON of the Rust SDK's ``LoaderOptions``, checked
    by it: an unknown or bad option raises ``ValueError`` now, in one line
    naming it (an unknown one with the list of known ones)."""

    def plain(value: Any) -> Any:
        if isinstance(value, os.PathLike):
            return os.fspath(value)
        if isinstance(value, (set, frozenset)):
            return sorted(value)
        raise TypeError(f"{type(value).__name__} is not a loader option value")

    # JSON has no NaN or infinity: as text they fail naming their option.
    values = {
        k: repr(v) if isinstance(v, float) and not math.isfinite(v) else v
        for k, v in options.items()
    }
    return _native.check_options(json.dumps(values, default=plain))
