"""Worker process entry point (``main``; ``Loader.local`` starts it with
``--coordinator URL --listen ADDR``).

``Loader.local`` starts its workers by re-executing the trainer's own
interpreter into this module, so the installed package is all that is needed:
the worker is compiled into ``loader._native`` (the same code as the
``loader-worker`` binary), and there is no executable to find or install.
It also serves jobs over Python datasets (``loader._source``). For a
deployment's remote workers that run a ``python: {factory: ...}`` job, start
it with the factory's package installed:
``python -m loader._worker --coordinator URL --listen ADDR``.

Each worker leaves the trainer's process group first: a Ctrl-C typed in the
terminal interrupts only the trainer (``KeyboardInterrupt``, which the trainer
may catch and carry on), and the trainer stops its workers itself when its
loader closes. A worker whose trainer died without closing fences itself when
its lease expires (the coordinator died with the trainer).
"""

import os
import sys


def main() -> int:
    # A worker's warnings about its trainer leaving (the normal end of a
    # local loader) would land in the user's terminal: errors only, unless
    # the user asked for more with RUST_LOG.
    os.environ.setdefault("RUST_LOG", "error")
    try:
        os.setpgid(0, 0)
    except OSError:
        pass  # already a group leader (or not allowed): nothing to gain
    # Imported here, not at the top: nothing else of the package (numpy...)
    # is loaded into a worker.
    from loader import _native

    return _native.run_worker(["loader-worker", *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())
