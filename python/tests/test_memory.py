"""Zero copy: arrays and DLPack tensors view the ring's mapping; the slot is
held while any view lives and released when the last one is freed."""

import gc
import threading

import numpy as np
import pytest

import loader
from conftest import expected_data, ring_mappings, synthetic


def inside_ring(address: int) -> bool:
    return any(start <= address < end for start, end in ring_mappings())


def test_arrays_lie_inside_the_rings_mapping():
    with loader.Loader.local(synthetic(num_samples=64, batch_size=16), workers=2) as dl:
        for batch in dl:
            assert batch.transport == "shared_memory"
            for name in ("data", "label"):
                arr = batch[name]
                address = arr.__array_interface__["data"][0]
                assert inside_ring(address), f"{name} at {address:#x} is not in {ring_mappings()}"
                assert address == batch.views()[name].data_ptr


def test_slot_is_released_only_when_the_last_array_is_freed():
    spec = synthetic(num_samples=64, batch_size=4)
    with loader.Loader.local(spec, workers=1, prefetch=1, ring=(2, 64 * 1024)) as dl:
        it = iter(dl)
        first = next(it)
        held = [first["data"]]
        del first  # the array alone keeps the slot
        second = next(it)
        held.append(second["label"])
        del second
        gc.collect()
        assert dl.ring_slots()[2] == 2, "both slots held by the two arrays"

        got = []
        waiter = threading.Thread(target=lambda: got.append(next(it)), daemon=True)
        waiter.start()
        waiter.join(1.5)
        assert waiter.is_alive() and not got, "a third batch came with both slots held"

        held.pop(0)  # frees the first slot: the worker can fill it
        waiter.join(10)
        assert got and got[0].index_in_epoch == 2
        del got[:]
        held.clear()

        # Releasing each batch keeps a 2-slot ring flowing to the end.
        n = 3
        for batch in it:
            assert batch.transport == "shared_memory"
            assert batch["data"][0].tobytes() == expected_data(batch.indices[0], 12)
            n += 1
        assert n == len(dl) == 16


def test_numpy_from_dlpack_shares_the_slot():
    with loader.Loader.local(synthetic(num_samples=8, batch_size=4), workers=1) as dl:
        batch = next(iter(dl))
        view = batch.views()["data"]
        arr = np.from_dlpack(view)
        assert arr.__array_interface__["data"][0] == view.data_ptr
        assert inside_ring(view.data_ptr)
        assert arr.shape == view.shape == (4, 3, 4) and arr.dtype == np.uint8
        np.testing.assert_array_equal(arr, batch["data"])
        assert view.__dlpack_device__() == (1, 0)
        memory = memoryview(view)
        assert memory.readonly and memory.shape == (4, 3, 4) and memory.format == "B"


def test_dlpack_keeps_the_batch_alive_after_everything_else_is_gone():
    with loader.Loader.local(synthetic(num_samples=8, batch_size=4), workers=1, ring=(4, 64 * 1024)) as dl:
        batch = next(iter(dl))
        expected = np.array(batch["data"])
        arr = np.from_dlpack(batch.views()["data"])
        del batch
        gc.collect()
        assert dl.ring_slots()[2] >= 1
        np.testing.assert_array_equal(arr, expected)
        del arr
        gc.collect()




def _torch():
    try:
        import torch
    except ImportError:
        pytest.skip("torch is not installed: the DLPack-to-torch tests need it")
    return torch


def test_torch_tensors_share_the_slot_and_allow_in_place_ops():
    torch = _torch()
    with loader.Loader.local(synthetic(num_samples=32, batch_size=8), workers=1) as dl:
        for batch in dl:
            tensors = batch.torch()
            data, label = tensors["data"], tensors["label"]
            assert data.dtype == torch.uint8 and label.dtype == torch.int64
            assert data.data_ptr() == batch["data"].__array_interface__["data"][0]
            assert inside_ring(data.data_ptr())
            assert label.tolist() == batch.indices
            x = torch.from_dlpack(batch.views()["data"])
            x.add_(1)  # the batch's own memory: no crash, and visible in place
            assert int(data.flatten()[8]) == (batch.indices[0] % 251 + 1) % 256


def test_float_tensors_round_trip_through_torch():
    torch = _torch()
    spec = synthetic(num_samples=8, batch_size=4, shape=(5,), dtype="float32")
    with loader.Loader.local(spec, workers=1) as dl:
        batch = next(iter(dl))
        t = batch.torch()["data"]
        assert t.dtype == torch.float32 and tuple(t.shape) == (4, 5)
        np.testing.assert_array_equal(t.numpy(), batch["data"])
