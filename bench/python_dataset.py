"""Bring-your-own-Dataset benchmark: the same user datasets through
``loader.Loader.local(dataset, ...)`` and through
``torch.utils.data.DataLoader(dataset, ...)``, same workers, same batch size,
in one run, repeats interleaved (the system that goes first alternates).
Prints one markdown table row per scenario (and per ``--epochs`` value) with
the median of each system's samples/s and the ratio, plus the
time-to-first-batch table.

    bench/make_images.py                                   # the JPEG folder (2,560 files)
    bench/python_dataset.py --workers 2 --repeats 5 --rows 100000      # everything, one epoch per run
    bench/python_dataset.py --only images,small --repeats 5 --rows 100000
    bench/python_dataset.py --only images --epochs 3 --repeats 8      # issue 22's image target
    bench/python_dataset.py --only tv --epochs 3,1 --repeats 5        # issue 29: torchvision ImageFolder
    bench/python_dataset.py --only tv-cache --epochs 3,1 --repeats 5  # the same with Loader's sample cache
    bench/python_dataset.py --only hf --repeats 5                     # issue 29: Hugging Face datasets
    bench/python_dataset.py --only first-batch --first-batch-repeats 7

Scenarios (``--only``, comma-separated; groups: ``tv``, ``hf``,
``hf-tokens``, ``hf-tabular``):
- images: the bench's own ``ImageFiles`` (bench/dataset_classes.py): PIL
  decode + torchvision RandomResizedCrop(224) + RandomHorizontalFlip +
  ToTensor, batch 64;
- small: 1 KB float32 rows of a .npy file (mmap) + an int label, batch 256
  (``Rows``; the file is made in bench/data/ on first use), with Loader's
  per-sample RNG seeding (the default) and without it (``seed_rngs=False``);
- tv-uint8 / tv-float: torchvision's own ``datasets.ImageFolder`` over the
  same folder with the standard transforms: RandomResizedCrop(224),
  RandomHorizontalFlip(), then PILToTensor() (uint8) or ToTensor() +
  Normalize(ImageNet mean, std) (float32); batch 64;
- tv-uint8-cache / tv-float-cache: the same two, with ``Loader.local(...,
  cache=True)``: the decoded images (ImageFolder's ``loader(path)``) kept
  across epochs in a cache the workers share, the transforms run every
  epoch (DataLoader as in the rows above: it has no such option);
- hf-tokens-numpy / hf-tokens-torch: a Hugging Face ``datasets.Dataset``
  built here (``Dataset.from_dict``, ``save_to_disk`` into bench/data/,
  reopened with ``load_from_disk``: Arrow memory-mapped, as users have it)
  of ``--hf-rows`` rows of 2048 int64 token ids + an int64 label,
  ``.with_format("numpy")`` / ``("torch")``, batch 64;
- hf-tabular-numpy / hf-tabular-torch: the same for ``--hf-tabular-rows``
  rows of 64 float32 features + an int64 label, batch 256;
- first-batch: seconds from constructing the loader (``Loader.local(...)``
  or ``DataLoader(...)``, non-persistent workers) to the first batch in
  hand, over the tv-uint8 ImageFolder, in fresh subprocesses that have
  already imported torch/torchvision and built the dataset: for the first
  loader of the process and for a second one made after the first was
  closed; and how long closing took.

DataLoader runs as users get it: ``persistent_workers=True`` for the
throughput rows (its best case over several epochs), its default fetcher
(which calls ``dataset.__getitems__`` when the dataset has one, as HF's
``Dataset`` does) and ``default_collate``. Both loops take each batch as
torch tensors and touch it (the last value of every sample of every leaf),
as a trainer does before the model. Two numbers per system: samples/s from
the first batch on (worker start-up excluded for both), and samples/s
including start-up (from constructing the loader to the last batch: what a
run of that many epochs costs). A third column pair: CPU ms per sample
(user + system, of this process and all its descendants, from construction
to the last batch): the job's whole cost, which stays put when other work
shares the cores and wall-clock ratios swing (on a box where the workers
saturate every core, the throughput ratio tends to the inverse CPU ratio).
Each run is a fresh loader over ``--epochs`` epochs. Loader forks its workers from a per-process template
made at the first ``Loader.local`` of the process, so only the first
Loader run of this process pays for the template; the first-batch table
measures fresh processes.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import warnings
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
import torch  # noqa: E402

# DataLoader's default_collate over HF's read-only numpy views warns once per
# worker process: noise in the table (inherited by the forked workers).
warnings.filterwarnings("ignore", message="The given NumPy array is not writable")

from dataset_classes import ImageFiles, ImageStream, Rows, ShardedTokenStream, TokenStream  # noqa: E402

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

# Scenario names, in the order they run, and the groups --only takes.
SCENARIOS = [
    "images", "small",
    "tv-uint8", "tv-float", "tv-uint8-cache", "tv-float-cache",
    "hf-tokens-numpy", "hf-tokens-torch", "hf-tabular-numpy", "hf-tabular-torch",
    "stream-tokens", "stream-tokens-sharded", "stream-images",
    "first-batch",
]
GROUPS = {
    "tv": ["tv-uint8", "tv-float"],
    "tv-cache": ["tv-uint8-cache", "tv-float-cache"],
    "hf": ["hf-tokens-numpy", "hf-tokens-torch", "hf-tabular-numpy", "hf-tabular-torch"],
    "hf-tokens": ["hf-tokens-numpy", "hf-tokens-torch"],
    "hf-tabular": ["hf-tabular-numpy", "hf-tabular-torch"],
    "stream": ["stream-tokens", "stream-tokens-sharded", "stream-images"],
}


# -- the loops ----------------------------------------------------------------


def _tensors(batch):
    if isinstance(batch, torch.Tensor):
        yield batch
    elif isinstance(batch, dict):
        for v in batch.values():
            yield from _tensors(v)
    elif isinstance(batch, (list, tuple)):
        for v in batch:
            yield from _tensors(v)
    else:
        raise TypeError(f"batch leaf {type(batch).__name__}")


def touch(batch) -> int:
    """Reads the last value of every sample of every leaf; returns the
    batch's samples."""
    n, total = 0, 0.0
    for t in _tensors(batch):
        n = t.shape[0]
        total += float(t.reshape(n, -1)[:, -1].sum())
    return n


def _cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


_TICKS = os.sysconf("SC_CLK_TCK")


def tree_cpu() -> dict[int, float]:
    """CPU seconds (user + system) of this process and every descendant
    (DataLoader's workers; Loader's worker template and the workers it
    forked), by pid."""
    out, todo = {}, [os.getpid()]
    while todo:
        pid = todo.pop()
        try:
            out[pid] = _cpu(pid)
            for tid in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    todo += [int(x) for x in f.read().split()]
        except (FileNotFoundError, ProcessLookupError):
            pass
    return out


def run_torch(dataset, batch_size, workers, epochs, persistent=True) -> tuple[float, float, float]:
    cpu = tree_cpu()
    constructed = time.perf_counter()
    # An IterableDataset takes no shuffle (DataLoader refuses it): its
    # order is its own.
    iterable = isinstance(dataset, torch.utils.data.IterableDataset)
    dl = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=None if iterable else True, num_workers=workers,
        persistent_workers=persistent, drop_last=False,
    )
    try:
        return _time(dl, epochs, lambda e: None, constructed, cpu)
    finally:
        del dl  # its workers stop (persistent ones with the loader)


def run_loader(dataset, batch_size, workers, epochs, **kwargs) -> tuple[float, float, float]:
    import loader

    cpu = tree_cpu()
    constructed = time.perf_counter()
    with loader.Loader.local(
        dataset, workers=workers, batch_size=batch_size, shuffle=True, seed=0, epochs=epochs, **kwargs,
    ) as dl:
        return _time(dl, epochs, dl.set_epoch, constructed, cpu)


def _time(dl, epochs, set_epoch, constructed, cpu) -> tuple[float, float, float]:
    """(samples/s from the first batch on, samples/s from construction, CPU
    ms per sample of the trainer and all its descendants from construction
    on: the whole job's cost, which holds when other work shares the
    cores)."""
    samples, total, first = 0, 0, None
    for epoch in range(epochs):
        set_epoch(epoch)
        for batch in dl:
            n = touch(batch)
            total += n
            if first is None:
                first = time.perf_counter()  # from the first batch on
                continue
            samples += n
    end = time.perf_counter()
    now = tree_cpu()  # before the workers stop
    used = sum(t - cpu.get(pid, 0.0) for pid, t in now.items())
    return samples / (end - first), total / (end - constructed), 1000 * used / total


# -- the datasets -------------------------------------------------------------


def token_files(count: int, tokens: int) -> list:
    """``count`` .npy files of ``tokens`` random int32 ids each, in
    bench/data/ (made on first use)."""
    out = []
    directory = HERE / "data" / f"token-files-{count}x{tokens}"
    directory.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    for i in range(count):
        path = directory / f"tokens-{i:03}.npy"
        if not path.exists():
            np.save(path, rng.integers(0, 50_000, tokens, dtype=np.int32))
        out.append(str(path))
    return out


def rows_file(n: int) -> str:
    path = HERE / "data" / f"rows-{n}x256-f32.npy"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = np.random.default_rng(0).random((n, 256), dtype=np.float32)
        np.save(path, rows)
    return str(path)


def tv_transform(variant: str):
    from torchvision import transforms as T

    if variant == "uint8":
        tail = [T.PILToTensor()]
    elif variant == "float":
        tail = [T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    else:
        raise ValueError(variant)
    return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), *tail])


def image_folder(root: str, variant: str):
    """torchvision's own ImageFolder, as a user builds it."""
    import torchvision

    if not os.path.isdir(root):
        sys.exit(f"{root}: no image folder; make it with bench/make_images.py --out {root}")
    return torchvision.datasets.ImageFolder(root, transform=tv_transform(variant))


def hf_path(kind: str, rows: int) -> Path:
    """A Hugging Face dataset saved with ``save_to_disk`` under bench/data/,
    made here on first use (``Dataset.from_dict`` in chunks, no hub)."""
    import datasets

    if kind == "tokens":
        path = HERE / "data" / f"hf-tokens-{rows}x2048-i64"
        features = datasets.Features({
            "input_ids": datasets.Sequence(datasets.Value("int64"), length=2048),
            "label": datasets.Value("int64"),
        })
    else:
        path = HERE / "data" / f"hf-tabular-{rows}x64-f32"
        features = datasets.Features({
            "features": datasets.Sequence(datasets.Value("float32"), length=64),
            "label": datasets.Value("int64"),
        })
    if (path / "dataset_info.json").exists():
        return path
    print(f"making {path} ...", file=sys.stderr, flush=True)
    rng = np.random.default_rng(0)
    parts, chunk = [], 2000 if kind == "tokens" else 50_000
    for start in range(0, rows, chunk):
        n = min(chunk, rows - start)
        if kind == "tokens":
            cols = {"input_ids": rng.integers(0, 50_257, (n, 2048), dtype=np.int64)}
        else:
            cols = {"features": rng.standard_normal((n, 64), dtype=np.float32)}
        cols["label"] = rng.integers(0, 10, n, dtype=np.int64)
        parts.append(datasets.Dataset.from_dict(cols, features=features))
    ds = datasets.concatenate_datasets(parts) if len(parts) > 1 else parts[0]
    tmp = path.with_name(path.name + ".tmp")
    datasets.disable_progress_bars()
    ds.save_to_disk(str(tmp))
    tmp.rename(path)
    return path


def hf_dataset(kind: str, rows: int, fmt: str):
    import datasets

    return datasets.load_from_disk(str(hf_path(kind, rows))).with_format(fmt)


# -- time to first batch (fresh subprocesses) ----------------------------------


def first_batch_child(system: str, root: str, workers: int, batch: int) -> None:
    """One fresh process: torch and torchvision imported and the ImageFolder
    built (not timed), then two loaders one after the other: seconds from
    constructing each to its first batch in hand, and to close it."""
    dataset = image_folder(root, "uint8")
    if system == "loader":
        import loader
    out = {}
    for which in ("first", "second"):
        t0 = time.perf_counter()
        if system == "torch":
            dl = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers)
        else:
            dl = loader.Loader.local(dataset, workers=workers, batch_size=batch, shuffle=True, seed=0)
        it = iter(dl)
        b = next(it)
        touch(b)
        t1 = time.perf_counter()
        del b
        if system == "torch":
            getattr(it, "_shutdown_workers", lambda: None)()  # what deleting it does
            del it, dl
        else:
            del it
            dl.close()
            del dl
        t2 = time.perf_counter()
        out[which] = t1 - t0
        out[which + "_close"] = t2 - t1
    print(json.dumps(out), flush=True)


def first_batch_table(args) -> None:
    runs = {"torch": [], "loader": []}
    for r in range(args.first_batch_repeats):
        order = ["torch", "loader"] if r % 2 == 0 else ["loader", "torch"]
        for system in order:
            cmd = [sys.executable, __file__, "--first-batch-child", system, "--images", args.images,
                   "--workers", str(args.workers)]
            p = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            if p.returncode != 0:
                print(f"  first-batch {system}: failed (exit {p.returncode}):\n{p.stderr[-3000:]}",
                      file=sys.stderr, flush=True)
                continue
            runs[system].append(json.loads(p.stdout.strip().splitlines()[-1]))
            got = runs[system][-1]
            print(f"  first-batch {system}: first {got['first']:.3f} s, second {got['second']:.3f} s, "
                  f"close {got['first_close']:.3f} / {got['second_close']:.3f} s",
                  file=sys.stderr, flush=True)
    print()
    print(f"Time to first batch: fresh process (torch + torchvision imported, ImageFolder of "
          f"{args.images} built), PILToTensor variant, batch 64, {args.workers} workers, shuffle; "
          f"DataLoader not persistent; medians of {args.first_batch_repeats}")
    print()
    print("| loader | first loader of the process, s | second loader (after closing the first), s "
          "| close first / second, s |")
    print("| --- | ---: | ---: | ---: |")
    names = {"torch": "torch DataLoader(num_workers=2)", "loader": "Loader.local(workers=2)"}
    for system in ("torch", "loader"):
        got = runs[system]
        if not got:
            print(f"| {names[system]} | failed | failed | |")
            continue
        med = {k: statistics.median(g[k] for g in got) for k in got[0]}
        print(f"| {names[system]} | {med['first']:.3f} | {med['second']:.3f} | "
              f"{med['first_close']:.3f} / {med['second_close']:.3f} |", flush=True)


# -- main ---------------------------------------------------------------------


def selected(only: str | None) -> list[str]:
    if not only:
        return list(SCENARIOS)
    names = set()
    for name in only.split(","):
        name = name.strip()
        if name in GROUPS:
            names.update(GROUPS[name])
        elif name in SCENARIOS:
            names.add(name)
        else:
            sys.exit(f"--only {name}: not one of {', '.join(SCENARIOS + list(GROUPS))}")
    return [s for s in SCENARIOS if s in names]


def scenarios(names: list[str], args):
    """(row name, dataset factory, batch size, Loader.local's extra keywords)
    per row."""
    for name in names:
        if name == "images":
            yield ("images: PIL + RandomResizedCrop(224) + flip + ToTensor, batch 64",
                   lambda: ImageFiles(args.images), 64, {})
        elif name == "small":
            rows = lambda: Rows(rows_file(args.rows))  # noqa: E731
            yield ("small samples: 1 KB float32 rows, batch 256", rows, 256, {})
            yield ("small samples, Loader with seed_rngs=False", rows, 256, {"seed_rngs": False})
        elif name == "tv-uint8":
            yield ("torchvision ImageFolder: RandomResizedCrop(224) + flip + PILToTensor (uint8), batch 64",
                   lambda: image_folder(args.images, "uint8"), 64, {})
        elif name == "tv-float":
            yield ("torchvision ImageFolder: RandomResizedCrop(224) + flip + ToTensor + Normalize "
                   "(float32), batch 64", lambda: image_folder(args.images, "float"), 64, {})
        elif name in ("tv-uint8-cache", "tv-float-cache"):
            variant = name.split("-")[1]
            what = "PILToTensor (uint8)" if variant == "uint8" else "ToTensor + Normalize (float32)"
            yield (f"the same ImageFolder, {what}, Loader with cache=True (decoded images kept across epochs)",
                   lambda variant=variant: image_folder(args.images, variant), 64, {"cache": True})
        elif name.startswith("hf-tokens-"):
            fmt = name.rsplit("-", 1)[1]
            yield (f"HF datasets load_from_disk: {args.hf_rows} x 2048 int64 tokens + label, "
                   f'with_format("{fmt}"), batch 64',
                   lambda fmt=fmt: hf_dataset("tokens", args.hf_rows, fmt), 64, {})
        elif name in ("stream-tokens", "stream-tokens-sharded"):
            files = lambda: token_files(args.token_files, args.file_tokens)  # noqa: E731
            if name == "stream-tokens":
                yield (f"IterableDataset: {args.token_files} .npy token files split by get_worker_info(), "
                       f"windows of 2049 int64, batch 64", lambda: TokenStream(files()), 64, {"shuffle_buffer": 0})
            else:
                yield ("the same with Loader's shard protocol (a file a shard, lengths counted by Loader)",
                       lambda: ShardedTokenStream(files()), 64, {"shuffle_buffer": 0})
        elif name == "stream-images":
            yield ("IterableDataset: 16 shards of JPEGs, PIL + RandomResizedCrop(224) + flip + ToTensor "
                   "in the iterator, shards and lengths given, batch 64",
                   lambda: ImageStream(args.images), 64, {"shuffle_buffer": 0})
        elif name.startswith("hf-tabular-"):
            fmt = name.rsplit("-", 1)[1]
            yield (f"HF datasets load_from_disk: {args.hf_tabular_rows} x 64 float32 features + label, "
                   f'with_format("{fmt}"), batch 256',
                   lambda fmt=fmt: hf_dataset("tabular", args.hf_tabular_rows, fmt), 256, {})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", default=str(HERE / "data" / "imagenet-shaped"))
    p.add_argument("--rows", type=int, default=200_000, help="samples of the small-sample dataset")
    p.add_argument("--hf-rows", type=int, default=20_000, help="rows of the HF token dataset")
    p.add_argument("--hf-tabular-rows", type=int, default=100_000, help="rows of the HF tabular dataset")
    p.add_argument("--token-files", type=int, default=16, help="files of the token streams")
    p.add_argument("--file-tokens", type=int, default=1_000_000, help="tokens per file of the token streams")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--first-batch-repeats", type=int, default=5)
    p.add_argument("--epochs", default="1",
                   help="epochs per run; a comma-separated list gives one row per value (e.g. 3,1)")
    p.add_argument("--only", default=None,
                   help=f"comma-separated scenarios or groups: {', '.join(SCENARIOS + list(GROUPS))}")
    p.add_argument("--first-batch-child", choices=["torch", "loader"], help=argparse.SUPPRESS)
    args = p.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # rows in order with the progress on stderr

    if args.first_batch_child:
        first_batch_child(args.first_batch_child, args.images, args.workers, 64)
        return
    names = selected(args.only)
    epochs_list = [int(e) for e in args.epochs.split(",")]
    # As a user's script has them: imported before the first loader (the
    # worker template of Loader.local is a snapshot of this process then).
    # torchvision only for the image scenarios: with torchvision imported,
    # HF datasets' numpy/torch formatters try `from torchvision.io import
    # VideoReader` on every value they format, which fails with torchvision
    # 0.29 after a full search of sys.path: a per-row cost a text-training
    # script does not have (run `--only hf` on its own).
    versions = [f"torch={torch.__version__}"]
    if any(n in ("images", "first-batch", "stream-images") or n.startswith("tv-") for n in names):
        import torchvision

        versions.append(f"torchvision={torchvision.__version__}")
    if any(n.startswith("hf-") for n in names):
        import datasets

        datasets.disable_progress_bars()
        versions.append(f"datasets={datasets.__version__}")
    import loader

    print(f"workers={args.workers} repeats={args.repeats} epochs={args.epochs} "
          f"cpus={os.cpu_count()} {' '.join(versions)} loader={getattr(loader, '__version__', '?')}", flush=True)
    rows = list(scenarios(names, args))
    if rows:
        print("| scenario | torch DataLoader samples/s | Loader samples/s | Loader / torch "
              "| torch incl. start-up | Loader incl. start-up | Loader / torch incl. start-up "
              "| CPU ms/sample torch / Loader |")
        print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, make, batch, loader_kwargs in rows:
        dataset = make()
        for epochs in epochs_list:
            label = name + (f", {epochs} epochs per run" if len(epochs_list) > 1 or epochs != 1 else "")
            runs = {"torch": [], "loader": []}
            for r in range(args.repeats):  # interleaved: load drifts hit both
                order = ["torch", "loader"] if r % 2 == 0 else ["loader", "torch"]
                this = {}
                for system in order:
                    try:
                        if system == "torch":
                            got = run_torch(dataset, batch, args.workers, epochs)
                        else:
                            got = run_loader(dataset, batch, args.workers, epochs, **loader_kwargs)
                    except Exception as e:  # a failing row says why and the others go on
                        print(f"  {label}: {system} failed: {type(e).__name__}: {e}",
                              file=sys.stderr, flush=True)
                        got = None
                    if got is not None:
                        runs[system].append(got)
                        this[system] = got
                print(f"  {label}: " + ", ".join(
                    f"{s} {this[s][0]:.0f} ({this[s][1]:.0f} incl. start-up, {this[s][2]:.3f} CPU ms/sample)"
                    for s in ("torch", "loader") if s in this), file=sys.stderr, flush=True)
            med = {s: [statistics.median(x[i] for x in runs[s]) for i in (0, 1, 2)] if runs[s] else None
                   for s in runs}
            t, lo = med["torch"], med["loader"]
            if t is None or lo is None:
                cell = lambda m, i: "failed" if m is None else f"{m[i]:.0f}"  # noqa: E731
                print(f"| {label} | {cell(t, 0)} | {cell(lo, 0)} | | {cell(t, 1)} | {cell(lo, 1)} | | |",
                      flush=True)
                continue
            print(f"| {label} | {t[0]:.0f} | {lo[0]:.0f} | {lo[0] / t[0]:.2f}x "
                  f"| {t[1]:.0f} | {lo[1]:.0f} | {lo[1] / t[1]:.2f}x | {t[2]:.3f} / {lo[2]:.3f} |", flush=True)
    if "first-batch" in names:
        first_batch_table(args)


if __name__ == "__main__":
    main()
