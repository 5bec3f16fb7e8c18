"""Parquet numeric columns: Loader's `parquet` dataset against torch
DataLoader over the same files, in one run, repeats interleaved (the system
that goes first alternates); medians and their ratio, one markdown row per
scenario.

    bench/parquet.py --rows 1000000 --repeats 5

The files (made once in bench/data/parquet-<rows>/, by pyarrow with its
defaults: snappy, here 8 files of row groups of 65,536 rows): `x`, a
fixed-size list of 16 float32, and `y`, an int64 label; 72 bytes a row.

The anchor is what a user writes for DataLoader: a map-style Dataset whose
`__getitem__` finds the row's file and row group, reads that row group
with pyarrow (`ParquetFile.read_row_group`, the two columns) and keeps it
until a row of another row group is asked for, then returns torch tensors;
`default_collate` makes the batch. A second anchor reads whole batches
(`__getitems__`, which DataLoader calls when a dataset has it: one
`take` per row group of the batch, collated by the dataset itself).

Scenarios (`--only`): `sequential` (no shuffle), `block` (row groups in
a new order each epoch, rows shuffled within each: Loader's `block_shuffle`;
DataLoader gets a sampler that yields the same kind of order). A full
shuffle is no scenario: the anchors would decode a row group for nearly
every row (hours at these sizes). Both loops take each batch as torch
tensors and touch it (the last value of every row), 2 workers, batch 256.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch

import loader

HERE = Path(__file__).resolve().parent
GROUP = 65536
FILES = 8
WIDTH = 16


def make_files(rows: int) -> Path:
    out = HERE / "data" / f"parquet-{rows}"
    if (out / "done").exists():
        return out
    out.mkdir(parents=True, exist_ok=True)
    per = rows // FILES
    rng = np.random.default_rng(0)
    for f in range(FILES):
        n = per if f < FILES - 1 else rows - per * (FILES - 1)
        x = rng.standard_normal((n, WIDTH), dtype=np.float32)
        y = np.arange(f * per, f * per + n, dtype=np.int64)
        table = pa.table({"x": pa.FixedSizeListArray.from_arrays(pa.array(x.reshape(-1)), WIDTH), "y": y})
        pq.write_table(table, out / f"part-{f:02d}.parquet", row_group_size=GROUP)
    (out / "done").write_text("")
    return out


class RowGroups:
    """Where each row lives: (file, row group, first row) of every group."""

    def __init__(self, folder: Path):
        self.paths = sorted(str(p) for p in folder.glob("*.parquet"))
        self.groups = []
        first = 0
        for f, path in enumerate(self.paths):
            meta = pq.ParquetFile(path).metadata
            for g in range(meta.num_row_groups):
                rows = meta.row_group(g).num_rows
                self.groups.append((f, g, first, rows))
                first += rows
        self.rows = first
        self.starts = np.array([g[2] for g in self.groups])

    def group_of(self, i: int) -> int:
        return int(np.searchsorted(self.starts, i, side="right") - 1)


class ParquetRows(torch.utils.data.Dataset):
    """The anchor: one row per `__getitem__`, its row group read with
    pyarrow and kept until another is needed."""

    def __init__(self, folder: Path):
        self.index = RowGroups(folder)
        self.files = None
        self.cached = (-1, None, None)

    def __len__(self):
        return self.index.rows

    def _group(self, g: int):
        if self.cached[0] != g:
            if self.files is None:
                self.files = [pq.ParquetFile(p) for p in self.index.paths]
            f, in_file, _, _ = self.index.groups[g]
            table = self.files[f].read_row_group(in_file, columns=["x", "y"])
            x = table.column("x").combine_chunks().flatten().to_numpy().reshape(-1, WIDTH)
            y = table.column("y").to_numpy()
            self.cached = (g, x, y)
        return self.cached

    def __getitem__(self, i):
        g = self.index.group_of(i)
        _, x, y = self._group(g)
        at = i - self.index.groups[g][2]
        return torch.from_numpy(x[at]), torch.tensor(y[at])


class ParquetBatches(ParquetRows):
    """The second anchor: whole batches (`__getitems__`), one take per row
    group of the batch."""

    def __getitems__(self, indices):
        indices = np.asarray(indices)
        groups = np.searchsorted(self.index.starts, indices, side="right") - 1
        xs = np.empty((len(indices), WIDTH), np.float32)
        ys = np.empty(len(indices), np.int64)
        for g in np.unique(groups):
            at = groups == g
            _, x, y = self._group(int(g))
            rows = indices[at] - self.index.groups[g][2]
            xs[at], ys[at] = x[rows], y[rows]
        return torch.from_numpy(xs), torch.from_numpy(ys)


def batched_collate(batch):
    return batch


class BlockOrder(torch.utils.data.Sampler):
    """Row groups in a new order each epoch, rows shuffled within each."""

    def __init__(self, index: RowGroups, seed: int):
        self.index, self.seed, self.epoch = index, seed, 0

    def __len__(self):
        return self.index.rows

    def __iter__(self):
        rng = np.random.default_rng((self.seed, self.epoch))
        self.epoch += 1
        for g in rng.permutation(len(self.index.groups)):
            _, _, first, rows = self.index.groups[g]
            yield from (first + rng.permutation(rows)).tolist()


def touch(x, y):
    return float(x[:, -1].sum()) + float(y[-1])


def run_dataloader(folder, scenario, batched, workers, batch):
    ds = (ParquetBatches if batched else ParquetRows)(folder)
    kwargs = {}
    if scenario == "block":
        kwargs["sampler"] = BlockOrder(ds.index, 0)
    else:
        kwargs["shuffle"] = False
    if batched:
        kwargs["collate_fn"] = batched_collate
    start = time.perf_counter()
    dl = torch.utils.data.DataLoader(ds, batch_size=batch, num_workers=workers, **kwargs)
    rows = 0
    for x, y in dl:
        touch(x, y)
        rows += len(y)
    return rows / (time.perf_counter() - start)


def run_loader(folder, scenario, workers, batch):
    sampler = {"shuffle": scenario == "block", "seed": 0, "block_shuffle": scenario == "block"}
    spec = {
        "dataset": {"parquet": {"files": str(folder / "*.parquet"), "columns": ["x", "y"]}},
        "batch_size": batch,
        "sampler": sampler,
    }
    start = time.perf_counter()
    rows = 0
    with loader.Loader.local(spec, workers=workers) as dl:
        for b in dl:
            x, y = torch.as_tensor(np.asarray(b["x"])), torch.as_tensor(np.asarray(b["y"]))
            touch(x, y)
            rows += len(y)
    return rows / (time.perf_counter() - start)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--only", default="sequential,block")
    args = ap.parse_args()
    folder = make_files(args.rows)
    print(f"<!-- {args.rows} rows, {FILES} files, row groups of {GROUP}, {args.workers} workers, batch {args.batch}, "
          f"{args.repeats} repeats, torch {torch.__version__}, pyarrow {pa.__version__}, {os.cpu_count()} cpus -->")
    print("| scenario | Loader rows/s | DataLoader `__getitem__` rows/s | DataLoader `__getitems__` rows/s | Loader / `__getitem__` | Loader / `__getitems__` |")
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    for scenario in args.only.split(","):
        runs = {"loader": [], "rows": [], "batches": []}
        for r in range(args.repeats):
            order = ["loader", "rows", "batches"]
            if r % 2:
                order.reverse()
            for system in order:
                if system == "loader":
                    v = run_loader(folder, scenario, args.workers, args.batch)
                else:
                    v = run_dataloader(folder, scenario, system == "batches", args.workers, args.batch)
                runs[system].append(v)
                print(f"  {scenario} {system}: {v:,.0f} rows/s", file=sys.stderr, flush=True)
        med = {k: statistics.median(v) for k, v in runs.items()}
        print(f"| {scenario} | {med['loader']:,.0f} | {med['rows']:,.0f} | {med['batches']:,.0f} | "
              f"{med['loader'] / med['rows']:.2f}x | {med['loader'] / med['batches']:.2f}x |", flush=True)


if __name__ == "__main__":
    main()
