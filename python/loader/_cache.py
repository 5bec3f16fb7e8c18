"""The sample cache of ``Loader.local(dataset, cache=...)``: the
deterministic half of each sample kept across epochs, so later epochs run
only the random half (augmentations), with the same results.

A dataset opts in by splitting ``__getitem__`` in two::

    class Photos(Dataset):
        def loader_load(self, index):             # deterministic: cached
            return Image.open(self.paths[index]).convert("RGB")

        def loader_transform(self, loaded, index):  # random: every epoch
            return self.augment(loaded), self.labels[index]

        def __getitem__(self, index):
            return self.loader_transform(self.loader_load(index), index)

torchvision's ``DatasetFolder`` and ``ImageFolder`` are split already: the
loaded image (``dataset.loader(path)``) is cached, ``transform`` and
``target_transform`` run every time (unless a subclass overrides
``__getitem__``, which then must split itself).

The cache is one file per loader (``loader_worker::sample_cache``): a memfd
in memory (default) or an unnamed file in ``cache_dir``, created by the
trainer and inherited by every worker the template forks, so co-located
workers share it and nothing outlives the loader. Entries are written once
and never evicted; when the budget is full the rest is loaded every time.
Workers started with ``multiprocessing_context="spawn"`` and remote workers
keep a cache each (a built-in image job's spawned workers share one by
name instead, as ``loader-worker --cache-shared`` does: docs/images.md).

The cache decides by itself whether it pays: every load of a missed
sample, every store and every read back (the first few entries a worker
stores are read back at once to time it) is timed, and once enough are
counted (over all workers) a cache turns itself off for the job unless a
read back costs under half a load and the later epochs save at least twice
what storing cost (the worker's rule for both caches,
``loader_worker::dataset::CachePayoff``; ``Loader.cache_stats()`` says so,
and the worker logs it). A job of one epoch never caches.

How a loaded sample is stored: a PIL image as its mode, size, ``info`` and
pixels (RGB as RGBX, PIL's own layout; ``Image.frombytes`` rebuilds it
straight from the cache's memory); anything else pickled (protocol 5, numpy
arrays out of band). A sample read back is a new object, copied once from
the cache: a transform may change it in place.
"""

from __future__ import annotations

import json
import os
import pickle
import struct
import sys
import time
from typing import Any, Callable, Optional

#: Set in a worker that inherited its loader's sample cache:
#: ``{"fd": N, "entries": N}`` (``loader._template`` sets it).
CACHE_VARIABLE = "LOADER_SAMPLE_CACHE"

#: Reads between two looks at the counters.
_DECIDE_EVERY = 16

_KIND_IMAGE = 0x49  # "I"
_KIND_PICKLE = 0x50  # "P"

#: Modes whose pixels are the whole image (no palette).
_IMAGE_MODES = frozenset({"1", "L", "LA", "I", "I;16", "F", "RGB", "RGBA", "RGBX", "CMYK", "YCbCr", "LAB", "HSV"})

#: Bytes per chunk of pixels an image is encoded in.
_PIXEL_CHUNK = 1 << 20

#: How pixels of a mode are stored, when not as the mode itself.
_RAW_MODES = {"RGB": "RGBX"}

_UNITS = {"": 1, "b": 1, "k": 1000, "kb": 1000, "kib": 1 << 10, "m": 1000**2, "mb": 1000**2, "mib": 1 << 20,
          "g": 1000**3, "gb": 1000**3, "gib": 1 << 30, "t": 1000**4, "tb": 1000**4, "tib": 1 << 40}


def budget(cache: Any) -> Optional[int]:
    """The bytes ``Loader.local(cache=)`` allows: None or False (no cache),
    True (a quarter of this machine's memory), a number of bytes, or a
    size such as ``"8GiB"`` or ``"500MB"``. ``ValueError`` in one line
    otherwise."""
    if cache is None or cache is False:
        return None
    if cache is True:
        try:
            return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 4
        except (ValueError, OSError):
            return 1 << 30
    if isinstance(cache, int):
        if cache <= 0:
            raise ValueError(f"cache: {cache} bytes; give a positive size, True, or None")
        return cache
    if isinstance(cache, str):
        text = cache.strip().lower().replace(" ", "")
        digits = text.rstrip("abcdefghijklmnopqrstuvwxyz")
        unit = text[len(digits):]
        try:
            value = float(digits)
        except ValueError:
            value = -1.0
        if unit in _UNITS and value > 0:
            return int(value * _UNITS[unit])
    raise ValueError(f"cache: {cache!r} is not a size (e.g. 8GiB, 500MB, a number of bytes, True or None)")


def split(dataset: Any) -> Optional[tuple[Callable[[int], Any], Callable[[Any, int], Any]]]:
    """``(load, transform)`` of a dataset that splits its samples (see the
    module docs), or None."""
    load = getattr(dataset, "loader_load", None)
    transform = getattr(dataset, "loader_transform", None)
    if callable(load) and callable(transform):
        return load, transform
    return _folder_split(dataset)


def check(dataset: Any) -> None:
    """``TypeError`` in one line unless ``dataset`` can be cached."""
    if split(dataset) is None:
        raise TypeError(
            f"cache: {type(dataset).__name__} does not say which part of a sample is the same every epoch; "
            "give it loader_load(index) (cached) and loader_transform(loaded, index) (run every time), "
            "see docs/migrating-from-dataloader.md"
        )


def _folder_split(dataset: Any) -> Optional[tuple[Callable, Callable]]:
    """torchvision's ``DatasetFolder`` (``ImageFolder``), split as its own
    ``__getitem__`` is: ``loader(path)``, then ``transform`` and
    ``target_transform``."""
    folder_module = sys.modules.get("torchvision.datasets.folder")
    if folder_module is None:
        return None
    folder = folder_module.DatasetFolder
    if not isinstance(dataset, folder) or type(dataset).__getitem__ is not folder.__getitem__:
        return None

    def load(index: int) -> Any:
        return dataset.loader(dataset.samples[index][0])

    def transform(loaded: Any, index: int) -> Any:
        target = dataset.samples[index][1]
        if dataset.transform is not None:
            loaded = dataset.transform(loaded)
        if dataset.target_transform is not None:
            target = dataset.target_transform(target)
        return loaded, target

    return load, transform


# -- how a loaded sample is stored ---------------------------------------------


def encode(obj: Any) -> list:
    """The parts of ``obj``'s entry (byte buffers, concatenated by the
    cache)."""
    image = sys.modules.get("PIL.Image")
    if image is not None and isinstance(obj, image.Image) and obj.mode in _IMAGE_MODES and obj.palette is None:
        # PIL keeps RGB pixels in 4 bytes; as RGBX they are copied a row at a
        # time each way (packing to 3 bytes costs several times the copy).
        raw = _RAW_MODES.get(obj.mode, obj.mode)
        head = pickle.dumps((obj.mode, raw, obj.size, dict(obj.info), obj.format), protocol=pickle.HIGHEST_PROTOCOL)
        return [struct.pack("<BI", _KIND_IMAGE, len(head)), head, *_pixels(image, obj, raw)]
    buffers: list = []
    main = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    head = struct.pack(f"<BIQ{len(raws)}Q", _KIND_PICKLE, len(raws), len(main), *(r.nbytes for r in raws))
    return [head, main, *raws]


def _pixels(image: Any, obj: Any, raw: str) -> list:
    """The pixels of PIL image ``obj`` in raw mode ``raw``, as
    ``obj.tobytes("raw", raw)`` makes them but in chunks of up to 1 MiB,
    not joined: the cache writes the parts one after the other, so the
    copy ``tobytes`` makes to join its 64 KiB chunks is saved."""
    encoder = getattr(image, "_getencoder", None)
    if encoder is None or obj.width == 0 or obj.height == 0:
        return [obj.tobytes("raw", raw)]
    obj.load()
    e = encoder(obj.mode, "raw", (raw,))
    try:
        e.setimage(obj.im, (0, 0, *obj.size))
        chunks = []
        while True:
            _, errcode, data = e.encode(max(_PIXEL_CHUNK, obj.width * 4))
            chunks.append(data)
            if errcode:
                break
        if errcode < 0:
            raise RuntimeError(f"encoder error {errcode}")
    finally:
        e.cleanup()
    return chunks


def decode(entry: Any) -> Any:
    """The object ``encode`` stored in ``entry`` (a buffer over the
    cache's memory, read-only): a new object, which the caller may change
    in place."""
    view = memoryview(entry)
    kind = view[0]
    if kind == _KIND_IMAGE:
        (n,) = struct.unpack_from("<I", view, 1)
        mode, raw, size, info, fmt = pickle.loads(view[5:5 + n])
        from PIL import Image

        image = Image.frombytes(mode, size, view[5 + n:], "raw", raw)
        image.info.update(info)
        if fmt is not None:
            image.format = fmt
        return image
    if kind == _KIND_PICKLE:
        count, main_len = struct.unpack_from("<IQ", view, 1)
        lens = struct.unpack_from(f"<{count}Q", view, 13)
        at = 13 + 8 * count
        main = view[at:at + main_len]
        at += main_len
        buffers = []
        for n in lens:
            buffers.append(bytearray(view[at:at + n]))  # writable, the sample's own
            at += n
        return pickle.loads(main, buffers=buffers)
    raise ValueError(f"a sample cache entry of unknown kind {kind}")


# -- the worker's side ----------------------------------------------------------


class CachedReads:
    """``dataset[index]`` through the cache, in a worker: the loaded half
    from the cache or loaded (and stored), then the random half."""

    def __init__(self, dataset: Any, settings: dict, num_samples: int) -> None:
        from . import _native

        parts = split(dataset)
        if parts is None:
            check(dataset)
        self._load, self._transform = parts
        inherited = os.environ.get(CACHE_VARIABLE)
        if inherited:
            given = json.loads(inherited)
            if int(given["entries"]) != num_samples:
                raise ValueError(f"cache: the inherited cache has {given['entries']} entries, the job {num_samples} samples")
            self._cache = _native.SampleCache.open(int(given["fd"]), num_samples)
        else:
            self._cache = _native.SampleCache.create(num_samples, int(settings["bytes"]), settings.get("dir"))
        #: Entries this worker reads back right after storing them, timed:
        #: what a hit costs, known before the first hit of a later epoch. As
        #: many as the rule needs timed before it decides, so that one
        #: worker alone decides in the first epoch (the worker's frame cache
        #: times a read back with every frame it keeps).
        self._trials_left = _native.CACHE_DECIDE_AFTER
        self._reads = 0
        self._decided = False
        #: Epochs the job reads each sample in: what a stored entry saves.
        self._epochs = int(settings.get("epochs", 2))
        if self._epochs <= 1:
            self._cache.turn_off("one-epoch")

    def __call__(self, index: int) -> Any:
        cache = self._cache
        if not cache.is_on():
            return self._transform(self._load(index), index)
        began = time.perf_counter_ns()
        entry = cache.get(index)
        if entry is not None:
            try:
                loaded = decode(entry)
            except Exception:
                cache.turn_off("failed")
            else:
                cache.record_hit(time.perf_counter_ns() - began)
                self._tick()
                return self._transform(loaded, index)
        began = time.perf_counter_ns()
        loaded = self._load(index)
        cache.record_miss(time.perf_counter_ns() - began)
        # Stored before the transform, which may change it in place.
        self._store(index, loaded)
        self._tick()
        return self._transform(loaded, index)

    def _store(self, index: int, loaded: Any) -> None:
        cache = self._cache
        began = time.perf_counter_ns()
        try:
            stored = cache.put(index, [memoryview(p).cast("B") for p in encode(loaded)])
        except Exception:
            cache.turn_off("failed")
            return
        if stored:
            cache.time_store(time.perf_counter_ns() - began)
        if stored and self._trials_left > 0:
            self._trials_left -= 1
            began = time.perf_counter_ns()
            entry = cache.get(index)
            try:
                if entry is not None:
                    decode(entry)
            except Exception:
                cache.turn_off("failed")
                return
            cache.time_hit(time.perf_counter_ns() - began)

    def _tick(self) -> None:
        self._reads += 1
        if self._decided or self._reads % _DECIDE_EVERY:
            return
        payoff = self._cache.payoff(self._epochs)
        if payoff is None:
            return
        self._decided = True
        pays, load, store, hit = payoff
        costs = f"loading a sample takes {load / 1000:.1f} us, storing it {store / 1000:.1f} us, reading it back {hit / 1000:.1f} us"
        if pays:
            _log(f"sample cache on: {costs}")
        else:
            self._cache.turn_off("does-not-pay")
            _log(f"sample cache off for this job: {costs}")


def _log(message: str) -> None:
    from . import _native

    _native.worker_log(message)
