"""Same-run A/B of two builds of the Python SDK over the matrix's cells, in
the Python loop (bench/ab.py does the Rust loop):

    pip install --no-deps --target /tmp/loader-old <wheel of the build before>
    pip install --no-deps --target /tmp/loader-new <wheel of the build after>
    python bench/ab_python.py --old /tmp/loader-old --new /tmp/loader-new [--repeats 3] [--transport grpc]

Per cell of bench/matrix.py, `bench/python_loop.py --system loader` (2
workers, the Loader epochs of the matrix) with `PYTHONPATH` at each build's
install, repeats interleaved (old, new, then new, old, ...), medians. The
Python running this needs torch and numpy (the loop hands batches over as
torch tensors). A wheel for a past commit: `maturin build --release
--auditwheel skip` in a worktree of it (touch its sources first when the
target dir is shared with another worktree: cargo keys a workspace crate's
artifacts by its path inside the workspace, so a checkout older than the
artifacts there would reuse them).
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent
TIMEOUT_S = 300  # one run; a hung run fails the benchmark instead of stalling it

sys.path.insert(0, str(BENCH))
import matrix  # noqa: E402  (the matrix's cells and data files)


def command(cell, tokens, rows, transport, workers):
    _name, kind, batch, _torch_epochs, loader_epochs, samples = cell
    cmd = [sys.executable, str(BENCH / "python_loop.py"), "--system", "loader", "--workers", str(workers),
           "--batch-size", str(batch), "--epochs", str(loader_epochs), "--transport", transport]
    if kind == "tokens":
        return cmd + ["--tokens", str(tokens), "--context-length", str(matrix.CONTEXT)]
    if kind == "npy":
        return cmd + ["--npy", str(rows)]
    return cmd + ["--shape", kind, "--samples", str(samples)]


def run_one(cmd, site):
    env = dict(os.environ, PYTHONPATH=str(site))
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        sys.exit(f"timed out after {TIMEOUT_S} s: {shlex.join(cmd)}")
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        sys.exit(f"failed ({out.returncode}): PYTHONPATH={site} {shlex.join(cmd)}\n{out.stderr.strip()[-2000:]}")
    return json.loads(lines[-1])["samples_per_s"]


def main():
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--old", required=True, type=Path, help="where the build before is installed (pip --target)")
    p.add_argument("--new", required=True, type=Path, help="where the build after is installed")
    p.add_argument("--repeats", type=int, default=3, help="runs of each build per cell, interleaved")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--transport", choices=["shm", "grpc"], default="grpc", help="how batches reach the trainer")
    p.add_argument("--only", default="", help="run only the cells whose name holds this text")
    args = p.parse_args()
    for site in (args.old, args.new):
        if not (site / "loader").is_dir():
            sys.exit(f"{site}: no loader package there (pip install --no-deps --target {site} <wheel>)")
    print("command: " + shlex.join([sys.executable] + sys.argv))
    tokens, rows = matrix.data_files()
    table = ["| cell | old samples/s | new samples/s | new / old (ratio of medians) | per-repeat ratios |",
             "| --- | ---: | ---: | ---: | --- |"]
    for cell in matrix.CELLS:
        name = cell[0]
        if args.only not in name:
            continue
        cmd = command(cell, tokens, rows, args.transport, args.workers)
        rates = {"old": [], "new": []}
        for r in range(args.repeats):
            for which in ("old", "new") if r % 2 == 0 else ("new", "old"):
                rates[which].append(run_one(cmd, getattr(args, which)))
                print(f"[{name}] run {r + 1}: {which}: {rates[which][-1]:,.0f} samples/s", flush=True)
        old, new = statistics.median(rates["old"]), statistics.median(rates["new"])
        paired = " ".join(f"{n / o:.2f}" for o, n in zip(rates["old"], rates["new"]))
        table.append(f"| {name} | {old:,.0f} | {new:,.0f} | {new / old:.2f}x | {paired} |")
    print()
    print(f"{args.repeats} repeats interleaved, {args.workers} workers, {args.transport}, Python loop")
    print()
    print("\n".join(table))


if __name__ == "__main__":
    main()
