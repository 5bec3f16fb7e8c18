"""Same-run A/B of two builds' device path on a machine with an NVIDIA GPU:
GB/s to a GPU and the trainer's CPU per batch, for the workloads of
bench/gpu_check.py (3x224x224 uint8 at batch 256, tokens 2048 x uint16 at
batch 64), through loaderctl (Rust) and the Python SDK, builds interleaved.

    python3 bench/gpu_ab.py --old-ctl OLD/loaderctl --new-ctl NEW/loaderctl \\
        --old-sdk OLD_SITE --new-sdk NEW_SITE [--repeats 3]

OLD_SITE / NEW_SITE: folders holding each build's `loader` package (a
`pip install --target` of its wheel). The Python runs are one process each
(`--one`), with the build's folder first on PYTHONPATH. GPU_AB_IMAGE_BATCHES
and GPU_AB_TOKEN_BATCHES shorten the runs, with `--device host`, to try
the script on a machine with no GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import gpu_check  # noqa: E402  (the workloads, one definition)

IMAGE_BATCHES = int(os.environ.get("GPU_AB_IMAGE_BATCHES", 384))
TOKEN_BATCHES = int(os.environ.get("GPU_AB_TOKEN_BATCHES", 1536))


DEVICE = "cuda:0"


def rust(ctl: str, workload: str, tokens: str) -> dict:
    batches = IMAGE_BATCHES if workload == "images" else TOKEN_BATCHES
    out = subprocess.run(
        [ctl, "run", "--json", "--workers", str(gpu_check.WORKERS), "--device", DEVICE]
        + gpu_check.loaderctl_args(workload, batches, tokens),
        capture_output=True, text=True, timeout=300, check=True,
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return {"gb_per_s": r["mb_per_s"] / 1e3, "cpu_us": r["trainer_cpu_us_per_batch"]}


def one(workload: str, tokens: str) -> dict:
    """One Python run (this process): GB/s and the process's CPU per batch
    (the SDK's threads, the reaper included; the workers are processes of
    their own), the clock started after the first batch."""
    import torch

    import loader

    sync = torch.cuda.synchronize if DEVICE.startswith("cuda") else (lambda: None)

    spec = gpu_check.image_spec(IMAGE_BATCHES) if workload == "images" else gpu_check.tokens_spec(tokens)
    nbytes, n, started, cpu0 = 0, 0, None, 0.0
    with loader.Loader.local(spec, workers=gpu_check.WORKERS, device=DEVICE, **gpu_check.options(workload)) as dl:
        for batch in dl:
            tensors = batch.torch()
            if started is None:
                sync()
                started = time.perf_counter()
                cpu0 = time.process_time()
                continue
            n += 1
            nbytes += sum(t.numel() * t.element_size() for t in tensors.values())
            del batch, tensors
        sync()
        elapsed = time.perf_counter() - started
        cpu = time.process_time() - cpu0
    return {"gb_per_s": nbytes / elapsed / 1e9, "cpu_us": cpu / n * 1e6, "sdk": loader.__file__}


def python(site: str, workload: str, tokens: str) -> dict:
    env = dict(os.environ, PYTHONPATH=site + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run(
        [sys.executable, __file__, "--one", workload, "--tokens", tokens, "--device", DEVICE],
        capture_output=True, text=True, timeout=300, check=True, env=env,
    )
    r = json.loads(out.stdout.strip().splitlines()[-1])
    if not r.pop("sdk").startswith(site):
        raise SystemExit(f"the run imported another SDK than {site}")
    return r


def main() -> int:
    global DEVICE
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--old-ctl")
    p.add_argument("--new-ctl")
    p.add_argument("--old-sdk")
    p.add_argument("--new-sdk")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--device", default=DEVICE, help="cuda:N, or host to try the script where there is no GPU")
    p.add_argument("--one", choices=["images", "tokens"], help=argparse.SUPPRESS)
    p.add_argument("--tokens", help=argparse.SUPPRESS)
    args = p.parse_args()
    DEVICE = args.device
    if args.one:
        print(json.dumps(one(args.one, args.tokens)))
        return 0
    results: dict[tuple, list] = {}
    with tempfile.TemporaryDirectory() as tmp:
        tokens = gpu_check.tokens_file(tmp, TOKEN_BATCHES)
        for _ in range(args.repeats):
            for workload in ("images", "tokens"):
                for build in ("old", "new"):
                    ctl = getattr(args, f"{build}_ctl")
                    results.setdefault(("Rust", workload, build), []).append(rust(ctl, workload, tokens))
                    site = getattr(args, f"{build}_sdk")
                    results.setdefault(("Python", workload, build), []).append(python(site, workload, tokens))
    print("| path | workload | GB/s old | GB/s new | new/old | trainer CPU us/batch old | new |")
    print("|---|---|---|---|---|---|---|")
    for path in ("Rust", "Python"):
        for workload in ("images", "tokens"):
            old, new = results[(path, workload, "old")], results[(path, workload, "new")]
            go, gn = (statistics.median(r["gb_per_s"] for r in rs) for rs in (old, new))
            co, cn = (statistics.median(r["cpu_us"] for r in rs) for rs in (old, new))
            print(f"| {path} | {workload} | {go:.2f} | {gn:.2f} | {gn / go:.2f} | {co:.0f} | {cn:.0f} |")
    print("runs (GB/s): " + json.dumps({" ".join(k): [round(r["gb_per_s"], 2) for r in v] for k, v in results.items()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
