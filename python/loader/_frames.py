"""Kept frames of a built-in image job (``Loader.local(spec, cache=...)``
over an ``image_folder`` or ``webdataset`` spec): the sample cache its
workers keep decoded frames in (``FrameCache`` in the worker), created
here for forked workers, or named in a directory for spawned ones."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from . import _native, _native_transforms

#: The built-in datasets whose pipeline keeps decoded frames (``cache=``).
IMAGE_KINDS = frozenset({"image_folder", "webdataset"})

NOTHING_TO_KEEP = "cache: only for a dataset or a job spec of a built-in image dataset (image_folder, webdataset)"


def asked(job: Any) -> bool:
    """Whether a ``cache=`` for ``job`` (a job spec, not a dataset, a
    stream or a Mix, whose samples are kept otherwise or not at all) asks
    for kept frames: said before the spec is read, as a dict spec names its
    dataset; a spec file or text is checked once read (``for_forked``,
    ``Spawned``)."""
    if isinstance(job, Mapping):
        return IMAGE_KINDS.intersection(job.get("dataset") or {}) != set() or _native_transforms.asks(job)
    return True


def for_forked(spec: bytes, cache_bytes: int, cache_dir: Any) -> Any:
    """The sample cache of a built-in image job's workers (a frame per
    image and scale, ``FrameCache`` in the worker), created here and
    inherited by the workers the template forks."""
    entries = _native.frame_cache_entries(spec)
    if entries is None:
        raise TypeError(NOTHING_TO_KEEP)
    directory = None if cache_dir is None else os.fspath(cache_dir)
    return _native.SampleCache.create(entries, cache_bytes, directory)


class Spawned:
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
            raise TypeError(NOTHING_TO_KEEP)
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
