"""Shared helpers for the SDK's tests: job specs, the ring's mapping, and
child Python processes for the signal and exit tests.

Every test starts real worker processes (``python -m loader._worker``) and
bounds its own time."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap
import time
from typing import Optional

import pytest

# The Rust coordinator and worker, for tests that run a deployment of them.
DEBUG = pathlib.Path(__file__).resolve().parents[2] / "target" / "debug"
SERVER = pathlib.Path(os.environ.get("LOADER_SERVER", DEBUG / "loader-server"))
WORKER = pathlib.Path(os.environ.get("LOADER_WORKER", DEBUG / "loader-worker"))

LOADERCTL = pathlib.Path(os.environ.get("LOADERCTL", DEBUG / "loaderctl"))

needs_binaries = pytest.mark.skipif(
    not (SERVER.exists() and WORKER.exists()),
    reason=f"no loader-server / loader-worker in {DEBUG} (cargo build --workspace builds them)",
)


def synthetic(
    num_samples: int = 100,
    shape=(3, 4),
    batch_size: int = 16,
    epochs: int = 1,
    shuffle: bool = False,
    seed: int = 0,
    cost_ns: int = 0,
    dtype: str = "uint8",
) -> dict:
    """A synthetic job spec in the spec-file schema."""
    return {
        "dataset": {
            "synthetic": {
                "num_samples": num_samples,
                "shape": list(shape),
                "dtype": dtype,
                "cost_ns": cost_ns,
            }
        },
        "batch_size": batch_size,
        "epochs": epochs,
        "sampler": {"shuffle": shuffle, "seed": seed},
    }


def expected_data(index: int, row_len: int) -> bytes:
    """The ``data`` row the synthetic dataset writes for sample ``index``:
    ``index % 251`` everywhere, the index in little-endian in front."""
    row = bytearray([index % 251]) * row_len
    head = min(8, row_len)
    row[:head] = index.to_bytes(8, "little")[:head]
    return bytes(row)


def ring_mappings() -> list[tuple[int, int]]:
    """``(start, end)`` of this process's mappings of the ring memfd."""
    out = []
    with open("/proc/self/maps") as f:
        for line in f:
            if "memfd:loader-ring" in line:
                start, end = line.split()[0].split("-")
                out.append((int(start, 16), int(end, 16)))
    return out


def alive(pid: int) -> bool:
    """True while a process with ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


#: x86_64 and aarch64 numbers of the system calls a thread waits in
#: (futex, epoll_wait, epoll_pwait, poll, ppoll, select, pselect6).
WAITING_SYSCALLS = {
    "x86_64": {202, 232, 281, 7, 271, 23, 270},
    "aarch64": {98, 22, 73, 72},
}


def wait_blocked(pid: int, tid: Optional[int] = None, timeout: float = 10.0) -> None:
    """Waits until thread ``tid`` of ``pid`` (its main thread by default)
    sits in a waiting system call, seen twice in a row 20 ms apart: it is
    blocked, not between two steps. Fails the test after ``timeout``."""
    import platform

    waiting = WAITING_SYSCALLS.get(platform.machine())
    if waiting is None:
        pytest.skip(f"no list of waiting system calls for {platform.machine()}")
    path = f"/proc/{pid}/task/{tid or pid}/syscall"
    deadline = time.monotonic() + timeout
    seen = 0
    while time.monotonic() < deadline:
        try:
            with open(path) as f:
                first = f.read().split(maxsplit=1)[0]
        except (FileNotFoundError, IndexError):
            first = ""
        seen = seen + 1 if first.isdigit() and int(first) in waiting else 0
        if seen == 2:
            return
        time.sleep(0.02)
    pytest.fail(f"thread {tid or pid} of process {pid} did not block within {timeout}s")


def wait_gone(pids, timeout: float) -> list[int]:
    """Waits until none of ``pids`` is alive; returns those still alive."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        left = [p for p in pids if alive(p)]
        if not left:
            return []
        time.sleep(0.05)
    return [p for p in pids if alive(p)]


class Child:
    """A Python script running in a child process, read line by line."""

    def __init__(self, source: str):
        # Ctrl-C as at a terminal: a suite started in the background (`cmd
        # &` in a script) passes SIGINT on ignored, and a Python started so
        # raises no KeyboardInterrupt (the Ctrl-C tests then failed for how
        # the suite was started, not for Loader).
        prelude = "import signal\nsignal.signal(signal.SIGINT, signal.default_int_handler)\n"
        self.proc = subprocess.Popen(
            [sys.executable, "-u", "-c", prelude + textwrap.dedent(source)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        # Bytes read from stdout that are not yet a whole line.
        self._pending = b""

    def expect(self, prefix: str, timeout: float = 30.0) -> str:
        """The next stdout line, which must start with ``prefix``.

        Lines are cut from bytes read straight from the pipe: a buffered
        ``readline`` after ``select`` can take two lines into its buffer at
        once, and the next ``select`` then waits for bytes that already came
        (this failed 1 run in 6 when a child printed two lines 10 ms apart).
        """
        import selectors

        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        deadline = time.monotonic() + timeout
        while b"\n" not in self._pending:
            left = deadline - time.monotonic()
            chunk = os.read(self.proc.stdout.fileno(), 65536) if left > 0 and sel.select(left) else b""
            if not chunk:
                self.kill()
                pytest.fail(f"no {prefix!r} line within {timeout}s; stderr: {self.stderr()}")
            self._pending += chunk
        raw, self._pending = self._pending.split(b"\n", 1)
        line = raw.decode().strip()
        if not line.startswith(prefix):
            self.kill()
            pytest.fail(f"expected {prefix!r}, got {line!r}; stderr: {self.stderr()}")
        return line[len(prefix):].strip()

    def wait(self, timeout: float) -> Optional[int]:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def stderr(self) -> str:
        if self.proc.poll() is None:
            return "(still running)"
        return self.proc.stderr.read()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def child():
    """Children started by a test, killed at its end whatever happened."""
    started: list[Child] = []

    def start(source: str) -> Child:
        c = Child(source)
        started.append(c)
        return c

    yield start
    for c in started:
        c.kill()


def read_line(proc: subprocess.Popen, prefix: str, timeout: float) -> str:
    """The first stdout line of `proc` starting with `prefix`, within `timeout`."""
    import selectors

    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while time.monotonic() < deadline:
            if not sel.select(max(0.0, deadline - time.monotonic())):
                break
            line = proc.stdout.readline()
            if not line:
                break
            if line.startswith(prefix):
                return line[len(prefix):].strip()
    pytest.fail(f"no {prefix!r} line within {timeout}s from {proc.args[0]}")
