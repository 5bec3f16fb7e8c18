"""The GPU check behind bench/gpu_check.sh: one table of
(1) correctness: for every batch of an epoch, the device bytes equal the
    host batch bytes, through loaderctl (Rust) and the Python SDK (torch);
(2) GB/s delivered to the GPU by Loader's device path, next to the same
    path delivering to host memory (the device stage must keep >= 90% of
    it: the workers' production bounds an end-to-end rate, not the copy),
    torch DataLoader(pin_memory=True) + .cuda(non_blocking=True), and a raw
    pinned cudaMemcpyAsync loop (the copy's ceiling, for scale), in the
    same run, for 3x224x224 uint8 at batch 256 and tokens (2048 x uint16)
    at batch 64 (Loader's rates: medians of 3 runs, device and host taking
    turns);
(3) overlap: a matmul-loop training step, sized to take longer than the
    slower loader's time per batch (so either could keep up), fed by each
    loader: GPU idle time per step is then what a loader does not overlap
    with the step (its copy, its hand-over), start-up left out.

With --mode host (no GPU here) only (1) runs, against the device path's
host backend (device="host"): the same stage, pool, events and ordering,
with host memory standing in for the device.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

import loader

IMAGE_SHAPE = (3, 224, 224)
IMAGE_BATCH = 256
TOKENS_CONTEXT = 2048
TOKENS_BATCH = 64
WORKERS = 4
# A 256-image batch (38.5 MB) is larger than the ring's default slot limit
# (16 MiB, above which batches stream over gRPC): give the ring slots of
# 40 MiB, and few credits per worker so it stays a few hundred MB.
IMAGE_RING = (12, 40 << 20)
PREFETCH = 2
# Rates run this many times the correctness check's batches, each path
# RATE_REPEATS times (medians).
RATE_RUNS = 8
RATE_REPEATS = 3
# Part (3): steps timed, after batches left untimed (start-up).
OVERLAP_STEPS = 40
OVERLAP_WARM = 4


def log(msg: str) -> None:
    print(f"gpu_check: {msg}", file=sys.stderr, flush=True)


# -- workloads ---------------------------------------------------------------


def image_spec(batches: int) -> dict:
    return {
        "dataset": {"synthetic": {"num_samples": IMAGE_BATCH * batches, "shape": list(IMAGE_SHAPE), "dtype": "uint8"}},
        "batch_size": IMAGE_BATCH,
        "epochs": 1,
        "sampler": {"shuffle": True, "seed": 1},
    }


def tokens_file(directory: str, batches: int) -> str:
    path = os.path.join(directory, "tokens.bin")
    rng = np.random.default_rng(0)
    tokens = rng.integers(0, 50_000, size=(TOKENS_CONTEXT + 1) * TOKENS_BATCH * batches + 1, dtype=np.uint16)
    tokens.tofile(path)
    return path


def tokens_spec(path: str) -> dict:
    return {
        "dataset": {"tokens": {"path": path, "dtype": "uint16", "context_length": TOKENS_CONTEXT}},
        "batch_size": TOKENS_BATCH,
        "epochs": 1,
        "sampler": {"shuffle": True, "seed": 1},
    }


def loaderctl_args(workload: str, batches: int, tokens: str) -> list[str]:
    common = ["--prefetch", str(PREFETCH)]
    if workload == "images":
        shape = ",".join(map(str, IMAGE_SHAPE))
        ring = f"{IMAGE_RING[0]},{IMAGE_RING[1]}"
        return common + ["--samples", str(IMAGE_BATCH * batches), "--shape", shape, "--batch-size", str(IMAGE_BATCH), "--ring", ring]
    return common + ["--dataset", "tokens", "--path", tokens, "--context-length", str(TOKENS_CONTEXT), "--batch-size", str(TOKENS_BATCH)]


def options(workload: str, **more) -> dict:
    """The Python loader's options for `workload`, as loaderctl's above."""
    out = {"prefetch": PREFETCH, **more}
    if workload == "images":
        out["ring"] = IMAGE_RING
    return out


# -- (1) correctness -----------------------------------------------------------


def rust_correct(ctl: str, device: str, workload: str, batches: int, tokens: str, tmp: str) -> tuple[bool, str]:
    sums = {}
    for dev in ("cpu", device):
        path = os.path.join(tmp, f"{workload}-{dev}.sums")
        out = subprocess.run(
            [ctl, "run", "--json", "--workers", str(WORKERS), "--device", dev, "--checksum", path]
            + loaderctl_args(workload, batches, tokens),
            capture_output=True,
            text=True,
            timeout=600,
        )
        if out.returncode != 0:
            return False, f"loaderctl --device {dev} failed: {out.stderr.strip().splitlines()[-1:]}"
        with open(path) as f:
            sums[dev] = f.read().splitlines()
    same = sums["cpu"] == sums[device] and len(sums["cpu"]) > 0
    return same, f"{len(sums[device])} batches" + ("" if same else " DIFFER")


def py_correct(device: str, spec: dict, opts: dict) -> tuple[bool, str]:
    torch = None
    if device.startswith("cuda"):
        import torch  # noqa: F811
    n, bad = 0, 0
    with loader.Loader.local(spec, workers=WORKERS, **opts) as host, loader.Loader.local(
        spec, workers=WORKERS, device=device, **opts
    ) as dev:
        for h, d in zip(host, dev, strict=True):
            if h.seq != d.seq:
                return False, f"batch {n}: seq {h.seq} on the host, {d.seq} on the device"
            if torch is not None:
                got = {k: t.cpu().numpy() for k, t in d.torch().items()}
            else:
                got = {k: np.asarray(v) for k, v in d.numpy().items()}
            for name in h.keys():
                if not np.array_equal(np.asarray(h[name]), got[name]):
                    bad += 1
            n += 1
            del h, d, got
    return bad == 0 and n > 0, f"{n} batches" + ("" if bad == 0 else f", {bad} tensors DIFFER")


# -- (2) H2D GB/s ----------------------------------------------------------------


def rust_rate(ctl: str, device: str, workload: str, batches: int, tokens: str) -> float:
    out = subprocess.run(
        [ctl, "run", "--json", "--workers", str(WORKERS), "--device", device] + loaderctl_args(workload, batches, tokens),
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])["mb_per_s"] / 1e3


def py_rate(torch, device: str | None, spec: dict, opts: dict) -> float:
    """GB/s the Python SDK delivers on `device` (None: host batches, the
    same path without the device stage), the clock stopped before close."""
    nbytes, started = 0, None
    more = {} if device is None else {"device": device}
    with loader.Loader.local(spec, workers=WORKERS, **more, **opts) as dl:
        for batch in dl:
            tensors = batch.torch()
            if started is None:
                torch.cuda.synchronize()
                started = time.perf_counter()
                continue
            nbytes += sum(t.numel() * t.element_size() for t in tensors.values())
        torch.cuda.synchronize()
        elapsed = time.perf_counter() - started
    return nbytes / elapsed / 1e9


class _Synthetic:
    """What torch's DataLoader loads: the same shapes, zero compute."""

    def __init__(self, shape: tuple[int, ...], dtype, n: int):
        self.shape, self.dtype, self.n = shape, dtype, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        import torch

        return torch.full(self.shape, i % 251, dtype=self.dtype), i


def torch_loader(torch, workload: str, batches: int):
    from torch.utils.data import DataLoader

    if workload == "images":
        ds, bs = _Synthetic(IMAGE_SHAPE, torch.uint8, IMAGE_BATCH * batches), IMAGE_BATCH
    else:
        ds, bs = _Synthetic((TOKENS_CONTEXT + 1,), torch.uint16 if hasattr(torch, "uint16") else torch.int16, TOKENS_BATCH * batches), TOKENS_BATCH
    return DataLoader(ds, batch_size=bs, num_workers=WORKERS, pin_memory=True, persistent_workers=False)


def torch_rate(torch, workload: str, batches: int) -> float:
    nbytes, started = 0, None
    for data, labels in torch_loader(torch, workload, batches):
        data, labels = data.cuda(non_blocking=True), labels.cuda(non_blocking=True)
        if started is None:
            torch.cuda.synchronize()
            started = time.perf_counter()
            continue
        nbytes += data.numel() * data.element_size() + labels.numel() * labels.element_size()
    torch.cuda.synchronize()
    return nbytes / (time.perf_counter() - started) / 1e9


def raw_rate(torch, nbytes: int, copies: int = 50) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
    dst = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        dst.copy_(src, non_blocking=True)
        stream.synchronize()
        started = time.perf_counter()
        for _ in range(copies):
            dst.copy_(src, non_blocking=True)  # cudaMemcpyAsync from pinned memory
        stream.synchronize()
    return nbytes * copies / (time.perf_counter() - started) / 1e9


# -- (3) overlap -------------------------------------------------------------------


def step(torch, weights, inputs, iters: int):
    """The training-step stand-in: a chain of matmuls reading the batch."""
    x = inputs.float().reshape(inputs.shape[0], -1)[:, : weights.shape[0]]
    for _ in range(iters):
        x = torch.relu(x @ weights)
    return x.sum()


def step_iters(torch, inputs, target_ms: float) -> int:
    """Matmuls per step for a step of about `target_ms` on this GPU."""
    weights = torch.randn(2048, 2048, device="cuda")
    inputs = inputs.cuda()
    step(torch, weights, inputs, 64).item()
    torch.cuda.synchronize()
    started = time.perf_counter()
    step(torch, weights, inputs, 64).item()
    per_iter = (time.perf_counter() - started) * 1e3 / 64
    return max(1, round(target_ms / per_iter))


def idle_per_step_ms(torch, feed, steps: int, iters: int, warm: int = 4) -> tuple[float, float]:
    """(GPU idle ms per step, step compute ms): wall time per step fed by
    `feed`, less the same steps on a batch already on the GPU. The first
    `warm` batches (start-up: workers, the ring's first pages, the pool's
    buffers) are not timed."""
    weights = torch.randn(2048, 2048, device="cuda")
    first = None
    n = 0
    for i, inputs in enumerate(feed):
        if i < warm:
            first = inputs.clone() if first is None else first
            step(torch, weights, inputs, iters).item()
            if i == warm - 1:
                torch.cuda.synchronize()
                started = time.perf_counter()
            continue
        step(torch, weights, inputs, iters).item()
        n += 1
        if n >= steps:
            break
    torch.cuda.synchronize()
    wall = (time.perf_counter() - started) / max(n, 1)
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(n):
        step(torch, weights, first, iters).item()
    torch.cuda.synchronize()
    compute = (time.perf_counter() - started) / max(n, 1)
    return max(0.0, wall - compute) * 1e3, compute * 1e3


def loader_feed(device: str, spec: dict, opts: dict):
    with loader.Loader.local(spec, workers=WORKERS, device=device, **opts) as dl:
        for batch in dl:
            tensors = batch.torch()
            yield tensors["data"] if "data" in tensors else tensors["tokens"]


def torch_feed(torch, workload: str, batches: int):
    for data, _ in torch_loader(torch, workload, batches):
        yield data.cuda(non_blocking=True)


# -- the table ------------------------------------------------------------------


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mode", choices=["cuda", "host"], default="cuda")
    p.add_argument("--loaderctl", required=True)
    p.add_argument("--batches", type=int, default=24, help="batches per epoch of each workload")
    args = p.parse_args()
    device = "cuda:0" if args.mode == "cuda" else "host"
    rows: list[tuple[str, ...]] = []
    ok = True
    with tempfile.TemporaryDirectory() as tmp:
        tokens = tokens_file(tmp, args.batches * RATE_RUNS)
        specs = {"images": image_spec(args.batches), "tokens": tokens_spec(tokens)}
        log(f"correctness on {device} ...")
        for workload in ("images", "tokens"):
            good, note = rust_correct(args.loaderctl, device, workload, args.batches, tokens, tmp)
            rows.append(("1 correctness", workload, "Rust (loaderctl)", note, "PASS" if good else "FAIL"))
            ok &= good
            good, note = py_correct(device, specs[workload], options(workload))
            rows.append(("1 correctness", workload, "Python" + (" (torch)" if args.mode == "cuda" else " (numpy)"), note, "PASS" if good else "FAIL"))
            ok &= good
        if args.mode == "cuda":
            import torch

            log(f"GPU: {torch.cuda.get_device_name(0)}")
            slowest_ms: dict[str, float] = {}
            for workload in ("images", "tokens"):
                log(f"H2D rates, {workload} ...")
                n = args.batches * RATE_RUNS
                spec = image_spec(n) if workload == "images" else specs[workload]
                # Device and host runs take turns, each first in every other
                # repeat (a machine's first runs are slower), medians kept.
                runs: dict[str, list[float]] = {"rust": [], "rust_host": [], "py": [], "py_host": []}
                for r in range(RATE_REPEATS):
                    for on_device in (r % 2 == 0, r % 2 == 1):
                        key = "" if on_device else "_host"
                        runs["rust" + key].append(rust_rate(args.loaderctl, device if on_device else "cpu", workload, n, tokens))
                        runs["py" + key].append(py_rate(torch, device if on_device else None, spec, options(workload)))
                rust, rust_host, py, py_host = (float(np.median(runs[k])) for k in ("rust", "rust_host", "py", "py_host"))
                theirs = torch_rate(torch, workload, n)
                per_batch = IMAGE_BATCH * int(np.prod(IMAGE_SHAPE)) if workload == "images" else TOKENS_BATCH * (TOKENS_CONTEXT + 1) * 2
                raw = raw_rate(torch, per_batch)
                # The device stage must cost (almost) nothing over delivering
                # the same batches to host memory: the workers' production,
                # not the copy, bounds an end-to-end rate (raw is the copy's
                # ceiling, for scale).
                slowest_ms[workload] = per_batch / min(py, theirs) / 1e6
                kept = min(rust / rust_host, py / py_host)
                best = max(rust, py)
                good = kept >= 0.9 and best >= 1.5 * theirs
                ok &= good
                rows.append(
                    (
                        "2 GB/s to the GPU",
                        workload,
                        "Loader Rust (host) / Loader Python (host) / torch pin_memory / raw pinned copy",
                        f"{rust:.2f} ({rust_host:.2f}) / {py:.2f} ({py_host:.2f}) / {theirs:.2f} / {raw:.2f} "
                        f"({kept:.0%} of host delivery, {best / max(theirs, 1e-9):.1f}x torch)",
                        "PASS" if good else "FAIL (>= 90% of host delivery and >= 1.5x torch)",
                    )
                )
            for workload in ("images", "tokens"):
                log(f"overlap, {workload} ...")
                # A step longer than the slower loader's time per batch, so
                # either could keep up: what is left idle is what a loader
                # does not overlap with the step (its copy, its hand-over).
                n = OVERLAP_STEPS + OVERLAP_WARM + 2
                spec = image_spec(n) if workload == "images" else specs[workload]
                sample = next(iter(torch_loader(torch, workload, 1)))[0]
                iters = step_iters(torch, sample, 1.25 * slowest_ms[workload])
                ours, compute = idle_per_step_ms(torch, loader_feed(device, spec, options(workload)), OVERLAP_STEPS, iters, OVERLAP_WARM)
                theirs, _ = idle_per_step_ms(torch, torch_feed(torch, workload, n), OVERLAP_STEPS, iters, OVERLAP_WARM)
                rows.append(
                    (
                        "3 GPU idle ms/step",
                        workload,
                        "Loader / torch pin_memory",
                        f"{ours:.2f} / {theirs:.2f} (step {compute:.2f} ms, {OVERLAP_STEPS} steps)",
                        "-",
                    )
                )
    widths = [max(len(r[i]) for r in rows + [("part", "workload", "path", "result", "verdict")]) for i in range(5)]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    print(line(("part", "workload", "path", "result", "verdict")))
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in rows:
        print(line(r))
    if args.mode == "host":
        print("(host backend: no GPU here; parts 2 and 3 need one: run bench/gpu_check.sh on a machine with an NVIDIA GPU)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
