"""Where the device path's start-up goes, and how fast a worker fills a
batch alone: the two questions the GPU check's part 2 left open (images
reached the GPU at 70-91% of host delivery in short runs, 87-91% in long
ones).

For images (3x224x224 uint8, batch 256, the check's ring) it prints, per
path (loaderctl and the Python SDK, host and device, taking turns):
start-up (open to the first batch), the steady rate after the first batch,
and the whole-run rate the check reports; then loaderctl's host rate with
1, 2, 4 and 8 workers and the page faults of each run (a worker's fill
alone, and whether it scales with workers on this machine).

    python3 bench/gpu_startup.py --loaderctl L [--device cuda:0] [--batches 192]
        [--ring-slots 12,16,24] [--no-workers-sweep]

--ring-slots repeats the device/host pairs with rings of that many 40 MiB
slots (the check's is 12): the device stage holds each slot until its
copy completed, so a ring sized for host delivery leaves the workers
fewer slots on the device path.

With --device host it runs where there is no GPU (the SDK's host backend
and loaderctl --device cpu stand in).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import loader

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_check  # noqa: E402  (the check's images workload, one definition)

BATCH = gpu_check.IMAGE_BATCH
BATCH_BYTES = BATCH * gpu_check.IMAGE_SHAPE[0] * gpu_check.IMAGE_SHAPE[1] * gpu_check.IMAGE_SHAPE[2]


def spec(batches: int) -> dict:
    return gpu_check.image_spec(batches)


def ctl(binary: str, device: str, batches: int, workers: int) -> dict:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    out = subprocess.run(
        [binary, "run", "--json", "--workers", str(workers), "--device", device]
        + gpu_check.loaderctl_args("images", batches, ""),
        capture_output=True, text=True, timeout=300, check=True,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    steady = (r["bytes"] - BATCH_BYTES) / max(r["seconds"] - r["first_batch_s"], 1e-9) / 1e9
    return {
        "process_s": wall,
        "first_batch_s": r["first_batch_s"],
        "whole_gbps": r["mb_per_s"] / 1e3,
        "steady_gbps": steady,
        "faults": after.ru_minflt - before.ru_minflt,
        "cpu_s": (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime),
    }


def py(device: str | None, batches: int, workers: int) -> dict:
    torch = None
    if device is not None and device.startswith("cuda"):
        import torch  # noqa: F811
    more = {} if device is None else {"device": device}
    t0 = time.perf_counter()
    dl = loader.Loader.local(spec(batches), workers=workers, **gpu_check.options("images"), **more)
    opened = time.perf_counter() - t0
    first = None
    nbytes = 0
    with dl:
        for batch in dl:
            if torch is not None:
                tensors = batch.torch()
                torch.cuda.synchronize()
            else:
                tensors = batch.numpy()
            if first is None:
                first = time.perf_counter()
                continue
            nbytes += BATCH_BYTES
            del tensors, batch
        end = time.perf_counter()
    closed = time.perf_counter()
    return {
        "open_s": opened,
        "first_batch_s": first - t0,
        "steady_gbps": nbytes / (end - first) / 1e9,
        "whole_gbps": (nbytes + BATCH_BYTES) / (end - t0) / 1e9,
        "close_s": closed - end,
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--loaderctl", required=True)
    p.add_argument("--device", default="cuda:0")
    p.add_argument("--batches", type=int, default=192)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--ring-slots", default=str(gpu_check.IMAGE_RING[0]), help="comma-separated slot counts to try")
    p.add_argument("--no-workers-sweep", action="store_true")
    args = p.parse_args()
    on_host = args.device == "host"
    slot_size = gpu_check.IMAGE_RING[1]
    for slots in (int(x) for x in args.ring_slots.split(",")):
        gpu_check.IMAGE_RING = (slots, slot_size)
        for r in range(args.repeats):
            for on_device in ((True, False) if r % 2 == 0 else (False, True)):
                dev = args.device if on_device else "cpu"
                if on_host and on_device:
                    dev = "cpu"
                where = "device" if on_device else "host"
                for path, m in (
                    ("loaderctl", ctl(args.loaderctl, dev, args.batches, 4)),
                    ("python", py(args.device if on_device else None, args.batches, 4)),
                ):
                    print(json.dumps({"path": path, "on": where, "slots": slots, "repeat": r, **{k: round(v, 4) for k, v in m.items()}}), flush=True)
    if args.no_workers_sweep:
        return 0
    for workers in (1, 2, 4, 8):
        m = ctl(args.loaderctl, "cpu", args.batches, workers)
        print(json.dumps({"path": "loaderctl", "on": "host", "workers": workers, **{k: round(v, 4) for k, v in m.items()}}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
