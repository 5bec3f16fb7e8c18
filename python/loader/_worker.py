"""Worker process entry points.

``Loader.local`` starts its workers by forking them from the worker
template (``loader._template``: ``serve`` below runs in each fork), or, with
``multiprocessing_context="spawn"``, by re-executing the trainer's own
interpreter into ``main``. Either way the installed package is all that is
needed: the worker is compiled into ``loader._native`` (the same code as the
``loader-worker`` binary), and there is no executable to find or install.
It also serves jobs over Python datasets (``loader._source``). For a
deployment's remote workers that run a ``python: {...}`` job, start it with
the dataset's package installed:
``python -m loader._worker --coordinator URL --listen ADDR``.

Each worker leaves the trainer's process group first: a Ctrl-C typed in the
terminal interrupts only the trainer (``KeyboardInterrupt``, which the trainer
may catch and carry on), and the trainer stops its workers itself when its
loader closes. A worker whose trainer died without closing fences itself when
its lease expires (the coordinator died with the trainer).

A worker ends with ``os._exit``, never by finalizing the interpreter: when
the worker's Rust half returns, its producer thread may still be inside the
dataset's ``__getitem__`` (holding, or waiting for, the GIL), and finalizing
under it is what printed "Fatal Python error: PyGILState_Release",
"terminate called without an active exception" (C++ thread pools torn down
by exit handlers) and "generator already executing" on users' terminals.
Nothing of a worker needs finalizing: its batches live in the trainer's
memory, and the kernel releases the rest.
"""

import os
import sys

#: Environment variables that size the thread pools of the numeric
#: libraries a dataset may use, read when each library loads.
THREAD_VARIABLES = (
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "NUMEXPR_NUM_THREADS",
    "VECLIB_MAXIMUM_THREADS",
    "BLIS_NUM_THREADS",
)

#: The thread policy a worker runs under (``Loader.local(worker_threads=)``),
#: read by ``loader._source`` for libraries imported after start-up.
THREADS_VARIABLE = "LOADER_WORKER_THREADS"


def apply_thread_policy(threads: int) -> None:
    """Caps the intra-op threads of torch, OpenMP, MKL, OpenBLAS (and
    OpenCV) in this worker at ``threads``, as DataLoader's workers run torch
    with one: the workers are the parallelism, and N workers x N threads
    oversubscribe every core. 0 leaves every library's default. Libraries
    already loaded (a forked worker's torch) are set directly; the
    variables cover those loaded later."""
    if threads <= 0:
        os.environ[THREADS_VARIABLE] = "0"
        return
    os.environ[THREADS_VARIABLE] = str(threads)
    for name in THREAD_VARIABLES:
        os.environ[name] = str(threads)
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(threads)
    cv2 = sys.modules.get("cv2")
    if cv2 is not None and hasattr(cv2, "setNumThreads"):
        cv2.setNumThreads(threads)


def _leave_process_group() -> None:
    try:
        os.setpgid(0, 0)
    except OSError:
        pass  # already a group leader (or not allowed): nothing to gain


def _run(argv: list) -> int:
    # A worker's warnings about its trainer leaving (the normal end of a
    # local loader) would land in the user's terminal: errors only, unless
    # the user asked for more with RUST_LOG.
    os.environ.setdefault("RUST_LOG", "error")
    # Imported here, not at the top: nothing else of the package (numpy...)
    # is loaded into a spawned worker.
    from loader import _native

    return _native.run_worker(["loader-worker", *argv])


def _exit(code: int) -> None:
    """Leaves without finalizing the interpreter (see the module doc)."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(code)


def serve(argv: list, env_remove: list, threads: int) -> None:
    """A worker forked by the template: runs until stopped, then exits the
    process. Never returns."""
    code = 1
    try:
        _leave_process_group()
        for name in env_remove:
            os.environ.pop(name, None)
        apply_thread_policy(threads)
        code = _run(argv)
    except BaseException as e:  # noqa: BLE001 - one line, then out
        if not isinstance(e, (KeyboardInterrupt, SystemExit)):
            print(f"loader worker: {type(e).__name__}: {e}", file=sys.stderr)
    finally:
        _exit(code)


def main(threads: int = 1) -> int:
    """A spawned worker (a fresh interpreter): the thread policy first, so
    the variables are set before numpy or torch load; never returns."""
    code = 1
    try:
        apply_thread_policy(threads)
        _leave_process_group()
        code = _run(sys.argv[1:])
    except BaseException as e:  # noqa: BLE001 - one line, then out
        if not isinstance(e, (KeyboardInterrupt, SystemExit)):
            print(f"loader worker: {type(e).__name__}: {e}", file=sys.stderr)
    finally:
        _exit(code)
    return code


if __name__ == "__main__":
    main(int(os.environ.get(THREADS_VARIABLE, "1") or 0))
