"""Loader's Python trainer SDK: a drop-in for ``torch.utils.data.DataLoader``
fed by Loader workers.

    import loader

    spec = {"dataset": {"synthetic": {"num_samples": 10_000, "shape": [3, 224, 224],
                                      "dtype": "uint8"}},
            "batch_size": 64, "sampler": {"shuffle": True, "seed": 0}}
    dl = loader.Loader.local(spec, num_workers=2)  # like DataLoader(num_workers=2)
    for epoch in range(3):
        for batch in dl:                           # one pass: len(dl) batches
            x = batch.torch()["data"]              # zero-copy torch tensor
            y = batch["label"]                     # zero-copy numpy array

Batches view the memory the workers wrote (a shared-memory slot, or the gRPC
frame of a remote worker) without copying. The slot is reused once the batch
and every array or tensor made from it are freed: keep only what you need
past a training step, or copy it.

Passes: as with a DataLoader, every ``for batch in loader`` is the next
pass (epoch) over the data, any number of times (a job spec's ``"epochs"``
or ``Loader.local(..., epochs=N)`` sets a bound), and a loop left early with
``break`` loses nothing of the next pass: it starts whole. ``len(loader)``
is the batches of one pass. ``set_epoch(e)`` (or ``loader.sampler
.set_epoch(e)``, as Lightning and accelerate call it) chooses the pass the
next ``for`` yields; the order of pass ``e`` depends only on (seed, e), so
a repeated or resumed pass repeats exactly. After ``load_state_dict`` the
next ``for`` yields the rest of the saved pass, and later ones go on.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import signal
import sys
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Optional, Union

from . import _cache, _dataset, _keywords, _native, _native_transforms, _passes, _stream, _template
from ._mix import Mix
from ._native import Batch, LoaderError, TensorView

if TYPE_CHECKING:
    from typing import Unpack

    from ._native import LoaderOptions

__all__ = ["Loader", "Batch", "TensorView", "LoaderError", "Mix", "merge_states", "UNBOUNDED_EPOCHS"]

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

#: Every option ``Loader`` takes, with its default: the Rust SDK's
#: ``LoaderOptions``, read from it (``ring`` as ``[slots, slot_bytes]``,
#: ``coordinator_timeout`` in seconds).
DEFAULT_OPTIONS: dict[str, Any] = json.loads(_native.default_options())

#: Credits per worker stream unless told otherwise (as in the Rust SDK).
DEFAULT_PREFETCH: int = DEFAULT_OPTIONS["prefetch"]

_SPEC_SUFFIXES = (".json", ".yaml", ".yml")

#: The epochs of a job whose loader sets no bound (``epochs=None``, a dict
#: spec without ``"epochs"``): in effect none, as a DataLoader iterates as
#: many times as it is asked. A pure number, so a state saved under it
#: resumes anywhere; ``Loader.epochs`` says None.
UNBOUNDED_EPOCHS = 1 << 20

_log = logging.getLogger("loader")


#: The built-in datasets whose pipeline keeps decoded frames (``cache=``).
_IMAGE_KINDS = frozenset({"image_folder", "webdataset"})
_NOTHING_TO_KEEP = "cache: only for a dataset or a job spec of a built-in image dataset (image_folder, webdataset)"


def _frame_cache(spec: bytes, cache_bytes: int, cache_dir: Any) -> Any:
    """The sample cache of a built-in image job's workers (a frame per
    image and scale, ``FrameCache`` in the worker), created here and
    inherited by the workers the template forks."""
    entries = _native.frame_cache_entries(spec)
    if entries is None:
        raise TypeError(_NOTHING_TO_KEEP)
    directory = None if cache_dir is None else os.fspath(cache_dir)
    return _native.SampleCache.create(entries, cache_bytes, directory)


class _SpawnedFrames:
    """Kept frames for a built-in image job's spawned workers
    (``multiprocessing_context="spawn"``), which inherit nothing from this
    process: each is started as ``loader-worker --cache SIZE --cache-dir
    DIR --cache-shared`` would be, so they share one cache file in DIR
    (``loader_worker::sample_cache::on_node``), which the last of them to
    let go removes. DIR is ``cache_dir``, or a directory of this loader's
    own in ``/dev/shm`` (memory, as a forked job's memfd), removed at
    close: a worker killed before letting go leaves its file there."""

    def __init__(self, spec: bytes, cache_bytes: int, cache_dir: Any):
        if _native.frame_cache_entries(spec) is None:
            raise TypeError(_NOTHING_TO_KEEP)
        import tempfile

        if cache_dir is not None:
            self.dir, self._own = os.fspath(cache_dir), False
        else:
            shm = "/dev/shm" if os.access("/dev/shm", os.W_OK | os.X_OK) else None
            self.dir, self._own = tempfile.mkdtemp(prefix="loader-frames.", dir=shm), True
        self.flags = ["--cache", str(int(cache_bytes)), "--cache-dir", self.dir, "--cache-shared"]

    def close(self) -> None:
        if self._own:
            import shutil

            self._own = False
            shutil.rmtree(self.dir, ignore_errors=True)


def _spec_bytes(job: Union[Mapping, str, os.PathLike]) -> bytes:
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


def _unbounded(job: Any) -> Any:
    """A dict spec that sets no ``"epochs"`` iterates as a DataLoader does,
    any number of passes (a spec file or text keeps its own bound, default
    1, as ``loaderctl`` reads it)."""
    if isinstance(job, Mapping) and "epochs" not in job:
        return {**job, "epochs": UNBOUNDED_EPOCHS}
    return job


def _compile(
    dataset: Any, native: bool, *, collate_fn: Any, worker_init_fn: Any, sampler: Any, shuffle_buffer: Any
) -> Optional["_native_transforms.Compiled"]:
    """``native_transforms=True``: the dataset's native job, or a one-line
    ``ValueError`` saying what keeps it in Python. Off: None, and once per
    process a log line when the dataset would qualify."""
    if not native:
        if not _hinted and _native_transforms.is_image_folder(dataset) and _native_transforms.describe(dataset) is None:
            _hinted.append(True)
            _log.warning(
                "this ImageFolder's transforms can run in Loader's native image pipeline: "
                "Loader.local(..., native_transforms=True) for about %s the samples/s "
                "(pixels differ slightly from PIL's: docs/images.md)",
                _native_transforms.EXPECTED_SPEEDUP,
            )
        return None
    for name, value in (("collate_fn", collate_fn), ("worker_init_fn", worker_init_fn), ("sampler", sampler),
                        ("shuffle_buffer", shuffle_buffer)):
        if value is not None:
            raise ValueError(f"native_transforms: {name} runs on Python samples; leave it out or native_transforms off")
    try:
        return _native_transforms.compile_dataset(dataset)
    except _native_transforms.NotNative as e:
        raise ValueError(f"native_transforms: {e}") from None


#: Set once the native-transforms hint was logged in this process.
_hinted: list[bool] = []


def _python_job(job: Any) -> bool:
    """True for a job over a Python dataset: its batches are yielded in
    ``default_collate``'s structure, not as a ``Batch``."""
    dataset = job.get("dataset") if isinstance(job, Mapping) else None
    mix = dataset.get("mix") if isinstance(dataset, Mapping) else None
    if isinstance(mix, Mapping):
        # A mixture yields like its first source.
        sources = mix.get("sources") or [{}]
        dataset = sources[0].get("dataset") if isinstance(sources[0], Mapping) else None
    return isinstance(dataset, Mapping) and "python" in dataset


def _size_ring(options: dict, dataset: Any, batch_size: int, workers: int, collate_fn: Any) -> None:
    """Sizes the ring (and the prefetch window) of a Python dataset's job
    from its first sample, unless the options set them or use no shared
    memory: the trainer cannot size it from the spec as for built-in
    datasets."""
    if "ring" in options or not options.get("shared_memory", True):
        return
    ring = _dataset.ring_for(
        dataset, batch_size, options.get("prefetch", DEFAULT_PREFETCH), workers, collate_fn
    )
    if ring is not None:
        window, slots, slot_bytes = ring
        options["ring"] = (slots, slot_bytes)
        options.setdefault("prefetch", window)


def _size_spec_ring(options: dict, spec: bytes, workers: int) -> None:
    """Sizes the ring of a built-in dataset's job whose batches outgrow
    the default slot (a batch of 64 float32 224x224 images is 38.5 MB), as
    for a Python dataset's, where the SDK alone would stream every batch
    over gRPC."""
    if "ring" in options or not options.get("shared_memory", True):
        return
    batch = _native.batch_bytes(spec)
    if batch is None or batch <= _native.DEFAULT_SLOT_SIZE:
        return
    window, slots, slot_bytes = _dataset.ring_for_batch(batch, options.get("prefetch", DEFAULT_PREFETCH), workers)
    options["ring"] = (slots, slot_bytes)
    options.setdefault("prefetch", window)


def _stream_view(
    dataset: Any, workers: int, settings: dict, shuffle_buffer: Optional[int], context: Any, threads: int, ready_timeout: float
) -> "_stream.StreamView":
    """An iterable dataset as ``Loader.local`` reads it: its shards, counted
    by a loader of this process's own (``batch_size=1`` over the shard
    counter, one sample per shard) unless the dataset gives their lengths."""
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
            # A ring sized here: sizing it from sample 0 would count a
            # shard in this process.
            # One pass: its workers must not read the shards again.
            counting = Loader.local(
                counter, workers=max(1, min(workers, n)), batch_size=1, seed_rngs=False, epochs=1,
                multiprocessing_context=context, worker_threads=threads, ready_timeout=ready_timeout,
                ring=(32, 4096),
            )
            try:
                return [int(x) for batch in counting for x in _numpy().asarray(batch).reshape(-1)]
            finally:
                # Its workers take ~0.1 s to stop: the job's loader starts
                # meanwhile (closing is idempotent; exit closes it anyway).
                threading.Thread(target=counting.close, name="loader-count-close", daemon=True).start()

        lengths = _stream.count_lengths(shards, count)
    except _stream.StreamError as e:
        raise ValueError(f"the iterable dataset cannot be read as shards: {e}") from None
    except LoaderError as e:
        raise LoaderError(f"counting the iterable dataset's shards: {e}") from None
    return _stream.StreamView(shards, lengths, window, settings["seed"], settings["seed_rngs"])


def _numpy() -> Any:
    import numpy

    return numpy


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


def _options_json(options: Mapping[str, Any]) -> str:
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


class Loader:
    """Batches of a Loader job for one data-parallel rank, like a DataLoader.

    ``Loader(coordinator, job, rank=, world_size=)`` reads from a Loader
    deployment; ``Loader.local(job, workers=N)`` starts its own coordinator
    (in this process) and N worker processes, like
    ``DataLoader(num_workers=N)``. Nothing starts until the first iteration
    (or ``state_dict()``); the spec is checked at once.

    Args:
        coordinator: the coordinator's URL (``host:port`` works too).
        job: the job spec: a dict, a path to a .json/.yaml file, or its text.
            A dict whose own ``python`` entry says ``native_transforms:
            true`` runs its factory's torchvision ``ImageFolder`` in the
            native image pipeline, as ``Loader.local(...,
            native_transforms=True)`` does (built here once to compile it;
            batches are ``[images, labels]``; the workers need the images
            at the same path, the manifest of its samples travels with the
            job).
        rank: this trainer's data-parallel rank (default 0; after
            ``load_state_dict``, the state's unless given).
        world_size: number of ranks (default: the spec's ``consumers``, 1;
            after ``load_state_dict``, the state's unless given: a state of
            another world size is re-planned for this one).

    Options (keywords of both ``Loader`` and ``Loader.local``; the defaults
    are the Rust SDK's, in ``loader.DEFAULT_OPTIONS``; a bad or unknown one
    raises ``ValueError`` at once):
        prefetch: batches each worker may send ahead of consumption, at
            least (default 8); small batches get more, up to 32 MiB of them
            (256 at most).
        in_order: yield batches in sequence order (default), or as they
            arrive (faster when workers are uneven; still each batch once).
        shared_memory: let workers on this machine write batches straight
            into this process's memory (default) instead of streaming them.
        ring: ``(slots, slot_bytes)`` of the shared-memory ring; by default
            slots the size of a batch (at most 16 MiB), twice as many as
            batches in flight (at least 4). Each yielded batch
            holds a slot until it and its arrays are freed.
        ring_dir: a directory for the ring's socket (a private directory in
            it, removed on close), for workers that share the directory but
            not this process's network namespace; by default an abstract
            socket, which a sidecar in the same pod reaches too.
        allow_ring_peer_uids: user ids besides this process's own whose
            workers may attach to the ring (a sidecar running as another
            user).
        coordinator_timeout: seconds the coordinator may not answer while
            the loader runs (a restart is survived within it) before
            iteration raises ``LoaderError`` (default 15).
        metrics_listen: ``"IP:PORT"`` to serve this process's Prometheus
            metrics at ``/metrics`` (batches consumed, stall time; port 0
            picks a free one); by default none. One endpoint per process.
        device: where batches land: ``"cpu"`` (default), ``"cuda"`` /
            ``"cuda:N"`` (copied to that GPU straight from the shared-memory
            ring; ``batch.torch()`` gives CUDA tensors, ordered after the
            copy on the current stream; ``LoaderError`` in one line when no
            GPU is usable), ``"auto"`` (the GPU when usable, else the host,
            said in one ``logging`` warning) or ``"host"`` (the device path
            with host memory as the device: for tests).
        device_prefetch: host-to-device copies queued ahead of the batch
            being consumed (default 2); GPU memory holds at most
            ``device_prefetch + 2`` batches.
    """

    def __init__(
        self,
        coordinator: str,
        job: Union[Mapping, str, os.PathLike],
        *,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        **options: Unpack[LoaderOptions],
    ) -> None:
        # A python entry's native_transforms: the job becomes the compiled
        # image_folder one, its manifest a blob the workers fetch.
        job, compiled = _native_transforms.compile_job(job)
        try:
            job = _unbounded(_dataset.fill_num_samples(job, world_size))
            spec = _spec_bytes(job)
            checked = _options_json(options)
        except BaseException:
            if compiled is not None:
                _dataset.release_pickle(compiled.manifest)
            raise

        def start(
            spec: bytes, resume: Optional[str], start_at: Optional[int]
        ) -> _native.NativeLoader:
            return _native.NativeLoader.open(
                spec,
                checked,
                coordinator=coordinator,
                rank=rank,
                world_size=world_size,
                resume=resume,
                start_at=start_at,
            )

        self._init(spec, rank, world_size, start)
        self._collate = _python_job(job)
        if compiled is not None:
            self._adopt(compiled)

    @staticmethod
    def merge_states(states: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
        """One state for the whole job from the ``state_dict()`` of every
        rank, saved at the same step or not, with batches yielded out of
        order or not: ``load_state_dict`` of it on any number of new ranks
        delivers each sample of the epoch once over the whole run. Every
        rank's state must be there, once."""
        texts = []
        for state in states:
            if not isinstance(state, Mapping):
                raise TypeError("merge_states expects the dicts that state_dict() returned")
            texts.append(json.dumps(dict(state)))
        return json.loads(_native.merge_states(texts))

    @classmethod
    def local(
        cls,
        dataset: Any,
        batch_size: Optional[int] = None,
        shuffle: Optional[bool] = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: Optional[int] = None,
        collate_fn: Any = None,
        pin_memory: bool = False,
        drop_last: Optional[bool] = None,
        timeout: float = 0,
        worker_init_fn: Any = None,
        multiprocessing_context: Any = None,
        generator: Any = None,
        *,
        prefetch_factor: Optional[int] = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: Optional[bool] = None,
        workers: Optional[int] = None,
        ready_timeout: float = 10.0,
        seed: Optional[int] = None,
        epochs: Optional[int] = None,
        on_corrupt: Optional[str] = None,
        seed_rngs: Optional[bool] = None,
        worker_threads: int = 1,
        cache: Any = None,
        cache_dir: Optional[str] = None,
        shuffle_buffer: Optional[int] = None,
        native_transforms: bool = False,
        **options: Unpack[LoaderOptions],
    ) -> "Loader":
        """A loader over local worker processes and a coordinator in this
        process: no deployment, the same protocol and code paths.

        DataLoader's drop-in: its signature and positional order
        (``Loader.local(ds, 64, True)`` is batch size 64, shuffled), every
        keyword with DataLoader's meaning or refused in one line naming it
        (``loader._keywords``; docs/migrating-from-dataloader.md has the
        table), and its iteration: every ``iter()`` is the next pass over
        the data, any number of times unless ``epochs`` bounds them, and a
        ``break`` loses nothing of the next pass. ``num_workers`` (or
        ``workers``, default 2): worker processes (0 means one: samples are
        always made in workers). ``ready_timeout``: seconds the workers get
        to register; ``options`` as for ``Loader``.

        ``job`` is a job spec (a dict, a path, spec text), a ``loader.Mix``
        of datasets and spec entries (docs/mixtures.md), or a map-style
        dataset (``__len__`` and ``__getitem__``, e.g. a
        ``torch.utils.data.Dataset``), like ``DataLoader(dataset,
        batch_size=, shuffle=, drop_last=, num_workers=workers)``: the
        dataset is pickled to each worker, which calls ``__getitem__`` for
        the samples of its batches and writes them straight into the batch
        buffer; iterating yields ``default_collate``'s structure (dicts stay
        dicts, tuples and lists become lists, leaves are torch tensors, or
        numpy arrays without torch). For a dataset: ``batch_size`` (default
        1), ``shuffle`` (False), ``seed`` (0, or ``generator``'s initial
        seed; with the epoch and the index it seeds ``random``, numpy and
        torch before each ``__getitem__``), ``drop_last`` (False),
        ``epochs`` (None: no bound), ``on_corrupt``: ``"fail"``
        (an exception in ``__getitem__`` raises ``LoaderError`` naming the
        index) or ``"skip"`` (the sample is left out and counted);
        ``seed_rngs`` (True): False never seeds (workers otherwise seed
        the generators a dataset is seen drawing from, see
        ``loader._rngs``); ``collate_fn``: runs in the workers on each
        batch's list of samples and returns anything DataLoader's may: its
        arrays and tensors (in dicts, tuples, lists, dataclasses, named
        tuples, any object) arrive as zero-copy views of the batch, the rest
        as it was (``loader._pickled``); it travels pickled with the
        dataset. In each local worker,
        ``torch.utils.data.get_worker_info()`` answers as in a DataLoader
        worker (``id`` 0..workers-1, ``num_workers``, ``seed`` the job's
        seed plus the id, ``dataset`` the worker's copy), and
        ``worker_init_fn(worker_id)`` (pickled like ``collate_fn``) runs
        once before the worker's first sample; a remote worker
        (``python -m loader._worker``) has no worker info and calls
        ``worker_init_fn(0)``.

        Workers are forked from this process's worker template
        (``loader._template``): at the first ``Loader.local`` this process
        forks it once, before Loader starts any thread of its own, and it
        forks every loader's workers from then on, so they start in
        milliseconds with everything this process had imported (torch, the
        dataset's modules), as DataLoader's forked workers do, but from a
        process that runs a single thread. ``multiprocessing_context="spawn"``
        (or a ``multiprocessing`` context whose start method is spawn)
        starts fresh interpreters instead, which import what the dataset
        needs themselves (seconds with torch). ``worker_threads`` (default
        1, as DataLoader's workers run torch): the intra-op threads of
        torch, OpenMP, MKL, OpenBLAS and OpenCV in each worker; 0 leaves the
        libraries' defaults. Workers stop silently when the loader is
        closed, garbage-collected, or the interpreter exits, whatever they
        were doing; if this process is killed outright, the template stops
        them at once (its socket to this process closes), and a spawned
        worker stops when its lease expires (a few seconds).

        An iterable-style dataset (``torch.utils.data.IterableDataset``, a
        Hugging Face ``IterableDataset``, anything with ``__iter__`` and no
        ``__getitem__``) is read as shards (``loader._stream``): its own
        (``__loader_shards__``/``__loader_shard__``), its files (Hugging
        Face), or, for a dataset written for DataLoader, what ``iter()``
        yields in each of ``workers`` workers under
        ``get_worker_info()``. Loader counts each shard once at the start
        (in the workers; ``__loader_shard_lengths__`` spares it) and then
        delivers every sample once per epoch, exactly once across worker
        deaths and resumes. ``shuffle`` shuffles the shards' order each
        epoch and the samples within windows of ``shuffle_buffer`` samples
        (default 1000 with ``shuffle``; 0 keeps each shard's order).

        ``cache`` (a dataset, or a job spec of a built-in image dataset;
        default None, no cache): keep the deterministic half of each sample
        across epochs, so later epochs run only the random half, with the
        same results: ``True`` (up to a quarter of this machine's memory),
        a size (``"8GiB"``, a number of bytes). A dataset says which half
        is which with ``loader_load(index)`` and ``loader_transform(loaded,
        index)``; torchvision's ``ImageFolder``/``DatasetFolder`` need
        nothing (the decoded image is cached). An ``image_folder`` or
        ``webdataset`` spec keeps each image decoded at the scale its crops
        need (docs/images.md). In memory, or in an unnamed file in
        ``cache_dir``; shared by the workers, gone with the loader (an
        image job's spawned workers share a named file in ``cache_dir`` or
        in a directory of the loader's own in ``/dev/shm``); it
        turns itself off when reading a sample back costs more than half
        of loading it, and for a job of one epoch. ``cache_stats()``
        counts hits and misses (``loader._cache``).

        ``native_transforms`` (default False): for torchvision's
        ``ImageFolder``/``DatasetFolder`` with the default loader and a
        ``Compose`` (v1 or v2) of Resize, CenterCrop, RandomResizedCrop,
        RandomHorizontalFlip, ToTensor/PILToTensor/ToImage, ToDtype,
        ConvertImageDtype and Normalize, run each sample in Loader's image
        pipeline instead of PIL (several times the samples/s; pixels within
        about one level of PIL's, docs/images.md): the dataset's ``samples``
        and labels, the same ``[images, labels]`` batches, its random
        augmentations drawn as torchvision defines them, seeded per sample.
        A dataset that cannot run natively raises ``ValueError`` naming the
        transform and argument that keeps it in Python; a dataset that could
        but is not asked to is said once in the log
        (``loader._native_transforms``). A dict job spec asks for the same
        with ``native_transforms: true`` in its own ``python`` entry, whose
        factory makes the dataset (as for ``Loader``).
        """
        job = dataset
        translated = _keywords.translate(
            dataset=job, batch_size=batch_size, shuffle=shuffle, sampler=sampler, batch_sampler=batch_sampler,
            num_workers=num_workers, workers=workers, pin_memory=pin_memory, pin_memory_device=pin_memory_device,
            drop_last=drop_last, timeout=timeout, generator=generator, seed=seed, prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers, in_order=in_order, options=options,
        )
        batch_size, shuffle, seed, drop_last = translated.batch_size, translated.shuffle, translated.seed, translated.drop_last
        workers, options = translated.workers, translated.options
        if workers < 1:
            raise ValueError("Loader.local needs at least one worker")
        threads = int(worker_threads)
        if threads < 0:
            raise ValueError(f"worker_threads must be 0 (the libraries' defaults) or more, not {threads}")
        # Forked first: before this call reads a sample here (which may start
        # torch's thread pool) and before Loader starts threads of its own.
        template = None if _start_method(multiprocessing_context) == "spawn" else _template.get()
        dataset_args = {
            "batch_size": batch_size, "shuffle": shuffle, "seed": seed,
            "drop_last": drop_last, "epochs": epochs, "on_corrupt": on_corrupt,
            "seed_rngs": seed_rngs,
        }
        # A dataset's (or a Mix's) job settings, DataLoader's defaults.
        settings = {
            "batch_size": 1 if batch_size is None else int(batch_size),
            "shuffle": bool(shuffle),
            "seed": int(seed or 0),
            "drop_last": bool(drop_last),
            "epochs": UNBOUNDED_EPOCHS if epochs is None else int(epochs),
            "on_corrupt": on_corrupt or "fail",
            "seed_rngs": seed_rngs is not False,
        }
        compiled = _compile(job, native_transforms, collate_fn=collate_fn, worker_init_fn=worker_init_fn,
                            sampler=translated.sampler, shuffle_buffer=shuffle_buffer)
        if compiled is not None:
            # From here on the job is the spec of the same samples.
            compiled.write_manifest()
            job = _dataset.job_around(compiled.dataset_entry(), **{k: v for k, v in settings.items() if k != "seed_rngs"})
            job["transforms"] = compiled.transforms
        cache_bytes = _cache.budget(cache)
        if cache_bytes is None and cache_dir is not None:
            raise TypeError("cache_dir: give cache= too (the budget)")
        if shuffle_buffer is not None and not _dataset.is_iterable_dataset(job):
            raise TypeError("shuffle_buffer: only for an iterable dataset (a map-style one shuffles whole)")
        sample_cache = None
        # A job spec's built-in image dataset keeps frames (below); a Mix's
        # or a stream's samples are not cached.
        keeps_frames = cache_bytes is not None and not (
            _dataset.is_dataset(job) or _dataset.is_iterable_dataset(job) or isinstance(job, Mix)
        )
        if keeps_frames and isinstance(job, Mapping):
            # Said before the spec is read: a dict spec names its dataset.
            keeps_frames = _IMAGE_KINDS.intersection(job.get("dataset") or {}) != set() or _native_transforms.asks(job)
        if cache_bytes is not None and not keeps_frames and not _dataset.is_dataset(job):
            raise TypeError(_NOTHING_TO_KEEP)
        if _dataset.is_dataset(job):
            job_dataset = job
            cache_settings = None
            if cache_bytes is not None:
                _cache.check(job)
                cache_settings = {
                    # Spawned workers keep a cache each: the budget is split.
                    "bytes": cache_bytes if template is not None else max(1, cache_bytes // workers),
                    "dir": None if cache_dir is None else os.fspath(cache_dir),
                    "epochs": settings["epochs"],
                }
                if template is not None:
                    # Created here, inherited by every worker the template
                    # forks for this loader; it goes when they and this
                    # loader have closed it.
                    sample_cache = _native.SampleCache.create(len(job), cache_bytes, cache_settings["dir"])
            job = _dataset.job_spec(
                job, **settings, collate_fn=collate_fn, worker_init_fn=worker_init_fn, num_workers=workers, cache=cache_settings,
                sampler=translated.sampler,
            )
            _size_ring(options, job_dataset, job["batch_size"], workers, collate_fn)
        elif isinstance(job, Mix):
            if collate_fn is not None:
                raise TypeError("collate_fn: a Mix collates its sources' samples itself; give each source's samples one structure")
            if worker_init_fn is not None:
                raise TypeError("worker_init_fn: only for a dataset")
            python = job.python_sources()
            job = job.job_spec(**settings)
            if python:
                # Every source's samples collate alike: size by the first
                # Python one's (plus the source field, in the margin).
                _size_ring(options, python[0], job["batch_size"], workers, None)
        elif _dataset.is_iterable_dataset(job):
            view = _stream_view(job, workers, settings, shuffle_buffer, multiprocessing_context, threads, ready_timeout)
            job = _dataset.job_spec(view, **settings, collate_fn=collate_fn, worker_init_fn=worker_init_fn, num_workers=workers)
            job["dataset"]["python"]["shard_samples"] = view.lengths
            job["sampler"]["lanes"] = int(workers)
            job["sampler"]["shuffle_buffer"] = view.window
            _size_ring(options, view, job["batch_size"], workers, collate_fn)
        elif compiled is None:
            given = [k for k, v in dataset_args.items() if v is not None]
            if collate_fn is not None:
                given.append("collate_fn")
            if worker_init_fn is not None:
                given.append("worker_init_fn")
            if given:
                raise TypeError(
                    f"{', '.join(given)}: only for a dataset; a job spec sets them itself"
                )
            job, compiled = _native_transforms.compile_job(job)
            job = _unbounded(_dataset.fill_num_samples(job))
        spec = _spec_bytes(job)
        if not _python_job(job):
            _size_spec_ring(options, spec, workers)
        spawned_frames = None
        if keeps_frames and template is not None:
            sample_cache = _frame_cache(spec, cache_bytes, cache_dir)
        elif keeps_frames:
            spawned_frames = _SpawnedFrames(spec, cache_bytes, cache_dir)
        checked = _options_json(options)
        command = _worker_command(threads) + ([] if spawned_frames is None else spawned_frames.flags)
        local = (workers, command, ready_timeout)
        forks = None if template is None else (template, threads, sample_cache)

        def start(
            spec: bytes, resume: Optional[str], start_at: Optional[int]
        ) -> _native.NativeLoader:
            return _native.NativeLoader.open(
                spec, checked, local=local, template=forks, resume=resume, start_at=start_at
            )

        self = cls.__new__(cls)
        self._init(spec, 0, 1, start)
        self._timeout = translated.timeout
        self._local = True
        if _dataset.is_dataset(dataset) or _dataset.is_iterable_dataset(dataset):
            self._dataset = dataset
        self._collate = _python_job(job)
        # The pickled dataset's files in the host's blob directory: removed
        # when the loader closes (a worker that needs one later fetches it).
        self._pickles = _dataset.written_pickles(job)
        if compiled is not None:
            self._adopt(compiled)
        self._sample_cache = sample_cache
        self._spawned_frames = spawned_frames
        return self

    def _adopt(self, compiled: "_native_transforms.Compiled") -> None:
        """A compiled torchvision job's: ``[images, labels]`` batches, and
        its manifest released at close with the pickles."""
        self._pairs = True
        self._manifest = compiled.manifest
        self._pickles = [*getattr(self, "_pickles", []), compiled.manifest]

    def _init(self, spec: bytes, rank: Optional[int], world_size: Optional[int], start) -> None:
        self._start = start
        self._spec = spec
        # This loader's place among the job's ranks, as given (None: the
        # spec's, or a loaded state's); a state of another world size is
        # re-planned for it.
        self._rank = rank
        self._world_size = world_size
        # Yield default_collate's structure (a Python dataset's job).
        self._collate = False
        # Yield [images, labels] (torchvision's ImageFolder run natively).
        self._pairs = False
        # The manifest file of such a job (in the blob directory, released
        # at close with the pickles).
        self._manifest: Optional[str] = None
        self._native: Optional[_native.NativeLoader] = None
        self._lock = threading.Lock()
        # Where the next start resumes from (JSON), and where the stream is.
        self._resume: Optional[str] = None
        # Without a state to resume, the batch the first start begins at: the
        # first of the epoch set_epoch chose before anything started.
        self._start_at: Optional[int] = None
        (self._batches_per_epoch, self._epochs, self._batch_size, self._drop_last, self._num_samples) = _native.plan(
            spec, rank or 0, world_size
        )
        self._yielded = 0
        self._next_epoch: Optional[int] = None
        # A loaded state's pass, which the next iter() finishes instead of
        # starting the next one.
        self._resumed = False
        # Passes begun (iter() calls): an iterator of an older pass stops.
        self._pass = 0
        # DataLoader's timeout: seconds one batch may take (0: no limit).
        self._timeout = 0.0
        # The dataset object Loader.local was given (None for a spec).
        self._dataset: Any = None
        # Embedded mode (Loader.local): its coordinator and workers are its
        # own, so a restart need not wait for the old ones to stop.
        self._local = False
        self._closed = False
        _live.add(self)
        _stop_on_sigterm()

    # -- DataLoader surface -------------------------------------------------

    def __len__(self) -> int:
        """Batches per epoch for this rank (``len(DataLoader)``)."""
        return self._batches_per_epoch

    @property
    def epochs(self) -> Optional[int]:
        """The job's bound on epochs (``epochs=`` or the spec's
        ``"epochs"``), or None: as many passes as ``iter()`` asks for."""
        return None if self._epochs >= UNBOUNDED_EPOCHS else self._epochs

    @property
    def epoch(self) -> int:
        """The epoch (pass) the next batch belongs to."""
        return self._yielded // max(self._batches_per_epoch, 1)

    def set_epoch(self, epoch: int) -> None:
        """Makes the next ``for batch in loader`` yield pass ``epoch``
        (``DistributedSampler.set_epoch``; frameworks call it through
        ``loader.sampler.set_epoch``).

        Without it, every ``iter()`` starts the next pass, as a DataLoader
        does. Before the first iteration it only records the epoch: the
        loader then starts at that epoch's first batch, and nothing starts
        twice. Later, the next epoch in sequence (or the one a loaded
        state stands in) continues the stream for free; any other epoch,
        or one a ``break`` left part-read, starts over at its first batch.
        The permutation of an epoch depends only on (seed, epoch), so a
        repeated epoch repeats exactly.
        """
        epoch = int(epoch)
        if epoch < 0 or epoch >= self._epochs:
            raise ValueError(
                f"epoch {epoch} is outside the job's {self._epochs} epochs "
                f"(0..{self._epochs - 1}); leave epochs= unset (or raise it) to train longer"
            )
        self._next_epoch = epoch

    def __iter__(self) -> Iterator[Any]:
        """Yields the batches of one pass over the data: the next one, as
        a DataLoader's ``iter()`` does (a pass a ``break`` left part-read
        is not continued), the one ``set_epoch`` chose, or, right after
        ``load_state_dict``, the rest of the saved pass."""
        self._check_open()
        per = max(self._batches_per_epoch, 1)
        epoch = self._next_pass()
        chosen, self._next_epoch = self._next_epoch is not None, None
        resumed, self._resumed = self._resumed, False
        yielded = self._yielded
        if not chosen and epoch >= self._epochs:
            raise LoaderError(
                f"all {self._epochs} epochs of the job were yielded; "
                f"leave epochs= unset (or raise it) to train longer"
            )
        mid_way = epoch * per < yielded < (epoch + 1) * per
        if not (epoch * per == yielded or (mid_way and resumed)):
            self._restart_at(epoch * per)
        self._pass += 1
        return _Epoch(self, (epoch + 1) * per, self._pass)

    def _next_pass(self) -> int:
        """The pass the next ``iter()`` yields: the one ``set_epoch``
        chose, else the one a loaded state stands in (finished first),
        else the next whole one (a part-read pass is not continued)."""
        if self._next_epoch is not None:
            return self._next_epoch
        per = max(self._batches_per_epoch, 1)
        return self._yielded // per if self._resumed else -(-self._yielded // per)

    def _next(self) -> Any:
        native = self._started()
        batch = native.next(self._timeout or None)
        if batch is not None:
            self._yielded += 1
            if self._collate:
                return _dataset.collated(batch)
            if self._pairs:
                return _native_transforms.as_pair(batch)
        return batch

    # -- What frameworks look for on a DataLoader ---------------------------

    @property
    def sampler(self) -> "_passes.EpochSampler":
        """The loader's order as a sampler object, so frameworks that call
        ``dataloader.sampler.set_epoch(e)`` (Lightning, accelerate) reach
        ``set_epoch``; ``len()`` is the samples per epoch."""
        return _passes.EpochSampler(self)

    @property
    def batch_sampler(self) -> "_passes.EpochBatchSampler":
        """``batch_sampler.sampler.set_epoch`` (Lightning's other path)
        and ``batch_size`` / ``drop_last``, as on a DataLoader."""
        return _passes.EpochBatchSampler(self)

    @property
    def batch_size(self) -> Optional[int]:
        """Samples per batch of this rank (DataLoader's ``batch_size``)."""
        return self._batch_size

    @property
    def drop_last(self) -> bool:
        """Whether an epoch's short last batch is dropped."""
        return self._drop_last

    @property
    def dataset(self) -> Any:
        """The dataset this loader reads: the object given to
        ``Loader.local`` (frameworks read ``dataloader.dataset``), else a
        sized stand-in for a job spec's dataset."""
        given = self._dataset
        return given if given is not None else _passes.SpecDataset(self._num_samples)

    # -- Exact resumption ---------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: save it with the model checkpoint.

        A loader given this dict by ``load_state_dict`` (in this process or a
        new one, with any number of workers) yields exactly the batches this
        one had not yielded, in the same order with the same samples. Take it
        between steps, after the step that consumed the last batch.
        """
        self._check_open()
        return json.loads(self._started().state())

    def load_state_dict(self, state: Mapping[str, Any], *, batch_size: Optional[int] = None) -> None:
        """Continues from a ``state_dict()`` (or ``merge_states`` of every
        rank's): the state is a *position*, and this loader's own arguments
        are the configuration it continues under, as with
        StatefulDataLoader. The next ``iter()`` yields the rest of the saved
        pass; later ones go on with the next passes.

        This loader's batch size (or ``batch_size`` here), epoch bound,
        mixture weights, workers and transforms apply; so do its rank and
        world size when given (``Loader(..., rank=r, world_size=w)``;
        ``Loader.local`` is rank 0 of 1), else the state's. Where they
        differ from the saved run's, the rest of the job is re-planned:
        every new rank loads the same state (one rank's when the ranks
        saved at the same step, else the merged one) and each sample of
        the epoch is delivered once over the whole run. A state of another
        dataset (another number of samples) or another seed is refused in
        one line. Keeping ``batch_size * world_size`` as it was keeps every
        global batch as the uninterrupted run had it (the epoch's last
        one's padding aside)."""
        self._check_open()
        if not isinstance(state, Mapping):
            raise TypeError("load_state_dict expects the dict that state_dict() returned")
        self._load(state, batch_size, self._spec)
        if batch_size is not None:
            self._batch_size = int(batch_size)
        self._resumed = True

    def _load(self, state: Mapping[str, Any], batch_size: Optional[int], spec: Optional[bytes]) -> None:
        """Loads ``state``: under this loader's configuration ``spec`` (a
        user's state), or as it is (the loader's own, moved)."""
        text = json.dumps(dict(state))
        text, per, epochs, yielded = _native.resume_state(
            text, self._rank, self._world_size, None if batch_size is None else int(batch_size), spec
        )
        # An embedded loader's old workers stop while the new ones start
        # (their own coordinator): a break costs the start, not the stop.
        self._stop_native(wait=not self._local)
        self._resume = text
        self._batches_per_epoch, self._epochs, self._yielded = per, epochs, yielded
        self._next_epoch = None
        self._start_at = None

    # -- Lifecycle ----------------------------------------------------------

    def close(self) -> None:
        """Stops the session and, in local mode, the workers. Idempotent and
        safe from any thread; a blocked iteration elsewhere raises
        ``LoaderError``. Batches already yielded stay valid."""
        self._closed = True
        self._stop_native()
        _live.discard(self)
        pickles, self._pickles = getattr(self, "_pickles", []), []
        for path in pickles:
            _dataset.release_pickle(path)
        # The cache's memory goes once the workers have exited too.
        self._sample_cache = None
        spawned_frames, self._spawned_frames = getattr(self, "_spawned_frames", None), None
        if spawned_frames is not None:
            spawned_frames.close()

    def __enter__(self) -> "Loader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    # -- Diagnostics --------------------------------------------------------

    def cache_stats(self) -> Optional[dict]:
        """The sample cache's counters over all workers (``Loader.local(...,
        cache=)``): ``on`` (False once it turned itself off, and
        ``off_reason``), ``hits``, ``misses``, ``stored``,
        ``stored_bytes``, ``refused_full`` (samples left out when the
        budget was full), ``capacity_bytes``, and the time loads and reads
        back took (``load_ns`` over ``loads_timed``, ``hit_ns`` over
        ``hits_timed``). None without a cache, after ``close()``, and with
        spawned workers (a Python dataset's keep a cache each; a built-in
        image job's share one this process does not hold:
        ``loaderctl status`` on ``coordinator_address()`` shows its hit
        ratio)."""
        cache = getattr(self, "_sample_cache", None)
        return None if cache is None else dict(cache.stats())

    def worker_pids(self) -> list[int]:
        """Process ids of the workers ``Loader.local`` started (empty before
        the first iteration and for a deployment's workers)."""
        native = self._native
        return list(native.worker_pids()) if native is not None else []

    def coordinator_address(self) -> Optional[str]:
        """The URL of the coordinator ``Loader.local`` started in this
        process: ``loaderctl status --coordinator URL`` (or ``top``) shows
        its workers, the job's progress and its sample cache's hit ratio.
        None before the first iteration and for a loader fed by a
        deployment (whose coordinator is the one given)."""
        native = self._native
        return native.coordinator_address() if native is not None else None

    def ring_slots(self) -> Optional[tuple[int, int, int]]:
        """``(free, granted, held)`` slots of the shared-memory ring, or None
        without one (or before the first iteration)."""
        native = self._native
        return native.ring_slots() if native is not None else None

    def ring_socket(self) -> Optional[str]:
        """The Unix socket co-located workers attach to the shared-memory
        ring through: a path under ``ring_dir``, or an abstract name (it
        starts with a NUL character). None without a ring (or before the
        first iteration)."""
        native = self._native
        return native.ring_socket() if native is not None else None

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("started" if self._native else "not started")
        bound = "" if self.epochs is None else f" of {self._epochs}"
        return f"<loader.Loader {state}: epoch {self.epoch}{bound}, {self._batches_per_epoch} batches per epoch>"

    # -- Internals ----------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise LoaderError("the loader is closed")

    def _started(self) -> _native.NativeLoader:
        native = self._native
        if native is not None:
            return native
        with self._lock:
            self._check_open()
            if self._native is None:
                native = self._start(self._spec, self._resume, self._start_at)
                fallback = native.device_fallback()
                if fallback is not None:
                    _log.warning("device auto: no usable GPU, batches stay on the host (%s)", fallback)
                self._native = native
                self._batches_per_epoch = native.batches_per_epoch()
                self._yielded = native.yielded()
            return self._native

    def _restart_at(self, seq: int) -> None:
        """Makes batch ``seq`` of the job the next one. Before the first
        start this only moves where that start begins; once started, the
        loader starts over at ``seq``."""
        with self._lock:
            started = self._native is not None
            if not started and self._resume is None:
                self._start_at = seq
                self._yielded = seq
                return
        # The state to start from (this loader's own, or the one loaded and
        # not yet started), moved to seq.
        state = self.state_dict() if started else json.loads(self._resume)
        state["next_seq"] = seq
        state.pop("yielded_above", None)
        # A merged state's per-rank progress would override next_seq.
        state.pop("ranks", None)
        self._load(state, None, None)

    def _stop_native(self, wait: bool = True) -> None:
        native, self._native = self._native, None
        if native is None:
            return
        if wait:
            native.close()
            return
        closing = threading.Thread(target=native.close, name="loader-restart-close", daemon=True)
        _closing.add(closing)
        closing.start()


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


class _Epoch:
    """The iterator of one pass. A class, not a generator: an exception
    raised while waiting (KeyboardInterrupt, a ``timeout``) leaves it
    usable, and the next ``next()`` yields the batch that was being waited
    for. Once a newer ``iter()`` began another pass it is exhausted, as a
    DataLoader's old iterator is of no use then."""

    __slots__ = ("_loader", "_end", "_pass")

    def __init__(self, loader: Loader, end: int, pass_: int) -> None:
        self._loader = loader
        self._end = end
        self._pass = pass_

    def __iter__(self) -> "_Epoch":
        return self

    def __len__(self) -> int:
        return max(0, self._end - self._loader._yielded) if self._pass == self._loader._pass else 0

    def __next__(self) -> Any:
        loader = self._loader
        if loader._yielded >= self._end or loader._pass != self._pass:
            raise StopIteration
        batch = loader._next()
        if batch is None:
            raise StopIteration
        return batch


# Loaders not yet closed. At interpreter exit they are closed while the
# interpreter is still whole (atexit runs before modules and threads are torn
# down), so their worker processes stop and none outlives the trainer, even
# when a daemon thread is still blocked iterating: close() unblocks it.
_live: "weakref.WeakSet[Loader]" = weakref.WeakSet()

# Threads stopping the workers a restart left behind; joined at exit.
_closing: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()

#: Seconds interpreter exit waits for a restart's old workers to stop.
_CLOSING_GRACE = 5.0


def _stop_on_sigterm() -> None:
    """Makes SIGTERM (how Kubernetes and most supervisors stop a process)
    raise ``SystemExit(143)`` instead of killing the interpreter outright,
    so open loaders are closed on the way out (``_close_all``): their worker
    processes stop and nothing is left behind. Only over the default action
    (a handler the program set is left alone) and only from the main thread,
    where Python allows it. SIGINT already raises KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _exit_on_sigterm)
    except (ValueError, OSError):
        pass


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


@atexit.register
def _close_all() -> None:
    for loader in list(_live):
        try:
            loader.close()
        except Exception:
            pass
    for closing in list(_closing):
        closing.join(_CLOSING_GRACE)
    # After the loaders closed: their last batches' spans are in, and go out
    # to the OTLP endpoint now (a no-op unless trace export is on).
    _native.flush_telemetry()


#: ``Loader.merge_states``, at module level: ``loader.merge_states([...])``.
merge_states = Loader.merge_states
