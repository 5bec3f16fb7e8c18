"""A mixture of two token files against one token file, same run (issue 31's
acceptance row: "a mixture of two token files at >= 0.9x the throughput of a
single token file, same run").

    python bench/mixture.py [--repeats 5] [--workers 2]

Per cell (batch 8, batch 64), repeats interleaved, medians:

- `loaderctl run` (embedded, shared memory, shuffled) on the single token
  file, on the `mix` of two token files at 0.5/0.5 and at 0.7/0.3. The
  single file holds the same tokens as the two sources together (their
  windows, a's then b's), so the comparison is the one a user makes
  ("mix my two files, or concatenate them into one?") and both sides read
  the same bytes of memory: with one source as "the single file" the
  mixture would touch twice the memory of its baseline. The mixture's `samples_per_epoch` is the single
  file's windows and the epochs are the same, so every Loader run moves the
  same bytes; only the dataset kind differs. For reference, one more row
  reads source a alone (half the tokens, twice the epochs).
- torch's DataLoader doing the mixture the usual hand-written way, the
  anchor: `ConcatDataset` of two map-style token-window datasets over
  `np.memmap` of the same files and a `WeightedRandomSampler` whose
  per-sample weights give 0.5/0.5; and a DataLoader over the single file
  (`RandomSampler`) for comparison. Both over a fixed number of samples.

The data are two uint16 token files of TOKEN_WINDOWS windows of CONTEXT + 1
ids (random ids < 50,000) and their concatenation, written afresh under
bench/data/ at every run (see token_files: the page cache must hold all
three alike). Rates
count samples from the first batch on (loaderctl's `samples_per_s`; the
torch loop here does the same). The CPU column is the whole process tree's
user + system time per batch, from getrusage (loaderctl with its workers,
start-up included; the torch loop with its workers from the DataLoader on,
without Python's start-up): where a mixture is slower, it says whether it
costs more CPU or waits more.

Needs `target/release/loaderctl` (`cargo build --release -p loader-ctl --bin
loaderctl`) and a Python with numpy and torch. The Python side uses torch
only, so an older `loader` package does not matter here.
"""

import argparse
import json
import os
import resource
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
DATA = BENCH / "data"
LOADERCTL = ROOT / "target" / "release" / "loaderctl"
PY = sys.executable

TOKEN_WINDOWS = 20000
CONTEXT = 2048
VOCAB = 50000
TIMEOUT_S = 120  # one run; a hung run fails the benchmark instead of stalling it

# (cell name, batch size, Loader epochs, torch samples): Loader moves
# ~0.7-2M samples/s here, so its runs take tens of epochs to last ~1 s;
# torch's runs are a fixed number of samples that last >= 1 s.
CELLS = [
    ("tokens 2049 x uint16, batch 8", 8, 20, 12_000),
    ("tokens 2049 x uint16, batch 64", 64, 40, 80_000),
]

SINGLE = "Loader single file"
HALF = "Loader source a alone (half the tokens)"
MIX55 = "Loader mix 0.5/0.5"
MIX73 = "Loader mix 0.7/0.3"
TORCH_SINGLE = "torch DataLoader single file"
TORCH_MIX = "torch ConcatDataset + WeightedRandomSampler 0.5/0.5"


def token_files():
    """The two token files (a, b) and the single file holding both (a's
    windows, then b's), written afresh under bench/data/ at every run.

    Afresh, all three the same way, because how a file came into the page
    cache decides how it is mapped: a file just written whole sits in large
    folios that a mapping takes as 2 MB pages, one read back from disk or
    copied may sit in 4 KB pages, and random 4 KB reads over 4 KB pages pay
    a TLB miss each. Left to chance, the single file read from 2 MB pages
    and the two sources from 4 KB ones, which measured the page cache
    (0.83x) instead of the mixture."""
    import numpy as np

    DATA.mkdir(parents=True, exist_ok=True)
    n = TOKEN_WINDOWS * CONTEXT + 1
    ids = {name: np.random.default_rng(seed).integers(0, VOCAB, n, dtype=np.uint16)
           for seed, name in enumerate("ab")}
    # Window i starts at token i * CONTEXT and reads CONTEXT + 1 ids: a's
    # last id only closes its last window, so the single file drops it and
    # b's first window follows on.
    contents = {"a": ids["a"], "b": ids["b"], "ab": np.concatenate([ids["a"][:-1], ids["b"]])}
    out = []
    for name in ("a", "b", "ab"):
        path = DATA / f"mix-{name}-{TOKEN_WINDOWS}x{CONTEXT}-u16.bin"
        tmp = path.with_suffix(".tmp")
        contents[name].tofile(tmp)
        tmp.replace(path)  # a killed run leaves no half file behind
        out.append(path)
    return out


def tokens_yaml(path):
    return f"{{tokens: {{path: {path}, dtype: uint16, context_length: {CONTEXT}}}}}"


def spec_file(name, dataset_yaml, batch, epochs):
    """Writes a job spec under bench/data/ and returns its path."""
    spec = DATA / f"mixture-{name}-batch{batch}-epochs{epochs}.yaml"
    spec.write_text(f"dataset:{dataset_yaml}\nbatch_size: {batch}\nepochs: {epochs}\n"
                    "sampler: {shuffle: true, seed: 0}\n")
    return spec


def mix_yaml(a, b, wa, wb):
    return ("\n  mix:\n    sources:\n"
            f"      - {{name: a, weight: {wa}, dataset: {tokens_yaml(a)}}}\n"
            f"      - {{name: b, weight: {wb}, dataset: {tokens_yaml(b)}}}\n"
            f"    samples_per_epoch: {2 * TOKEN_WINDOWS}")


def commands(cell, a, b, ab, workers):
    """label -> command line of every system for one cell."""
    _, batch, epochs, torch_samples = cell
    ctl = [str(LOADERCTL), "run", "--json", "--workers", str(workers), "--spec"]
    torch = [PY, str(Path(__file__).resolve()), "--workers", str(workers), "--batch-size", str(batch),
             "--samples", str(torch_samples), "--tokens", str(a), str(b), "--torch"]
    return {
        SINGLE: ctl + [str(spec_file("single", " " + tokens_yaml(ab), batch, epochs))],
        HALF: ctl + [str(spec_file("half", " " + tokens_yaml(a), batch, 2 * epochs))],
        MIX55: ctl + [str(spec_file("mix55", mix_yaml(a, b, 0.5, 0.5), batch, epochs))],
        MIX73: ctl + [str(spec_file("mix73", mix_yaml(a, b, 0.7, 0.3), batch, epochs))],
        TORCH_SINGLE: torch + ["single", "--single", str(ab)],
        TORCH_MIX: torch + ["mix"],
    }


def run_one(cmd):
    """Runs one command; its last JSON line, plus `tree_cpu_s` (the CPU of
    the process and every descendant it waited for)."""
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", "1")  # numpy/torch threads would fight the workers for 2 cores
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        sys.exit(f"timed out after {TIMEOUT_S} s: {' '.join(cmd)}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if out.returncode != 0:
        sys.exit(f"failed ({out.returncode}): {' '.join(cmd)}\n{out.stderr.strip()[-2000:]}")
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if not lines:
        sys.exit(f"no JSON line from: {' '.join(cmd)}\n{out.stdout[-1000:]}{out.stderr[-1000:]}")
    res = json.loads(lines[-1])
    res["tree_cpu_s"] = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return res


def run(repeats, workers, log=print):
    """Runs every cell; returns {cell: {label: [result, ...]}}."""
    a, b, ab = token_files()
    results = {}
    for cell in CELLS:
        cmds = commands(cell, a, b, ab, workers)
        runs = {label: [] for label in cmds}
        for r in range(repeats):
            for label, cmd in cmds.items():
                res = run_one(cmd)
                log(f"[{cell[0]}] run {r + 1}: {label}: {res['samples_per_s']:,.0f} samples/s "
                    f"in {res['seconds']:.2f} s", flush=True)
                runs[label].append(res)
        same_volume(cell[0], runs)
        results[cell[0]] = runs
    return results


def same_volume(cell, runs):
    """Every Loader run of a cell must have moved the same samples, and all
    but the half-the-tokens row the same bytes (that row cuts its epochs
    differently: a few more batch headers)."""
    loader = {label: rs for label, rs in runs.items() if label.startswith("Loader")}
    samples = {r["samples"] for rs in loader.values() for r in rs}
    volumes = {(r["samples"], r["bytes"]) for label, rs in loader.items() if label != HALF for r in rs}
    if len(samples) > 1 or len(volumes) > 1:
        sys.exit(f"[{cell}] the Loader runs moved different volumes: {sorted(volumes)}, samples {sorted(samples)}")


def med(rs, key):
    vals = [r[key] for r in rs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def cpu_per_batch(r):
    """CPU per batch: the torch loop's own count (from its DataLoader on,
    without Python's start-up and torch's import), else the process tree's."""
    return r.get("cpu_s", r["tree_cpu_s"]) * 1e6 / r["batches"]


def render(results):
    """Markdown lines of the table."""
    lines = ["| cell | system | samples/s (median) | vs Loader single file | vs torch single file "
             "| CPU/batch, all processes |",
             "| --- | --- | ---: | ---: | ---: | ---: |"]
    for cell, runs in results.items():
        single = med(runs[SINGLE], "samples_per_s")
        torch = med(runs[TORCH_SINGLE], "samples_per_s")
        for label, rs in runs.items():
            sps = med(rs, "samples_per_s")
            cpu = statistics.median(cpu_per_batch(r) for r in rs)
            lines.append(f"| {cell} | {label} | {sps:,.0f} | {sps / single:.2f}x | {sps / torch:.2f}x "
                         f"| {cpu:,.0f} µs |")
    return lines


def check(results):
    """The acceptance bar, as lines: each mixture >= 0.9x the single file
    (ratio of medians; the median of the per-repeat ratios beside it, since
    the repeats are interleaved)."""
    out = []
    for cell, runs in results.items():
        single = runs[SINGLE]
        for label in (MIX55, MIX73):
            ratio = med(runs[label], "samples_per_s") / med(single, "samples_per_s")
            paired = statistics.median(m["samples_per_s"] / s["samples_per_s"]
                                       for m, s in zip(runs[label], single))
            out.append(f"- {cell}, {label}: {ratio:.2f}x the single file (per-repeat median {paired:.2f}x; "
                       f"bar 0.9x): {'met' if ratio >= 0.9 else 'NOT met'}")
    return out


def cpu_s():
    """User + system CPU seconds of this process and its waited-for children."""
    return sum(u.ru_utime + u.ru_stime for u in (resource.getrusage(resource.RUSAGE_SELF),
                                                 resource.getrusage(resource.RUSAGE_CHILDREN)))


def torch_run(which, paths, single, batch, samples, workers):
    """One torch DataLoader run (this script re-run with --torch): the
    single file shuffled, or the hand-written 0.5/0.5 mixture. One JSON
    line out, loaderctl's field names."""
    import numpy as np
    import torch
    from torch.utils.data import (ConcatDataset, DataLoader, Dataset, RandomSampler,
                                  WeightedRandomSampler)

    class Tokens(Dataset):
        """Windows of CONTEXT + 1 ids, window i at token i * CONTEXT (Loader's
        tokens dataset), from a memory-mapped file opened in each worker."""

        def __init__(self, path):
            self.path = path
            self.n = (os.path.getsize(path) // 2 - 1) // CONTEXT
            self.ids = None

        def __len__(self):
            return self.n

        def __getitem__(self, i):
            if self.ids is None:
                self.ids = np.memmap(self.path, dtype=np.uint16, mode="r")
            return torch.from_numpy(np.array(self.ids[i * CONTEXT:(i + 1) * CONTEXT + 1]))

    if which == "single":
        data = Tokens(single)
        sampler = RandomSampler(data, num_samples=samples)
    else:
        parts = [Tokens(p) for p in paths]
        data = ConcatDataset(parts)
        # Per-sample weights: each source's share spread over its samples.
        weights = torch.cat([torch.full((len(p),), 0.5 / len(p), dtype=torch.double) for p in parts])
        sampler = WeightedRandomSampler(weights, num_samples=samples, replacement=True)

    cpu0 = cpu_s()
    dl = DataLoader(data, batch_size=batch, sampler=sampler, num_workers=workers, prefetch_factor=4)
    it = iter(dl)
    start = time.perf_counter()
    first = None
    n = batches = first_n = 0
    for x in it:
        if first is None:
            first, first_n = time.perf_counter(), x.shape[0]
        n += x.shape[0]
        batches += 1
    end = time.perf_counter()
    del it  # the workers are joined once it is exhausted: their CPU is counted below
    print(json.dumps({
        "samples": n - first_n, "batches": batches, "seconds": end - first,
        "samples_per_s": (n - first_n) / (end - first), "bytes": (n - first_n) * (CONTEXT + 1) * 2,
        "first_batch_s": first - start,
        "cpu_s": cpu_s() - cpu0,
    }), flush=True)


def main():
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--repeats", type=int, default=5, help="runs of every system per cell, interleaved")
    p.add_argument("--workers", type=int, default=2, help="worker processes of every system")
    p.add_argument("--torch", choices=["single", "mix"], help=argparse.SUPPRESS)  # one torch run
    p.add_argument("--tokens", nargs=2, help=argparse.SUPPRESS)
    p.add_argument("--single", help=argparse.SUPPRESS)
    p.add_argument("--batch-size", type=int, help=argparse.SUPPRESS)
    p.add_argument("--samples", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.torch:
        torch_run(args.torch, args.tokens, args.single, args.batch_size, args.samples, args.workers)
        return
    if not LOADERCTL.exists():
        sys.exit(f"{LOADERCTL} is missing: build it first with\n"
                 "    cargo build --release -p loader-ctl --bin loaderctl")

    print("command: " + shlex.join([PY] + sys.argv))
    began = time.perf_counter()
    results = run(args.repeats, args.workers)
    print()
    print(f"{args.repeats} repeats interleaved, {args.workers} workers, shuffled; "
          f"{2 * TOKEN_WINDOWS:,} samples per Loader epoch; wall {time.perf_counter() - began:.0f} s")
    print()
    print("\n".join(render(results)))
    print()
    print("\n".join(check(results)))


if __name__ == "__main__":
    main()
