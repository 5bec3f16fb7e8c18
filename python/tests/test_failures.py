"""Failure and exit paths: a worker killed mid-iteration, Ctrl-C while a
batch is awaited, and the interpreter exiting while iterating. Each checks
that no worker process outlives its trainer."""

import os
import signal
import time

import loader
from conftest import WAITING_SYSCALLS, synthetic, wait_blocked, wait_gone

PRELUDE = """
import os, sys, time, threading
import loader
spec = {spec!r}
"""

#: In a child: waits (bounded) until thread ``tid`` of this process sits in
#: a waiting system call twice in a row (see ``conftest.wait_blocked``).
WAIT_BLOCKED = """
def wait_blocked(tid, waiting={waiting!r}):
    seen = 0
    for _ in range(500):
        first = open(f"/proc/self/task/{{tid}}/syscall").read().split(maxsplit=1)[0]
        seen = seen + 1 if first.isdigit() and int(first) in waiting else 0
        if seen == 2:
            return
        time.sleep(0.02)
    raise SystemExit(f"thread {{tid}} did not block")
"""


def test_worker_sigkill_during_iteration_loses_no_batch():
    spec = synthetic(num_samples=480, batch_size=8, epochs=1)
    with loader.Loader.local(spec, workers=2, prefetch=2) as dl:
        pids = None
        seqs, samples = [], []
        started = time.monotonic()
        for batch in dl:
            if pids is None:
                pids = dl.worker_pids()
                assert len(pids) == 2
            seqs.append(batch.seq)
            samples.extend(batch.indices)
            if batch.seq == 5:
                os.kill(pids[0], signal.SIGKILL)
            assert time.monotonic() - started < 60, "stuck after the worker died"
        assert seqs == list(range(len(dl)))
        assert sorted(samples) == list(range(480))
        # Gone (its parent, the worker template, reaps it; a forked worker
        # with the trainer's mappings takes a few ms to tear down).
        assert wait_gone([pids[0]], 5) == []
    assert wait_gone(pids, 5) == []


def test_ctrl_c_while_waiting_raises_keyboard_interrupt_promptly(child):
    # Two slots, both held: the next batch cannot come, so the trainer blocks.
    script = PRELUDE.format(spec=synthetic(num_samples=64, batch_size=4)) + """
dl = loader.Loader.local(spec, workers=2, prefetch=1, ring=(2, 64 * 1024))
it = iter(dl)
held = [next(it)["data"], next(it)["data"]]
print("pids", *dl.worker_pids(), flush=True)
try:
    next(it)
    print("unexpected batch", flush=True)
except KeyboardInterrupt:
    print("interrupted", time.monotonic(), flush=True)
    held.clear()
    # Nothing was lost: the awaited batch is the next one.
    print("next", next(it).index_in_epoch, flush=True)
"""
    c = child(script)
    pids = [int(p) for p in c.expect("pids").split()]
    wait_blocked(c.proc.pid)  # in next(), which cannot return
    sent = time.monotonic()
    os.kill(c.proc.pid, signal.SIGINT)
    interrupted = float(c.expect("interrupted", timeout=5))
    assert interrupted - sent < 2.0, f"KeyboardInterrupt took {interrupted - sent:.2f}s"
    assert c.expect("next") == "2"
    assert c.wait(10) == 0, c.stderr()
    assert wait_gone(pids, 1) == [], "workers outlived the trainer"


def test_uncaught_ctrl_c_exits_and_leaves_no_process(child):
    script = PRELUDE.format(spec=synthetic(num_samples=64, batch_size=4)) + """
dl = loader.Loader.local(spec, workers=2, prefetch=1, ring=(2, 64 * 1024))
it = iter(dl)
held = [next(it)["data"], next(it)["data"]]
print("pids", *dl.worker_pids(), flush=True)
next(it)
"""
    c = child(script)
    pids = [int(p) for p in c.expect("pids").split()]
    wait_blocked(c.proc.pid)
    sent = time.monotonic()
    os.kill(c.proc.pid, signal.SIGINT)
    code = c.wait(5)
    elapsed = time.monotonic() - sent
    assert code is not None, "the trainer did not exit after Ctrl-C"
    assert code != 0 and "KeyboardInterrupt" in c.stderr()
    assert elapsed < 5, f"exit took {elapsed:.2f}s"
    assert wait_gone(pids, 1) == [], "workers outlived the trainer"


def test_interpreter_exit_mid_iteration_is_clean(child):
    script = PRELUDE.format(spec=synthetic(num_samples=6400, batch_size=16, epochs=5)) + """
dl = loader.Loader.local(spec, workers=2)
held = []
for batch in dl:
    held.append(batch["data"])
    if len(held) == 3:
        print("pids", *dl.worker_pids(), flush=True)
        print("exiting", time.monotonic(), flush=True)
        sys.exit(0)
"""
    c = child(script)
    pids = [int(p) for p in c.expect("pids").split()]
    exiting = float(c.expect("exiting"))
    code = c.wait(5)
    assert code == 0, f"exit code {code}; stderr: {c.stderr()}"
    assert time.monotonic() - exiting < 5
    assert wait_gone(pids, 1) == [], "workers outlived the trainer"


def test_interpreter_exit_while_a_thread_is_blocked_iterating(child):
    # A daemon thread is blocked waiting for a batch that cannot come; the
    # main thread returns. DataLoader's pin-memory thread hangs exit here.
    waiting = set().union(*WAITING_SYSCALLS.values())
    script = PRELUDE.format(spec=synthetic(num_samples=64, batch_size=4)) + WAIT_BLOCKED.format(waiting=waiting) + """
dl = loader.Loader.local(spec, workers=2, prefetch=1, ring=(2, 64 * 1024))
it = iter(dl)
held = [next(it)["data"], next(it)["data"]]
errors = []
def consume():
    try:
        next(it)
    except Exception as e:
        errors.append(e)
t = threading.Thread(target=consume, daemon=True)
t.start()
wait_blocked(t.native_id)
print("pids", *dl.worker_pids(), flush=True)
print("exiting", time.monotonic(), flush=True)
"""
    c = child(script)
    pids = [int(p) for p in c.expect("pids").split()]
    exiting = float(c.expect("exiting"))
    code = c.wait(5)
    assert code == 0, f"exit code {code}; stderr: {c.stderr()}"
    assert time.monotonic() - exiting < 5
    assert wait_gone(pids, 1) == [], "workers outlived the trainer"


def _dev_shm() -> set[str]:
    try:
        return set(os.listdir("/dev/shm"))
    except FileNotFoundError:
        return set()


def test_sigterm_and_sigkill_of_a_trainer_leave_nothing_behind(child, tmp_path):
    # SIGTERM: SystemExit(143), the loader closes, its workers stop within 2 s.
    # SIGKILL: nothing can run, but nothing was left to clean up: the ring is
    # a memfd and its socket a name in the abstract namespace. Either way the
    # trainer's TMPDIR stays empty and /dev/shm gets nothing new.
    before = _dev_shm()
    for sig, code in [(signal.SIGTERM, 128 + signal.SIGTERM), (signal.SIGKILL, -signal.SIGKILL)]:
        tmp = tmp_path / sig.name
        tmp.mkdir()
        script = f"import os\nos.environ['TMPDIR'] = {str(tmp)!r}\n" + PRELUDE.format(
            spec=synthetic(num_samples=64000, batch_size=16, epochs=50, cost_ns=20000)
        ) + """
dl = loader.Loader.local(spec, workers=2)
it = iter(dl)
next(it)
print("pids", *dl.worker_pids(), flush=True)
# Every epoch, not one: an epoch takes well under a second, and a child
# that finished its loop before the signal came would exit 0.
i = 0
while True:
    for batch in it:
        i += 1
        if i == 20:
            print("iterating", flush=True)
    it = iter(dl)
"""
        c = child(script)
        pids = [int(p) for p in c.expect("pids").split()]
        c.expect("iterating")
        sent = time.monotonic()
        os.kill(c.proc.pid, sig)
        got = c.wait(5)
        assert got == code, f"{sig.name}: exit {got}; stderr: {c.stderr()}"
        if sig == signal.SIGTERM:
            assert time.monotonic() - sent < 2.0, "SIGTERM exit took too long"
            assert wait_gone(pids, 2.0 - (time.monotonic() - sent) + 0.2) == [], "workers outlived SIGTERM"
        else:
            # Killed outright, embedded coordinator and all: the workers
            # cannot renew their leases, fence and exit (TTL 5 s).
            assert wait_gone(pids, 10) == [], "workers outlived their lease"

        assert list(tmp.iterdir()) == [], f"{sig.name} left {list(tmp.iterdir())}"
    assert _dev_shm() - before == set(), "/dev/shm got a new entry"
