"""Python map-style datasets inside Loader's workers: the trainer's half
(the job spec of ``Loader.local(dataset)``, rebuilding the collated
structure) and the worker's half (``Source``, which the worker's native
dataset calls per sample).

A sample (numpy arrays, torch tensors, Python numbers, and dicts, tuples and
lists of them) is flattened into leaves; each leaf becomes one tensor of the
batch, named by its path in the sample as JSON (``'["image"]'``, ``'[0]'``,
``'["x", 1]'``, ``'[]'`` for a bare array). The worker copies each leaf
straight into its row of the batch buffer; nothing is pickled between
processes. The trainer rebuilds ``default_collate``'s structure from the
names: dicts stay dicts, tuples and lists become lists, every leaf a
tensor with the batch dimension first.

Determinism: before each ``__getitem__`` the worker seeds Python's
``random``, numpy's global RNG and torch's (when torch is imported) from
(seed, epoch, index), so random augmentations are the same on any number of
workers and after a resume.
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

#: The ``custom`` dataset name a Python dataset job carries (the spec-file
#: entry ``python: {...}`` becomes it).
DATASET_NAME = "python"

#: Pickled datasets travel inside the job spec; larger ones would strain
#: every message that carries the spec.
MAX_PICKLE_BYTES = 512 * 1024

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


# -- trainer side -----------------------------------------------------------


def is_dataset(obj: Any) -> bool:
    """True for a map-style dataset (``__len__`` and ``__getitem__``), as
    opposed to a job spec (a dict, a path, spec text)."""
    if isinstance(obj, (Mapping, str, bytes)) or hasattr(obj, "__fspath__"):
        return False
    return hasattr(obj, "__getitem__") and hasattr(obj, "__len__")


def is_iterable_dataset(obj: Any) -> bool:
    """True for an iterable-style dataset (``__iter__``, no
    ``__getitem__``), which Loader does not run yet."""
    if isinstance(obj, (Mapping, str, bytes)) or hasattr(obj, "__fspath__"):
        return False
    return hasattr(obj, "__iter__") and not hasattr(obj, "__getitem__")


def pickle_dataset(dataset: Any) -> str:
    """The dataset, pickled and base64-encoded for the job spec, with this
    process's ``sys.path`` (so a worker imports the dataset's module from
    where the trainer did, as multiprocessing's spawn does). Classes
    defined in ``__main__`` or a notebook go by value through cloudpickle
    when it is installed. Raises ``TypeError`` in one line when the dataset
    cannot be pickled."""
    try:
        data = pickle.dumps(
            ([p for p in sys.path if isinstance(p, str)], _dumps(dataset)),
            protocol=pickle.HIGHEST_PROTOCOL,
        )
    except Exception as e:  # pickling runs user code (__reduce__): any error
        reason = _last_line(e)
        raise TypeError(
            f"the dataset cannot be pickled to the workers ({type(dataset).__name__}): "
            f"{reason}; define its class at module level, open files and "
            f"handles lazily in __getitem__, or install cloudpickle"
        ) from None
    if len(data) > MAX_PICKLE_BYTES:
        raise ValueError(
            f"the dataset pickles to {len(data)} bytes, over the {MAX_PICKLE_BYTES} "
            f"a job spec carries; keep large arrays in files (np.load(path, "
            f"mmap_mode='r') in __getitem__) or use a python factory spec"
        )
    return base64.b64encode(data).decode("ascii")


def _dumps(obj: Any) -> bytes:
    try:
        data = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as e:
        try:
            import cloudpickle
        except ImportError:
            raise e from None
        return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    if b"__main__" in data:
        # Pickled by reference to __main__, which a worker does not run.
        try:
            import cloudpickle
        except ImportError:
            raise pickle.PicklingError(
                "it refers to classes or functions of __main__, which workers "
                "cannot import"
            ) from None
        return cloudpickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    return data


def job_spec(
    dataset: Any,
    *,
    batch_size: int,
    shuffle: bool,
    seed: int,
    drop_last: bool,
    epochs: int,
    on_corrupt: str,
    seed_rngs: bool = True,
) -> dict:
    """The job spec (spec-file schema) of ``Loader.local(dataset, ...)``."""
    try:
        n = len(dataset)
    except Exception as e:
        raise TypeError(f"len(dataset) failed: {_last_line(e)}") from None
    if n <= 0:
        raise ValueError("the dataset is empty (len(dataset) == 0)")
    return {
        "dataset": {
            "python": {
                "pickle": pickle_dataset(dataset),
                "args": {"seed_rngs": bool(seed_rngs)},
                "num_samples": n,
            }
        },
        "batch_size": batch_size,
        "epochs": epochs,
        "sampler": {"shuffle": bool(shuffle), "seed": int(seed), "drop_last": bool(drop_last)},
        "on_corrupt": on_corrupt,
    }


#: Memory the ring of one loader over a Python dataset may take by default.
_RING_BUDGET = 1 << 30


def ring_for(dataset: Any, batch_size: int, prefetch: int, workers: int) -> Optional[tuple[int, int, int]]:
    """``(prefetch, slots, slot_bytes)`` for a Python dataset's job, which
    the trainer cannot size from its spec as the Rust SDK does for the
    built-in datasets: the SDK's window for the batch's bytes (small
    batches get a long one, as the workers' own window does), slots that
    hold a whole batch (a larger one would stream over gRPC), and enough of
    them for every worker's window twice over. Reads sample 0 here, with
    the seeds a worker would use; None when that fails (the workers then
    report it)."""
    from . import _native

    leaves: list = []
    saved = _rng_states()
    try:
        _flatten(seeded_sample(dataset, 0), [], leaves, _numpy())
    except Exception:
        return None
    finally:
        _restore_rng_states(saved)
    per_sample = sum(a.nbytes for _, a, _ in leaves)
    # Payloads, their 64-byte alignment, the header and its index list.
    batch = per_sample * batch_size + 64 * (len(leaves) + 1) + 8 * batch_size + (64 << 10)
    window = _native.window_batches(batch, prefetch)
    slot = -(-batch // 4096) * 4096
    slots = max(4, min(2 * window * workers, _RING_BUDGET // slot, 1 << 16))
    return window, slots, slot


def _rng_states() -> tuple:
    """The trainer's global RNG states, which reading a sample here must
    leave as they were (they seed the user's model, not Loader's)."""
    numpy, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    return (
        random.getstate(),
        numpy.random.get_state() if numpy is not None else None,
        torch.get_rng_state() if torch is not None else None,
    )


def _restore_rng_states(saved: tuple) -> None:
    py, np_state, torch_state = saved
    random.setstate(py)
    numpy, torch = sys.modules.get("numpy"), sys.modules.get("torch")
    if numpy is not None:
        if np_state is None:
            numpy.random.seed()  # numpy was imported by the sample: fresh entropy
        else:
            numpy.random.set_state(np_state)
    if torch is not None and torch_state is not None:
        torch.set_rng_state(torch_state)


def _numpy() -> Any:
    import numpy

    return numpy


def fill_num_samples(job: Any) -> Any:
    """A dict spec with a ``python`` factory dataset and no
    ``num_samples``: the factory's dataset, built here once, says how many."""
    if not isinstance(job, Mapping):
        return job
    python = job.get("dataset", {}).get("python") if isinstance(job.get("dataset"), Mapping) else None
    if not isinstance(python, Mapping) or "num_samples" in python or "factory" not in python:
        return job
    dataset = make_from_factory(python["factory"], python.get("args") or {})
    job = dict(job)
    job["dataset"] = {"python": {**python, "num_samples": len(dataset)}}
    return job


class Structure:
    """Rebuilds ``default_collate``'s structure from a batch's tensor names."""

    __slots__ = ("_paths", "_names")

    def __init__(self, names: list[str]) -> None:
        self._names = names
        self._paths = [tuple(json.loads(n)) for n in names]

    def build(self, leaves: Mapping[str, Any]) -> Any:
        if len(self._paths) == 1 and self._paths[0] == ():
            return leaves[self._names[0]]
        root: Any = None
        for name, path in zip(self._names, self._paths):
            root = _insert(root, path, leaves[name])
        return _freeze(root)


def _insert(node: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    key, rest = path[0], path[1:]
    if node is None:
        node = {} if isinstance(key, str) else []
    if isinstance(node, dict):
        node[key] = _insert(node.get(key), rest, value)
    else:
        while len(node) <= key:
            node.append(None)
        node[key] = _insert(node[key], rest, value)
    return node


def _freeze(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: _freeze(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_freeze(v) for v in node]
    return node


_structures: dict[tuple, Structure] = {}


def collated(batch: Any) -> Any:
    """A Python dataset's batch in ``default_collate``'s structure: torch
    tensors when torch is importable (zero-copy, DLPack), else numpy
    arrays. The tensors hold the batch's memory like the batch itself."""
    names = tuple(batch.keys())
    structure = _structures.get(names)
    if structure is None:
        structure = _structures.setdefault(names, Structure(list(names)))
    leaves = batch.torch() if _torch_available() else batch.numpy()
    return structure.build(leaves)


_HAS_TORCH: list[bool] = []


def _torch_available() -> bool:
    if not _HAS_TORCH:
        try:
            import torch  # noqa: F401

            _HAS_TORCH.append(True)
        except ImportError:
            _HAS_TORCH.append(False)
    return _HAS_TORCH[0]


# -- worker side ------------------------------------------------------------


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


def seeded_sample(dataset: Any, index: int, *, seed: int = 0, epoch: int = 0) -> Any:
    """``dataset[index]`` exactly as a worker draws it in ``epoch`` of a job
    seeded ``seed`` (the same RNG seeds): for checking or debugging a
    sample outside Loader."""
    from . import _native

    seed_rngs(_native.sample_seed(seed, epoch, index))
    return dataset[index]


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
