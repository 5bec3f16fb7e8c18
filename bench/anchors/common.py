"""Shared bits of the anchor benchmarks: timing and the one-line JSON result."""

import json
import sys
import time


def report(system, samples, nbytes, seconds, first_batch_s, **extra):
    """Prints one JSON object, the same fields loaderctl --json prints."""
    out = {
        "system": system,
        "samples": samples,
        "bytes": nbytes,
        "seconds": seconds,
        "samples_per_s": samples / seconds if seconds > 0 else 0.0,
        "mb_per_s": nbytes / seconds / 1e6 if seconds > 0 else 0.0,
        "first_batch_s": first_batch_s,
    }
    out.update(extra)
    print(json.dumps(out))
    sys.stdout.flush()


class Timer:
    """Measures from the first next() call: time to first batch and total."""

    def __init__(self):
        self.start = time.perf_counter()
        self.first = None

    def batch(self):
        if self.first is None:
            self.first = time.perf_counter() - self.start

    def elapsed(self):
        return time.perf_counter() - self.start
