"""Same-run A/B of two `loaderctl` builds over the shapes of the small-batch
matrix, shuffled (a change to the sampler or the read path shows in every
cell or in none):

    python bench/ab.py --old /tmp/loaderctl-before [--new target/release/loaderctl] [--repeats 5]

Per cell (tokens 2049 x uint16 at batch 1/8/64, synthetic 3x32x32 uint8 at
batch 64/256, synthetic 3x224x224 uint8 at batch 64, npy rows 256 x float32
at batch 1024), `loaderctl run` (embedded, 2 workers, shared memory or
`--transport grpc`) with
the same spec file for both builds, repeats interleaved (old, new, new,
old, ...), medians. The Rust loop only: bench/ab_python.py runs the Python loop
over two installed wheels. Data: the matrix's files under bench/data/ (bench/matrix.py makes
them).
"""

import argparse
import shlex
import statistics
import subprocess
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
DATA = BENCH / "data"
TIMEOUT_S = 120  # one run; a hung run fails the benchmark instead of stalling it

sys.path.insert(0, str(BENCH))
import matrix  # noqa: E402  (the matrix's data files and constants)

# (cell name, dataset kind, batch, epochs): each run lasts about a second
# or more on 2 cores, so start-up is a small part of it
CELLS = [
    ("tokens 2049 x uint16, batch 1", "tokens", 1, 15),
    ("tokens 2049 x uint16, batch 8", "tokens", 8, 50),
    ("tokens 2049 x uint16, batch 64", "tokens", 64, 80),
    ("3x32x32 uint8, batch 64", "3, 32, 32|100000", 64, 30),
    ("3x32x32 uint8, batch 256", "3, 32, 32|100000", 256, 40),
    ("3x224x224 uint8, batch 64", "3, 224, 224|12800", 64, 12),
    ("npy rows 256 x float32, batch 1024", "npy", 1024, 30),
]


def dataset_yaml(kind, tokens, rows):
    if kind == "tokens":
        return f"{{tokens: {{path: {tokens}, dtype: uint16, context_length: {matrix.CONTEXT}}}}}"
    if kind == "npy":
        return f"{{npy: {{arrays: {{x: {rows}}}}}}}"
    shape, samples = kind.split("|")
    return f"{{synthetic: {{num_samples: {samples}, shape: [{shape}], dtype: uint8}}}}"


def spec_file(i, kind, batch, epochs, tokens, rows):
    spec = DATA / f"ab-{i}-batch{batch}-epochs{epochs}.yaml"
    spec.write_text(f"dataset: {dataset_yaml(kind, tokens, rows)}\nbatch_size: {batch}\n"
                    f"epochs: {epochs}\nsampler: {{shuffle: true, seed: 0}}\n")
    return spec


def run_one(cmd):
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        sys.exit(f"timed out after {TIMEOUT_S} s: {shlex.join(cmd)}")
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {shlex.join(cmd)}\n{out.stderr.strip()[-2000:]}")
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        sys.exit(f"no JSON line from: {shlex.join(cmd)}\n{out.stdout[-1000:]}{out.stderr[-1000:]}")
    return json.loads(lines[-1])


def main():
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--old", required=True, help="the loaderctl build before the change")
    p.add_argument("--new", default=str(ROOT / "target" / "release" / "loaderctl"),
                   help="the build after it (default: target/release/loaderctl)")
    p.add_argument("--repeats", type=int, default=5, help="runs of each build per cell, interleaved")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--only", default="", help="run only the cells whose name holds this text")
    p.add_argument("--transport", choices=["shm", "grpc"], default="shm", help="how batches reach the trainer")
    args = p.parse_args()
    for b in (args.old, args.new):
        if not Path(b).exists():
            sys.exit(f"{b} is missing")
    print("command: " + shlex.join([sys.executable] + sys.argv))
    tokens, rows = matrix.data_files()
    began = time.perf_counter()
    lines = ["| cell | old samples/s | new samples/s | new / old (ratio of medians) | per-repeat ratios |",
             "| --- | ---: | ---: | ---: | --- |"]
    for i, (name, kind, batch, epochs) in enumerate(CELLS):
        if args.only not in name:
            continue
        spec = spec_file(i, kind, batch, epochs, tokens, rows)
        rates = {"old": [], "new": []}
        for r in range(args.repeats):
            # Each build goes first in every other repeat: a run's place
            # in the pair moves its rate (an A/A run of one build read
            # 1.09x for the second of each pair).
            for which in ("old", "new") if r % 2 == 0 else ("new", "old"):
                binary = getattr(args, which)
                res = run_one([binary, "run", "--json", "--workers", str(args.workers), "--transport", args.transport,
                               "--spec", str(spec)])
                rates[which].append(res["samples_per_s"])
                print(f"[{name}] run {r + 1}: {which}: {res['samples_per_s']:,.0f} samples/s", flush=True)
        old, new = statistics.median(rates["old"]), statistics.median(rates["new"])
        paired = " ".join(f"{n / o:.2f}" for o, n in zip(rates["old"], rates["new"]))
        lines.append(f"| {name} | {old:,.0f} | {new:,.0f} | {new / old:.2f}x | {paired} |")
    print()
    print(f"{args.repeats} repeats interleaved, {args.workers} workers, {args.transport}, shuffled; "
          f"wall {time.perf_counter() - began:.0f} s")
    print()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
