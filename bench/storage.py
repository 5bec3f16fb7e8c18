"""Datasets read from object storage against the same files on local disk,
same run, same machine (issue 53, docs/storage.md).

The store is s3s-fs (an S3 server over a directory, from crates.io; built
into target/s3s-fs once), filled through its S3 API with boto3, and reached
through bench/delay_relay.py: a round trip of --rtt-ms and a link of --mbit
each way, shared by every connection, each of which has at most
--window-kb bytes waiting for the link (a flow's window). Each repeat runs, taking turns, the
job on the local files and the same job on `s3://bench/...`, each with fresh
`loaderctl run` workers (so a fresh local copy: epoch 1 reads the store,
later epochs the local copy), and prints samples/s per epoch and their
ratio. With --local-cold, a third job in the same rotation reads the local
files after their pages were dropped from the page cache: the disk read a
dataset larger than the machine's memory gets in every epoch. With --python,
the image job also runs as a PyTorch user writes it (the Python SDK's
`Loader.local`, from the local folder and from the store, and torchvision's
`ImageFolder` with `DataLoader` from the local folder; bench/storage_python.py). Loader's
jobs shuffle (`--shuffle 0`), as the anchors do; `--shuffle -1` reads in
dataset order.

    python bench/storage.py --bin target/release --images /work/imagenet-shaped \\
        --tokens-mb 512 --rtt-ms 10 --mbit 1000 --epochs 3 --repeats 3

Needs `cargo build --release -p loader-ctl -p loader-worker --bins` and boto3; --bare needs curl
7.75 or later (`--aws-sigv4`).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
S3S_VERSION = "0.14.1"


def s3s_fs() -> Path:
    """The s3s-fs binary, built once into target/s3s-fs."""
    bin = ROOT / "target" / "s3s-fs" / "bin" / "s3s-fs"
    if not bin.exists():
        subprocess.run(
            ["cargo", "install", "s3s-fs", "--version", S3S_VERSION, "--features", "binary", "--locked",
             "--root", str(bin.parent.parent)],
            check=True,
        )
    return bin


def listening(proc: subprocess.Popen, prefix: str, timeout: float = 30.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if line.startswith(prefix):
            return line[len(prefix):].strip()
        if not line and proc.poll() is not None:
            break
    raise SystemExit(f"{proc.args[0]} did not print {prefix!r}")


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pinned(cpus: set[int] | None):
    """A `preexec_fn` that keeps a process (and what it starts) on `cpus`."""
    return (lambda: os.sched_setaffinity(0, cpus)) if cpus else None


def cpu_set(text: str | None) -> set[int] | None:
    return {int(c) for c in text.split(",")} if text else None


def children_cpu_s() -> float:
    """CPU seconds (user + system) of this process's children waited for so
    far, and of theirs: `loaderctl run` waits for its workers."""
    import resource

    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return used.ru_utime + used.ru_stime


def run(bin: Path, args: list[str], env: dict[str, str], cpus: set[int] | None = None):
    """One `loaderctl run`: samples/s per epoch, the first batch's seconds,
    epoch 1's rate from its first batch on, and the CPU seconds the run took
    (loaderctl, its coordinator and workers)."""
    cpu = children_cpu_s()
    out = subprocess.run([str(bin / "loaderctl"), "run", "--json", *args], env=env, capture_output=True, text=True,
                         preexec_fn=pinned(cpus))
    if out.returncode != 0:
        raise SystemExit(f"loaderctl {' '.join(args)}: {out.stderr.strip().splitlines()[-1:]}")
    record = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")][-1]
    # One epoch: its rate alone.
    epochs, first = record.get("epochs_samples_per_s", [record["samples_per_s"]]), record["first_batch_s"]
    # Epoch 1 from its first batch on: what the job's start-up (the workers
    # listing and opening the dataset, the first fetches) leaves out.
    per_epoch = record["samples"] / max(len(epochs), 1)
    steady = per_epoch / max(per_epoch / epochs[0] - first, 1e-9) if epochs else 0.0
    return epochs, first, steady, children_cpu_s() - cpu


def bare(config: Path, cpus: set[int] | None) -> tuple[float, float, int]:
    """A bare client's read of the objects in curl's `config`: `curl
    --parallel` (64 transfers at once, connections reused), every response
    thrown away. Its wall and CPU seconds, and the bytes read; an error
    unless every transfer answered 200 or 206. What the store and the relay
    give a client that does nothing else, and what fetching costs a client
    that is not Loader, on the cores Loader runs on."""
    cpu, started = children_cpu_s(), time.monotonic()
    out = subprocess.run(["curl", "--parallel", "--parallel-max", "64", "-K", str(config)], capture_output=True,
                         text=True, preexec_fn=pinned(cpus))
    wall = time.monotonic() - started
    answers = [line.split() for line in out.stdout.splitlines() if line.strip()]
    failed = [a for a in answers if a[0] not in ("200", "206")]
    if out.returncode != 0 or failed or not answers:
        raise SystemExit(f"curl -K {config}: exit {out.returncode}, answers {failed[:3] or answers[:3]}: {out.stderr.strip()[-200:]}")
    return wall, children_cpu_s() - cpu, sum(int(a[1]) for a in answers)


def curl_config(path: Path, endpoint: str, objects: list[tuple[str, tuple[int, int] | None]]) -> Path:
    """A curl config reading `objects` (a key, and a byte range or None for
    the whole object) from bucket `bench` at `endpoint`, signed as S3 wants."""
    blocks = []
    for key, span in objects:
        block = (f'url = "{endpoint}/bench/{key}"\noutput = "/dev/null"\nsilent\naws-sigv4 = "aws:amz:us-east-1:s3"\n'
                 f'user = "bench:benchbench"\nheader = "x-amz-content-sha256: UNSIGNED-PAYLOAD"\n'
                 'write-out = "%{http_code} %{size_download}\\n"\n')
        if span:
            block += f'header = "Range: bytes={span[0]}-{span[1] - 1}"\n'
        blocks.append(block)
    path.write_text("next\n".join(blocks))
    return path


def evict(path: Path) -> None:
    """Drops the page cache's copy of every file under `path` (clean pages
    only: `posix_fadvise(DONTNEED)`, no privilege needed), so that the next
    run reads them from the disk, as a dataset larger than the machine's
    memory is read."""
    for f in [path] if path.is_file() else sorted(path.rglob("*")):
        if f.is_file():
            fd = os.open(f, os.O_RDONLY)
            try:
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def cpu_s(procs: list[subprocess.Popen]) -> float:
    """CPU seconds (user + system) the processes `procs` have used so far."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for p in procs:
        try:
            fields = Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", type=Path, default=ROOT / "target" / "release")
    ap.add_argument("--images", type=Path, help="an image folder (class folders of JPEGs); omitted: no image rows")
    ap.add_argument("--tokens-mb", type=int, default=512, help="size of the token file (0: no token rows)")
    ap.add_argument("--rtt-ms", type=float, default=10.0)
    ap.add_argument("--mbit", type=float, default=1000.0)
    ap.add_argument("--window-kb", type=int, default=64,
                    help="bytes of one connection that may wait for the relay's link (bench/delay_relay.py; 0: whole responses)")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--anchors", type=Path, help="a Python with litdata and mosaicml-streaming: LitData and Mosaic "
                    "Streaming read the same bytes from the same store (bench/storage_anchor.py)")
    ap.add_argument("--shuffle", type=int, default=0, metavar="SEED",
                    help="Loader's jobs shuffle with this seed, as the anchors do (shuffle=True); -1: dataset order")
    ap.add_argument("--libs", default="litdata,mosaic", help="which anchors run, with --anchors")
    ap.add_argument("--step-ms", type=float, default=0.0,
                    help="a training step of this long per batch (loaderctl run --step-ms): the trainer's pace, not the loader's")
    ap.add_argument("--store-cpus", help="cores (e.g. 1) the store and the relay run on: with --loader-cpus, a store on "
                    "another machine, whose CPU the workers do not share")
    ap.add_argument("--loader-cpus", help="cores (e.g. 0) Loader's runs, local and from the store, and the anchors run on")
    ap.add_argument("--python", type=Path,
                    help="a Python with Loader's SDK (pip install ./python) and torchvision: the image job also runs "
                         "through loader.Loader.local from the local folder and from the store, and torchvision's "
                         "ImageFolder through DataLoader from the local folder, in the same rotation (bench/storage_python.py)")
    ap.add_argument("--bare", action="store_true",
                    help="also read the same objects through the same relay with a bare client (curl --parallel, "
                         "responses thrown away) on Loader's cores, in the same rotation: what the store and the link "
                         "give, and what a GET costs a client that is not Loader")
    ap.add_argument("--local-cold", action="store_true",
                    help="also run the local job with its files out of the page cache before each run (read from the "
                         "disk, as a dataset larger than memory is), in the same rotation")
    args = ap.parse_args()
    store_cpus, loader_cpus = cpu_set(args.store_cpus), cpu_set(args.loader_cpus)
    if args.shuffle < 0:
        args.shuffle = None

    import boto3

    work = Path(tempfile.mkdtemp(prefix="loader-storage-bench-"))
    procs: list[subprocess.Popen] = []
    try:
        tokens = work / "tokens.bin"
        with open(tokens, "wb") as f:
            f.write(os.urandom(max(args.tokens_mb, 1) << 20))
        port = free_port()
        store_dir = work / "store"
        store_dir.mkdir()
        store = subprocess.Popen(
            [str(s3s_fs()), "--host", "127.0.0.1", "--port", str(port), "--access-key", "bench",
             "--secret-key", "benchbench", str(store_dir)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=pinned(store_cpus),
        )
        procs.append(store)
        endpoint = f"http://127.0.0.1:{port}"
        s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="bench", aws_secret_access_key="benchbench",
                          region_name="us-east-1")
        for _ in range(100):
            try:
                s3.create_bucket(Bucket="bench")
                break
            except Exception:
                time.sleep(0.1)
        s3.upload_file(str(tokens), "bench", "tokens.bin")
        if args.images:
            # 16 at once: each of s3s-fs's responses waits 40 ms for a
            # delayed ACK (see bench/delay_relay.py), 9 minutes for 12,800
            # images one after another.
            from concurrent.futures import ThreadPoolExecutor

            files = [p for p in sorted(args.images.rglob("*")) if p.is_file()]
            with ThreadPoolExecutor(16) as pool:
                list(pool.map(lambda p: s3.upload_file(str(p), "bench", "images/" + str(p.relative_to(args.images))), files))
        relay = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "delay_relay.py"), "--to", f"127.0.0.1:{port}",
             "--rtt-ms", str(args.rtt_ms), "--mbit", str(args.mbit), "--window-kb", str(args.window_kb)],
            stdout=subprocess.PIPE, text=True, preexec_fn=pinned(store_cpus),
        )
        procs.append(relay)
        relayed = "http://" + listening(relay, "listening ")
        env = dict(os.environ, AWS_ENDPOINT_URL=relayed, AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="benchbench",
                   AWS_REGION="us-east-1", LOADER_STORAGE_CACHE_DIR=str(work))
        common = ["--workers", str(args.workers), "--epochs", str(args.epochs)]
        if args.shuffle is not None:
            # As the anchors read (shuffle=True): a new order each epoch.
            common += ["--shuffle", str(args.shuffle)]
        if args.step_ms:
            common += ["--step-ms", f"{args.step_ms:g}"]
        workloads = []
        if args.tokens_mb:
            workloads.append(("tokens b64 ctx 2048", ["--dataset", "tokens", "--batch-size", "64", "--context-length", "2048"],
                              str(tokens), "s3://bench/tokens.bin"))
        if args.images:
            workloads.append(("images b64 (RandomResizedCrop 224)", ["--dataset", "imagefolder", "--batch-size", "64"],
                              str(args.images), "s3://bench/images"))
        print(f"store: s3s-fs {S3S_VERSION} through a relay of {args.rtt_ms:g} ms RTT and {args.mbit:g} Mbit/s each way "
              f"({args.window_kb} KB a connection may queue); "
              f"{args.workers} workers, {args.epochs} epochs, {args.repeats} repeats taking turns"
              + (f", a {args.step_ms:g} ms step per batch" if args.step_ms else "")
              + (f"; the store and the relay on cores {args.store_cpus}" if store_cpus else "")
              + (f"; Loader and the anchors on cores {args.loader_cpus}" if loader_cpus else ""), flush=True)
        anchor = ROOT / "bench" / "storage_anchor.py"
        for name, flags, local, url in workloads:
            kind = "tokens" if "tokens" in flags else "images"
            libs = args.libs.split(",") if args.anchors else []
            for lib in libs:
                out = work / f"{lib}-{kind}"
                subprocess.run([str(args.anchors), str(anchor), "convert", lib, kind, local, str(out)], check=True,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for path in sorted(out.rglob("*")):
                    if path.is_file():
                        s3.upload_file(str(path), "bench", f"{lib}-{kind}/{path.relative_to(out)}")
                shutil.rmtree(out)
            cold = ["cold"] if args.local_cold else []
            # The image job as a PyTorch user runs it: Python SDK, local
            # and store, and DataLoader over the local folder.
            python = {"py-local": ("loader", local), "py-store": ("loader", url), "dataloader": ("dataloader", local)}
            python = python if args.python and kind == "images" else {}
            rates: dict[str, list[list[float]]] = {"local": [], "store": [], **{c: [] for c in cold}, **{lib: [] for lib in libs},
                                                   **{p: [] for p in python}}
            # The bare client's objects: each image, or the token file in
            # 16 ranges of equal size.
            bares: list[tuple[float, float, int]] = []
            if args.bare:
                if kind == "images":
                    objects = [("images/" + str(p.relative_to(local)), None) for p in sorted(Path(local).rglob("*")) if p.is_file()]
                else:
                    size = Path(local).stat().st_size
                    objects = [("tokens.bin", (size * i // 16, size * (i + 1) // 16)) for i in range(16)]
                bare_config = curl_config(work / f"curl-{kind}.cfg", relayed, objects)
            cpus: dict[str, list[float]] = {"local": [], "store": []}
            # Cores the store and the relay used while Loader read from the
            # store: CPU the workers could not have on this machine.
            harness: list[float] = []
            firsts: dict[str, list[float]] = {"local": [], "store": [], "cold": [], **{p: [] for p in python}}
            steadies: dict[str, list[float]] = {"local": [], "store": [], "cold": []}
            for r in range(args.repeats):
                order = ([("local", local), ("store", url)] + [(c, local) for c in cold] + [(p, None) for p in python]
                         + [(lib, None) for lib in libs] + [("bare", None)] * args.bare)
                if r % 2:
                    order.reverse()
                for source, path in order:
                    if source == "bare":
                        bares.append(bare(bare_config, loader_cpus))
                        continue
                    if source in python:
                        which, target = python[source]
                        out = subprocess.run(
                            [str(args.python), str(ROOT / "bench" / "storage_python.py"), which, target, str(args.epochs),
                             str(args.workers), str(-1 if args.shuffle is None else args.shuffle)],
                            env=env, capture_output=True, text=True, timeout=3600, preexec_fn=pinned(loader_cpus),
                        )
                        lines = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
                        if not lines:
                            error = (out.stderr.strip().splitlines() or ["no output"])[-1]
                            raise SystemExit(f"bench/storage_python.py {which} {target}: {error}")
                        rates[source].append(lines[-1]["epochs_samples_per_s"])
                        firsts[source].append(lines[-1]["first_batch_s"])
                        continue
                    if path is not None:
                        if source == "cold":
                            evict(Path(path))
                        used, started = cpu_s([store, relay]), time.monotonic()
                        epochs, first, steady, cpu = run(args.bin, [*flags, *common, "--path", path], env, loader_cpus)
                        rates[source].append(epochs)
                        if source in cpus:
                            cpus[source].append(cpu)
                        firsts[source].append(first)
                        steadies[source].append(steady)
                        if source == "store":
                            harness.append((cpu_s([store, relay]) - used) / (time.monotonic() - started))
                        continue
                    cache = tempfile.mkdtemp(dir=work)
                    out = subprocess.run(
                        [str(args.anchors), str(anchor), "read", source, kind, f"s3://bench/{source}-{kind}", cache,
                         str(args.epochs), str(args.workers)],
                        env=dict(env, S3_ENDPOINT_URL=relayed, AWS_ALLOW_HTTP="true"), capture_output=True, text=True, timeout=3600,
                        preexec_fn=pinned(loader_cpus),
                    )
                    shutil.rmtree(cache, ignore_errors=True)
                    lines = [json.loads(l) for l in out.stdout.splitlines() if l.startswith("{")]
                    if not lines:
                        # An anchor that fails is a finding, not the end of
                        # the run: its error's last line is the record.
                        error = (out.stderr.strip().splitlines() or ["no output"])[-1]
                        print(f"{source} {kind}, repeat {r + 1}: failed: {error}", flush=True)
                        rates[source].append([float("nan")] * args.epochs)
                        continue
                    rates[source].append(lines[-1]["epochs_samples_per_s"])
            def median(values):
                values = [v for v in values if v == v]  # a failed run's NaN is no rate
                return statistics.median(values) if values else float("nan")

            med = {s: [median(run[e] for run in rates[s]) for e in range(args.epochs)] for s in rates}
            for e in range(args.epochs):
                ratios = [st[e] / lo[e] for st, lo in zip(rates["store"], rates["local"])]
                row = (f"{name}: epoch {e + 1}: local {med['local'][e]:,.0f} samples/s, store {med['store'][e]:,.0f} "
                       f"-> {statistics.median(ratios):.2f}x (repeats {min(ratios):.2f}-{max(ratios):.2f})")
                for lib in libs:
                    row += f"; {lib} {med[lib][e]:,.0f} (Loader {med['store'][e] / med[lib][e]:.2f}x)"
                print(row, flush=True)
            if args.epochs > 2:
                # Later epochs read the local copy: each repeat's median
                # epoch from the second on, against the local file's. Short
                # epochs (a token file's last 50-100 ms) move with whatever
                # else the machine does, and two workers sharing a core take
                # a few epochs to settle, from a store's slow first epoch
                # more than from a local file's.
                later = [statistics.median(st[1:]) / statistics.median(lo[1:])
                         for st, lo in zip(rates["store"], rates["local"])]
                print(f"{name}: epochs 2-{args.epochs}: local {median(statistics.median(r[1:]) for r in rates['local']):,.0f}, "
                      f"store {median(statistics.median(r[1:]) for r in rates['store']):,.0f} samples/s (median epoch) -> "
                      f"{statistics.median(later):.2f}x (repeats {min(later):.2f}-{max(later):.2f})", flush=True)
            print(f"{name}: first batch: local {statistics.median(firsts['local']):.2f} s, "
                  f"store {statistics.median(firsts['store']):.2f} s; epoch 1 from its first batch on: local "
                  f"{statistics.median(steadies['local']):,.0f}, store {statistics.median(steadies['store']):,.0f} samples/s -> "
                  f"{statistics.median(st / lo for st, lo in zip(steadies['store'], steadies['local'])):.2f}x", flush=True)
            if cold:
                ratios = [st[0] / co[0] for st, co in zip(rates["store"], rates["cold"])]
                print(f"{name}: epoch 1 from local disk out of the page cache: {med['cold'][0]:,.0f} samples/s, first batch "
                      f"{statistics.median(firsts['cold']):.2f} s; store / that {statistics.median(ratios):.2f}x "
                      f"(repeats {min(ratios):.2f}-{max(ratios):.2f})", flush=True)
            for e in range(args.epochs if python else 0):
                ratios = [st[e] / lo[e] for st, lo in zip(rates["py-store"], rates["py-local"])]
                anchor = [st[e] / dl[e] for st, dl in zip(rates["py-store"], rates["dataloader"])]
                print(f"{name}: Python Loader.local, epoch {e + 1}: local {med['py-local'][e]:,.0f} samples/s, store "
                      f"{med['py-store'][e]:,.0f} -> {statistics.median(ratios):.2f}x (repeats {min(ratios):.2f}-{max(ratios):.2f}); "
                      f"DataLoader (torchvision ImageFolder, local folder) {med['dataloader'][e]:,.0f} "
                      f"(Loader from the store {statistics.median(anchor):.2f}x)", flush=True)
            if python:
                print(f"{name}: Python first batch: Loader.local local {statistics.median(firsts['py-local']):.2f} s, "
                      f"store {statistics.median(firsts['py-store']):.2f} s; DataLoader {statistics.median(firsts['dataloader']):.2f} s",
                      flush=True)
            if bares:
                wall, cpu, read = (statistics.median(b[i] for b in bares) for i in range(3))
                # Later epochs read the local copy either way: the
                # difference is epoch 1's fetching, about.
                extra = statistics.median(st - lo for st, lo in zip(cpus["store"], cpus["local"]))
                each = (f"{len(objects):,} GETs, {1e3 * cpu / len(objects):.2f} CPU-ms a GET" if kind == "images"
                        else f"{len(objects)} ranges, {cpu:.2f} CPU-s")
                per = f", {1e3 * extra / len(objects):.2f} ms a GET" if kind == "images" else ""
                print(f"{name}: a bare client (curl --parallel, 64 at once, responses thrown away) through the same relay "
                      f"on Loader's cores: {read / 1e6 / wall:,.0f} MB/s, {each}; Loader's runs took "
                      f"{statistics.median(cpus['local']):.1f} CPU-s from the local files and "
                      f"{statistics.median(cpus['store']):.1f} from the store ({args.epochs} epochs; {extra:.1f} s more{per})",
                      flush=True)
            print(f"{name}: the store and the relay used {statistics.median(harness):.2f} cores on average while "
                  f"Loader read from the store (of {os.cpu_count()})", flush=True)
    finally:
        for p in reversed(procs):
            p.kill()
            p.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
