"""Python map-style datasets, the trainer's half: the job spec of
``Loader.local(dataset)`` (the dataset pickled with this process's
``sys.path`` into a file of the host's blob directory, which travels as a
blob: see ``write_pickle``) and ``default_collate``'s structure rebuilt
from a batch's tensor names. The worker's half is ``loader._source``; the
ring a Python job's batches need is ``loader._ring``'s.

A sample (numpy arrays, torch tensors, Python numbers, and dicts, tuples and
lists of them) is flattened into leaves; each leaf becomes one tensor of the
batch, named by its path in the sample as JSON (``'["image"]'``, ``'[0]'``,
``'["x", 1]'``, ``'[]'`` for a bare array). The trainer rebuilds
``default_collate``'s structure from the names: dicts stay dicts, tuples
and lists become lists, every leaf a tensor with the batch dimension
first.
"""

from __future__ import annotations

import atexit
import hashlib
import json
import mmap
import os
import pickle
import sys
import tempfile
import threading
from collections.abc import Mapping
from typing import Any, Callable, Optional

from . import _pickled
from ._rngs import seed_all
from ._sampled import check as check_sampler
from ._source import BUNDLE, SYS_PATH_HEADER, _last_line, make_from_factory
from ._stream import is_hf_iterable

#: The ``custom`` dataset name a Python dataset job carries (the spec-file
#: entry ``python: {...}`` becomes it).
DATASET_NAME = "python"


def is_dataset(obj: Any) -> bool:
    """True for a map-style dataset (``__len__`` and ``__getitem__``), as
    opposed to a job spec (a dict, a path, spec text) or an iterable one."""
    if isinstance(obj, (Mapping, str, bytes)) or hasattr(obj, "__fspath__"):
        return False
    return hasattr(obj, "__getitem__") and hasattr(obj, "__len__") and not is_iterable_dataset(obj)


def is_iterable_dataset(obj: Any) -> bool:
    """True for an iterable-style dataset: a torch ``IterableDataset``
    (which inherits a ``__getitem__`` that raises), a Hugging Face
    ``IterableDataset``, or anything with ``__iter__`` and no
    ``__getitem__``; ``loader._stream`` reads it as shards."""
    if isinstance(obj, (Mapping, str, bytes)) or hasattr(obj, "__fspath__"):
        return False
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.utils.data.IterableDataset):
        return True
    if is_hf_iterable(obj):
        return True
    return hasattr(obj, "__iter__") and not hasattr(obj, "__getitem__")


def write_pickle(obj: Any, what: str = "the dataset") -> str:
    """Pickles ``obj`` into the host's blob directory (``$LOADER_BLOB_DIR``,
    else ``$XDG_RUNTIME_DIR/loader-blobs``, else ``$TMPDIR/loader-blobs-<uid>``;
    the workers' own) under the SHA-256 of the bytes, and returns the file's
    path, for a spec's ``pickle_file``. The SDK uploads the file to the
    coordinator when the job is submitted; co-located workers read it where
    it is, remote ones fetch it once per host. Streamed: the pickle is
    hashed as it is written, never held in memory whole.

    The file holds two pickles: this process's ``sys.path`` (so a worker
    imports the dataset's module from where the trainer did, as
    multiprocessing's spawn does), then the object. Classes defined in
    ``__main__`` or a notebook go by value through cloudpickle when it is
    installed. Raises ``TypeError`` in one line when ``obj`` cannot be
    pickled (``what`` names it: the dataset or its collate_fn). Each call
    takes a reference on the file; ``release_pickle`` drops it, and the file
    this process wrote goes with the last one (or at interpreter exit)."""
    from . import _native

    directory = _native.blob_dir()
    paths = [p for p in sys.path if isinstance(p, str)]

    def attempt(dump: Callable[[Any, Any], None]) -> tuple[str, str, int]:
        fd, temp = tempfile.mkstemp(prefix=".tmp-py-", dir=directory)
        try:
            with os.fdopen(fd, "wb") as raw:
                out = _Hashing(raw)
                pickle.dump((SYS_PATH_HEADER, paths), out, protocol=pickle.HIGHEST_PROTOCOL)
                dump(obj, out)
            return temp, out.hexdigest(), out.size
        except BaseException:
            _unlink(temp)
            raise

    try:
        try:
            temp, sha, size = attempt(_pickle_into)
        except Exception as e:
            cloudpickle = _cloudpickle()
            if cloudpickle is None:
                raise e from None
            temp, sha, size = attempt(lambda o, f: cloudpickle.dump(o, f, protocol=pickle.HIGHEST_PROTOCOL))
        else:
            if _refers_to_main(temp):
                # Pickled by reference to __main__, which a worker does not run.
                _unlink(temp)
                cloudpickle = _cloudpickle()
                if cloudpickle is None:
                    raise pickle.PicklingError(
                        "it refers to classes or functions of __main__, which workers cannot import"
                    ) from None
                temp, sha, size = attempt(lambda o, f: cloudpickle.dump(o, f, protocol=pickle.HIGHEST_PROTOCOL))
    except Exception as e:  # pickling runs user code (__reduce__): any error
        reason = _last_line(e)
        raise TypeError(
            f"{what} cannot be pickled to the workers ({type(obj).__name__}): "
            f"{reason}; define its class at module level, open files and "
            f"handles lazily in __getitem__, or install cloudpickle"
        ) from None
    return _publish(temp, os.path.join(directory, sha), size)


def write_blob(data: bytes) -> str:
    """``data`` in the host's blob directory under its SHA-256, with a
    reference, as ``write_pickle``'s files are (``release_pickle`` drops
    it): a file a spec names by path (an image job's manifest) gets the
    same path from the same bytes, so a saved state that names it finds it
    again in a later loader or process."""
    from . import _native

    directory = _native.blob_dir()
    fd, temp = tempfile.mkstemp(prefix=".tmp-blob-", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
    except BaseException:
        _unlink(temp)
        raise
    return _publish(temp, os.path.join(directory, hashlib.sha256(data).hexdigest()), len(data))


def release_pickle(path: str) -> None:
    """Drops a reference ``write_pickle`` took on ``path``; the last one
    removes the file if this process wrote it (a worker that needs it later
    fetches it from the coordinator)."""
    with _written_lock:
        entry = _written.get(path)
        if entry is None:
            return
        entry[0] -= 1
        if entry[0] > 0:
            return
        del _written[path]
        if entry[1] == os.getpid():
            _unlink(path)


#: Files ``write_pickle`` handed out: path -> [references, the pid of the
#: process that wrote it (which removes it with the last reference), or 0
#: for a file another process put there].
_written: dict[str, list] = {}
_written_lock = threading.Lock()


def _publish(temp: str, path: str, size: int) -> str:
    """Renames ``temp`` into place as ``path``, read-only, unless another
    process put the same bytes there already (then that file stays theirs:
    it is left for the workers' sweep, not removed at close)."""
    with _written_lock:
        entry = _written.setdefault(path, [0, 0])
        if _holds(path, size):
            _unlink(temp)
        else:
            os.chmod(temp, 0o400)
            os.replace(temp, path)
            entry[1] = os.getpid()
        entry[0] += 1
    return path


@atexit.register
def _remove_written() -> None:
    # Only in the process that wrote them: a fork that exits normally (the
    # user's own) must not take the trainer's files along.
    with _written_lock:
        for path, (_, writer) in _written.items():
            if writer == os.getpid():
                _unlink(path)
        _written.clear()


def _holds(path: str, size: int) -> bool:
    try:
        return os.stat(path).st_size == size
    except OSError:
        return False


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class _Hashing:
    """A file that hashes (SHA-256) and counts what is written to it."""

    __slots__ = ("_file", "_sha", "size")

    def __init__(self, file: Any) -> None:
        self._file = file
        self._sha = hashlib.sha256()
        self.size = 0

    def write(self, data: Any) -> int:
        view = memoryview(data)
        self._sha.update(view)
        self.size += view.nbytes
        return self._file.write(view)

    def hexdigest(self) -> str:
        return self._sha.hexdigest()


def _pickle_into(obj: Any, out: Any) -> None:
    pickle.dump(obj, out, protocol=pickle.HIGHEST_PROTOCOL)


def _refers_to_main(path: str) -> bool:
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return data.find(b"__main__") >= 0


def _cloudpickle() -> Any:
    try:
        import cloudpickle
    except ImportError:
        return None
    return cloudpickle


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
    collate_fn: Any = None,
    worker_init_fn: Any = None,
    num_workers: Optional[int] = None,
    cache: Optional[dict] = None,
    sampler: Any = None,
) -> dict:
    """The job spec (spec-file schema) of ``Loader.local(dataset, ...)``:
    the dataset (and ``collate_fn``) pickled into the host's blob directory
    (``write_pickle``); ``written_pickles(spec)`` lists the files, for
    ``release_pickle`` when the loader closes. ``cache``: the sample
    cache's settings (``loader._cache``), or None."""
    try:
        n = len(dataset)
    except Exception as e:
        raise TypeError(f"len(dataset) failed: {_last_line(e)}") from None
    if n <= 0:
        raise ValueError("the dataset is empty (len(dataset) == 0)")
    if sampler is not None:
        # A pass is the sampler's positions; each worker runs it per pass.
        n = check_sampler(sampler, n, int(seed))
    # Libraries the workers import before the first sample, as a
    # DataLoader's forked workers have them: torch, so that its generator is
    # seeded from the first batch on (not only once a batch imported it).
    preload = [name for name in ("torch",) if name in sys.modules]
    if collate_fn is not None and not callable(collate_fn):
        raise TypeError(f"collate_fn must be callable, not {type(collate_fn).__name__}")
    if worker_init_fn is not None and not callable(worker_init_fn):
        raise TypeError(f"worker_init_fn must be callable, not {type(worker_init_fn).__name__}")
    args: dict = {"seed_rngs": bool(seed_rngs), "preload": preload, "seed": int(seed)}
    if num_workers is not None:
        # For get_worker_info() in each worker (loader._source).
        args["num_workers"] = int(num_workers)
    if cache is not None:
        # {"bytes": N, "dir": path or None}: loader._cache.
        args["cache"] = cache
    extras = {k: v for k, v in (("collate_fn", collate_fn), ("worker_init_fn", worker_init_fn), ("sampler", sampler)) if v is not None}
    if not extras:
        pickled = write_pickle(dataset)
    else:
        # One pickle for them all, so that what pickles by value (classes
        # and functions of __main__ or a notebook) shares one namespace in
        # the worker, as under DataLoader's fork: a global worker_init_fn
        # sets is the one __getitem__ reads.
        what = "the dataset" + "".join(f" or its {name}" for name in extras)
        pickled = write_pickle((BUNDLE, {"dataset": dataset, **extras}), what=what)
    python = {
        "pickle_file": pickled,
        "args": args,
        "num_samples": n,
    }
    return job_around(
        {"python": python},
        batch_size=batch_size,
        shuffle=shuffle,
        seed=seed,
        drop_last=drop_last,
        epochs=epochs,
        on_corrupt=on_corrupt,
    )


def job_around(
    dataset: dict, *, batch_size: int, shuffle: bool, seed: int, drop_last: bool, epochs: int, on_corrupt: str
) -> dict:
    """The job spec (spec-file schema) of a dataset entry with a
    DataLoader-style loader's settings."""
    return {
        "dataset": dataset,
        "batch_size": batch_size,
        "epochs": epochs,
        "sampler": {"shuffle": bool(shuffle), "seed": int(seed), "drop_last": bool(drop_last)},
        "on_corrupt": on_corrupt,
    }


def written_pickles(spec: Any) -> list[str]:
    """The files ``job_spec`` wrote for ``spec`` (none for other specs)."""
    dataset = spec.get("dataset") if isinstance(spec, Mapping) else None
    entries = [dataset] if isinstance(dataset, Mapping) else []
    mix = dataset.get("mix") if isinstance(dataset, Mapping) else None
    if isinstance(mix, Mapping):
        entries = [s.get("dataset") for s in mix.get("sources", []) if isinstance(s, Mapping)]
    files = []
    for entry in entries:
        python = entry.get("python") if isinstance(entry, Mapping) else None
        if isinstance(python, Mapping):
            files += [python.get("pickle_file"), python.get("collate_pickle_file"), python.get("worker_init_pickle_file")]
    with _written_lock:
        return [f for f in files if isinstance(f, str) and f in _written]


def fill_num_samples(job: Any, consumers: Optional[int] = None) -> Any:
    """A dict spec with a ``python`` factory dataset and no
    ``num_samples``: the factory's dataset, built here once, says how many."""
    if not isinstance(job, Mapping):
        return job
    python = job.get("dataset", {}).get("python") if isinstance(job.get("dataset"), Mapping) else None
    if not isinstance(python, Mapping) or "num_samples" in python or "factory" not in python:
        return job
    dataset = make_from_factory(python["factory"], python.get("args") or {})
    job = dict(job)
    if is_iterable_dataset(dataset):
        return _stream_spec(job, python, dataset, consumers or int(job.get("consumers") or 1))
    job["dataset"] = {"python": {**python, "num_samples": len(dataset)}}
    return job


def _stream_spec(job: dict, python: Mapping, dataset: Any, consumers: int) -> dict:
    """A deployment's spec whose factory makes an iterable dataset: the
    shards counted here, and the workers' factory ``loader._stream``'s,
    which opens the same dataset as a view over them. The sampler reads
    ``sampler.lanes`` lanes (default: up to 8, one per shard); a dataset
    split by ``get_worker_info()`` is split that many ways."""
    from . import _native, _stream

    sampler = dict(job.get("sampler") or {})
    shards = _stream.Shards(dataset, int(sampler.get("lanes") or 1))
    sampler.setdefault("lanes", min(shards.count, 8))
    shuffle = bool(sampler.get("shuffle"))
    window = int(sampler.get("shuffle_buffer", _stream.DEFAULT_SHUFFLE_BUFFER if shuffle else 0))
    if window and not shuffle:
        # As Loader.local(shuffle_buffer=) without shuffle=True: a buffer only
        # shuffles, and dropping it quietly would read the stream in order.
        raise ValueError("sampler.shuffle_buffer: give sampler.shuffle: true too (a buffer only shuffles)")
    sampler["shuffle_buffer"] = window
    try:
        lengths = _stream.counted_in_process(shards)
    except _stream.StreamError as e:
        raise ValueError(f"dataset.python: the iterable dataset cannot be read as shards: {e}") from None
    args = {
        "factory": python["factory"],
        "args": dict(python.get("args") or {}),
        "lengths": lengths,
        "num_workers": shards.num_workers,
        "shuffle_buffer": sampler["shuffle_buffer"],
        "seed": int(sampler.get("seed", 0)),
        # The ranks' samples of a lane's turn, which one worker reads.
        "keep_ahead": _native.LANE_TURN * int(job.get("batch_size") or 1) * consumers if consumers > 1 else 0,
    }
    job["sampler"] = sampler
    job["dataset"] = {
        "python": {
            **{k: v for k, v in python.items() if k not in ("factory", "args")},
            "factory": "loader._stream:from_factory",
            "args": args,
            "num_samples": sum(lengths),
            "shard_samples": lengths,
        }
    }
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
    if isinstance(key, str) != isinstance(node, dict):
        raise TypeError(
            f"the batch's samples are not dicts, so its field {key!r} (a mixture's source_field) "
            "has no place in them: return dicts from __getitem__, or leave source_field out"
        )
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
    if _pickled.is_pickled(names):
        return _pickled.unpack(batch, _torch_available())
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


def seeded_sample(dataset: Any, index: int, *, seed: int = 0, epoch: int = 0) -> Any:
    """``dataset[index]`` exactly as a worker draws it in ``epoch`` of a job
    seeded ``seed`` (the same RNG seeds): for checking or debugging a
    sample outside Loader."""
    from . import _native

    seed_all(_native.sample_seed(seed, epoch, index))
    return dataset[index]
