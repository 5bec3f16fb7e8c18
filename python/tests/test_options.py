"""Loader options: the Rust SDK's names and defaults, checked when the
loader is constructed; ``ring_dir`` and ``coordinator_timeout`` reach the
loader and do what they say."""

import os
import time

import pytest

import loader
from conftest import synthetic, wait_gone


def test_defaults_and_names_come_from_the_rust_sdk():
    assert loader.DEFAULT_OPTIONS == {
        "prefetch": 8,
        "in_order": True,
        "shared_memory": True,
        "ring": None,
        "ring_dir": None,
        "allow_ring_peer_uids": [],
        "coordinator_timeout": 15.0,
        "metrics_listen": None,
        "device": "cpu",
        "device_prefetch": 2,
    }
    assert loader.DEFAULT_PREFETCH == 8


def test_an_unknown_option_raises_at_once_in_one_line():
    for make in (
        lambda: loader.Loader.local(synthetic(), prefetchh=3),
        # Nothing is reached for: the options fail first.
        lambda: loader.Loader("127.0.0.1:1", synthetic(), prefetchh=3),
    ):
        with pytest.raises(ValueError) as e:
            make()
        message = str(e.value)
        assert message.startswith("unknown loader option `prefetchh`, expected one of `prefetch`"), message
        assert "`ring_dir`" in message and "`coordinator_timeout`" in message, message
        assert "\n" not in message


@pytest.mark.parametrize(
    "options, named",
    [
        ({"prefetch": 0}, "prefetch"),
        ({"prefetch": "many"}, "prefetch"),
        ({"coordinator_timeout": -1.0}, "coordinator_timeout"),
        ({"coordinator_timeout": float("nan")}, "coordinator_timeout"),
        ({"ring": (4,)}, "ring"),
        ({"allow_ring_peer_uids": [-1]}, "allow_ring_peer_uids"),
        ({"device": "tpu"}, "device"),
        ({"device_prefetch": 0}, "device_prefetch"),
    ],
)
def test_a_bad_option_value_raises_at_once_naming_it(options, named):
    with pytest.raises(ValueError) as e:
        loader.Loader.local(synthetic(), **options)
    assert named in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_ring_dir_holds_the_socket_while_the_loader_runs(tmp_path):
    spec = synthetic(num_samples=320, batch_size=8)
    with loader.Loader.local(
        spec,
        workers=1,
        ring_dir=tmp_path,
        allow_ring_peer_uids={os.getuid() + 1},
        coordinator_timeout=30,
        prefetch=2,
        ready_timeout=20.0,
    ) as dl:
        it = iter(dl)
        batches = [next(it)]
        socket = dl.ring_socket()
        assert socket is not None and socket.startswith(str(tmp_path) + os.sep), socket
        assert os.path.exists(socket)
        batches.extend(it)
        assert sorted(i for b in batches for i in b.indices) == list(range(320))
        assert any(b.transport == "shared_memory" for b in batches), "no batch came through the ring"
        del batches
    assert list(tmp_path.iterdir()) == [], "the ring's directory outlived the loader"


def test_a_default_ring_socket_is_an_abstract_name():
    with loader.Loader.local(synthetic(num_samples=16, batch_size=8), workers=1) as dl:
        next(iter(dl))
        assert dl.ring_socket().startswith("\0")


def test_a_coordinator_timeout_shorter_than_a_heartbeat_keeps_a_healthy_coordinator():
    # Heartbeats go every lease/3 (1.7 s by default): a timeout under that
    # must not expire between two of them while the coordinator answers.
    spec = synthetic(num_samples=300, batch_size=4, cost_ns=10_000_000)
    with loader.Loader.local(spec, workers=1, coordinator_timeout=0.5) as dl:
        seen = sorted(i for b in dl for i in b.indices)
    assert seen == list(range(300))


def test_coordinator_timeout_bounds_the_wait_for_a_lost_coordinator(child):
    # A coordinator in another process (embedded mode's, with one spawned
    # worker, whose command line names the coordinator), which this test
    # kills with its process.
    host = child(
        """
import loader, time
spec = {"dataset": {"synthetic": {"num_samples": 1, "shape": [4], "dtype": "uint8"}},
        "batch_size": 1, "epochs": 1, "name": "host"}
dl = loader.Loader.local(spec, workers=1, multiprocessing_context="spawn")
list(dl)
pid = dl.worker_pids()[0]
args = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
print("coordinator", args[args.index(b"--coordinator") + 1].decode(), pid, flush=True)
time.sleep(120)
"""
    )
    coordinator, worker = host.expect("coordinator").split()
    worker = int(worker)
    # About 20 s of work for the one worker: far from done when the
    # coordinator goes.
    spec = {**synthetic(num_samples=4000, batch_size=8, cost_ns=5_000_000), "name": "trainer"}
    dl = loader.Loader(coordinator, spec, coordinator_timeout=1.0)
    try:
        it = iter(dl)
        next(it)
        host.kill()
        lost = time.monotonic()
        with pytest.raises(loader.LoaderError) as e:
            for _ in it:
                pass
        waited = time.monotonic() - lost
        assert "lost the coordinator" in str(e.value), str(e.value)
        # The default would wait 15 s.
        assert waited < 10.0, f"the lost coordinator was waited for {waited:.1f}s"
    finally:
        dl.close()
        # Its coordinator gone, the worker fences itself and exits.
        assert wait_gone([worker], 15) == []
