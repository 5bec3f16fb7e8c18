"""The worker template: one process per trainer process that forks
``Loader.local``'s workers.

A fresh interpreter takes seconds to import torch and torchvision; a
DataLoader's workers skip that because they are forks of the trainer, which
has imported everything already, but they are forked from a process full of
threads (torch's pools, CUDA's, the user's), which is how forked workers
deadlock. The template takes the first half without the second: at the
first ``Loader.local`` the trainer forks it once (before Loader itself has
started any thread, and with the trainer's buffered output flushed), and it
then runs one thread that only waits for requests and forks workers. So a
worker starts in milliseconds with torch, the dataset's modules and the
trainer's imports already loaded, its thread policy applied, and later
loaders in the same process reuse the template.

What the template holds: a copy-on-write snapshot of the trainer as it was
at that first ``Loader.local`` (its imported modules, and whatever objects
the trainer held then, shared with the trainer until either writes them).
It forks; it never runs the dataset, the model or any user code. It stops
its workers and exits when the trainer's end of its socket closes (the
trainer exited or was killed): no process is watched by pid.

The protocol (JSON lines) is described in ``python/src/template.rs``,
whose ``WorkerTemplate`` is the trainer's end.
"""

from __future__ import annotations

import gc
import json
import os
import select
import signal
import socket
import sys
import threading
import warnings
from typing import Optional

from . import _cache

#: How long stopping workers get between SIGTERM and SIGKILL when the
#: trainer goes away.
_STOP_GRACE_S = 1.0

_lock = threading.Lock()
_template = None  # the WorkerTemplate of this process, once started


def get():
    """This process's template (``loader._native.WorkerTemplate``), started
    on first use, or again if it exited or this process is a fork of the
    one that started it."""
    global _template
    with _lock:
        if _template is None or _template[0] != os.getpid() or not _template[1].alive():
            _template = (os.getpid(), _start())
        return _template[1]


def _start():
    from . import _native

    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    # Output buffered in this process would be written again by the
    # template's children: out first.
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    with warnings.catch_warnings():
        # Python 3.12+ warns about forking a process with threads; the
        # template runs none of them, and forks only from its own one.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:
        code = 0
        try:
            ours.close()
            _serve(theirs)
        except BaseException:  # noqa: BLE001 - the template says nothing
            code = 1
        finally:
            os._exit(code)
    theirs.close()
    return _native.WorkerTemplate(ours.detach(), pid)


def _serve(sock: socket.socket) -> None:
    """The template's loop: fork workers on request, reap them, report
    their exits, stop them all when the trainer's end closes."""
    try:
        os.setpgid(0, 0)  # Ctrl-C in the terminal is for the trainer alone
    except OSError:
        pass
    # The trainer's handlers are not the template's.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # Objects the trainer had stay shared with it: the collector must not
    # touch (and so copy) their pages in every fork.
    gc.freeze()
    wake_r, wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    live: set[int] = set()
    # Descriptors that came with the trainer's lines (a loader's sample
    # cache), taken in order by the spawn lines that say they carry one.
    fds: list[int] = []
    buf = b""
    try:
        while True:
            try:
                ready, _, _ = select.select([sock, wake_r], [], [], 1.0)
            except InterruptedError:
                ready = []
            if wake_r in ready:
                try:
                    while os.read(wake_r, 512):
                        pass
                except BlockingIOError:
                    pass
            _reap(sock, live)
            if sock not in ready:
                continue
            data, received, _, _ = socket.recv_fds(sock, 1 << 16, 4)
            fds.extend(received)
            if not data:
                return  # the trainer is gone
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                _handle(sock, json.loads(line), live, (wake_r, wake_w), fds)
    finally:
        for fd in fds:
            os.close(fd)
        _stop(live)


def _handle(sock: socket.socket, request: dict, live: set, wake: tuple, fds: list) -> None:
    if "signal" in request:
        pid, signo = request["signal"]
        if pid in live:
            try:
                os.kill(pid, signo)
            except ProcessLookupError:
                pass
        return
    spawn = request.get("spawn")
    if spawn is None:
        return
    cache = spawn.get("cache")
    cache_fd = None
    if cache is not None:
        if not fds:
            _send(sock, {"error": "the sample cache's descriptor did not come with the request"})
            return
        cache_fd = fds.pop(0)
    try:
        threads = os.listdir("/proc/self/task") if os.path.isdir("/proc/self/task") else ["1"]
        if len(threads) != 1:
            # Nothing in the template starts threads; if something did, a
            # fork could inherit a lock held by one of them.
            _send(sock, {"error": f"the template runs {len(threads)} threads; forking is not safe"})
            return
        pid = os.fork()
        if pid == 0:
            for fd in fds:  # other loaders' caches, not this worker's
                os.close(fd)
            if cache_fd is not None:
                os.environ[_cache.CACHE_VARIABLE] = json.dumps({"fd": cache_fd, "entries": int(cache["entries"])})
            for name, value in spawn.get("env", {}).items():
                os.environ[str(name)] = str(value)
            _child(sock, wake, spawn)
        live.add(pid)
        _send(sock, {"spawned": pid})
    finally:
        # The worker has its own copy; the trainer holds the cache.
        if cache_fd is not None:
            os.close(cache_fd)


def _child(sock: socket.socket, wake: tuple, spawn: dict) -> None:
    """In a fresh fork: drop the template's plumbing, become a worker."""
    try:
        signal.set_wakeup_fd(-1)
        for signo in (signal.SIGCHLD, signal.SIGINT, signal.SIGTERM):
            signal.signal(signo, signal.SIG_DFL)
        sock.close()
        for fd in wake:
            os.close(fd)
        # The worker prints its address on stdout, for a parent that reads
        # it: nobody does here.
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.close(null)
        # The trainer's objects stay frozen: a worker's collections never
        # walk (and so copy) them.
        from . import _worker

        threads = int(spawn["threads"])
    except BaseException:  # noqa: BLE001
        os._exit(1)
    _worker.serve(list(spawn.get("argv", [])[1:]), list(spawn.get("env_remove", [])), threads)


def _reap(sock: Optional[socket.socket], live: set) -> None:
    while live:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        if pid in live:
            live.discard(pid)
            if sock is not None:
                _send(sock, {"exited": pid, "status": _describe(status)})


def _describe(status: int) -> str:
    if os.WIFSIGNALED(status):
        signo = os.WTERMSIG(status)
        try:
            name = signal.Signals(signo).name
        except ValueError:
            name = "?"
        return f"signal: {signo} ({name})"
    return f"exit status: {os.waitstatus_to_exitcode(status)}"


def _send(sock: socket.socket, message: dict) -> None:
    try:
        sock.sendall(json.dumps(message).encode() + b"\n")
    except OSError:
        pass  # the trainer is gone; the loop sees it next


def _stop(live: set) -> None:
    """SIGTERM every worker, SIGKILL those left after the grace period."""
    import time

    for pid in list(live):
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            live.discard(pid)
    deadline = time.monotonic() + _STOP_GRACE_S
    while live and time.monotonic() < deadline:
        _reap(None, live)
        time.sleep(0.01)
    for pid in list(live):
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass
