"""The small-batch matrix: every shape a trainer meets, each cell measured for
Loader over shared memory, Loader over gRPC and torch DataLoader, in the Rust
loop (`loaderctl run`) and the Python loop (`loader.Loader.local`, through
bench/python_loop.py, which also runs torch's DataLoader), interleaved,
medians of the repeats. bench/run.py runs it as the scenario named MATRIX and
renders the table (`bench/run.sh --only matrix` runs it alone and keeps the
other scenarios' last results); the raw runs go to docs/benchmarks.json with
the rest.

Each cell reads the same data in every system: a token file (uint16 ids,
windows of 2049), synthetic uint8 samples of a shape, or the rows of a
float32 .npy array, all made once under bench/data/. Loader runs more epochs
of the same data than torch where torch would otherwise take a minute, so
every run lasts a second or more; rates are per second either way.

Per run it records samples/s, batches/s, the trainer's wait in `next()`
(p50, p99, from the second batch on) and, for `loaderctl run`, the CPU the
embedded coordinator spent per batch (it hosts the coordinator in the
trainer's process, so its threads are counted apart).
"""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
LOADERCTL = ROOT / "target" / "release" / "loaderctl"
PY = sys.executable

MATRIX = "Small batches: tokens, CIFAR-sized and ImageNet-sized images, tabular rows (matrix)"

TOKEN_WINDOWS = 20000
CONTEXT = 2048
NPY_ROWS = 200_000
NPY_COLS = 256

# (cell name, data kind, batch size, torch epochs, Loader epochs, samples of synthetic data)
CELLS = [
    ("tokens 2049 x uint16, batch 1", "tokens", 1, 1, 5, None),
    ("tokens 2049 x uint16, batch 8", "tokens", 8, 1, 5, None),
    ("tokens 2049 x uint16, batch 64", "tokens", 64, 1, 10, None),
    ("3x32x32 uint8, batch 64", "3,32,32", 64, 1, 5, 100_000),
    ("3x32x32 uint8, batch 256", "3,32,32", 256, 1, 5, 100_000),
    ("3x224x224 uint8, batch 64", "3,224,224", 64, 1, 3, 12_800),
    ("npy rows 256 x float32, batch 1024", "npy", 1024, 1, 5, None),
]

SYSTEMS = [
    # (label, loop, transport or None for torch)
    ("Loader shm (Rust loop)", "rust", "shm"),
    ("Loader gRPC (Rust loop)", "rust", "grpc"),
    ("Loader shm (Python loop)", "python", "shm"),
    ("Loader gRPC (Python loop)", "python", "grpc"),
    ("torch DataLoader", "python", None),
]


def data_files():
    """The token file and the .npy array of the matrix, made once (a pure
    function of the constants above) and kept in bench/data/."""
    import numpy as np

    out = BENCH / "data"
    out.mkdir(parents=True, exist_ok=True)
    tokens = out / f"tokens-{TOKEN_WINDOWS}x{CONTEXT}.bin"
    if not tokens.exists():
        n = TOKEN_WINDOWS * CONTEXT + 1
        ids = (np.arange(n, dtype=np.uint64) * 2654435761 >> 7) % 50257
        ids.astype(np.uint16).tofile(tokens)
    rows = out / f"rows-{NPY_ROWS}x{NPY_COLS}-f32.npy"
    if not rows.exists():
        x = np.arange(NPY_ROWS * NPY_COLS, dtype=np.float32).reshape(NPY_ROWS, NPY_COLS) % 1000
        np.save(rows, x)
    return tokens, rows


def commands(cell, tokens, rows, workers=2):
    """label -> command line of every system for one cell."""
    name, kind, batch, torch_epochs, loader_epochs, samples = cell
    out = {}
    for label, loop, transport in SYSTEMS:
        epochs = loader_epochs if transport else torch_epochs
        if loop == "rust":
            cmd = [str(LOADERCTL), "run", "--json", "--workers", str(workers),
                   "--batch-size", str(batch), "--epochs", str(epochs), "--transport", transport]
            if kind == "tokens":
                cmd += ["--dataset", "tokens", "--path", str(tokens), "--context-length", str(CONTEXT)]
            elif kind == "npy":
                spec = BENCH / "data" / f"rows-batch{batch}-epochs{epochs}.yaml"
                spec.write_text(f"dataset: {{npy: {{arrays: {{x: {rows}}}}}}}\nbatch_size: {batch}\n"
                                f"epochs: {epochs}\nsampler: {{shuffle: true, seed: 0}}\n")
                cmd = [str(LOADERCTL), "run", "--json", "--workers", str(workers),
                       "--transport", transport, "--spec", str(spec)]
            else:
                cmd += ["--dataset", "synthetic", "--shape", kind, "--dtype", "uint8",
                        "--samples", str(samples)]
        else:
            cmd = [PY, str(BENCH / "python_loop.py"), "--system", "loader" if transport else "torch",
                   "--workers", str(workers), "--batch-size", str(batch), "--epochs", str(epochs)]
            if transport:
                cmd += ["--transport", transport]
            if kind == "tokens":
                cmd += ["--tokens", str(tokens), "--context-length", str(CONTEXT)]
            elif kind == "npy":
                cmd += ["--npy", str(rows)]
            else:
                cmd += ["--shape", kind, "--samples", str(samples)]
        out[label] = cmd
    return out


def run(run_one, repeats, log=print):
    """Runs every cell; returns {cell: {label: [result, ...]}}."""
    tokens, rows = data_files()
    results = {}
    for cell in CELLS:
        cmds = commands(cell, tokens, rows)
        runs = {label: [] for label in cmds}
        for r in range(repeats):
            for label, cmd in cmds.items():
                res = run_one(cmd)
                if "batches" not in res:
                    res["batches"] = res["samples"]
                res["batches_per_s"] = res["batches"] / res["seconds"] if res["seconds"] else 0.0
                log(f"[{cell[0]}] run {r + 1}: {label}: {res['samples_per_s']:,.0f} samples/s, "
                    f"{res['batches_per_s']:,.0f} batches/s, wait p50 {res.get('wait_p50_us', 0):.0f} us",
                    flush=True)
                runs[label].append(res)
        same_data(cell, runs)
        results[cell[0]] = runs
    return results


def same_data(cell, runs):
    """The Python loops report a checksum of what they read (labels, and the
    last element of each sample); per epoch it must be the same for Loader
    and torch, which run different numbers of epochs of the same data."""
    name, _, _, torch_epochs, loader_epochs, _ = cell
    per_epoch = set()
    for label, rs in runs.items():
        epochs = torch_epochs if label.startswith("torch") else loader_epochs
        per_epoch |= {r["checksum"] / epochs for r in rs if "checksum" in r}
    if len(per_epoch) > 1:
        sys.exit(f"[{name}] the systems read different data (checksums per epoch {per_epoch})")


def render(results, med):
    """Markdown lines of the matrix table from `results` (as `run` returns)."""
    lines = ["| cell | system | samples/s | batches/s | vs torch | wait p50 / p99 | coordinator CPU |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for cell, runs in results.items():
        torch = med(runs.get("torch DataLoader", []), "samples_per_s")
        for label, rs in runs.items():
            sps = med(rs, "samples_per_s")
            bps = med(rs, "batches_per_s")
            p50, p99 = med(rs, "wait_p50_us"), med(rs, "wait_p99_us")
            coord = med(rs, "coordinator_cpu_us_per_batch")
            vs = f"**{sps / torch:.2f}x**" if torch and label != "torch DataLoader" else "1.00x" if torch else "-"
            wait = f"{p50:,.0f} / {p99:,.0f} µs" if p50 is not None else "-"
            cpu = f"{coord:.1f} µs/batch" if coord is not None else "-"
            lines.append(f"| {cell} | {label} | {sps:,.0f} | {bps:,.0f} | {vs} | {wait} | {cpu} |")
    return lines


def check(results, med):
    """The issue's bar for each cell, as lines: shared memory >= 3x torch and
    >= gRPC in each loop; tokens at batch 64 >= 5x torch; tokens at batch 1
    >= 20k batches/s over shared memory."""
    out = []
    for cell, runs in results.items():
        torch = med(runs["torch DataLoader"], "samples_per_s")
        for loop in ("Rust", "Python"):
            shm = med(runs[f"Loader shm ({loop} loop)"], "samples_per_s")
            grpc = med(runs[f"Loader gRPC ({loop} loop)"], "samples_per_s")
            need = 5 if "batch 64" in cell and cell.startswith("tokens") else 3
            ok = shm >= need * torch and shm >= grpc
            out.append(f"- {cell}, {loop} loop: shared memory {shm / torch:.1f}x torch (bar {need}x), "
                       f"{shm / grpc:.2f}x gRPC: {'met' if ok else 'NOT met'}")
        if cell.endswith("batch 1"):
            bps = med(runs["Loader shm (Rust loop)"], "batches_per_s")
            out.append(f"- {cell}: {bps:,.0f} batches/s over shared memory (bar 20,000): "
                       f"{'met' if bps >= 20000 else 'NOT met'}")
    return out
