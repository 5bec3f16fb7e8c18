"""torchvision's ImageFolder run natively in a deployment: a job whose own
``python`` entry says ``native_transforms: true``, given to
``loader.Loader(coordinator, job)`` over a real loader-server and
loader-worker processes. The trainer builds the factory's dataset, compiles
it, and submits the ``image_folder`` job; its manifest travels as a blob,
which each worker (a blob directory of its own, as on another host) fetches
from the coordinator and lists the folder from."""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
import numpy as np  # noqa: E402
from PIL import Image  # noqa: E402

import loader  # noqa: E402
from conftest import SERVER, WORKER, needs_binaries, read_line  # noqa: E402
from sample_datasets import FOLDER_MEAN, FOLDER_STD, torchvision_folder  # noqa: E402

#: (width, height) of the images, each class gets every size once.
SIZES = [(64, 48), (48, 64), (50, 50), (90, 40), (41, 77)]


@pytest.fixture
def folder(tmp_path) -> str:
    """Three class folders of small photo-like JPEGs and a PNG."""
    root = tmp_path / "images"
    rng = np.random.default_rng(54)
    for c in range(3):
        (root / f"class{c}").mkdir(parents=True)
        for i, (w, h) in enumerate(SIZES):
            smooth = Image.fromarray(rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)).resize((w, h), Image.BICUBIC)
            name = f"{i:02d}.png" if (c, i) == (1, 2) else f"{i:02d}.jpg"
            smooth.save(root / f"class{c}" / name, quality=95)
    return str(root)


@pytest.fixture
def deployment(tmp_path):
    """A coordinator and two Rust workers, each with a blob directory of its
    own (not this process's): yields the URL and the directories."""
    procs = []
    dirs = [tmp_path / f"worker-host-{i}" for i in range(2)]
    try:
        server = subprocess.Popen(
            [str(SERVER), "--listen", "127.0.0.1:0", "--lease-ttl-ms", "3000"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        procs.append(server)
        url = "http://" + read_line(server, "listening ", 30)
        for d in dirs:
            worker = subprocess.Popen(
                [str(WORKER), "--coordinator", url, "--listen", "127.0.0.1:0"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                env=dict(os.environ, LOADER_BLOB_DIR=str(d)),
            )
            procs.append(worker)
            read_line(worker, "listening ", 30)
        yield url, dirs
    finally:
        for proc in reversed(procs):
            proc.kill()
            proc.wait(10)


def job(root: str, **python) -> dict:
    return {
        "dataset": {"python": {"factory": "sample_datasets:torchvision_folder", "args": {"root": root}, **python}},
        "batch_size": 4,
        "epochs": 1,
        "sampler": {"shuffle": False},
    }


@needs_binaries
def test_a_deployments_python_entry_runs_natively_and_the_workers_fetch_the_manifest(folder, deployment):
    url, worker_dirs = deployment
    reference = torchvision_folder(folder)
    with loader.Loader(url, job(folder, native_transforms=True), coordinator_timeout=60.0) as dl:
        manifest = dl._manifest
        with open(manifest, "rb") as f:
            manifest_bytes = f.read()
        images, labels = [], []
        for x, y in dl:
            images.append(x.clone())
            labels.append(y.clone())
    assert not os.path.exists(manifest), "the trainer's manifest goes with its loader"
    got, labels = torch.cat(images), torch.cat(labels)
    # Unshuffled, in order: sample i of the stream is dataset[i], each once.
    assert labels.tolist() == [target for _, target in reference.samples]
    assert labels.dtype == torch.int64
    assert len(got) == len(reference)
    mean = torch.tensor(FOLDER_MEAN).view(3, 1, 1)
    std = torch.tensor(FOLDER_STD).view(3, 1, 1)
    for i in range(len(reference)):
        want, _ = reference[i]
        assert (got[i].dtype, got[i].shape) == (want.dtype, want.shape), f"sample {i}"
        # In uint8 steps, as the parity tests measure (test_native_transforms.py).
        mae = float(((got[i] - want) * std * 255).abs().mean())
        assert mae <= 2.0, f"sample {i} ({reference.samples[i][0]}): mean abs error {mae:.2f} levels"
    # Each worker host fetched the manifest into its own directory.
    sha = hashlib.sha256(manifest_bytes).hexdigest()
    assert os.path.basename(manifest) == sha
    fetched = [d for d in worker_dirs if (d / sha).exists()]
    assert fetched, f"no worker fetched the manifest blob into {worker_dirs}"
    for d in fetched:
        assert (d / sha).read_bytes() == manifest_bytes


@needs_binaries
def test_a_saved_state_resumes_the_native_job_in_a_new_loader(folder, deployment):
    url, _ = deployment
    spec = {**job(folder, native_transforms=True), "name": "native-resume"}
    with loader.Loader(url, spec, coordinator_timeout=60.0) as dl:
        it = iter(dl)
        before = [next(it)[1].clone() for _ in range(2)]
        state = dl.state_dict()
    # The first loader's manifest is gone with it; the new one writes the
    # same bytes, and the resumed job's blob is carried from its spec.
    with loader.Loader(url, spec, coordinator_timeout=60.0) as dl:
        dl.load_state_dict(state)
        after = [y.clone() for _, y in dl]
    labels = torch.cat(before + after).tolist()
    assert labels == [target for _, target in torchvision_folder(folder).samples]


@needs_binaries
def test_two_trainers_share_one_stream_of_the_native_job(folder, deployment):
    """A shared stream (docs/sharing.md) of the compiled job: two trainers
    subscribed by name each get every batch, the same random crops, made
    once; a solo run of the same job yields the same batches."""
    url, _ = deployment
    spec = {
        "name": "native-sweep",
        "shared": True,
        "dataset": {"python": {"factory": "sample_datasets:torchvision_train_folder", "args": {"root": folder},
                               "native_transforms": True}},
        "batch_size": 4,
        "epochs": 1,
        "sampler": {"shuffle": True, "seed": 9},
    }
    with loader.Loader(url, spec, coordinator_timeout=60.0) as a, loader.Loader(url, spec, coordinator_timeout=60.0) as b:
        it_a, it_b = iter(a), iter(b)
        got_a, got_b = [], []
        for _ in range(len(a)):
            (xa, ya), (xb, yb) = next(it_a), next(it_b)
            got_a.append((xa.clone(), ya.clone()))
            got_b.append((xb.clone(), yb.clone()))
    assert len(got_a) == 4
    assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(got_a, got_b))
    assert sorted(torch.cat([y for _, y in got_a]).tolist()) == sorted(t for _, t in torchvision_folder(folder).samples)
    solo = {k: v for k, v in spec.items() if k != "shared"} | {"name": "native-solo"}
    with loader.Loader(url, solo, coordinator_timeout=60.0) as dl:
        again = [(x.clone(), y.clone()) for x, y in dl]
    assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(got_a, again))


def test_loader_local_compiles_a_dict_specs_entry_the_same_way(folder):
    with loader.Loader.local(job(folder, native_transforms=True), workers=1) as dl:
        assert dl._pairs
        labels = torch.cat([y.clone() for _, y in dl]).tolist()
    assert labels == [target for _, target in torchvision_folder(folder).samples]


def test_a_python_entry_that_cannot_run_natively_is_refused_in_one_line(folder):
    with pytest.raises(ValueError) as e:
        loader.Loader("http://127.0.0.1:1", job(folder, native_transforms=True, args={"root": folder, "jitter": True}))
    message = str(e.value)
    assert message.startswith("native_transforms: transform.transforms[2]: ") and "ColorJitter" in message, message
    assert "\n" not in message
    with pytest.raises(ValueError, match=r"^native_transforms: dataset.python.collate runs in Python"):
        loader.Loader("http://127.0.0.1:1", job(folder, native_transforms=True, collate="m:f"))
    # A value that is not a bool (a YAML "yes" read as text, a 1) is
    # refused, not read as true or false.
    for value in ("yes", 1):
        with pytest.raises(ValueError) as e:
            loader.Loader("http://127.0.0.1:1", job(folder, native_transforms=value))
        assert str(e.value) == f"dataset.python.native_transforms: must be true or false, not {value!r}"


def test_native_transforms_false_keeps_the_python_path(folder):
    with loader.Loader("http://127.0.0.1:1", job(folder, native_transforms=False)) as dl:
        assert len(dl) == 4 and dl._manifest is None and not dl._pairs
