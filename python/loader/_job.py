"""A job as the SDK hands it to the native module: the spec (a dict, a
file, or its text) as the native module's opaque, validated encoding, the
epoch bound of a spec that sets none, and whether its batches are a Python
dataset's."""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any, Union

from . import _native

_SPEC_SUFFIXES = (".json", ".yaml", ".yml")

#: The epochs of a job whose loader sets no bound (``epochs=None``, a dict
#: spec without ``"epochs"``): in effect none, as a DataLoader iterates as
#: many times as it is asked. A pure number, so a state saved under it
#: resumes anywhere; ``Loader.epochs`` says None.
UNBOUNDED_EPOCHS = 1 << 20


def spec_bytes(job: Union[Mapping, str, os.PathLike]) -> bytes:
    """The job spec as the native module's opaque, validated encoding.

    ``job`` is a dict (the spec-file schema), a path to a .json/.yaml file
    (relative dataset paths resolve against the file's directory), or the
    text of a spec.
    """
    if isinstance(job, Mapping):
        return _native.parse_spec(json.dumps(job), os.getcwd())
    if isinstance(job, os.PathLike) or (
        isinstance(job, str)
        and not job.lstrip().startswith(("{", "["))
        and "\n" not in job
        and (job.endswith(_SPEC_SUFFIXES) or os.path.isfile(job))
    ):
        return _native.parse_spec_file(os.path.abspath(os.fspath(job)))
    if isinstance(job, str):
        return _native.parse_spec(job, os.getcwd())
    raise TypeError(f"job must be a dict, a path or spec text, not {type(job).__name__}")


def unbounded(job: Any) -> Any:
    """A dict spec that sets no ``"epochs"`` iterates as a DataLoader does,
    any number of passes (a spec file or text keeps its own bound, default
    1, as ``loaderctl`` reads it)."""
    if isinstance(job, Mapping) and "epochs" not in job:
        return {**job, "epochs": UNBOUNDED_EPOCHS}
    return job


def is_python_job(job: Any) -> bool:
    """True for a job over a Python dataset: its batches are yielded in
    ``default_collate``'s structure, not as a ``Batch``."""
    dataset = job.get("dataset") if isinstance(job, Mapping) else None
    mix = dataset.get("mix") if isinstance(dataset, Mapping) else None
    if isinstance(mix, Mapping):
        # A mixture yields like its first source.
        sources = mix.get("sources") or [{}]
        dataset = sources[0].get("dataset") if isinstance(sources[0], Mapping) else None
    return isinstance(dataset, Mapping) and "python" in dataset
