"""Worker CPU of several trainers reading the same image job: one shared
stream against separate jobs, in the same run on the same data (issue 36):

    python bench/shared_stream.py --images /work/imagenet-shaped [--trainers 4] [--epochs 2] [--repeats 3] [--apart] [--step-ms MS]

A real `loader-server` (target/release) on loopback, and per scenario
`--trainers` `loaderctl consume --transport shm` processes on the image
folder (the standard training pipeline: random resized crop to 224, flip)
and `--workers` `loader-worker`s. By default the workers start once every
trainer has subscribed, as when a sweep's trials start together; with
`--apart` they run first and the trainers start as processes do, a few
hundred milliseconds apart, so the later ones need the batches the first
got before they came, made again for them. The scenarios:

- `one`: a single trainer (the reference);
- `shared`: the trainers subscribe to one job (`--job-name X --shared`):
  each receives every batch, made once;
- `separate`: each trainer runs a job of its own (what a sweep does
  without sharing).

Worker CPU is user + sys of the scenario's worker processes (from /proc,
read before they stop); per-trainer samples/s is each trainer's report, and
trainer CPU the sum of the trainers' own (their reports'
`client_cpu_us_per_batch` times batches). "Cores busy" is workers' and
trainers' CPU over the wall time: near `os.cpu_count()`, the scenario
had no CPU to spare and its trainers' rate measures contention. With
`--step-ms` each trainer holds each batch that long, as a training step
would: trainers then consume at most at that pace, and the question is
whether the workers keep all of them fed. Scenarios take turns within each
repeat; medians. The table goes to stdout.
"""

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RELEASE = ROOT / "target" / "release"
TIMEOUT_S = 600  # one scenario; a hung run fails the benchmark instead of stalling it

sys.path.insert(0, str(ROOT / "bench"))
from recv_cpu import Service  # noqa: E402  (a coordinator and its workers)

TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(pid):
    """User + sys seconds of a process so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def sessions(url):
    out = subprocess.run([str(RELEASE / "loaderctl"), "status", "--coordinator", url, "--json"],
                         capture_output=True, text=True, timeout=30)
    return len(json.loads(out.stdout)["sessions"]) if out.returncode == 0 else 0


def scenario(kind, n, service, images, epochs, tag, workers, apart, step_ms):
    """Runs `n` trainers (1 for `one`) together with `workers` workers of
    their own; returns worker CPU-s, wall seconds, each trainer's samples/s
    and share through shared memory, and the trainers' CPU-s together."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOADER_")}

    def start_workers():
        return [subprocess.Popen([str(RELEASE / "loader-worker"), "--coordinator", service.url, "--listen",
                                  "127.0.0.1:0"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                for _ in range(workers)]

    procs = start_workers() if apart else []
    if apart:
        time.sleep(1)  # they register
    began = time.perf_counter()
    trainers = []
    count = 1 if kind == "one" else n
    for i in range(count):
        flags = ["--dataset", "imagefolder", "--path", str(images), "--epochs", str(epochs), "--batch-size", "64",
                 "--step-ms", str(step_ms)]
        if kind == "shared":
            flags += ["--job-name", f"shared-{tag}", "--shared"]
        else:
            flags += ["--job-name", f"{kind}-{tag}-{i}"]
        cmd = [str(RELEASE / "loaderctl"), "consume", "--coordinator", service.url, "--json", "--transport", "shm",
               *flags]
        trainers.append((cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    if not apart:
        deadline = time.monotonic() + 60
        while sessions(service.url) < count:
            if time.monotonic() > deadline:
                sys.exit("the trainers did not subscribe within 60 s")
            time.sleep(0.05)
        procs = start_workers()
    rates, shm, trainer_cpu = [], [], 0.0
    for cmd, p in trainers:
        try:
            out, err = p.communicate(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            p.kill()
            sys.exit(f"timed out after {TIMEOUT_S} s: {shlex.join(cmd)}")
        lines = [line for line in out.splitlines() if line.startswith("{")]
        if p.returncode != 0 or not lines:
            sys.exit(f"failed ({p.returncode}): {shlex.join(cmd)}\n{err.strip()[-2000:]}")
        report = json.loads(lines[-1])
        rates.append(report["samples_per_s"])
        shm.append(report["shm_batches"] / max(report["batches"], 1))
        trainer_cpu += report["client_cpu_us_per_batch"] * report["batches"] / 1e6
    wall = time.perf_counter() - began
    cpu = sum(cpu_s(p.pid) for p in procs)
    for p in procs:
        p.terminate()
    for p in procs:
        p.wait(timeout=10)
    return cpu, wall, rates, shm, trainer_cpu


def main():
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--images", required=True, help="a folder of class folders of JPEGs (bench/make_images.py)")
    p.add_argument("--trainers", type=int, default=4)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--apart", action="store_true", help="workers first, trainers a few hundred ms apart")
    p.add_argument("--step-ms", type=float, default=0.0,
                   help="each trainer holds each batch this long, as a training step would (loaderctl --step-ms): "
                        "what matters is then whether the workers keep every trainer fed at that pace")
    args = p.parse_args()
    for b in ("loader-server", "loader-worker", "loaderctl"):
        if not (RELEASE / b).exists():
            sys.exit(f"{RELEASE / b} is missing (cargo build --release --bins)")
    print("command: " + shlex.join([sys.executable] + sys.argv))
    kinds = ["one", "shared", "separate"]
    got = {k: [] for k in kinds}
    env = {k: v for k, v in os.environ.items() if not k.startswith("LOADER_")}
    with tempfile.TemporaryDirectory() as tmp:
        service = Service(0, env, "http", Path(tmp))
        try:
            for r in range(args.repeats):
                for kind in (kinds if r % 2 == 0 else kinds[::-1]):
                    cpu, wall, rates, shm, tcpu = scenario(kind, args.trainers, service, args.images, args.epochs, f"r{r}",
                                                args.workers, args.apart, args.step_ms)
                    got[kind].append((cpu, wall, statistics.median(rates), tcpu))
                    print(f"run {r + 1} {kind}: worker CPU {cpu:.1f} s, trainer CPU {tcpu:.1f} s, wall {wall:.1f} s, "
                          "per-trainer samples/s "
                          + ", ".join(f"{x:,.0f}" for x in rates)
                          + " (through shared memory: " + ", ".join(f"{x:.0%}" for x in shm) + ")", flush=True)
        finally:
            service.stop()
    med = {k: tuple(statistics.median(v[i] for v in got[k]) for i in range(4)) for k in kinds}
    base_cpu, _, base_rate, _ = med["one"]
    print()
    start = "workers started first, trainers apart" if args.apart else "workers started once every trainer subscribed"
    step = f", a {args.step_ms:g} ms training step per batch" if args.step_ms else ""
    print(f"{args.trainers} trainers, {args.workers} workers ({start}), {args.epochs} epochs of {args.images}, "
          f"batch 64{step}, medians of {args.repeats}")
    print()
    print("| scenario | trainers | worker CPU-s | vs one trainer | trainer CPU-s | cores busy | wall s "
          "| samples/s per trainer | vs one trainer |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for k in kinds:
        cpu, wall, rate, tcpu = med[k]
        n = 1 if k == "one" else args.trainers
        # workers' and trainers' CPU over the wall time: against os.cpu_count(), how
        # much of the machine the scenario had to itself
        print(f"| {k} | {n} | {cpu:.1f} | {cpu / base_cpu:.2f}x | {tcpu:.1f} | {(cpu + tcpu) / wall:.2f} "
              f"| {wall:.1f} | {rate:,.0f} | {rate / base_rate:.2f}x |")


if __name__ == "__main__":
    main()
