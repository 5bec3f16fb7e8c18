"""tf.data service on zero-compute samples: a dispatcher and N workers, each
sample a 3x224x224 uint8 tensor filled with (index % 251), batched by 64,
read with processing_mode="distributed_epoch" so each sample is produced
once. --mode inprocess runs the workers in this process (tf.data service's
local shortcut); --mode processes runs each worker in its own process (the
gRPC path)."""

import argparse
import os
import subprocess
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import tensorflow as tf  # noqa: E402

from common import Timer, report  # noqa: E402


def dataset(n, shape, batch):
    ds = tf.data.Dataset.range(n).shuffle(min(n, 10000), seed=0)

    def make(i):
        v = tf.cast(i % 251, tf.uint8)
        return tf.fill(shape, v), i

    return ds.map(make).batch(batch)


def worker_main(dispatcher, port):
    w = tf.data.experimental.service.WorkerServer(
        tf.data.experimental.service.WorkerConfig(dispatcher_address=dispatcher, port=port))
    w.join()


def wait_for_workers(dispatcher, n, limit_s=60):
    """Waits until n workers registered, so that, as for Loader, the clock
    starts with the workers already running."""
    deadline = time.time() + limit_s
    while time.time() < deadline:
        if dispatcher._num_workers() >= n:  # noqa: SLF001 (no public accessor)
            return
        time.sleep(0.05)
    raise SystemExit(f"tf.data service: {n} workers did not register in {limit_s}s")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=32000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--shape", default="3,224,224")
    p.add_argument("--mode", choices=["inprocess", "processes"], default="inprocess")
    p.add_argument("--worker-of", default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker_of:
        worker_main(a.worker_of, 0)
        return
    shape = [int(x) for x in a.shape.split(",")]
    dispatcher = tf.data.experimental.service.DispatchServer(
        tf.data.experimental.service.DispatcherConfig(port=0))
    address = dispatcher.target.split("://")[1]
    children = []
    workers = []
    try:
        if a.mode == "inprocess":
            for _ in range(a.workers):
                workers.append(tf.data.experimental.service.WorkerServer(
                    tf.data.experimental.service.WorkerConfig(dispatcher_address=address)))
        else:
            for _ in range(a.workers):
                children.append(subprocess.Popen(
                    [sys.executable, __file__, "--worker-of", address],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
            wait_for_workers(dispatcher, a.workers)
        ds = dataset(a.samples, shape, a.batch_size).apply(
            tf.data.experimental.service.distribute(
                processing_mode="distributed_epoch", service=dispatcher.target))
        t = Timer()
        samples = nbytes = 0
        for data, label in ds:
            t.batch()
            samples += int(data.shape[0])
            nbytes += int(tf.size(data)) + int(tf.size(label)) * 8
        report(f"tf.data service ({a.mode})", samples, nbytes, t.elapsed(), t.first,
               workers=a.workers)
    finally:
        for c in children:
            c.kill()
            c.wait()


if __name__ == "__main__":
    main()
