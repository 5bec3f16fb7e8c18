"""torchvision's ImageFolder with the standard train and eval transforms
(issue 54): torch's DataLoader (the anchor, and optionally the same in a
Pillow-SIMD venv) against ``Loader.local`` on its Python path and with
``native_transforms=True``, same run, same data, repeats taking turns.

    python bench/torchvision_native.py --repeats 5 --anchor-python target/simd-venv/bin/python
    python bench/torchvision_native.py --images bench/data/imagenet-shaped-256 --epochs 2 --repeats 1  # a quick check

bench/make_images.py makes the image folder (default
bench/data/imagenet-shaped, 2,560 JPEGs); bench/simd_venv.sh makes the
Pillow-SIMD venv. Rows, for each transform set (``--transforms``):
- train: RandomResizedCrop(224), RandomHorizontalFlip(), ToTensor(),
  Normalize(ImageNet mean, std);
- eval: Resize(256), CenterCrop(224), ToTensor(), Normalize(same);
each through
- ``DataLoader(ds, batch_size=64, shuffle=True, num_workers=2,
  persistent_workers=True)``: the anchor every ratio is against;
- the same in ``--anchor-python``'s interpreter (a venv with Pillow-SIMD);
- ``Loader.local(ds, 64, True, num_workers=2)``: the Python path;
- ``Loader.local(ds, 64, True, num_workers=2, native_transforms=True)``:
  left out, with the error's line, while Loader refuses the keyword or the
  dataset.

Every run is one fresh process, as a training script is: torch,
torchvision (and loader) imported and the ImageFolder built untimed, then
the loader constructed, ``--epochs`` passes iterated, and the loader shut
down (DataLoader's workers too) before the process exits, so no two runs
overlap and Loader pays its worker template every time, as a user does.
The loop touches each batch as a trainer would before the model (the last
value of every sample, bench/python_dataset.py's ``touch``). Numbers: time
from constructing the loader to the first batch in hand; samples/s of
epoch 1 from construction (start-up included, as users see it), of each
later epoch, and of all ``--epochs`` from construction; medians over
``--repeats``, the rows taking turns (the first row of a repeat rotates).
The files are in the page cache after the first run, for every row alike.
The Loader rows need loader built in the release profile (``pip install
./python``); the test venv's is a dev build (test.sh), several times
slower, and the header says so when it finds one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

IMAGENET_MEAN = [0.485, 0.456, 0.406]
IMAGENET_STD = [0.229, 0.224, 0.225]
BATCH = 64

# Row keys, in table order: (who runs it, label).
SYSTEMS = {
    "dataloader": "DataLoader",
    "simd": "DataLoader, Pillow-SIMD",
    "loader": "Loader.local",
    "native": "Loader.local native_transforms=True",
}


def transform(variant: str):
    from torchvision import transforms as T

    normalize = [T.ToTensor(), T.Normalize(mean=IMAGENET_MEAN, std=IMAGENET_STD)]
    if variant == "train":
        return T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), *normalize])
    if variant == "eval":
        return T.Compose([T.Resize(256), T.CenterCrop(224), *normalize])
    raise ValueError(variant)


# -- one run (a child process) -------------------------------------------------


def one_run(system: str, variant: str, images: str, workers: int, epochs: int) -> dict:
    """One loader over `epochs` passes of the ImageFolder; what the parent
    tabulates. Raises what constructing or iterating raised."""
    import torch
    import torchvision

    sys.path.insert(0, str(HERE))
    from python_dataset import touch  # the bench's one way to touch a batch

    dataset = torchvision.datasets.ImageFolder(images, transform=transform(variant))
    if system == "dataloader":
        make = lambda: torch.utils.data.DataLoader(  # noqa: E731
            dataset, batch_size=BATCH, shuffle=True, num_workers=workers, persistent_workers=True)
    else:
        import loader

        native = {"native_transforms": True} if system == "native" else {}
        make = lambda: loader.Loader.local(dataset, BATCH, True, num_workers=workers, **native)  # noqa: E731

    constructed = time.perf_counter()
    dl = make()
    first, ends, counts = None, [], []
    try:
        for _ in range(epochs):
            n = 0
            for batch in dl:
                n += touch(batch)
                if first is None:
                    first = time.perf_counter()
            ends.append(time.perf_counter())
            counts.append(n)
    finally:
        done = time.perf_counter()
        if system == "dataloader":
            # What deleting a persistent DataLoader does, made explicit so
            # the close is timed and its workers are gone before the exit.
            getattr(dl._iterator, "_shutdown_workers", lambda: None)()
        else:
            dl.close()
        closed = time.perf_counter()
    starts = [constructed, *ends[:-1]]
    return {
        "first_batch_s": first - constructed,
        "epoch_samples_per_s": [n / (e - s) for n, s, e in zip(counts, starts, ends)],
        "samples_per_s": sum(counts) / (ends[-1] - constructed),
        "samples": sum(counts),
        "close_s": closed - done,
    }


def child(args) -> None:
    try:
        out = one_run(args.child, args.variant, args.images, args.workers, args.epochs)
    except Exception as e:  # the parent prints the line and leaves the row out
        out = {"error": f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"}
    print(json.dumps(out), flush=True)


def dev_build() -> str | None:
    """A line when this interpreter's ``loader._native`` is a dev-profile
    build (the test venv's, test.sh's ``--profile dev``): its workers run
    unoptimized Rust, several times slower, and the Loader rows would not
    be Loader's speed. Read from the build-script paths the library
    embeds (``.../debug/build/...``), without importing loader."""
    import importlib.util
    import mmap

    spec = importlib.util.find_spec("loader")
    if spec is None or not spec.submodule_search_locations:
        return None
    for lib in Path(next(iter(spec.submodule_search_locations))).glob("_native*.so"):
        with open(lib, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
            if m.find(b"/debug/build/") >= 0:
                return (f"warning: {lib} is a dev-profile build: the Loader rows are not Loader's speed; install a "
                        f"release build (python -m pip install --force-reinstall --no-deps ./python)")
    return None


def versions(python: str) -> str:
    code = ("import torch, torchvision, PIL; "
            "print(f'torch={torch.__version__} torchvision={torchvision.__version__} PIL={PIL.__version__}')")
    p = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    return p.stdout.strip() if p.returncode == 0 else f"(failed: {p.stderr.strip().splitlines()[-1:]})"


# -- the parent ---------------------------------------------------------------


def run(python: str, system: str, variant: str, args) -> dict:
    cmd = [python, __file__, "--child", "dataloader" if system == "simd" else system, "--variant", variant,
           "--images", args.images, "--workers", str(args.workers), "--epochs", str(args.epochs)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout)
    lines = [line for line in p.stdout.splitlines() if line.startswith("{")]
    if p.returncode != 0 or not lines:
        tail = (p.stderr.strip().splitlines() or ["no output"])[-1]
        return {"error": f"exit {p.returncode}: {tail}"}
    return json.loads(lines[-1])


def medians(runs: list[dict]) -> dict:
    return {
        "first_batch_s": statistics.median(r["first_batch_s"] for r in runs),
        "epoch_samples_per_s": [statistics.median(r["epoch_samples_per_s"][e] for r in runs)
                                for e in range(len(runs[0]["epoch_samples_per_s"]))],
        "samples_per_s": statistics.median(r["samples_per_s"] for r in runs),
        "close_s": statistics.median(r["close_s"] for r in runs),
    }


def report(variant: str, med: dict[str, dict], errors: dict[str, str], epochs: int) -> None:
    # Epochs after the first (no start-up in them), when there are any.
    later = [] if epochs == 1 else [f"epochs 2-{epochs}" if epochs > 2 else "epoch 2"]
    span = "1 epoch" if epochs == 1 else f"{epochs} epochs"
    print()
    print(f"{variant} transforms")
    print("| loader | first batch, s | epoch 1 samples/s (start-up incl.) | "
          + "".join(f"{x} samples/s | " for x in later)
          + f"{span} samples/s (start-up incl.) | close, s |")
    print("| --- | ---: | ---: | " + "---: | " * len(later) + "---: | ---: |")
    for system, m in med.items():
        rest = [f"{statistics.median(m['epoch_samples_per_s'][1:]):,.0f} | "] if later else []
        print(f"| {SYSTEMS[system]} | {m['first_batch_s']:.2f} | {m['epoch_samples_per_s'][0]:,.0f} | "
              + "".join(rest) + f"{m['samples_per_s']:,.0f} | {m['close_s']:.2f} |")
    anchor = med.get("dataloader")
    for system, m in med.items():
        if system == "dataloader" or anchor is None:
            continue
        line = (f"{variant}, {SYSTEMS[system]}: {m['epoch_samples_per_s'][0] / anchor['epoch_samples_per_s'][0]:.2f}x "
                f"DataLoader in epoch 1, {m['samples_per_s'] / anchor['samples_per_s']:.2f}x over {span}, "
                f"first batch {m['first_batch_s']:.2f} s against {anchor['first_batch_s']:.2f} s")
        simd = med.get("simd")
        if simd and system in ("loader", "native"):
            line += (f"; {m['epoch_samples_per_s'][0] / simd['epoch_samples_per_s'][0]:.2f}x / "
                     f"{m['samples_per_s'] / simd['samples_per_s']:.2f}x DataLoader with Pillow-SIMD")
        print(line)
    for system, error in errors.items():
        print(f"{variant}, {SYSTEMS[system]}: left out: {error}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--images", default=str(HERE / "data" / "imagenet-shaped"))
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3, help="passes per run; epoch 1 is reported on its own too")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--transforms", default="train,eval", help="comma-separated: train, eval")
    p.add_argument("--only", default=",".join(SYSTEMS),
                   help=f"comma-separated rows: {', '.join(SYSTEMS)} (simd needs --anchor-python)")
    p.add_argument("--anchor-python", help="an interpreter with torch, torchvision and Pillow-SIMD "
                   "(bench/simd_venv.sh): the DataLoader rows again in it, taking turns with the others")
    p.add_argument("--json", help="write the runs and medians to this file ('-': stdout, after the tables)")
    p.add_argument("--timeout", type=float, default=900, help="seconds one run may take")
    p.add_argument("--child", choices=["dataloader", "loader", "native"], help=argparse.SUPPRESS)
    p.add_argument("--variant", choices=["train", "eval"], help=argparse.SUPPRESS)
    args = p.parse_args()
    args.images = os.path.abspath(args.images)
    if args.child:
        child(args)
        return
    if not os.path.isdir(args.images):
        sys.exit(f"{args.images}: no image folder; make one with bench/make_images.py --out {args.images}")
    if args.epochs < 1:
        sys.exit("--epochs must be at least 1")
    only, variants = args.only.split(","), args.transforms.split(",")
    for name, given, known in (("--only", only, list(SYSTEMS)), ("--transforms", variants, ["train", "eval"])):
        if unknown := set(given) - set(known):
            sys.exit(f"{name} {','.join(sorted(unknown))}: not one of {', '.join(known)}")
    systems = [s for s in SYSTEMS if s in only and (s != "simd" or args.anchor_python)]
    sys.stdout.reconfigure(line_buffering=True)  # tables in order with the progress on stderr

    files = sum(len(f) for _, _, f in os.walk(args.images))
    print(f"images={args.images} ({files:,} files) workers={args.workers} batch={BATCH} epochs={args.epochs} "
          f"repeats={args.repeats} cpus={os.cpu_count()} {versions(sys.executable)}")
    if "simd" in systems:
        print(f"anchor {args.anchor_python}: {versions(args.anchor_python)}")
    if {"loader", "native"} & set(systems) and (warning := dev_build()):
        print(warning)

    runs = {v: {s: [] for s in systems} for v in variants}
    errors: dict[str, dict[str, str]] = {v: {} for v in variants}
    for r in range(args.repeats):
        for variant in variants:
            # Taking turns: each repeat starts with the next row.
            k = r % len(systems)
            for system in systems[k:] + systems[:k]:
                if system in errors[variant]:
                    continue  # refused once, refused every time: the row is left out
                python = args.anchor_python if system == "simd" else sys.executable
                got = run(python, system, variant, args)
                if "error" in got:
                    errors[variant][system] = got["error"]
                    print(f"  {variant} {SYSTEMS[system]}: {got['error']}", file=sys.stderr, flush=True)
                    continue
                runs[variant][system].append(got)
                print(f"  {variant} {SYSTEMS[system]}: first batch {got['first_batch_s']:.2f} s, "
                      + ", ".join(f"{x:,.0f}" for x in got["epoch_samples_per_s"])
                      + f" samples/s by epoch, {got['samples_per_s']:,.0f} over all", file=sys.stderr, flush=True)

    summary = {}
    for variant in variants:
        med = {s: medians(runs[variant][s]) for s in systems if runs[variant][s] and s not in errors[variant]}
        report(variant, med, errors[variant], args.epochs)
        summary[variant] = {"medians": med, "runs": runs[variant], "left_out": errors[variant]}
    if args.json:
        text = json.dumps({"images": args.images, "workers": args.workers, "batch_size": BATCH,
                           "epochs": args.epochs, "repeats": args.repeats, "anchor_python": args.anchor_python,
                           "transforms": summary}, indent=1)
        if args.json == "-":
            print(text)
        else:
            Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
