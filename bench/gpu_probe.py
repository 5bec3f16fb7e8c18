"""Where the device path's time goes (the open gap of bench/gpu_check.py:
38.5 MB image batches reach the GPU slower than they reach host memory).

Runs on a machine with an NVIDIA GPU, next to gpu_check.py, with the same
workload (synthetic 3x224x224 uint8, batch 256, ring 12 x 40 MiB):

1. loaderctl (Rust) GB/s, host vs cuda:0, 4 and 8 workers, interleaved
   repeats, with the trainer's wait p50/p99 and CPU per batch: if 8
   workers lift the host rate and not the device rate, the stage bounds it;
2. the Python SDK the same, and device_prefetch 4, with the time per batch
   spent in next() and in batch.torch();
3. one profiled Python device run (torch.profiler, CUPTI sees every copy
   in the process, the SDK's own stream too): the copies' kind (pinned or
   pageable), their time, and the gaps between them.

    python3 bench/gpu_probe.py --loaderctl target/release/loaderctl [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import loader

SHAPE = (3, 224, 224)
BATCH = 256
RING = (12, 40 << 20)
PREFETCH = 2


def spec(batches: int) -> dict:
    return {
        "dataset": {"synthetic": {"num_samples": BATCH * batches, "shape": list(SHAPE), "dtype": "uint8"}},
        "batch_size": BATCH,
        "epochs": 1,
        "sampler": {"shuffle": True, "seed": 1},
    }


def rust(ctl: str, device: str, workers: int, batches: int) -> dict:
    shape = ",".join(map(str, SHAPE))
    out = subprocess.run(
        [ctl, "run", "--json", "--workers", str(workers), "--device", device, "--prefetch", str(PREFETCH),
         "--samples", str(BATCH * batches), "--shape", shape, "--batch-size", str(BATCH), "--ring", f"{RING[0]},{RING[1]}"],
        capture_output=True, text=True, timeout=300, check=True,
    )
    for line in out.stderr.splitlines():
        if "regist" in line or "WARN" in line or "staging" in line:
            print(f"  loaderctl stderr: {line}", flush=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def python(torch, device: str | None, workers: int, batches: int, device_prefetch: int) -> dict:
    more = {} if device is None else {"device": device, "device_prefetch": device_prefetch}
    in_next = in_torch = 0.0
    nbytes, n, started = 0, 0, None
    with loader.Loader.local(spec(batches), workers=workers, prefetch=PREFETCH, ring=RING, **more) as dl:
        it = iter(dl)
        while True:
            t0 = time.perf_counter()
            try:
                batch = next(it)
            except StopIteration:
                break
            t1 = time.perf_counter()
            tensors = batch.torch()
            t2 = time.perf_counter()
            if started is None:
                torch.cuda.synchronize()
                started = time.perf_counter()
                continue
            in_next += t1 - t0
            in_torch += t2 - t1
            n += 1
            nbytes += sum(t.numel() * t.element_size() for t in tensors.values())
            del batch, tensors
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
    return {"gb_per_s": nbytes / elapsed / 1e9, "next_ms": in_next / n * 1e3, "torch_ms": in_torch / n * 1e3}


def profiled(torch, out_dir: str | None, batches: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    with loader.Loader.local(spec(batches), workers=4, prefetch=PREFETCH, ring=RING, device="cuda:0") as dl:
        it = iter(dl)
        for _ in range(8):  # warm: the ring's pages, the pool's buffers
            next(it).torch()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for batch in it:
                tensors = batch.torch()
                del batch, tensors
            torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=12), flush=True)
    copies = []
    for e in prof.events():
        name = e.name or ""
        if "Memcpy" in name or "memcpy" in name:
            copies.append(e)
    if out_dir:
        prof.export_chrome_trace(os.path.join(out_dir, "device_trace.json"))
    kinds = {}
    for e in copies:
        kinds[e.name] = kinds.get(e.name, 0) + 1
    print(f"copy events by name: {kinds}", flush=True)
    spans = sorted((e.time_range.start, e.time_range.end) for e in copies if e.device_type.name == "CUDA")
    if len(spans) > 2:
        dur = [(b - a) / 1e3 for a, b in spans]
        gaps = [(spans[i + 1][0] - spans[i][1]) / 1e3 for i in range(len(spans) - 1)]
        print(
            f"device copies: {len(spans)}, each {statistics.median(dur):.2f} ms median "
            f"(max {max(dur):.2f}); gap to the next {statistics.median(gaps):.2f} ms median (max {max(gaps):.2f})",
            flush=True,
        )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--loaderctl", required=True)
    p.add_argument("--batches", type=int, default=384)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    import torch

    print(f"GPU: {torch.cuda.get_device_name(0)}, {os.cpu_count()} CPUs", flush=True)
    print("1. loaderctl, GB/s (wait p50/p99 us, trainer CPU us/batch)", flush=True)
    rows: dict[tuple, list] = {}
    for _ in range(args.repeats):
        for workers in (4, 8):
            for device in ("cpu", "cuda:0"):
                r = rust(args.loaderctl, device, workers, args.batches)
                rows.setdefault((device, workers), []).append(r)
    for (device, workers), rs in rows.items():
        gb = [r["mb_per_s"] / 1e3 for r in rs]
        print(
            f"  {device:7} workers {workers}: {' '.join(f'{g:.2f}' for g in gb)} GB/s; wait p50 "
            f"{statistics.median(r['wait_p50_us'] for r in rs):.0f} p99 {statistics.median(r['wait_p99_us'] for r in rs):.0f}; "
            f"trainer CPU {statistics.median(r['trainer_cpu_us_per_batch'] for r in rs):.0f}",
            flush=True,
        )
    print("2. Python SDK, GB/s (ms per batch in next() / in torch())", flush=True)
    configs = [(None, 4, 2), ("cuda:0", 4, 2), ("cuda:0", 4, 4), (None, 8, 2), ("cuda:0", 8, 2)]
    prow: dict[tuple, list] = {}
    for _ in range(args.repeats):
        for c in configs:
            prow.setdefault(c, []).append(python(torch, c[0], c[1], args.batches, c[2]))
    for (device, workers, dp), rs in prow.items():
        print(
            f"  {device or 'host':7} workers {workers} device_prefetch {dp}: "
            + " ".join(f"{r['gb_per_s']:.2f} ({r['next_ms']:.2f}/{r['torch_ms']:.2f})" for r in rs),
            flush=True,
        )
    print("3. profiled Python device run", flush=True)
    try:
        profiled(torch, args.out, 96)
    except Exception as e:  # the numbers above stand without it
        print(f"  the profiled run failed: {e!r}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
