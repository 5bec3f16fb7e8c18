"""The process around the loaders: every loader not yet closed is closed
at interpreter exit, and SIGTERM is made an exit that closes them too, so
no worker process outlives the trainer however it stops.

At exit (``atexit`` runs while the interpreter is still whole, before
modules and threads are torn down) each open loader is closed, even when
a daemon thread is still blocked iterating it (``close()`` unblocks it),
then the threads stopping the workers a restart left behind are joined
for a grace period, then the trainer's trace spans are flushed.
"""

from __future__ import annotations

import atexit
import signal
import threading
import weakref
from typing import Any, Callable

from . import _native

#: Seconds interpreter exit waits for a restart's old workers to stop.
_CLOSING_GRACE = 5.0

# Loaders not yet closed, closed at exit.
_live: "weakref.WeakSet[Any]" = weakref.WeakSet()

# Threads stopping the workers a restart left behind; joined at exit.
_closing: "weakref.WeakSet[threading.Thread]" = weakref.WeakSet()


def track(loader: Any) -> None:
    """Closes ``loader`` at exit unless it was closed before
    (``forget``), and makes SIGTERM an exit that does so."""
    _live.add(loader)
    _stop_on_sigterm()


def forget(loader: Any) -> None:
    """``loader`` closed itself: exit has nothing to do for it."""
    _live.discard(loader)


def close_in_background(close: Callable[[], None], name: str) -> None:
    """Runs ``close`` (stopping a restart's old workers) on a thread of its
    own, which exit waits for within the grace period."""
    closing = threading.Thread(target=close, name=name, daemon=True)
    _closing.add(closing)
    closing.start()


def _stop_on_sigterm() -> None:
    """Makes SIGTERM (how Kubernetes and most supervisors stop a process)
    raise ``SystemExit(143)`` instead of killing the interpreter outright,
    so open loaders are closed on the way out (``_close_all``): their worker
    processes stop and nothing is left behind. Only over the default action
    (a handler the program set is left alone) and only from the main thread,
    where Python allows it. SIGINT already raises KeyboardInterrupt."""
    if threading.current_thread() is not threading.main_thread():
        return
    try:
        if signal.getsignal(signal.SIGTERM) is signal.SIG_DFL:
            signal.signal(signal.SIGTERM, _exit_on_sigterm)
    except (ValueError, OSError):
        pass


def _exit_on_sigterm(signum, frame) -> None:
    raise SystemExit(128 + signum)


@atexit.register
def _close_all() -> None:
    for loader in list(_live):
        try:
            loader.close()
        except Exception:
            pass
    for closing in list(_closing):
        closing.join(_CLOSING_GRACE)
    # After the loaders closed: their last batches' spans are in, and go out
    # to the OTLP endpoint now (a no-op unless trace export is on).
    _native.flush_telemetry()
