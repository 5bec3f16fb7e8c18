"""Per-worker memory of a dataset that holds its index in Python lists, like
torchvision's ``ImageFolder`` over ImageNet (1.28 M ``(path, class_index)``
pairs), through ``torch.utils.data.DataLoader(num_workers=W)`` and through
``loader.Loader.local(dataset, workers=W)``: RSS, USS (private pages) and
PSS (shared pages split between the processes that map them) of each worker,
from ``/proc/PID/smaps_rollup``, right after the first batch and after the
workers have read ``--samples-per-worker`` samples each (shuffled).

DataLoader's workers are forks of the trainer: the list starts shared, and
every sample read bumps reference counts (and the garbage collector writes
its headers) on the pages of the list's objects, so each worker ends up with
its own copy of the pages it touched ("copy-on-read", pytorch#13246): USS
grows with the samples read. Loader's workers receive the dataset pickled
and hold their own unpickled copy from the start (private from the first
batch, no growth), and are forked from a worker template made at the first
``Loader.local`` (a snapshot of the trainer then, with ``gc.freeze()``), so
whatever the trainer held at that time is shared with them as well. The
total PSS of all processes (trainer, workers, Loader's template) is the
machine's memory for the job.

    bench/dataset_rss.py                          # 1.28 M pairs (needs large-pickle support in Loader)
    bench/dataset_rss.py --pairs 5000 --samples-per-worker 2000   # a quick check

Each system runs in a fresh subprocess (the dataset built there, before the
loader, as a training script does).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

FIELDS = ("Rss", "Pss", "Pss_Anon", "Pss_File", "Pss_Shmem", "Shared_Clean", "Shared_Dirty",
          "Private_Clean", "Private_Dirty", "Anonymous")


def memory(pid: int) -> dict:
    """kB of each of FIELDS from /proc/PID/smaps_rollup, and USS."""
    out = {f: 0 for f in FIELDS}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 2 and parts[0].rstrip(":") in out:
                out[parts[0].rstrip(":")] = int(parts[1])
    out["Uss"] = out["Private_Clean"] + out["Private_Dirty"]
    return out


def children(pid: int) -> list[int]:
    """Direct children of pid, from /proc/PID/task/*/children."""
    kids = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return kids
    for tid in tasks:
        try:
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                kids += [int(x) for x in f.read().split()]
        except FileNotFoundError:
            pass
    return sorted(set(kids))


def snapshot(roles: dict[str, list[int]]) -> dict:
    snap = {}
    for role, pids in roles.items():
        for i, pid in enumerate(pids):
            try:
                snap[f"{role}{i if len(pids) > 1 or role == 'worker' else ''}"] = {"pid": pid, **memory(pid)}
            except (FileNotFoundError, ProcessLookupError):
                pass
    return snap


def child(system: str, pairs: int, per_worker: int, workers: int, batch: int) -> None:
    """One fresh process: build the dataset, run one loader, print JSON."""
    import numpy  # noqa: F401
    import torch

    from dataset_classes import ImageNetPaths

    me = os.getpid()
    bare = memory(me)
    t0 = time.perf_counter()
    dataset = ImageNetPaths(pairs)
    built = time.perf_counter() - t0
    result = {"system": system, "pairs": len(dataset), "build_s": built,
              "trainer_bare": bare, "trainer_before": memory(me)}
    want = per_worker * workers
    consumed, first = 0, None
    t0 = time.perf_counter()
    if system == "torch":
        dl = torch.utils.data.DataLoader(dataset, batch_size=batch, shuffle=True, num_workers=workers)
        it = iter(dl)
        roles = lambda: {"trainer": [me], "worker": [w.pid for w in it._workers]}  # noqa: E731
    else:
        import loader

        dl = loader.Loader.local(dataset, workers=workers, batch_size=batch, shuffle=True, seed=0,
                                 ready_timeout=120)
        it = iter(dl)

        def roles():
            pids = dl.worker_pids()
            # The template: the trainer's child that forks the workers.
            others = [p for p in children(me) if p not in pids]
            return {"trainer": [me], "worker": pids, "template": others}
    for b in it:
        consumed += b[1].shape[0]
        if first is None:
            first = time.perf_counter() - t0
            result["first_batch_s"] = first
            result["at_first_batch"] = snapshot(roles())
        del b
        if consumed >= want:
            break
    result["read_s"] = time.perf_counter() - t0
    result["consumed"] = consumed
    time.sleep(0.5)  # workers finish the batches they were making
    result["after"] = snapshot(roles())
    if system == "torch":
        del it, dl
    else:
        dl.close()
    print(json.dumps(result), flush=True)


def mb(kb: int) -> str:
    return f"{kb / 1024:,.0f}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pairs", type=int, default=1_281_167, help="(path, class_index) pairs in the list")
    p.add_argument("--samples-per-worker", type=int, default=100_000)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--systems", default="torch,loader")
    p.add_argument("--json", help="also write the raw measurements here")
    p.add_argument("--child", choices=["torch", "loader"], help=argparse.SUPPRESS)
    a = p.parse_args()
    sys.stdout.reconfigure(line_buffering=True)  # rows in order with the progress on stderr
    if a.child:
        child(a.child, a.pairs, a.samples_per_worker, a.workers, a.batch_size)
        return

    results = []
    for system in a.systems.split(","):
        cmd = [sys.executable, __file__, "--child", system, "--pairs", str(a.pairs),
               "--samples-per-worker", str(a.samples_per_worker), "--workers", str(a.workers),
               "--batch-size", str(a.batch_size)]
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
        if proc.returncode != 0 or not proc.stdout.strip():
            print(f"{system}: failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}", file=sys.stderr)
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        results.append(r)
        print(f"  {system}: built {r['pairs']:,} pairs in {r['build_s']:.1f} s, first batch "
              f"{r['first_batch_s']:.2f} s, {r['consumed']:,} samples in {r['read_s']:.1f} s",
              file=sys.stderr, flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(results, indent=1))

    print(f"pairs={a.pairs:,} workers={a.workers} samples-per-worker={a.samples_per_worker:,} "
          f"batch={a.batch_size} (MB; USS = private pages; PSS = shared pages split among the "
          f"processes mapping them; 'first' = right after the first batch, 'after' = after "
          f"the samples)")
    print()
    print("| system | process | RSS first | RSS after | USS first | USS after | PSS first | PSS after "
          "| PSS anon after | PSS shmem after |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    names = {"torch": "DataLoader", "loader": "Loader.local"}
    for r in results:
        first, after = r["at_first_batch"], r["after"]
        for role in after:
            f, s = first.get(role, {}), after[role]
            print(f"| {names[r['system']]} | {role} | {mb(f.get('Rss', 0))} | {mb(s['Rss'])} "
                  f"| {mb(f.get('Uss', 0))} | {mb(s['Uss'])} | {mb(f.get('Pss', 0))} | {mb(s['Pss'])} "
                  f"| {mb(s['Pss_Anon'])} | {mb(s['Pss_Shmem'])} |")
        tot = lambda snap, k: sum(v[k] for v in snap.values())  # noqa: E731
        wk = lambda snap, k: sum(v[k] for n, v in snap.items() if n.startswith("worker"))  # noqa: E731
        print(f"| {names[r['system']]} | **workers, sum** | {mb(wk(first, 'Rss'))} | {mb(wk(after, 'Rss'))} "
              f"| {mb(wk(first, 'Uss'))} | {mb(wk(after, 'Uss'))} | {mb(wk(first, 'Pss'))} "
              f"| {mb(wk(after, 'Pss'))} | {mb(wk(after, 'Pss_Anon'))} | {mb(wk(after, 'Pss_Shmem'))} |")
        print(f"| {names[r['system']]} | **all processes, sum** | {mb(tot(first, 'Rss'))} "
              f"| {mb(tot(after, 'Rss'))} | {mb(tot(first, 'Uss'))} | {mb(tot(after, 'Uss'))} "
              f"| {mb(tot(first, 'Pss'))} | {mb(tot(after, 'Pss'))} | {mb(tot(after, 'Pss_Anon'))} "
              f"| {mb(tot(after, 'Pss_Shmem'))} |")
    print()
    for r in results:
        tb, bare = r["trainer_before"], r["trainer_bare"]
        print(f"{names[r['system']]}: trainer before the loader: RSS {mb(tb['Rss'])} MB, "
              f"USS {mb(tb['Uss'])} MB, of which the dataset's lists {mb(tb['Uss'] - bare['Uss'])} MB "
              f"(built in {r['build_s']:.1f} s); first batch {r['first_batch_s']:.2f} s after "
              f"constructing the loader; {r['consumed']:,} samples in {r['read_s']:.1f} s")


if __name__ == "__main__":
    main()
