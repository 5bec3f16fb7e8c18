"""The sample cache (``Loader.local(dataset, cache=...)``, ``loader._cache``):
batches are bit-identical with and without it over several epochs of
random augmentation, each sample is loaded once, the workers share one
cache, and a cache that does not pay (or a one-epoch job) turns itself off.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import time

import numpy as np
import pytest

import loader
from conftest import LOADERCTL
from sample_datasets import CachedArrays, CachedPhotos, CheapCached, NumpyRows


def _run(ds, epochs: int, batch_size: int = 8, **kwargs):
    """Every batch of every epoch as (epoch, indexes, bytes of the first
    leaf), in order, and the cache's counters before close."""
    out = []
    with loader.Loader.local(ds, workers=2, batch_size=batch_size, shuffle=True, seed=5, epochs=epochs, **kwargs) as dl:
        for epoch in range(epochs):
            dl.set_epoch(epoch)
            for x, i in dl:
                out.append((epoch, np.asarray(i).tolist(), np.asarray(x).tobytes()))
        stats = dl.cache_stats()
    return out, stats


def _loads(directory: pathlib.Path) -> dict[int, int]:
    """Loads per index the workers made (files CachedPhotos writes; the
    trainer's own read of sample 0, to size the ring, left out)."""
    counts: dict[int, int] = {}
    for name in os.listdir(directory):
        index, pid, _ = name.split("-")
        if int(pid) != os.getpid():
            counts[int(index)] = counts.get(int(index), 0) + 1
    return counts


def test_cached_batches_are_the_uncached_ones_and_samples_load_once_per_worker_at_most(tmp_path):
    plain, none = _run(CachedPhotos(), epochs=3)
    assert none is None
    cached, stats = _run(CachedPhotos(loads_dir=str(tmp_path)), epochs=3, cache=True)
    assert [(e, i) for e, i, _ in cached] == [(e, i) for e, i, _ in plain]
    for (e, i, want), (_, _, got) in zip(plain, cached):
        assert got == want, f"epoch {e}, batch of {i}: cached pixels differ"
    assert stats["on"], stats
    assert stats["stored"] == 48 and stats["refused_full"] == 0, stats
    loads = _loads(tmp_path)
    assert sorted(loads) == list(range(48))
    assert sum(loads.values()) == stats["misses"], (loads, stats)
    # Every read is a hit but the first of each index, unless two workers
    # read one at the same moment: a worker prefetching the next epoch (or
    # running a backup copy of a late batch) while the other is still
    # loading the index for the first time, or both reading sample 0 for
    # the schema. Each worker loads an index once at most (a third load
    # needs a read racing the other worker's store).
    assert sum(loads.values()) <= 2 * 48, loads
    # Three epochs and each worker's schema read; a backup copy of a late
    # batch reads its samples once more.
    assert stats["hits"] + stats["misses"] >= 3 * 48 + 2, stats
    assert stats["hits"] >= 3 * 48 + 2 - 2 * 48, stats


def test_a_loaded_array_changed_in_place_by_the_transform_reads_back_unchanged():
    plain, _ = _run(CachedArrays(), epochs=3)
    cached, stats = _run(CachedArrays(), epochs=3, cache="1MiB")
    assert cached == plain
    assert stats["on"] and stats["stored"] == 40, stats


def test_over_budget_samples_are_loaded_every_time_with_the_same_results():
    # Each 40x40 RGB image takes ~6.5 KB as RGBX: room for about ten.
    budget = 10 * 6500
    plain, _ = _run(CachedPhotos(), epochs=2)
    cached, stats = _run(CachedPhotos(), epochs=2, cache=budget)
    assert cached == plain
    assert 0 < stats["stored"] < 48 and stats["refused_full"] > 0, stats
    assert stats["stored_bytes"] <= budget


def test_a_cache_that_does_not_pay_turns_itself_off():
    plain, _ = _run(CheapCached(), epochs=2, batch_size=64)
    cached, stats = _run(CheapCached(), epochs=2, batch_size=64, cache=True)
    assert cached == plain
    assert not stats["on"], stats
    assert "cost about as much as loading" in stats["off_reason"]
    assert stats["stored"] < 4000


def test_a_one_epoch_job_never_caches():
    _, stats = _run(CachedPhotos(), epochs=1, cache=True)
    assert not stats["on"] and "one epoch" in stats["off_reason"], stats
    assert stats["stored"] == 0, stats


def test_a_cache_in_a_directory_leaves_no_file_there(tmp_path):
    plain, _ = _run(CachedPhotos(n=24), epochs=2)
    cached, stats = _run(CachedPhotos(n=24), epochs=2, cache="8MB", cache_dir=str(tmp_path))
    assert cached == plain
    assert stats["stored"] == 24, stats
    assert os.listdir(tmp_path) == []


def test_spawned_workers_keep_a_cache_each_with_the_same_results():
    plain, _ = _run(CachedArrays(n=24), epochs=2)
    cached, stats = _run(CachedArrays(n=24), epochs=2, cache=True, multiprocessing_context="spawn")
    assert cached == plain
    assert stats is None  # the trainer holds no cache: each worker has its own


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"cache": "lots"}, ValueError, "not a size"),
        ({"cache": -5}, ValueError, "positive size"),
        ({"cache_dir": "/tmp"}, TypeError, "give cache= too"),
    ],
)
def test_bad_cache_settings_fail_in_one_line(kwargs, error, words):
    with pytest.raises(error) as e:
        loader.Loader.local(CachedPhotos(), workers=1, batch_size=4, epochs=2, **kwargs)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_dataset_that_does_not_split_is_refused_in_one_line():
    with pytest.raises(TypeError) as e:
        loader.Loader.local(NumpyRows(), workers=1, batch_size=4, epochs=2, cache=True)
    assert "loader_load(index)" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(TypeError, match="only for a dataset"):
        loader.Loader.local({"dataset": {"synthetic": {"num_samples": 8, "shape": [2]}}}, workers=1, cache=True)


def test_torchvision_image_folder_caches_its_decoded_images(tmp_path):
    torchvision = pytest.importorskip("torchvision", reason="torchvision is not installed in this venv")
    from PIL import Image
    from torchvision import transforms as T

    rng = np.random.default_rng(0)
    for c in range(2):
        (tmp_path / f"class{c}").mkdir()
        for k in range(12):
            pixels = rng.integers(0, 255, size=(160 + k, 200 + 2 * k, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / f"class{c}" / f"{k}.jpg", quality=90)
    transform = T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.PILToTensor()])
    folder = torchvision.datasets.ImageFolder(str(tmp_path), transform=transform)
    plain, _ = _run(folder, epochs=3)
    cached, stats = _run(folder, epochs=3, cache=True)
    assert cached == plain
    assert stats["on"] and stats["stored"] == 24, stats
    # Every read (3 epochs, each worker's schema read of sample 0, and a
    # backup copy's reads) is a hit or a miss; a miss only where a worker
    # loads an index for the first time (the other may be prefetching a
    # later epoch meanwhile): at most once per worker.
    assert stats["hits"] + stats["misses"] >= 3 * 24 + 2, stats
    assert stats["misses"] <= 2 * 24, stats


def test_a_worker_killed_mid_epoch_loses_nothing_and_the_cache_stays_whole():
    plain, _ = _run(CachedPhotos(), epochs=3)
    out = []
    with loader.Loader.local(CachedPhotos(), workers=2, batch_size=8, shuffle=True, seed=5, epochs=3, cache=True) as dl:
        killed = False
        for epoch in range(3):
            dl.set_epoch(epoch)
            for x, i in dl:
                out.append((epoch, np.asarray(i).tolist(), np.asarray(x).tobytes()))
                if len(out) == 2 and not killed:
                    # In the first epoch, while both are loading and
                    # storing: it may die holding an index it claimed,
                    # which later reads then load themselves.
                    os.kill(dl.worker_pids()[0], signal.SIGKILL)
                    killed = True
        stats = dl.cache_stats()
    assert killed
    assert out == plain
    assert 40 <= stats["stored"] <= 48, stats


# -- built-in image jobs: kept frames (loader_worker::dataset::FrameCache) --


def _photo_folder(root: pathlib.Path, per_class: int = 12) -> str:
    """Two classes of noisy JPEGs of a few sizes (4:2:0, as cameras write
    them) and one PNG."""
    pil = pytest.importorskip("PIL.Image", reason="Pillow is not installed in this venv")
    rng = np.random.default_rng(0)
    for c in range(2):
        (root / f"class{c}").mkdir()
        for k in range(per_class):
            pixels = rng.integers(0, 255, size=(160 + 3 * k, 200 + 5 * k, 3), dtype=np.uint8)
            pil.fromarray(pixels).save(root / f"class{c}" / f"{k}.jpg", quality=90)
    pil.fromarray(rng.integers(0, 255, size=(90, 120, 3), dtype=np.uint8)).save(root / "class0" / "z.png")
    return str(root)


def _run_spec(root: str, transforms: list, epochs: int, status: list | None = None, **kwargs):
    """Every batch of every epoch as (labels, image bytes), and the cache's
    counters before close; with `status`, the job's cache use as
    `loaderctl status --json` shows it once every read is counted there
    (bounded wait) is appended to it."""
    spec = {
        "dataset": {"image_folder": {"path": root}},
        "transforms": transforms,
        "batch_size": 8,
        "epochs": epochs,
        "sampler": {"shuffle": True, "seed": 5},
    }
    out = []
    with loader.Loader.local(spec, workers=2, **kwargs) as dl:
        for epoch in range(epochs):
            dl.set_epoch(epoch)
            for batch in dl:
                out.append((np.asarray(batch["label"]).tolist(), np.asarray(batch["image"]).tobytes()))
        stats = dl.cache_stats()
        if status is not None:
            reads = sum(len(labels) for labels, _ in out)
            deadline = time.monotonic() + 15
            while True:
                cache = json.loads(_status(dl.coordinator_address(), "--json"))["jobs"][0]["cache"]
                if cache is not None and cache["hits"] + cache["misses"] >= reads or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            status.append(cache)
    return out, stats


def test_an_image_job_reads_kept_frames_with_the_same_batches(tmp_path):
    # One DCT scale an image (a fixed resize), flipped at random: every
    # image's frame is kept once and read back in the later epochs.
    root = _photo_folder(tmp_path)
    steps = ["decode", {"resize": {"size": 40}}, {"center_crop": {"size": 32}}, "horizontal_flip"]
    plain, _ = _run_spec(root, steps, epochs=3)
    cached, stats = _run_spec(root, steps, epochs=3, cache="64MB")
    assert cached == plain
    assert stats["on"], stats
    # Workers run ahead into the next epoch: an image whose frame another
    # worker is still keeping is decoded again (a miss), never waited for.
    assert stats["stored"] == 25 and stats["hits"] + stats["misses"] == 75 and stats["hits"] >= 25, stats


def test_random_resized_crops_from_kept_frames_are_the_uncached_ones(tmp_path):
    # Crops that ask for several DCT scales, flips: the same bytes whether
    # or not the cache keeps (or decides to stop keeping) frames.
    root = _photo_folder(tmp_path)
    steps = ["decode", {"random_resized_crop": {"size": 32}}, "horizontal_flip"]
    plain, _ = _run_spec(root, steps, epochs=3)
    cached, stats = _run_spec(root, steps, epochs=3, cache=True, cache_dir=str(tmp_path))
    assert cached == plain
    # Whether it kept on keeping depends on this machine's costs (it decides
    # by itself), not what the batches hold.
    assert stats["stored"] >= 1, stats


def test_an_image_cache_that_is_too_small_keeps_what_fits(tmp_path):
    root = _photo_folder(tmp_path)
    steps = ["decode", {"resize": {"size": 40}}, {"center_crop": {"size": 32}}, "horizontal_flip"]
    plain, _ = _run_spec(root, steps, epochs=2)
    cached, stats = _run_spec(root, steps, epochs=2, cache="200KB")
    assert cached == plain
    assert 0 < stats["stored"] < 25 and stats["refused_full"] >= 1, stats


def test_a_one_epoch_image_job_keeps_no_frame(tmp_path):
    root = _photo_folder(tmp_path, per_class=4)
    _, stats = _run_spec(root, ["decode", {"resize": {"size": 32}}, {"center_crop": {"size": 32}}], epochs=1, cache=True)
    assert not stats["on"] and "one epoch" in stats["off_reason"] and stats["stored"] == 0, stats


def test_spawned_workers_of_an_image_job_share_one_cache_and_give_the_same_batches(tmp_path):
    photos = tmp_path / "photos"
    photos.mkdir()
    root = _photo_folder(photos)
    cache_dir = tmp_path / "frames"
    cache_dir.mkdir()
    steps = ["decode", {"resize": {"size": 40}}, {"center_crop": {"size": 32}}, "horizontal_flip"]
    plain, _ = _run_spec(root, steps, epochs=3, multiprocessing_context="spawn")
    uses = []
    cached, stats = _run_spec(
        root, steps, epochs=3, multiprocessing_context="spawn", cache="64MB", cache_dir=str(cache_dir), status=uses
    )
    assert cached == plain
    assert stats is None, "this process does not hold the spawned workers' cache"
    # One file for both workers: each of the 25 images kept once, read back
    # in epochs 2 and 3 (an image both workers miss at once is decoded
    # twice); with a cache each, about half the reads of epoch 2 miss.
    use = uses[0]
    assert use["hits"] + use["misses"] == 75 and use["hits"] >= 40 and use["misses"] <= 35, use
    assert list(cache_dir.iterdir()) == [], "the last worker to let go removes the file"


def test_spawned_workers_cache_in_a_directory_of_the_loaders_own_by_default(tmp_path):
    root = _photo_folder(tmp_path, per_class=2)
    spec = {"dataset": {"image_folder": {"path": root}}, "transforms": ["decode", {"resize": {"size": 32}}, {"center_crop": {"size": 32}}], "batch_size": 2, "epochs": 2}
    dl = loader.Loader.local(spec, workers=1, cache=True, multiprocessing_context="spawn")
    made = dl._spawned_frames.dir
    with dl:
        assert sum(1 for _ in dl) > 0
        assert os.path.isdir(made) and os.path.basename(made).startswith("loader-frames.")
    assert not os.path.exists(made)


def _status(url: str, *more: str) -> str:
    out = subprocess.run([str(LOADERCTL), "status", "--coordinator", url, *more], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _coordinators_cache_use(dl: loader.Loader, stats: dict) -> dict:
    """The job's cache use as `loaderctl status --json` shows it, once the
    workers' last heartbeats brought it level with the cache file's own
    counters (bounded wait)."""
    url = dl.coordinator_address()
    assert url is not None and url.startswith("http://127.0.0.1:"), url
    deadline = time.monotonic() + 15
    while True:
        cache = json.loads(_status(url, "--json"))["jobs"][0]["cache"]
        reads = None if cache is None else cache["hits"] + cache["misses"]
        if reads == stats["hits"] + stats["misses"] or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert cache is not None, "no worker reported its cache use"
    return cache


needs_loaderctl = pytest.mark.skipif(not LOADERCTL.exists(), reason=f"no {LOADERCTL} (cargo build --workspace builds it)")


@needs_loaderctl
def test_loaderctl_status_shows_an_image_jobs_cache_use(tmp_path):
    # Each worker reports its own use (co-located workers share the cache
    # file, whose counters sum over them); the coordinator's sums are the
    # file's once the last heartbeats are in.
    root = _photo_folder(tmp_path)
    spec = {
        "dataset": {"image_folder": {"path": root}},
        "transforms": ["decode", {"resize": {"size": 40}}, {"center_crop": {"size": 32}}, "horizontal_flip"],
        "batch_size": 8,
        "epochs": 3,
        "sampler": {"shuffle": True, "seed": 5},
    }
    with loader.Loader.local(spec, workers=2, cache="64MB") as dl:
        assert dl.coordinator_address() is None, "started at the first iteration"
        for epoch in range(3):
            dl.set_epoch(epoch)
            for _ in dl:
                pass
        stats = dl.cache_stats()
        cache = _coordinators_cache_use(dl, stats)
        assert (cache["hits"], cache["misses"], cache["stored_bytes"]) == (stats["hits"], stats["misses"], stats["stored_bytes"]), (cache, stats)
        assert cache["off"] is None and cache["hit_ratio"] == pytest.approx(stats["hits"] / (stats["hits"] + stats["misses"]))
        table = _status(dl.coordinator_address())
        assert f"{100 * cache['hit_ratio']:.0f}% hits" in table, table


@needs_loaderctl
def test_loaderctl_status_says_a_python_datasets_cache_turned_itself_off():
    with loader.Loader.local(CheapCached(), workers=2, batch_size=64, shuffle=True, seed=5, epochs=2, cache=True) as dl:
        for epoch in range(2):
            dl.set_epoch(epoch)
            for _ in dl:
                pass
        stats = dl.cache_stats()
        assert not stats["on"], stats
        cache = _coordinators_cache_use(dl, stats)
        assert (cache["hits"], cache["misses"], cache["off"]) == (stats["hits"], stats["misses"], "does-not-pay"), (cache, stats)
        assert "off: does-not-pay" in _status(dl.coordinator_address())
