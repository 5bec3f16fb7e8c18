"""Where a worker's time goes in one scenario of bench/python_dataset.py:
runs the scenario's dataset through Loader.local or DataLoader (2 workers)
for as many epochs as it takes, and once warm samples every worker (and the
trainer) with ``py-spy record`` (pip install py-spy), then prints each
process's CPU seconds over the window (from /proc) per 1,000 samples, and
the hottest frames: by self time (the leaf) and by inclusive time.

    bench/profile_dataset.py --scenario tv-uint8 --system loader
    bench/profile_dataset.py --scenario hf-tokens-numpy --system torch --duration 8
    bench/profile_dataset.py --scenario tv-float --system loader --native   # C/Rust frames too

The raw collapsed stacks are kept (``--out``, one file per process), e.g.
for flamegraph.pl.
"""

from __future__ import annotations

import argparse
import collections
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import python_dataset as pd  # noqa: E402


def cpu_seconds(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def summarize(path: Path, top: int) -> str:
    leaf, incl, total = collections.Counter(), collections.Counter(), 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack:
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        # py-spy's first frame is the thread ("process 123:..."/"thread (0x..)")
        frames = [f for f in frames if not f.startswith(("process ", "thread "))]
        if not frames:
            continue
        leaf[_short(frames[-1])] += n
        for f in set(_short(f) for f in frames):
            incl[f] += n
    if not total:
        return "    (no samples)\n"
    out = [f"    {total} samples; self:"]
    out += [f"    {100 * n / total:5.1f}%  {f}" for f, n in leaf.most_common(top)]
    out.append("    inclusive:")
    out += [f"    {100 * n / total:5.1f}%  {f}" for f, n in incl.most_common(top)]
    return "\n".join(out) + "\n"


def _short(frame: str) -> str:
    # "func (path/to/file.py:123)" -> "func (file.py)": lines of one function merge
    name, _, where = frame.partition(" (")
    if where:
        file = where.rstrip(")").rsplit(":", 1)[0]
        return f"{name} ({'/'.join(Path(file).parts[-2:])})"
    return name


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scenario", default="tv-uint8",
                   choices=[s for s in pd.SCENARIOS if s not in ("first-batch", "small")])
    p.add_argument("--system", choices=["loader", "torch"], default="loader")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--warmup", type=float, default=3.0, help="seconds after the first batch")
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--rate", type=int, default=250)
    p.add_argument("--native", action="store_true", help="py-spy --native (C and Rust frames)")
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--with-torchvision", action="store_true",
                   help="import torchvision for an hf- scenario too (see python_dataset.py)")
    p.add_argument("--out", type=Path, default=Path("/tmp/profile_dataset"))
    p.add_argument("--images", default=str(HERE / "data" / "imagenet-shaped"))
    p.add_argument("--hf-rows", type=int, default=20_000)
    p.add_argument("--hf-tabular-rows", type=int, default=100_000)
    p.add_argument("--rows", type=int, default=200_000)
    a = p.parse_args()
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    a.out.mkdir(parents=True, exist_ok=True)

    import torch

    if a.scenario.startswith("hf-"):
        import datasets  # noqa: F401

        if a.with_torchvision:
            import torchvision  # noqa: F401
    else:
        import torchvision  # noqa: F401
    import loader

    [(name, make, batch, seed_rngs)] = list(pd.scenarios([a.scenario], a))
    dataset = make()
    epochs = 1000
    if a.system == "loader":
        dl = loader.Loader.local(dataset, workers=a.workers, batch_size=batch, shuffle=True, seed=0,
                                 epochs=epochs, seed_rngs=seed_rngs)
        set_epoch, pids = dl.set_epoch, lambda it: dl.worker_pids()
    else:
        dl = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=a.workers,
                                         persistent_workers=True)
        set_epoch, pids = (lambda e: None), (lambda it: [w.pid for w in it._workers])
    print(f"{name}: {a.system}, {a.workers} workers", flush=True)

    state = {"samples": 0, "done": False}
    window = {}

    def profile(workers: list[int]) -> None:
        time.sleep(a.warmup)
        procs, files = [], {}
        targets = {"trainer": os.getpid(), **{f"worker{i}": w for i, w in enumerate(workers)}}
        for role, pid in targets.items():
            files[role] = a.out / f"{a.scenario}-{a.system}-{role}.txt"
            files[role].unlink(missing_ok=True)
            cmd = [spy, "record", "--pid", str(pid), "--duration", str(int(a.duration)), "--rate",
                   str(a.rate), "--format", "raw", "--output", str(files[role])]
            # --native pauses the process for each sample (py-spy cannot
            # unwind native frames without stopping it): slower, but exact.
            cmd.append("--native" if a.native else "--nonblocking")
            procs.append(subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE))
        cpu0 = {r: cpu_seconds(p) for r, p in targets.items()}
        s0, t0 = state["samples"], time.perf_counter()
        errors = [p.communicate()[1].decode(errors="replace") for p in procs]
        cpu1 = {r: cpu_seconds(p) for r, p in targets.items()}
        s1, t1 = state["samples"], time.perf_counter()
        window.update(targets=targets, files=files, errors=errors, cpu=(cpu0, cpu1), samples=s1 - s0,
                      seconds=t1 - t0)
        state["done"] = True

    thread = None
    try:
        for epoch in range(epochs):
            set_epoch(epoch)
            it = iter(dl)
            for batch in it:
                state["samples"] += pd.touch(batch)
                if thread is None:
                    thread = threading.Thread(target=profile, args=(pids(it),), daemon=True)
                    thread.start()
                if state["done"]:
                    break
            if state["done"]:
                break
    finally:
        if a.system == "loader":
            dl.close()
    thread.join()
    n, secs = window["samples"], window["seconds"]
    cpu0, cpu1 = window["cpu"]
    print(f"window: {secs:.1f} s, {n} samples, {n / secs:.0f} samples/s; CPU s per 1,000 samples:")
    for role in window["targets"]:
        used = cpu1[role] - cpu0[role]
        print(f"  {role}: {1000 * used / max(n, 1):.3f} ({100 * used / secs:.0f}% of a core)")
    for role, file in window["files"].items():
        print(f"\n{role} (pid {window['targets'][role]}), {file}:")
        if file.exists():
            print(summarize(file, a.top), end="")
    for e in window["errors"]:
        lines = [ln for ln in e.splitlines() if ln.strip() and "Wrote raw" not in ln
                 and "Sampling process" not in ln and "flamegraph" not in ln]
        if lines:
            print("py-spy: " + "\n".join(lines)[-2000:], file=sys.stderr)


if __name__ == "__main__":
    main()
