"""Resuming on another world size: a job run by W ranks against a real
loader-server and loader-worker processes, stopped mid-epoch or at an epoch
boundary, continued by W' ranks that all load the same state (one rank's, or
``merge_states`` of all), as a trainer restarted on fewer or more GPUs does.
Over the whole run every sample of each epoch is delivered once (plus
DistributedSampler's padding, less its drop_last truncation), and with
``batch_size * world_size`` kept the global batches after the resume are the
uninterrupted run's. Each test bounds its own time and stops what it started."""

from __future__ import annotations

import collections
import json
import subprocess
import time

import pytest

import loader
from conftest import SERVER, WORKER, needs_binaries, read_line, synthetic


N = 150


@pytest.fixture
def deployment():
    """A coordinator and two Rust workers on loopback; yields its URL."""
    procs = []
    try:
        server = subprocess.Popen(
            [str(SERVER), "--listen", "127.0.0.1:0", "--lease-ttl-ms", "1000"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        procs.append(server)
        url = "http://" + read_line(server, "listening ", 30)
        for _ in range(2):
            worker = subprocess.Popen(
                [str(WORKER), "--coordinator", url, "--listen", "127.0.0.1:0"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
            )
            procs.append(worker)
            read_line(worker, "listening ", 30)
        yield url
    finally:
        for proc in reversed(procs):
            proc.kill()
            proc.wait(10)


def job(name: str, batch_size: int, drop_last: bool) -> dict:
    spec = synthetic(num_samples=N, shape=(2,), batch_size=batch_size, epochs=2, shuffle=True, seed=5)
    spec["name"] = name
    spec["sampler"]["drop_last"] = drop_last
    return spec


def take(dl: loader.Loader, n: int) -> list[tuple[int, int, list[int]]]:
    """Up to n batches of the loader's stream, across epochs, as
    (epoch, seq, indices)."""
    out = []
    while len(out) < n and dl.epoch < dl.epochs:
        dl.set_epoch(dl.epoch)
        for batch in dl:
            out.append((batch.epoch, batch.seq, list(batch.indices)))
            if len(out) == n:
                break
    return out


def check_epochs(delivered, drop_last: bool, slack: int) -> None:
    """Each epoch: every sample at least once, repeats at most the padding
    (a few per rank); with drop_last none twice and at most `slack` missing."""
    for epoch in (0, 1):
        counts = collections.Counter(i for e, idx in delivered if e == epoch for i in idx)
        if drop_last:
            assert max(counts.values()) == 1, f"epoch {epoch}: a sample twice"
            assert len(counts) + slack >= N, f"epoch {epoch}: {len(counts)} of {N}"
        else:
            assert sorted(counts) == list(range(N)), f"epoch {epoch} not whole"
            repeats = sum(c - 1 for c in counts.values())
            assert repeats <= 16, f"epoch {epoch}: {repeats} repeats, more than padding"


@needs_binaries
@pytest.mark.parametrize(
    "w, b, w2, b2, drop_last, steps",
    [
        (4, 5, 2, 10, False, 3),  # 4 -> 2 mid-epoch, global batch kept
        (2, 6, 3, 4, True, 12),  # 2 -> 3 at the epoch boundary, kept
        (3, 5, 5, 3, False, 13),  # 3 -> 5 in the second epoch, kept
        (2, 8, 3, 5, True, 4),  # 2 -> 3 mid-epoch, another global batch
    ],
)
def test_every_new_rank_loads_the_same_state(deployment, w, b, w2, b2, drop_last, steps):
    name = f"elastic-{w}-{w2}-{int(drop_last)}"
    spec = job(name, b, drop_last)
    delivered, old = [], collections.defaultdict(list)
    states = []
    for rank in range(w):
        with loader.Loader(deployment, spec, rank=rank, world_size=w) as dl:
            per_epoch = len(dl)
            for epoch, seq, idx in take(dl, steps):
                delivered.append((epoch, idx))
                old[seq].extend(idx)
            states.append(json.loads(json.dumps(dl.state_dict())))
    new = collections.defaultdict(list)
    lens = []
    for rank in range(w2):
        with loader.Loader(deployment, spec, rank=rank, world_size=w2) as dl:
            dl.load_state_dict(states[0], batch_size=b2)
            assert len(dl) >= 1
            rest = take(dl, 10**6)
            lens.append(sum(len(i) for _, _, i in rest))
            for epoch, seq, idx in rest:
                delivered.append((epoch, idx))
                new[seq].extend(idx)
    assert len(set(lens)) == 1, f"ranks got different sample counts: {lens}"
    check_epochs(delivered, drop_last, slack=(b + 1) * w + (b2 + 1) * w2)
    if b * w == b2 * w2:
        # The same global batch size: the same sequence numbers, and each
        # global batch the uninterrupted run's (the epoch's last one may
        # differ in padding only).
        assert min(new) == steps
        for seq, idx in new.items():
            if not drop_last and seq % per_epoch == per_epoch - 1:
                continue
            assert sorted(idx) == sorted(old_global(deployment, spec, w, seq)), f"global batch {seq}"


_reference: dict = {}


def old_global(url: str, spec: dict, w: int, seq: int) -> list[int]:
    """Global batch `seq` of the uninterrupted run on `w` ranks (run once,
    under another name, and kept)."""
    key = (json.dumps(spec, sort_keys=True), w)
    if key not in _reference:
        batches = collections.defaultdict(list)
        ref = dict(spec, name=spec["name"] + "-reference")
        for rank in range(w):
            with loader.Loader(url, ref, rank=rank, world_size=w) as dl:
                for _, s, idx in take(dl, 10**6):
                    batches[s].extend(idx)
        _reference[key] = batches
    return _reference[key][seq]


@needs_binaries
def test_ranks_at_different_steps_merge_and_resume_exactly(deployment):
    spec = job("merged", 6, False)
    delivered, states = [], []
    for rank, steps in enumerate([5, 7, 6]):
        with loader.Loader(deployment, spec, rank=rank, world_size=3) as dl:
            delivered += [(e, i) for e, _, i in take(dl, steps)]
            states.append(dl.state_dict())
    merged = loader.merge_states(states)
    assert len(merged["ranks"]) == 3 and merged["next_seq"] == 5
    for rank in range(2):
        with loader.Loader(deployment, spec, rank=rank, world_size=2) as dl:
            dl.load_state_dict(merged)
            delivered += [(e, i) for e, _, i in take(dl, 10**6)]
    check_epochs(delivered, False, 0)
    with pytest.raises(ValueError, match="rank 2 of 3 missing"):
        loader.merge_states(states[:2])


@needs_binaries
def test_eight_ranks_resume_on_one_in_embedded_mode(deployment):
    # Eight ranks of 2 on a deployment; then one trainer, Loader.local (rank
    # 0 of 1), loads rank 0's state with batches of 16: the same global
    # batch size, so the same global batches.
    spec = job("eight", 2, True)
    delivered, old = [], collections.defaultdict(list)
    state = None
    for rank in range(8):
        with loader.Loader(deployment, spec, rank=rank, world_size=8) as dl:
            for epoch, seq, idx in take(dl, 5):
                delivered.append((epoch, idx))
                old[seq].extend(idx)
            state = state or dl.state_dict()
    with loader.Loader.local(spec, workers=2) as dl:
        dl.load_state_dict(state, batch_size=16)
        assert dl.epoch == 0
        rest = take(dl, 10**6)
    assert rest[0][1] == 5
    for epoch, seq, idx in rest:
        delivered.append((epoch, idx))
        assert sorted(idx) == sorted(old_global(deployment, spec, 8, seq)), f"global batch {seq}"
    check_epochs(delivered, True, 16 + 8 * 3)


#: Longer than a resumed run waits for the run it continues to leave (the
#: SDK's 20 s), so that a resume which waited for the killed ranks' leases
#: would be refused, not just slow.
LONG_LEASE_MS = 30_000


@needs_binaries
def test_a_resumed_run_does_not_wait_a_lease_for_ranks_that_were_killed(child, tmp_path):
    # Two ranks, each in its own process, take 3 steps, save their state and
    # are SIGKILLed while their sessions are open; three new ranks load rank
    # 0's state at once. The coordinator saw the killed ranks' connections
    # close, so it ends their sessions instead of waiting out their 30 s
    # leases (server log), and the new ranks deliver the rest exactly.
    log = open(tmp_path / "server.log", "w")
    procs = []
    try:
        server = subprocess.Popen(
            [str(SERVER), "--listen", "127.0.0.1:0", "--lease-ttl-ms", str(LONG_LEASE_MS)],
            stdout=subprocess.PIPE, stderr=log, text=True,
        )
        procs.append(server)
        url = "http://" + read_line(server, "listening ", 30)
        worker = subprocess.Popen(
            [str(WORKER), "--coordinator", url, "--listen", "127.0.0.1:0"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )
        procs.append(worker)
        read_line(worker, "listening ", 30)
        spec = job("killed", 5, False)
        ranks = []
        for rank in range(2):
            ranks.append(child(f"""
                import json, time, loader
                with loader.Loader({url!r}, json.loads({json.dumps(spec)!r}), rank={rank}, world_size=2) as dl:
                    taken = []
                    for batch in dl:
                        taken.append(list(batch.indices))
                        if len(taken) == 3:
                            break
                    print("state", json.dumps({{"state": dl.state_dict(), "taken": taken}}), flush=True)
                    time.sleep(600)
            """))
        saved = [json.loads(r.expect("state ", 60)) for r in ranks]
        for r in ranks:
            r.kill()
        killed = time.monotonic()
        delivered = [(0, idx) for s in saved for idx in s["taken"]]
        firsts = []
        for rank in range(3):
            with loader.Loader(url, spec, rank=rank, world_size=3) as dl:
                dl.load_state_dict(saved[0]["state"], batch_size=3)
                rest = []
                while dl.epoch < dl.epochs:
                    for batch in dl:
                        if not rest:
                            firsts.append(time.monotonic() - killed)
                        rest.append((batch.epoch, list(batch.indices)))
                delivered += rest
        check_epochs(delivered, False, 0)
        print(f"first batch of each new rank {[round(f, 2) for f in firsts]} s after the kill "
              f"(lease {LONG_LEASE_MS / 1000:.0f} s)")
        # Both sessions were ended for their closed connections, not expired.
        log.flush()
        text = (tmp_path / "server.log").read_text()
        assert text.count("its connection closed") == 2, text[-4000:]
        assert "session lease expired" not in text
    finally:
        for proc in reversed(procs):
            proc.kill()
            proc.wait(10)
        log.close()
