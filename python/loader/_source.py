"""Python map-style datasets, the worker's half: ``Source``, which the
worker's native dataset (``python/src/dataset.rs``) opens per job and calls
once per batch. It unpickles the dataset (from the job's ``pickle_file``
blob, mapped from the host's blob directory, or inline ``pickle``) or calls
its factory, seeds Python's ``random``, numpy's global RNG and torch's from
(seed, epoch, index) before each ``__getitem__`` (those the dataset draws
from: ``loader._rngs``), so random augmentations are the same on any
number of workers and after a resume, and flattens each sample into
C-contiguous byte views the worker copies straight into the batch buffer;
nothing is pickled between processes.
"""

from __future__ import annotations

import base64
import importlib
import json
import mmap
import os
import pickle
import sys
from collections.abc import Iterator, Mapping
from typing import Any, Optional

from . import _pickled
from ._cache import CachedReads
from ._rngs import Rngs, seed_all
from ._sampled import PassOrders

#: First pickle of a ``pickle_file`` (``loader._dataset.write_pickle``):
#: ``(SYS_PATH_HEADER, sys.path of the trainer)``, then the object.
SYS_PATH_HEADER = "loader.sys_path"

#: First item of a ``pickle_file`` that holds ``(BUNDLE, {"dataset": ...,
#: "collate_fn": ..., "worker_init_fn": ..., "sampler": ...})`` in one
#: pickle (``loader._dataset.job_spec``).
BUNDLE = "loader.bundle"

#: Samples tried for the schema before an exception in ``__getitem__`` is
#: taken as the dataset's, not one sample's.
_SCHEMA_TRIES = 16

_NUMPY_DTYPES = {
    "uint8", "int8", "uint16", "int16", "uint32", "int32", "uint64", "int64",
    "float16", "float32", "float64", "bool",
}


class Raised:
    """A sample whose ``__getitem__`` raised: the exception's last line."""

    __slots__ = ("reason",)

    def __init__(self, reason: str) -> None:
        self.reason = reason


#: Yielded by ``Source.read_batch`` before the batch's samples come again.
RESTART = object()


class SampleError(ValueError):
    """A sample Loader cannot batch: its leaves differ from sample 0's in
    structure, shape or dtype, or a leaf is not an array or a number. It
    fails the job (the corrupt policy is for samples that cannot be read)."""


def import_attr(target: str, field: str) -> Any:
    """The object ``package.module:name`` names; ``field`` says which spec
    field named it, for the error."""
    module, sep, attr = target.partition(":")
    if not sep or not module or not attr:
        raise ValueError(f"{field}: {target!r} is not 'package.module:function'")
    try:
        fn = importlib.import_module(module)
        for part in attr.split("."):
            fn = getattr(fn, part)
    except (ImportError, AttributeError) as e:
        raise ValueError(f"{field}: cannot import {target}: {_last_line(e)}") from None
    return fn


def make_from_factory(factory: str, args: Mapping) -> Any:
    """Calls ``package.module:function`` with ``args`` as keywords."""
    return import_attr(factory, "dataset.python.factory")(**dict(args))


class Source:
    """A Python dataset opened in a worker. The worker's native dataset
    calls ``tensors()`` once and ``read(index, sample_seed)`` per sample."""

    def __init__(self, params: Mapping[str, str], num_samples: int) -> None:
        # For a pickled dataset, `args` are Loader's own settings.
        seed_rngs = True
        bundled_collate = bundled_init = None
        #: A user's sampler's order by pass (loader._sampled), or None:
        #: positions are then dataset indices.
        self._orders: Optional[PassOrders] = None
        settings: dict = {}
        if "pickle_file" in params or "pickle" in params:
            settings = json.loads(params.get("args") or "{}")
            seed_rngs = bool(settings.get("seed_rngs", True))
            for name in settings.get("preload", []):
                try:
                    importlib.import_module(name)
                except Exception:  # a worker without it imports it when the dataset does
                    pass
            self._dataset = _unpickle(params, "pickle")
            if isinstance(self._dataset, tuple) and len(self._dataset) == 2 and self._dataset[0] == BUNDLE:
                bundle = self._dataset[1]
                self._dataset = bundle["dataset"]
                bundled_collate, bundled_init = bundle.get("collate_fn"), bundle.get("worker_init_fn")
                if bundle.get("sampler") is not None:
                    self._orders = PassOrders(bundle["sampler"], int(settings.get("seed", 0)))
        elif "factory" in params:
            args = json.loads(params.get("args") or "{}")
            self._dataset = make_from_factory(params["factory"], args)
        else:
            raise ValueError("dataset.python: give `factory` (package.module:function), `pickle_file` or `pickle`")
        _set_worker_info(self._dataset, settings)
        #: A stream's view (``loader._stream``): read a batch at a time,
        #: its iterators seeded per shard rather than per sample.
        self._stream = bool(getattr(self._dataset, "__loader_stream__", False))
        if self._stream:
            seed_rngs = False
        if "worker_init_pickle_file" in params:
            bundled_init = _unpickle(params, "worker_init_pickle")
        if bundled_init is not None:
            bundled_init(worker_id())
        self._rngs = Rngs(seed_rngs)
        #: ``dataset[index]`` through the sample cache
        #: (``Loader.local(cache=)``), or None.
        self._cached: Optional[CachedReads] = None
        if settings.get("cache"):
            self._cached = CachedReads(self._dataset, settings["cache"], len(self._dataset))
        #: DataLoader's batched fetch, when the dataset has one (not with a
        #: cache, which reads sample by sample).
        self._getitems = getattr(self._dataset, "__getitems__", None) if self._cached is None else None
        if self._getitems is not None:
            self._rngs.batched()
        #: The user's collate_fn (batches are then made whole by ``collate``).
        self._collate_fn: Any = bundled_collate
        if "collate_pickle_file" in params or "collate_pickle" in params:
            self._collate_fn = _unpickle(params, "collate_pickle")
        elif params.get("collate"):
            self._collate_fn = import_attr(params["collate"], "dataset.python.collate")
        self.collates = self._collate_fn is not None
        held = len(self._orders) if self._orders is not None else len(self._dataset)
        if held != num_samples:
            what = "len(sampler)" if self._orders is not None else "len(dataset)"
            raise ValueError(f"dataset.python: {what} is {held}, the job was planned for {num_samples}")
        import numpy

        self._np = numpy
        self._schema: list[tuple[list, str, tuple[int, ...]]] = []
        self._paths: list[list] = []
        self._names: list[str] = []
        self._first = 0
        self._torch_threads = False
        self._schema_sample: Any = None

    def tensors(self) -> list[tuple[str, str, list[int]]]:
        """``(name, dtype, shape)`` of each leaf, from the first sample that
        reads without an exception (of the first few; read with seed 0)."""
        schema = getattr(self._dataset, "__loader_schema_sample__", None)
        if schema is not None:
            # Loader's own datasets (a stream's shard counter), whose
            # samples cost a pass over a shard each.
            sample, first = schema(), 0
        else:
            for first in range(min(len(self._dataset), _SCHEMA_TRIES)):
                try:
                    sample = self._get(first, 0)
                except Exception:
                    # That sample's own batch applies the corrupt policy to it.
                    if first + 1 == min(len(self._dataset), _SCHEMA_TRIES):
                        raise
                    continue
                break
        try:
            leaves = self._leaves(sample)
        except SampleError:
            if not self.collates:
                raise
            # collate_fn makes batches of samples of any kind (strings,
            # objects): no per-sample tensors.
            leaves = []
        self._first = first
        self._schema_sample = sample
        self._paths = [path for path, _, _ in leaves]
        self._names = [json.dumps(path) for path in self._paths]
        self._schema = [(path, dtype, a.shape) for path, a, dtype in leaves]
        return [(name, dtype, list(a.shape)) for name, (_, a, dtype) in zip(self._names, leaves)]

    def _get(self, index: int, sample_seed: int) -> Any:
        self._torch_one_thread()
        if self._rngs.enabled:
            seed_all(sample_seed)
        if self._cached is not None:
            return self._cached(index)
        return self._dataset[index]

    def _torch_one_thread(self) -> None:
        if not self._torch_threads and "torch" in sys.modules:
            # The worker's thread policy (loader._worker.apply_thread_policy:
            # one intra-op thread by default, as DataLoader's workers run)
            # for a torch the dataset imported after the worker started.
            threads = int(os.environ.get("LOADER_WORKER_THREADS", "1") or 0)
            if threads > 0:
                sys.modules["torch"].set_num_threads(threads)
            self._torch_threads = True

    def read_batch(self, indices: list, seeds: list, epoch: int = 0) -> Iterator[Any]:
        """The samples ``indices`` of one batch, one at a time as
        ``__getitem__`` returns them (so the worker writes each into the
        batch before the next is made, and large samples do not pile up),
        or ``Raised`` for one whose ``__getitem__`` raised (the worker
        applies the job's corrupt policy). One call per batch: the worker
        writes plain samples itself (``python/src/sample_plan.rs``) and
        hands the others to ``convert``. Generators are seeded as
        ``loader._rngs`` says: when the batch must be read again seeded,
        ``RESTART`` comes first and then every sample again."""
        self._torch_one_thread()
        if self._stream:
            yield from self._dataset.read_batch(indices, epoch)
            return
        if self._orders is not None:
            # Before the RNG check begins: running the sampler draws.
            indices = self._orders.indices(indices, epoch)
        seed = self._rngs.begin(len(indices))
        many = self._fetch_many(indices) if seed is None else None
        if many is not None:
            yield from many
        else:
            yield from self._read_samples(indices, seeds, seed)
        if self._rngs.drawn():
            self._torch_one_thread()
            yield RESTART
            yield from self._read_samples(indices, seeds, self._rngs.begin(0))

    def _fetch_many(self, indices: list) -> Optional[list]:
        """The batch's samples from one ``__getitems__`` call, as DataLoader
        fetches them when the dataset has it (Hugging Face ``datasets``
        read a batch with one Arrow take, ~100 us a sample less than one
        ``__getitem__`` each). Only for a batch no generator is seeded
        for (the dataset has not been seen drawing random numbers; a batch
        that draws is read again sample by sample, seeded, as any other).
        None without ``__getitems__``, or when it raised or returned the
        wrong number of samples: the batch is then read sample by sample,
        so the corrupt policy applies to the sample that fails."""
        getitems = self._getitems
        if getitems is None:
            return None
        try:
            samples = getitems(list(indices))
        except Exception:
            return None
        if not isinstance(samples, (list, tuple)) or len(samples) != len(indices):
            return None
        return list(samples)

    def _read_samples(self, indices: list, seeds: list, seed: Any) -> Iterator[Any]:
        dataset, cached = self._dataset, self._cached
        for index, sample_seed in zip(indices, seeds):
            if seed is not None:
                seed(sample_seed)
            try:
                sample = dataset[index] if cached is None else cached(index)
            except Exception as e:
                yield Raised(_last_line(e))
                continue
            yield sample

    def collate(self, samples: list) -> list:
        """The batch ``collate_fn(samples)`` makes, flattened as samples
        are: ``(name, dtype, shape, bytes)`` per leaf (arrays, tensors and
        numbers in dicts, tuples and lists), any shapes. An exception of
        ``collate_fn`` or a leaf that cannot be batched raises
        ``SampleError`` (it fails the job, in one line)."""
        try:
            batch = self._collate_fn(samples)
        except Exception as e:
            raise SampleError(f"collate_fn raised on a batch of {len(samples)} samples: {_last_line(e)}") from None
        leaves: list = []
        try:
            _flatten(batch, [], leaves, self._np)
        except SampleError:
            # Not plain arrays in dicts/tuples/lists: carried whole, as
            # DataLoader carries it (loader._pickled).
            return self._pickled(batch)
        return [
            (json.dumps(path), dtype, list(array.shape), memoryview(array.reshape(-1)).cast("B"))
            for path, array, dtype in leaves
        ]

    def _pickled(self, batch: Any) -> list:
        np = self._np

        def leaf(obj: Any) -> Any:
            try:
                if isinstance(obj, np.ndarray):
                    array = np.ascontiguousarray(obj)
                    return array, _dtype(array)
                return _torch_leaf(obj, np)
            except (SampleError, TypeError, RuntimeError):
                return None  # a dtype a batch cannot hold: pickled inline

        try:
            packed = _pickled.pack(batch, leaf, np)
        except Exception as e:
            raise SampleError(f"collate_fn returned a {type(batch).__name__} that cannot be pickled: {_last_line(e)}") from None
        return [
            (name, dtype, list(array.shape), memoryview(array.reshape(-1)).cast("B"))
            for name, (array, dtype) in packed
        ]

    def schema_sample(self) -> Any:
        """The sample ``tensors()`` took the schema from."""
        return self._schema_sample

    def read(self, index: int, sample_seed: int, epoch: int = 0) -> list:
        """The leaves of sample ``index`` as C-contiguous byte memoryviews,
        in the order of ``tensors()``. An exception of ``__getitem__``
        propagates (the worker applies the job's corrupt policy); a sample
        that does not match sample 0 raises ``SampleError``."""
        if self._stream:
            sample = next(iter(self._dataset.read_batch([index], epoch)))
            if isinstance(sample, Raised):
                raise ValueError(sample.reason)
            return self.convert(index, sample)
        if self._orders is not None:
            index = self._orders.indices([index], epoch)[0]
        return self.convert(index, self._get(index, sample_seed))

    def convert(self, index: int, sample: Any) -> list:
        """The leaves of ``sample`` (sample ``index``) as C-contiguous byte
        memoryviews, in the order of ``tensors()``, whatever the leaves
        (torch tensors, numpy scalars, strided arrays); ``SampleError`` when
        it does not match the schema sample."""
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

    def _leaves(self, sample: Any) -> list[tuple[list, Any, str]]:
        out: list[tuple[list, Any, str]] = []
        _flatten(sample, [], out, self._np)
        return out


#: The index a local worker was started with (0 .. workers - 1), set by
#: the loader that started it (embedded mode's launchers).
WORKER_ID_VARIABLE = "LOADER_WORKER_ID"


def worker_id() -> int:
    """This worker's index among its loader's local workers; 0 for a
    worker nobody numbered (a remote ``python -m loader._worker``)."""
    try:
        return int(os.environ.get(WORKER_ID_VARIABLE, "0"))
    except ValueError:
        return 0


def _set_worker_info(dataset: Any, settings: Mapping) -> None:
    """Makes ``torch.utils.data.get_worker_info()`` answer in this worker
    as in a DataLoader worker: ``id``, ``num_workers``, ``seed`` (the job's
    seed plus the id, as DataLoader's base seed plus the id) and
    ``dataset``, for datasets that open per-worker handles or split work
    by it. Only for a local worker of a loader that said how many it
    started, and only when torch is loaded (a dataset that asks has
    imported it; the workers preload it when the trainer had it)."""
    torch = sys.modules.get("torch")
    if torch is None or WORKER_ID_VARIABLE not in os.environ or "num_workers" not in settings:
        return
    try:
        from torch.utils.data._utils import worker as torch_worker
    except ImportError:  # a torch without DataLoader's internals: nothing to answer
        return
    wid = worker_id()
    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=wid, num_workers=int(settings["num_workers"]), seed=int(settings.get("seed", 0)) + wid, dataset=dataset
    )


def _unpickle(params: Mapping[str, str], key: str) -> Any:
    """The object of ``params[key + "_file"]`` (a local path: the worker
    made the job's blob local and names it there), else of the inline
    ``params[key]`` (base64 of ``(sys.path, pickle)``)."""
    path = params.get(key + "_file")
    if path is None:
        paths, data = pickle.loads(base64.b64decode(params[key]))
        sys.path.extend(p for p in paths if p not in sys.path)
        return pickle.loads(data)
    return load_pickle_file(path)


def load_pickle_file(path: str) -> Any:
    """The object pickled in the file at ``path``: mapped, not read, so the
    only copy of its bytes in this process is the object unpickled from
    them (the page cache holds the file once for every worker of the
    host). A file ``loader._dataset.write_pickle`` wrote starts with the
    trainer's ``sys.path``, added to this process's before the object is
    unpickled; any other file is one plain pickle."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        first = pickle.load(data)
        if not (isinstance(first, tuple) and len(first) == 2 and first[0] == SYS_PATH_HEADER):
            return first
        sys.path.extend(p for p in first[1] if isinstance(p, str) and p not in sys.path)
        with memoryview(data)[data.tell():] as rest:
            return pickle.loads(rest)


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


#: ``dtype.name`` by dtype: numpy computes the name in Python (~1.5 us),
#: once per leaf of every sample the Python half converts.
_DTYPE_NAMES: dict = {}


def _dtype(array: Any) -> str:
    dtype = array.dtype
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES.setdefault(dtype, dtype.name)
    if name not in _NUMPY_DTYPES:
        raise SampleError(f"dtype {name} cannot be batched; use one of {sorted(_NUMPY_DTYPES)}")
    return name


def _last_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return f"{type(e).__name__}: {text[-1]}" if text else type(e).__name__
