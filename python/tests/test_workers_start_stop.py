"""How ``Loader.local``'s workers start and stop, as a user sees it: forked
from one worker template per trainer process (reused by later loaders),
under the thread policy (torch with one thread by default, as DataLoader's
workers), and silent when they stop, whatever they were doing: the
trainer's terminal (the stderr workers share with it) holds no "Fatal
Python error", "terminate called" or traceback after a close, an
interpreter exit, a SIGTERM or a SIGKILL of the trainer, mid-epoch or after
the last batch, on 1 and 3 workers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

import loader
from conftest import alive, wait_gone

torch = pytest.importorskip("torch", reason="the thread policy is torch's")

HERE = os.path.dirname(os.path.abspath(__file__))

#: What a crash dump on the user's terminal looks like.
CRASH_MARKS = ("Fatal Python error", "terminate called", "Traceback", "Exception ignored", "core dumped")


def _ppid(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1])


def test_torch_runs_one_thread_per_worker_by_default():
    from sample_datasets import ThreadCounts

    with loader.Loader.local(ThreadCounts(), workers=2, batch_size=4) as dl:
        batches = list(dl)
    threads = torch.cat([b["torch"] for b in batches])
    omp = torch.cat([b["omp"] for b in batches])
    assert threads.tolist() == [1] * len(ThreadCounts())
    assert omp.tolist() == [1] * len(ThreadCounts())


def test_worker_threads_sets_the_policy_and_zero_leaves_the_defaults():
    from sample_datasets import ThreadCounts

    with loader.Loader.local(ThreadCounts(), workers=1, batch_size=4, worker_threads=2) as dl:
        assert {int(t) for b in dl for t in b["torch"]} == {2}
    with loader.Loader.local(ThreadCounts(), workers=1, batch_size=4, worker_threads=0) as dl:
        # Nothing set: the variables are the trainer's own.
        assert {int(t) for b in dl for t in b["omp"]} == {int(os.environ.get("OMP_NUM_THREADS", "-1"))}
    with pytest.raises(ValueError, match="worker_threads"):
        loader.Loader.local(ThreadCounts(), workers=1, worker_threads=-1)


def test_spawned_workers_follow_the_thread_policy_too():
    from sample_datasets import ThreadCounts

    with loader.Loader.local(
        ThreadCounts(), workers=1, batch_size=4, multiprocessing_context="spawn"
    ) as dl:
        assert {int(t) for b in dl for t in b["torch"]} == {1}
        pids = dl.worker_pids()
        assert all(_ppid(p) == os.getpid() for p in pids), "spawned workers are this process's children"
    with pytest.raises(ValueError, match="multiprocessing_context"):
        loader.Loader.local(ThreadCounts(), workers=1, multiprocessing_context="threads")


def test_workers_are_forked_by_one_template_that_later_loaders_reuse():
    from sample_datasets import NumpyRows

    with loader.Loader.local(NumpyRows(), workers=2, batch_size=10) as dl:
        assert len(list(dl)) == 10
        first = dl.worker_pids()
        templates = {_ppid(p) for p in first}
    assert len(templates) == 1 and os.getpid() not in templates
    (template,) = templates
    assert _ppid(template) == os.getpid()
    assert wait_gone(first, 5.0) == []
    with loader.Loader.local(NumpyRows(), workers=3, batch_size=10) as dl:
        assert len(list(dl)) == 10
        assert {_ppid(p) for p in dl.worker_pids()} == {template}
    assert alive(template), "the template outlives its loaders, for the next one"


def _trainer(workers: int, ending: str, mid_epoch: bool) -> str:
    """A trainer over a torch dataset slow enough that its workers are
    inside ``__getitem__`` when it ends: it prints ``ready`` and then ends
    the way ``ending`` says."""
    return textwrap.dedent(
        f"""
        import os, sys, time
        sys.path.insert(0, {HERE!r})
        import torch, loader
        from sample_datasets import SlowTorch
        dl = loader.Loader.local(SlowTorch(n=320, delay=0.004), workers={workers}, batch_size=32, shuffle=True)
        it = iter(dl)
        n = 0
        for batch in it:
            n += 1
            if {mid_epoch!r} and n == 3:
                break
        print("ready", n, flush=True)
        ending = {ending!r}
        if ending == "close":
            dl.close()
        elif ending in ("sigterm", "sigkill"):
            time.sleep(60)   # killed from outside meanwhile
        # "exit": the interpreter exits with the loader open
        """
    )


def _run_trainer(workers: int, ending: str, mid_epoch: bool) -> tuple[int, str]:
    proc = subprocess.Popen(
        [sys.executable, "-u", "-c", _trainer(workers, ending, mid_epoch)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stdout.readline()
        assert line.startswith("ready"), f"trainer said {line!r}; stderr: {proc.stderr.read()}"
        if ending == "sigterm":
            proc.send_signal(signal.SIGTERM)
        elif ending == "sigkill":
            proc.send_signal(signal.SIGKILL)
        # EOF on stderr: the trainer, its template and every worker have
        # closed it (they all write to it).
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, err


@pytest.mark.parametrize("workers", [1, 3])
@pytest.mark.parametrize("mid_epoch", [True, False], ids=["mid-epoch", "after-last-batch"])
@pytest.mark.parametrize("ending", ["close", "exit", "sigterm", "sigkill"])
def test_workers_stop_without_a_crash_dump(workers, mid_epoch, ending):
    code, err = _run_trainer(workers, ending, mid_epoch)
    expected = {"close": 0, "exit": 0, "sigterm": 143, "sigkill": -signal.SIGKILL}[ending]
    assert code == expected, f"exit {code}; stderr: {err}"
    marks = [m for m in CRASH_MARKS if m in err]
    assert not marks, f"{marks} on the trainer's terminal:\n{err}"
