"""Python map-style datasets, the worker's half: ``Source``, which the
worker's native dataset (``python/src/dataset.rs``) opens per job and calls
per sample. It unpickles the dataset (or calls its factory), seeds Python's
``random``, numpy's global RNG and torch's (when torch is imported) from
(seed, epoch, index) before each ``__getitem__``, so random augmentations
are the same on any number of workers and after a resume, and flattens the
sample into C-contiguous byte views the worker copies straight into the
batch buffer; nothing is pickled between processes.
"""

from __future__ import annotations

import base64
import importlib
import json
import pickle
import random
import struct
import sys
from collections.abc import Mapping
from typing import Any, Optional

#: Samples tried for the schema before an exception in ``__getitem__`` is
#: taken as the dataset's, not one sample's.
_SCHEMA_TRIES = 16

_NUMPY_DTYPES = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
    "float16", "float32", "float64", "bool",
}


class SampleError(ValueError):
    """A sample Loader cannot batch: its leaves differ from sample 0's in
    structure, shape or dtype, or a leaf is not an array or a number. It
    fails the job (the corrupt policy is for samples that cannot be read)."""


def make_from_factory(factory: str, args: Mapping) -> Any:
    """Calls ``package.module:function`` with ``args`` as keywords."""
    module, sep, attr = factory.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"dataset.python.factory: {factory!r} is not 'package.module:function'")
    try:
        fn = importlib.import_module(module)
        for part in attr.split("."):
            fn = getattr(fn, part)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"dataset.python.factory: cannot import {factory}: {_last_line(e)}") from None
    return fn(**dict(args))


class Source:
    """A Python dataset opened in a worker. The worker's native dataset
    calls ``tensors()`` once and ``read(index, sample_seed)`` per sample."""

    def __init__(self, params: Mapping[str, str], num_samples: int) -> None:
        # For a pickled dataset, `args` are Loader's own settings.
        self._seed_rngs = True
        if "pickle" in params:
            self._seed_rngs = bool(json.loads(params.get("args") or "{}").get("seed_rngs", True))
            paths, data = pickle.loads(base64.b64decode(params["pickle"]))
            sys.path.extend(p for p in paths if p not in sys.path)
            self._dataset = pickle.loads(data)
        elif "factory" in params:
            args = json.loads(params.get("args") or "{}")
            self._dataset = make_from_factory(params["factory"], args)
        else:
            raise ValueError("dataset.python: give `factory` (package.module:function) or `pickle`")
        held = len(self._dataset)
        if held != num_samples:
            raise ValueError(f"dataset.python: len(dataset) is {held}, the job was planned for {num_samples}")
        import numpy

        self._np = numpy
        self._schema: list[tuple[list, str, tuple[int, ...]]] = []
        self._paths: list[list] = []
        self._names: list[str] = []
        self._first = 0
        self._torch_threads = False
        # What _fast_read checks: per leaf (numpy dtype, shape), or
        # (Python type, ()) for a number; and the dicts' keys in order.
        self._expect: list = []
        self._keys: list = []

    def tensors(self) -> list[tuple[str, str, list[int]]]:
        """``(name, dtype, shape)`` of each leaf, from the first sample that
        reads without an exception (of the first few; read with seed 0)."""
        leaves = None
        for first in range(min(len(self._dataset), _SCHEMA_TRIES)):
            try:
                sample = self._get(first, 0)
            except Exception:
                # That sample's own batch applies the corrupt policy to it.
                if first + 1 == min(len(self._dataset), _SCHEMA_TRIES):
                    raise
                continue
            leaves = self._leaves(sample)
            break
        self._first = first
        self._expect, self._keys = _fast_schema(sample, self._np)
        self._paths = [path for path, _, _ in leaves]
        self._names = [json.dumps(path) for path in self._paths]
        self._schema = [(path, dtype, a.shape) for path, a, dtype in leaves]
        return [(name, dtype, list(a.shape)) for name, (_, a, dtype) in zip(self._names, leaves)]

    def _get(self, index: int, sample_seed: int) -> Any:
        if not self._torch_threads and "torch" in sys.modules:
            # One intra-op thread per worker, as DataLoader's workers do:
            # the workers are the parallelism, and N workers x N threads
            # would oversubscribe every core.
            sys.modules["torch"].set_num_threads(1)
            self._torch_threads = True
        if self._seed_rngs:
            seed_rngs(sample_seed)
        return self._dataset[index]

    def read(self, index: int, sample_seed: int) -> list:
        """The leaves of sample ``index`` as C-contiguous byte memoryviews,
        in the order of ``tensors()``. An exception of ``__getitem__``
        propagates (the worker applies the job's corrupt policy); a sample
        that does not match sample 0 raises ``SampleError``."""
        sample = self._get(index, sample_seed)
        fast = self._fast_read(sample)
        if fast is not None:
            return fast
        leaves = self._leaves(sample)
        schema = self._schema
        if [path for path, _, _ in leaves] != self._paths:
            raise SampleError(
                f"sample {index} has tensors {[json.dumps(p) for p, _, _ in leaves]}, "
                f"sample {self._first} has {self._names}; samples must have the same structure"
            )
        out = []
        for (path, array, got), (_, dtype, shape) in zip(leaves, schema):
            if array.shape != shape or got != dtype:
                raise SampleError(
                    f"{json.dumps(path)} of sample {index} has shape {list(array.shape)} {got}, "
                    f"sample {self._first} has {list(shape)} {dtype}; samples of a batch must "
                    f"have equal shapes (resize or pad them in __getitem__)"
                )
            out.append(memoryview(array).cast("B"))
        return out

    def _fast_read(self, sample: Any) -> Optional[list]:
        """``read``'s result for a sample of plain containers, numpy arrays
        and Python numbers that matches the schema; None for anything else
        (torch tensors, numpy scalars, a mismatch), which ``read`` then
        handles in full. Per-sample Python work is the cost of small
        samples: no paths, numbers straight to their little-endian bytes."""
        leaves: list = []
        keys: list = []
        try:
            _fast_leaves(sample, leaves, keys, self._np.ndarray)
        except _NotPlain:
            return None
        if keys != self._keys or len(leaves) != len(self._expect):
            return None
        out = []
        for leaf, (dtype, shape) in zip(leaves, self._expect):
            if type(leaf) is tuple:  # (Python type, bytes) of a number
                if leaf[0] is not dtype:  # another type, or an array expected
                    return None
                out.append(leaf[1])
            elif isinstance(dtype, type) or leaf.dtype != dtype or leaf.shape != shape:
                return None
            else:
                out.append(memoryview(leaf).cast("B"))
        return out

    def _leaves(self, sample: Any) -> list[tuple[list, Any, str]]:
        out: list[tuple[list, Any, str]] = []
        _flatten(sample, [], out, self._np)
        return out


def seed_rngs(sample_seed: int) -> None:
    """Seeds Python's ``random``, numpy's global RNG and, when torch is
    imported, torch's CPU generator, as a worker does before each
    ``__getitem__``. ``torch.default_generator`` rather than
    ``torch.manual_seed``, which also seeds every accelerator backend and
    costs a hundred times more per sample."""
    random.seed(sample_seed)
    numpy = sys.modules.get("numpy")
    if numpy is not None:
        numpy.random.seed(sample_seed & 0xFFFF_FFFF)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.default_generator.manual_seed(sample_seed)


class _NotPlain(Exception):
    """A sample _fast_leaves leaves to the full path."""


_PACK_F64 = struct.Struct("<d").pack


def _fast_leaves(sample: Any, out: list, keys: list, ndarray: type) -> None:
    """The leaves of a sample of dicts/tuples/lists, numpy arrays and Python
    numbers, in ``_flatten``'s order: C-contiguous arrays as they are,
    numbers as (their Python type, their little-endian bytes); dict keys
    go to ``keys``."""
    t = type(sample)
    if t is ndarray or (t is not bool and isinstance(sample, ndarray)):
        if not sample.flags.c_contiguous:
            raise _NotPlain
        out.append(sample)
    elif t is tuple or t is list:
        for value in sample:
            _fast_leaves(value, out, keys, ndarray)
    elif t is dict:
        keys.append(tuple(sample))
        for value in sample.values():
            _fast_leaves(value, out, keys, ndarray)
    elif t is bool:
        out.append((bool, b"\x01" if sample else b"\x00"))
    elif t is int:
        try:
            out.append((int, sample.to_bytes(8, "little", signed=True)))
        except OverflowError:
            raise _NotPlain from None
    elif t is float:
        out.append((float, _PACK_F64(sample)))
    else:
        raise _NotPlain


def _fast_schema(sample: Any, np: Any) -> tuple[list, list]:
    """What ``_fast_read`` expects of every sample, from the schema
    sample: per leaf (numpy dtype, shape) of an array or (Python type, ())
    of a number, and the dicts' keys. Empty when the sample is not plain (every
    read then takes the full path)."""
    leaves: list = []
    keys: list = []
    try:
        _fast_leaves(sample, leaves, keys, np.ndarray)
    except _NotPlain:
        return [], [None]  # matches no sample's keys
    expect = [(v[0], ()) if type(v) is tuple else (v.dtype, v.shape) for v in leaves]
    return expect, keys


def _flatten(sample: Any, path: list, out: list, np: Any) -> None:
    if isinstance(sample, np.ndarray):
        _leaf(out, path, np.ascontiguousarray(sample))
    elif isinstance(sample, Mapping):
        for key, value in sample.items():
            if not isinstance(key, str):
                raise SampleError(f"sample dict key {key!r} is not a str")
            _flatten(value, path + [key], out, np)
    elif isinstance(sample, (tuple, list)):
        for i, value in enumerate(sample):
            _flatten(value, path + [i], out, np)
    elif isinstance(sample, bool):
        _leaf(out, path, np.asarray(sample, dtype=np.bool_))
    elif isinstance(sample, int):
        _leaf(out, path, np.asarray(sample, dtype=np.int64))
    elif isinstance(sample, float):
        _leaf(out, path, np.asarray(sample, dtype=np.float64))
    elif isinstance(sample, np.generic):
        _leaf(out, path, np.asarray(sample))
    elif type(sample).__module__ == "torch" and type(sample).__name__ == "Tensor":
        array, dtype = _torch_leaf(sample, np)
        out.append((path, array, dtype))
    else:
        where = json.dumps(path)
        raise SampleError(
            f"sample leaf {where} is a {type(sample).__name__}; samples hold numpy "
            f"arrays, torch tensors, numbers, and dicts/tuples/lists of them"
        )


def _leaf(out: list, path: list, array: Any) -> None:
    out.append((path, array, _dtype(array)))


def _torch_leaf(t: Any, np: Any) -> tuple[Any, str]:
    """A torch tensor as a numpy array over its bytes and its dtype name
    (numpy has no bfloat16: its bits travel as int16)."""
    import torch

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    t = t.contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy(), "bfloat16"
    array = t.numpy()
    return array, _dtype(array)


def _dtype(array: Any) -> str:
    name = array.dtype.name
    if name not in _NUMPY_DTYPES:
        raise SampleError(f"dtype {name} cannot be batched; use one of {sorted(_NUMPY_DTYPES)}")
    return name


def _last_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[-1]}" if text else type(e).__name__
