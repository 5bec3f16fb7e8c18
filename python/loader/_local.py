"""``Loader.local``'s job, in the steps ``Loader.local`` runs them:

1. ``read``: DataLoader's keywords (and Loader's own) read into one
   ``Request``, checked, and the worker template forked (first: before a
   sample is read here, which may start torch's thread pool, and before
   Loader starts threads of its own).
2. ``build``: the job's spec, made by one builder per kind of job (a
   map-style dataset, a ``Mix``, an iterable dataset, a job spec, or a
   torchvision dataset compiled to the native image pipeline), each
   sizing its ring; then encoded, with the cache of a built-in image
   job's frames and how its workers start: a ``LocalJob``.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import _cache, _dataset, _frames, _job, _keywords, _native, _native_transforms, _options, _ring, _stream, _template
from ._mix import Mix

_log = logging.getLogger("loader")

#: Set once the native-transforms hint was logged in this process.
_hinted: list[bool] = []


@dataclass
class Request:
    """What ``Loader.local`` was asked, once its keywords are read."""

    #: The job's settings for a dataset (or a Mix), DataLoader's defaults
    #: applied: batch_size, shuffle, seed, drop_last, epochs, on_corrupt,
    #: seed_rngs.
    settings: dict
    #: The same settings as given (None: not given): a job spec sets them
    #: itself, and refuses them in one line.
    given: dict
    #: DataLoader's keywords that run on Python samples.
    collate_fn: Any
    worker_init_fn: Any
    sampler: Any
    shuffle_buffer: Optional[int]
    native_transforms: bool
    #: The sample cache's budget in bytes (None: no cache) and directory.
    cache_bytes: Optional[int]
    cache_dir: Any
    workers: int
    #: Intra-op threads of each worker's libraries (0: their defaults).
    threads: int
    ready_timeout: float
    #: ``multiprocessing_context`` as given (a stream's shards are counted
    #: by workers started the same way).
    context: Any
    #: Seconds one batch may take (0: no limit).
    timeout: float
    #: The loader options, the ring's size added where it is sized here.
    options: dict
    #: The worker template the workers are forked from; None: spawned.
    template: Any = None


def read(
    dataset: Any,
    *,
    collate_fn: Any,
    worker_init_fn: Any,
    multiprocessing_context: Any,
    ready_timeout: float,
    epochs: Optional[int],
    on_corrupt: Optional[str],
    seed_rngs: Optional[bool],
    worker_threads: int,
    cache: Any,
    cache_dir: Any,
    shuffle_buffer: Optional[int],
    native_transforms: bool,
    **dataloader_keywords: Any,
) -> Request:
    """``Loader.local``'s arguments as a ``Request``; a bad one raises in
    one line naming it. Forks the worker template unless the workers are
    spawned."""
    # DataLoader's keywords (and their Loader equivalents, the options among
    # them) are `_keywords.translate`'s, which names each.
    translated = _keywords.translate(dataset=dataset, **dataloader_keywords)
    if translated.workers < 1:
        raise ValueError("Loader.local needs at least one worker")
    threads = int(worker_threads)
    if threads < 0:
        raise ValueError(f"worker_threads must be 0 (the libraries' defaults) or more, not {threads}")
    # Forked first: before this call reads a sample here (which may start
    # torch's thread pool) and before Loader starts threads of its own.
    template = None if _start_method(multiprocessing_context) == "spawn" else _template.get()
    batch_size, shuffle, seed, drop_last = translated.batch_size, translated.shuffle, translated.seed, translated.drop_last
    return Request(
        settings={
            "batch_size": 1 if batch_size is None else int(batch_size),
            "shuffle": bool(shuffle),
            "seed": int(seed or 0),
            "drop_last": bool(drop_last),
            "epochs": _job.UNBOUNDED_EPOCHS if epochs is None else int(epochs),
            "on_corrupt": on_corrupt or "fail",
            "seed_rngs": seed_rngs is not False,
        },
        given={
            "batch_size": batch_size, "shuffle": shuffle, "seed": seed, "drop_last": drop_last, "epochs": epochs,
            "on_corrupt": on_corrupt, "seed_rngs": seed_rngs,
        },
        collate_fn=collate_fn,
        worker_init_fn=worker_init_fn,
        sampler=translated.sampler,
        shuffle_buffer=shuffle_buffer,
        native_transforms=native_transforms,
        cache_bytes=_cache.budget(cache),
        cache_dir=cache_dir,
        workers=translated.workers,
        threads=threads,
        ready_timeout=ready_timeout,
        context=multiprocessing_context,
        timeout=translated.timeout,
        options=translated.options,
        template=template,
    )


@dataclass
class LocalJob:
    """A local job ready to start, and what its loader releases at close."""

    #: The job as built (the spec-file schema, or the spec as given).
    job: Any
    #: The job spec in the native module's encoding.
    spec: bytes
    #: A torchvision dataset compiled to the native image pipeline (its
    #: manifest released at close), or None.
    compiled: Optional["_native_transforms.Compiled"] = None
    #: The sample cache the forked workers inherit, or None.
    sample_cache: Any = None
    #: The kept frames of an image job's spawned workers, or None.
    spawned_frames: Optional[_frames.Spawned] = None
    #: The options, checked, as the Rust SDK's JSON.
    options_json: str = ""
    #: ``(workers, spawn command, ready timeout)`` of the workers.
    local: tuple = ()
    #: ``(template, threads, sample cache)`` when they are forked.
    forks: Optional[tuple] = None
    #: Pickled datasets in the host's blob directory, removed at close.
    pickles: list = field(default_factory=list)

    def start(self, spec: bytes, resume: Optional[str], start_at: Optional[int]) -> _native.NativeLoader:
        """Starts the coordinator and workers for ``spec`` (this job's, or
        a resumed state's), from ``resume`` or batch ``start_at``."""
        return _native.NativeLoader.open(
            spec, self.options_json, local=self.local, template=self.forks, resume=resume, start_at=start_at
        )


def build(dataset: Any, request: Request, local: Callable[..., Any]) -> LocalJob:
    """The job of ``Loader.local(dataset, ...)`` as ``request`` says:
    compiled to the native image pipeline when asked, checked against
    its cache and shuffle buffer, built by the builder of its kind,
    encoded, its frames' cache made, its workers' start prepared.
    ``local``: ``Loader.local``, which counts a stream's shards."""
    made = LocalJob(job=dataset, spec=b"")
    made.compiled = _compile(dataset, request)
    if made.compiled is not None:
        # From here on the job is the spec of the same samples.
        made.job = _compiled_spec(made.compiled, request)
    keeps_frames = _check_cache(made.job, request)
    _builder(made)(made, request, local)
    made.spec = _job.spec_bytes(made.job)
    if not _job.is_python_job(made.job):
        _ring.size_for_spec(request.options, made.spec, request.workers)
    if keeps_frames and request.template is not None:
        made.sample_cache = _frames.for_forked(made.spec, request.cache_bytes, request.cache_dir)
    elif keeps_frames:
        made.spawned_frames = _frames.Spawned(made.spec, request.cache_bytes, request.cache_dir)
    made.options_json = _options.checked_json(request.options)
    command = _worker_command(request.threads) + ([] if made.spawned_frames is None else made.spawned_frames.flags)
    made.local = (request.workers, command, request.ready_timeout)
    made.forks = None if request.template is None else (request.template, request.threads, made.sample_cache)
    # The pickled dataset's files in the host's blob directory: removed
    # when the loader closes (a worker that needs one later fetches it).
    made.pickles = _dataset.written_pickles(made.job)
    return made


def _check_cache(job: Any, request: Request) -> bool:
    """Whether the job keeps a built-in image job's frames; a cache or a
    shuffle buffer the job has no use for raises in one line."""
    if request.cache_bytes is None and request.cache_dir is not None:
        raise TypeError("cache_dir: give cache= too (the budget)")
    if request.shuffle_buffer is not None and not _dataset.is_iterable_dataset(job):
        raise TypeError("shuffle_buffer: only for an iterable dataset (a map-style one shuffles whole)")
    # A job spec's built-in image dataset keeps frames; a Mix's or a
    # stream's samples are not cached.
    keeps_frames = request.cache_bytes is not None and not (
        _dataset.is_dataset(job) or _dataset.is_iterable_dataset(job) or isinstance(job, Mix)
    ) and _frames.asked(job)
    if request.cache_bytes is not None and not keeps_frames and not _dataset.is_dataset(job):
        raise TypeError(_frames.NOTHING_TO_KEEP)
    return keeps_frames


def _builder(made: LocalJob) -> Callable[[LocalJob, Request, Callable[..., Any]], None]:
    """The builder of the job's kind."""
    if made.compiled is not None:
        return _nothing_to_build
    if _dataset.is_dataset(made.job):
        return _dataset_job
    if isinstance(made.job, Mix):
        return _mix_job
    if _dataset.is_iterable_dataset(made.job):
        return _stream_job
    return _spec_job


def _nothing_to_build(made: LocalJob, request: Request, local: Callable[..., Any]) -> None:
    """A compiled torchvision dataset: its spec is made already."""


def _dataset_job(made: LocalJob, request: Request, local: Callable[..., Any]) -> None:
    """A map-style dataset: pickled to the workers, with its sample cache
    (created here for forked workers, who inherit it; it goes when they
    and the loader have closed it), its ring sized from sample 0."""
    dataset, workers = made.job, request.workers
    cache_settings = None
    if request.cache_bytes is not None:
        _cache.check(dataset)
        cache_settings = {
            # Spawned workers keep a cache each: the budget is split.
            "bytes": request.cache_bytes if request.template is not None else max(1, request.cache_bytes // workers),
            "dir": None if request.cache_dir is None else os.fspath(request.cache_dir),
            "epochs": request.settings["epochs"],
        }
        if request.template is not None:
            made.sample_cache = _native.SampleCache.create(len(dataset), request.cache_bytes, cache_settings["dir"])
    made.job = _dataset.job_spec(
        dataset, **request.settings, collate_fn=request.collate_fn, worker_init_fn=request.worker_init_fn,
        num_workers=workers, cache=cache_settings, sampler=request.sampler,
    )
    _ring.size_for_dataset(request.options, dataset, made.job["batch_size"], workers, request.collate_fn)


def _mix_job(made: LocalJob, request: Request, local: Callable[..., Any]) -> None:
    """A ``Mix``: its sources' spec, the ring sized by its first Python
    source's samples (every source's collate alike), source field
    included."""
    mix = made.job
    if request.collate_fn is not None:
        raise TypeError("collate_fn: a Mix collates its sources' samples itself; give each source's samples one structure")
    if request.worker_init_fn is not None:
        raise TypeError("worker_init_fn: only for a dataset")
    python = mix.python_sources()
    made.job = mix.job_spec(**request.settings)
    if python:
        field = made.job["dataset"]["mix"].get("source_field")
        _ring.size_for_dataset(request.options, python[0], made.job["batch_size"], request.workers, None, field)


def _stream_job(made: LocalJob, request: Request, local: Callable[..., Any]) -> None:
    """An iterable dataset: read as shards over lanes, one per worker."""
    view = _stream_view(made.job, request, local)
    made.job = _dataset.job_spec(
        view, **request.settings, collate_fn=request.collate_fn, worker_init_fn=request.worker_init_fn,
        num_workers=request.workers,
    )
    made.job["dataset"]["python"]["shard_samples"] = view.lengths
    made.job["sampler"]["lanes"] = int(request.workers)
    made.job["sampler"]["shuffle_buffer"] = view.window
    _ring.size_for_dataset(request.options, view, made.job["batch_size"], request.workers, request.collate_fn)


def _spec_job(made: LocalJob, request: Request, local: Callable[..., Any]) -> None:
    """A job spec: it sets a dataset's settings itself (given ones are
    refused); a ``python`` entry asking for ``native_transforms`` is
    compiled."""
    given = [k for k, v in request.given.items() if v is not None]
    if request.collate_fn is not None:
        given.append("collate_fn")
    if request.worker_init_fn is not None:
        given.append("worker_init_fn")
    if given:
        raise TypeError(f"{', '.join(given)}: only for a dataset; a job spec sets them itself")
    job, made.compiled = _native_transforms.compile_job(made.job)
    made.job = _job.unbounded(_dataset.fill_num_samples(job))


def _stream_view(dataset: Any, request: Request, local: Callable[..., Any]) -> "_stream.StreamView":
    """An iterable dataset as ``Loader.local`` reads it: its shards, counted
    by a loader of this process's own (``batch_size=1`` over the shard
    counter, one sample per shard) unless the dataset gives their lengths."""
    settings, workers, shuffle_buffer = request.settings, request.workers, request.shuffle_buffer
    if shuffle_buffer is None:
        window = _stream.DEFAULT_SHUFFLE_BUFFER if settings["shuffle"] else 0
    else:
        window = int(shuffle_buffer)
        if window < 0:
            raise ValueError(f"shuffle_buffer must be 0 or more samples, not {window}")
        if window and not settings["shuffle"]:
            raise TypeError("shuffle_buffer: give shuffle=True too (a buffer only shuffles)")
    try:
        shards = _stream.Shards(dataset, workers)

        def count(counter: "_stream.ShardCounter", n: int) -> list:
            import numpy

            # A ring sized here: sizing it from sample 0 would count a
            # shard in this process.
            # One pass: its workers must not read the shards again.
            counting = local(
                counter, workers=max(1, min(workers, n)), batch_size=1, seed_rngs=False, epochs=1,
                multiprocessing_context=request.context, worker_threads=request.threads,
                ready_timeout=request.ready_timeout, ring=(32, 4096),
            )
            try:
                return [int(x) for batch in counting for x in numpy.asarray(batch).reshape(-1)]
            finally:
                # Its workers take ~0.1 s to stop: the job's loader starts
                # meanwhile (closing is idempotent; exit closes it anyway).
                threading.Thread(target=counting.close, name="loader-count-close", daemon=True).start()

        lengths = _stream.count_lengths(shards, count)
    except _stream.StreamError as e:
        raise ValueError(f"the iterable dataset cannot be read as shards: {e}") from None
    except _native.LoaderError as e:
        raise _native.LoaderError(f"counting the iterable dataset's shards: {e}") from None
    return _stream.StreamView(shards, lengths, window, settings["seed"], settings["seed_rngs"])


def _compile(dataset: Any, request: Request) -> Optional["_native_transforms.Compiled"]:
    """``native_transforms=True``: the dataset's native job, or a one-line
    ``ValueError`` saying what keeps it in Python. Off: None, and once per
    process a log line when the dataset would qualify."""
    if not request.native_transforms:
        if not _hinted and _native_transforms.is_image_folder(dataset) and _native_transforms.describe(dataset) is None:
            _hinted.append(True)
            _log.warning(
                "this ImageFolder's transforms can run in Loader's native image pipeline: "
                "Loader.local(..., native_transforms=True) for about %s the samples/s "
                "(pixels differ slightly from PIL's: docs/images.md)",
                _native_transforms.EXPECTED_SPEEDUP,
            )
        return None
    for name, value in (("collate_fn", request.collate_fn), ("worker_init_fn", request.worker_init_fn),
                        ("sampler", request.sampler), ("shuffle_buffer", request.shuffle_buffer)):
        if value is not None:
            raise ValueError(f"native_transforms: {name} runs on Python samples; leave it out or native_transforms off")
    try:
        return _native_transforms.compile_dataset(dataset)
    except _native_transforms.NotNative as e:
        raise ValueError(f"native_transforms: {e}") from None


def _compiled_spec(compiled: "_native_transforms.Compiled", request: Request) -> dict:
    """The spec of a compiled torchvision dataset's samples under the
    request's settings, its manifest written to the blob directory."""
    compiled.write_manifest()
    job = _dataset.job_around(compiled.dataset_entry(), **{k: v for k, v in request.settings.items() if k != "seed_rngs"})
    job["transforms"] = compiled.transforms
    return job


def _start_method(context: Any) -> str:
    """``"fork"`` (the worker template) or ``"spawn"``, from
    ``multiprocessing_context`` as DataLoader takes it: None, a start
    method's name, or a ``multiprocessing`` context."""
    if context is None:
        return "fork"
    name = context if isinstance(context, str) else getattr(context, "get_start_method", lambda: None)()
    if name in ("fork", "forkserver"):
        return "fork"
    if name == "spawn":
        return "spawn"
    raise ValueError(
        f"multiprocessing_context must be 'fork' (the default: workers forked from "
        f"the worker template), 'forkserver' (the same) or 'spawn', not {context!r}"
    )


def _worker_command(threads: int) -> list[str]:
    """This interpreter, running ``loader._worker`` from this very package
    under the thread policy ``threads`` (``multiprocessing_context="spawn"``).

    Not ``python -m loader._worker``: that would look in the working
    directory first, and from a source checkout find a ``loader`` package
    with no compiled module in it. ``-P`` keeps the working directory off
    ``sys.path``; the package's own directory goes first instead.
    """
    parent = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    boot = (
        "import sys; sys.path.insert(0, sys.argv.pop(1)); "
        f"from loader._worker import main; main({int(threads)})"
    )
    return [sys.executable, "-P", "-c", boot, parent]
