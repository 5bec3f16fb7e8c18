"""The device path (``device=``): a GPU this machine cannot use is one
``LoaderError`` line saying why, ``"auto"`` falls back to host batches with
one ``logging`` warning, and the device path itself (on its host backend,
``"host"``, which every machine has) yields every batch in order with the
bytes the workers wrote. With a GPU and torch, ``batch.torch()`` gives CUDA
tensors equal to the host batch."""

import logging

import numpy as np
import pytest

import loader
from conftest import expected_data, synthetic


def _gpu_usable() -> bool:
    try:
        with loader.Loader.local(synthetic(num_samples=16), workers=1, device="cuda") as dl:
            next(iter(dl))
        return True
    except loader.LoaderError:
        return False


def test_device_cuda_without_a_usable_gpu_is_one_line_saying_why():
    if _gpu_usable():
        pytest.skip("this machine has a usable GPU")
    dl = loader.Loader.local(synthetic(), workers=1, device="cuda:0")
    with pytest.raises(loader.LoaderError) as e:
        next(iter(dl))
    message = str(e.value)
    assert message.startswith("device cuda:0: "), message
    assert "\n" not in message
    # One of the reasons: no driver library, no GPU, a build without CUDA.
    assert any(
        why in message for why in ("no CUDA driver library", "sees no GPU", "no such GPU", "no CUDA support", "failed")
    ), message
    dl.close()


def test_device_auto_falls_back_to_the_host_with_one_log_line(caplog):
    if _gpu_usable():
        pytest.skip("this machine has a usable GPU: auto uses it")
    caplog.set_level(logging.WARNING, logger="loader")
    with loader.Loader.local(synthetic(num_samples=64, batch_size=16), workers=1, device="auto") as dl:
        batches = list(dl)
    assert [b.seq for b in batches] == [0, 1, 2, 3]
    assert all(b.device == "cpu" for b in batches)
    said = [r.getMessage() for r in caplog.records if "device auto" in r.getMessage()]
    assert len(said) == 1, said
    assert "batches stay on the host" in said[0], said[0]


def test_the_device_path_yields_every_batch_in_order_with_the_workers_bytes():
    spec = synthetic(num_samples=200, shape=(3, 8, 8), batch_size=16, shuffle=True, seed=3)
    with loader.Loader.local(spec, workers=2, device="host", device_prefetch=3) as dl:
        seqs = []
        for batch in dl:
            assert batch.device == "host"
            seqs.append(batch.seq)
            data = batch["data"]
            assert data.shape == (len(batch.indices), 3, 8, 8)
            for row, index in zip(data.reshape(len(batch.indices), -1), batch.indices):
                assert row.tobytes() == expected_data(index, 3 * 8 * 8), index
            labels = batch["label"]
            assert list(labels) == batch.indices
            del data, labels, batch
    assert seqs == list(range(13))


def test_cuda_tensors_equal_the_host_batch():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or not _gpu_usable():
        pytest.skip("no usable GPU")
    spec = synthetic(num_samples=96, shape=(3, 8, 8), batch_size=16)
    with loader.Loader.local(spec, workers=1) as host, loader.Loader.local(spec, workers=1, device="cuda:0") as dev:
        for h, d in zip(host, dev):
            assert d.device == "cuda:0"
            tensors = d.torch()
            assert tensors["data"].device.type == "cuda"
            assert np.array_equal(tensors["data"].cpu().numpy(), h["data"])
            assert np.array_equal(tensors["label"].cpu().numpy(), h["label"])
