"""``Loader``: the batches of a Loader job for one data-parallel rank,
like a DataLoader (the package's docs say how it iterates). A deployment's
(``Loader(coordinator, job)``) or its own (``Loader.local``, whose job
``loader._local`` builds); passes, resumption and what frameworks look
for on a DataLoader; closed at exit by ``loader._lifecycle``.

Its length is the documented DataLoader surface: about 280 of its lines are
docstrings, which say what each keyword means as DataLoader users read it."""

from __future__ import annotations

import json
import logging
import os
import threading
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Optional, Union

from . import _dataset, _job, _lifecycle, _local, _native, _native_transforms, _options, _passes
from ._native import LoaderError

if TYPE_CHECKING:
    from typing import Unpack

    from ._native import LoaderOptions

_log = logging.getLogger("loader")


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
            job = _job.unbounded(_dataset.fill_num_samples(job, world_size))
            spec = _job.spec_bytes(job)
            checked = _options.checked_json(options)
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
        self._collate = _job.is_python_job(job)
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
        request = _local.read(
            dataset, batch_size=batch_size, shuffle=shuffle, sampler=sampler, batch_sampler=batch_sampler,
            num_workers=num_workers, workers=workers, collate_fn=collate_fn, pin_memory=pin_memory,
            pin_memory_device=pin_memory_device, drop_last=drop_last, timeout=timeout, worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context, generator=generator, prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers, in_order=in_order, ready_timeout=ready_timeout, seed=seed,
            epochs=epochs, on_corrupt=on_corrupt, seed_rngs=seed_rngs, worker_threads=worker_threads, cache=cache,
            cache_dir=cache_dir, shuffle_buffer=shuffle_buffer, native_transforms=native_transforms, options=options,
        )
        job = _local.build(dataset, request, cls.local)
        self = cls.__new__(cls)
        self._init(job.spec, 0, 1, job.start)
        self._adopt_local(dataset, request, job)
        return self

    def _adopt_local(self, dataset: Any, request: "_local.Request", job: "_local.LocalJob") -> None:
        """What a local loader holds beyond its job: DataLoader's
        ``timeout`` and ``dataset``, how to yield its batches, and what it
        releases at close (pickles, a compiled job's manifest, the sample
        cache, a spawned job's kept frames)."""
        self._timeout = request.timeout
        self._local = True
        if _dataset.is_dataset(dataset) or _dataset.is_iterable_dataset(dataset):
            self._dataset = dataset
        self._collate = _job.is_python_job(job.job)
        self._pickles = job.pickles
        if job.compiled is not None:
            self._adopt(job.compiled)
        self._sample_cache = job.sample_cache
        self._spawned_frames = job.spawned_frames

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
        _lifecycle.track(self)

    # -- DataLoader surface -------------------------------------------------

    def __len__(self) -> int:
        """Batches per epoch for this rank (``len(DataLoader)``)."""
        return self._batches_per_epoch

    @property
    def epochs(self) -> Optional[int]:
        """The job's bound on epochs (``epochs=`` or the spec's
        ``"epochs"``), or None: as many passes as ``iter()`` asks for."""
        return None if self._epochs >= _job.UNBOUNDED_EPOCHS else self._epochs

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
        return _passes.Pass(self, (epoch + 1) * per, self._pass)

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
        _lifecycle.forget(self)
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
        _lifecycle.close_in_background(native.close, "loader-restart-close")
