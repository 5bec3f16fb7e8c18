"""Runs Loader and its anchors side by side, in one run on the same data, and
writes docs/benchmarks.md and docs/benchmarks.png.

Each system runs as its own process, repeated (--repeats, default 3),
interleaved so that drift on the machine hits every system alike; the table
reports medians and ratios against the anchors measured in this same run."""

import argparse
import datetime
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
LOADERCTL = ROOT / "target" / "release" / "loaderctl"
PY = sys.executable

sys.path.insert(0, str(BENCH))
import matrix  # noqa: E402  (bench/matrix.py: the small-batch matrix)


IMAGE_SCENARIO = "JPEG decode + RandomResizedCrop(224) + flip, uint8"
# The same Python loop over the Python SDK and over torch's DataLoader
# (bench/python_loop.py, with the SDK installed in this interpreter's
# environment by run.sh); `--only "Python loop"` runs both of them.
PY_LOOP_SCENARIO = "Python loop: `loader.Loader.local` vs torch DataLoader, synthetic 3x224x224 uint8"
PY_LOOP_IMAGE_SCENARIO = ("Python loop: `loader.Loader.local` vs torch DataLoader, image folder "
                          "(decode + random-resized-crop 224 + flip)")


def image_folder(files):
    """The ImageNet-shaped folder of the image scenario, made once and kept
    in bench/data/ (bench/make_images.py; a pure function of its arguments):
    bench/data/imagenet-shaped for the default 2,560 files, else one folder
    per file count."""
    name = "imagenet-shaped" if files == 2560 else f"imagenet-shaped-{files}"
    out = BENCH / "data" / name
    subprocess.run([PY, str(BENCH / "make_images.py"), "--out", str(out), "--files", str(files)],
                   check=True, stdout=subprocess.DEVNULL, timeout=1800)
    return out


def scenarios(samples, image_files=2560, image_epochs=2, only=None):
    """name -> list of (label, command, role). role marks anchors for ratios.
    Only scenarios whose name contains `only` (all when None)."""
    def wanted(name):
        return only is None or only in name

    shape = "3,224,224"
    common = ["--samples", str(samples), "--batch-size", "64", "--workers", "2"]
    loader = [str(LOADERCTL), "run", "--dataset", "synthetic", "--shape", shape,
              "--dtype", "uint8", "--json"] + common
    out = {
        "zero-compute 3x224x224 uint8 (transport only)": [
            ("Loader (gRPC, loopback)", loader + ["--transport", "grpc"], "loader"),
            ("Loader (shared memory)", loader + ["--transport", "shm"], "loader"),
            ("torch DataLoader", [PY, str(BENCH / "anchors" / "torch_synthetic.py"),
                                  "--shape", shape] + common, "anchor"),
            ("tf.data service (in-process workers)",
             [PY, str(BENCH / "anchors" / "tfdata_synthetic.py"), "--shape", shape,
              "--mode", "inprocess"] + common, "anchor"),
            ("tf.data service (worker processes)",
             [PY, str(BENCH / "anchors" / "tfdata_synthetic.py"), "--shape", shape,
              "--mode", "processes"] + common, "anchor"),
        ],
    }
    folder = None
    if wanted(IMAGE_SCENARIO) or wanted(PY_LOOP_IMAGE_SCENARIO):
        folder = str(image_folder(image_files))
        img = ["--path", folder, "--epochs", str(image_epochs), "--batch-size", "64", "--workers", "2"]
        out[IMAGE_SCENARIO] = [
            ("Loader (shared memory)", [str(LOADERCTL), "run", "--dataset", "imagefolder",
                                        "--transport", "shm", "--json"] + img, "loader"),
            ("torch DataLoader", [PY, str(BENCH / "anchors" / "torch_images.py")] + img, "anchor"),
            ("tf.data service (in-process workers)",
             [PY, str(BENCH / "anchors" / "tfdata_images.py"), "--mode", "inprocess"] + img, "anchor"),
            ("tf.data service (worker processes)",
             [PY, str(BENCH / "anchors" / "tfdata_images.py"), "--mode", "processes"] + img, "anchor"),
        ]
    py_loop = [PY, str(BENCH / "python_loop.py")]
    out[PY_LOOP_SCENARIO] = [
        ("loader.Loader.local (Python SDK)", py_loop + ["--system", "loader"] + common, "loader"),
        ("torch DataLoader", py_loop + ["--system", "torch"] + common, "anchor"),
    ]
    if folder:
        py_img = ["--images", folder, "--epochs", str(image_epochs), "--batch-size", "64",
                  "--workers", "2"]
        out[PY_LOOP_IMAGE_SCENARIO] = [
            ("loader.Loader.local (Python SDK)", py_loop + ["--system", "loader"] + py_img, "loader"),
            ("torch DataLoader", py_loop + ["--system", "torch"] + py_img, "anchor"),
        ]
    return {name: systems for name, systems in out.items() if wanted(name)}


def run_one(cmd):
    env = dict(os.environ)
    # numpy/torch threads would fight the loaders for 2 cores.
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONPATH"] = str(BENCH / "anchors")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"{cmd[0]} failed ({out.returncode}): {out.stderr.strip()[-2000:]}")
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    return json.loads(lines[-1])


NOTES = """## Your own Dataset: `Loader.local(dataset)` vs `DataLoader(dataset)` (bench/python_dataset.py)

Not part of `bench/run.sh`; its own command, both systems in the same run,
repeats interleaved, medians (2 workers each, shuffled, one epoch per run,
samples/s counted from the first batch on):

```
pip install torch torchvision ./python      # target/test-venv has them after ./test.sh
python bench/python_dataset.py --workers 2 --repeats 3 --rows 100000
```

| scenario | torch DataLoader samples/s | Loader samples/s | Loader / torch |
| --- | ---: | ---: | ---: |
| images: PIL + RandomResizedCrop(224) + flip + ToTensor, batch 64 | 561 | 574 | 1.02x |
| small samples: 1 KB float32 rows, batch 256 | 114,499 | 66,161 | 0.58x |
| small samples, Loader with seed_rngs=False | 111,999 | 101,439 | 0.91x |

Machine: 2 cores, shared with two other engineers compiling Rust during
the run (load average 2.5-3.4); single runs varied by up to a third (torch
on small samples 91-124 k), so read the ratios as rough. Targets of issue
22 (>= 1.3x on images, >= 3x on small samples): **not met**. Same Dataset
classes for both (bench/dataset_classes.py), the image folder of the JPEG
scenario (bench/make_images.py, 2,560 files). Where the time goes
(measured in-process, 1 KB rows): a worker spends about 14 us of Python
per sample, 10 of them seeding `random`, numpy and torch from (seed,
epoch, index) before `__getitem__` (what makes the augmentations identical
on any worker count; `seed_rngs=False` turns it off, and the rate goes
from 0.58x to 0.91x of torch's), against about 18 us for DataLoader's
whole per-sample path. What is left is the per-sample GIL acquisition and
call from the Rust worker and the per-leaf buffer copies; batching the
calls of a batch into one (a batch-level hook in the worker's `Dataset`
trait) is the next step, not done. On images both spend their time in
PIL and torchvision; Loader saves only the batch hand-off.

## How to read these numbers

- Small batches (the matrix, `bench/matrix.py`): tokens are windows of
  2,049 uint16 ids (context 2048) from one 20,000-window file; torch's
  Dataset memory-maps the same file and returns each window as uint16, the
  same bytes Loader yields. 3x32x32 and 3x224x224 are the synthetic uint8
  samples of the zero-compute scenario (torch: `torch.full`). npy is a
  200,000 x 256 float32 array; torch's Dataset memory-maps it and returns a
  row. Every system shuffles, runs 2 workers, and touches each batch in the
  same loop. Loader runs 3-10 epochs of a cell's data where torch runs one,
  so each Loader run lasts long enough to time; rates are per second.
  What made these cells fast (issue 15): the work in flight is counted in
  bytes and time, not batches (`loader_proto::window`: a worker holds 32 MiB
  or 50 ms of batches per consumer, at least `--prefetch`, at most 256, and
  tells the coordinator, which hands out ranges of a quarter of that; the
  trainer sizes its ring slots to the batch and its credits by the same
  bytes rule), and the coordinator's and workers' gRPC servers set
  TCP_NODELAY on every connection (tonic's `Server::tcp_nodelay` does not
  reach a listener of our own, so every heartbeat answer waited 40 ms for a
  delayed ACK). Tokens at batch 1 over shared memory went from 384 to
  ~200k batches/s in `loaderctl run`.
- No regression elsewhere, same-run A/B against the build before issue 15
  (dd1997f), interleaved, 4 runs each, medians (2026-11-24, `loaderctl run
  --workers 2 --batch-size 64`; zero-compute `--samples 32000 --shape
  3,224,224`, images `--dataset imagefolder` on the folder below, 1 epoch):
  zero-compute shared memory 80.9k -> 114.7k samples/s (slots sized to the
  batch), gRPC 13.7k -> 13.9k, images 2,574 -> 2,832 samples/s; trainer CPU
  per shared-memory batch 15.5 -> 15.2 µs.
- Issues 17 and 19 (the crate layout; metrics, `loaderctl top`), same-run
  A/B against the build before them (8e257ea, release, a /tmp worktree):
  `SCENARIOS="shm grpc images small tokens1" bench/ab/compare_builds.sh
  OLD/loaderctl target/release/loaderctl 5`, then `SCENARIOS="tokens1
  small" ... 10` (2026-11-24, `loaderctl run --workers 2`, interleaved, order
  alternating, medians, new/old): zero-compute 3x224x224 b64 shared memory
  1.009, gRPC 1.005, images 1.019, 2049xu16 b1 0.926 then 0.999, 3x32x32
  b256 0.965 then 0.935, trainer CPU per batch equal in every cell (e.g.
  10.8 / 10.7 µs at 3x32x32). The small cells' runs spread ±35% on both
  sides (3x32x32: 2.5M-5.0M old, 2.5M-5.2M new), so neither a slowdown nor
  a gain is shown. Metrics on vs off (same build): docs/operations.md, "Cost".

- Every system reads the same samples: a 3x224x224 uint8 tensor per sample
  filled with `index % 251`, plus its int64 index as the label, batch 64,
  2 workers, shuffled. The work measured is the transport: Loader's workers
  collate straight into the batch buffer (a ring slot, or the gRPC frame);
  PyTorch's workers `torch.full` each sample, collate with `torch.stack`, and
  pass the batch through `/dev/shm`; tf.data service builds the same tensors
  with `tf.fill` in its workers, with `processing_mode="distributed_epoch"`
  so each sample is produced once.
- "First batch" runs from the first `next()`. Loader's and tf.data service's
  workers are already running (registered) when the clock starts; PyTorch's
  are forked by `iter()`, as a DataLoader user sees them.
- "trainer CPU" is the consuming process's user + system CPU per batch from
  the first batch on, less the CPU of the embedded coordinator's threads
  (`loaderctl run` hosts the coordinator in the trainer's process, a
  deployment does not; `run` reports both, as `client_cpu_us_per_batch` and
  `trainer_cpu_us_per_batch`, the coordinator's threads read from
  `/proc/self/task/*/schedstat`; "client CPU" in older rows is the whole
  process). The trainer's own cost is also measured against an external
  coordinator by
  `bench/floor/compare.sh` (`loader-server` and two `loader-worker`s,
  `loaderctl consume --samples 64000 --transport shm`), next to the
  machine's floors in the same minutes, repeats interleaved
  (`BIN=dir bench/floor/compare.sh` measures another build's binaries).
  2026-11-23, medians of 5 (µs of client CPU per batch); the rows of one
  build were measured in the same minutes as the build before it:

  | what | µs/batch |
  | --- | ---: |
  | futex: one sleep + one wake-up across processes, nothing else | 20.2 |
  | futex, the worker writing 10 MB per batch | 22.7 |
  | socket: `poll`, read a report, write a grant | 45.2 |
  | socket, the worker writing 10 MB per batch | 59.3 |
  | `loaderctl consume --transport shm`, doorbell waking after 3/4 of the reports in flight | **20.4** (18.5-23.2) |
  | the same, waking after half of them (43ab9c2), same minutes | 21.6 (20.0-23.5) |
  | the same, waking after half of them (43ab9c2), earlier | 25.9 (20.5-27.9) |
  | before the doorbell (56257d3), same minutes as the row above | 36.2 (34.8-48.7) |

  Longer runs, interleaved (8 runs each of `loaderctl consume --samples
  128000`, waking after 3/4 against after half, 43ab9c2): **18.3** µs (15.0-19.3) against
  21.6 (17.5-23.5), at the same rate, 73.1k against 72.6k samples/s; with
  small batches (`--shape 3,32,32 --samples 640000`, 10,000 batches) 26.0
  µs against 33.1 before the doorbell, 25.4k against 23.6k samples/s.

  In a zero-compute loop the trainer is faster than its workers, so it
  waits for nearly every batch; on this VM a sleep and a wake-up alone
  costs 18-20 µs (scheduler work and VM exits). Before the doorbell the
  trainer slept once per batch and was woken by each report on the
  ring's socket, and paid the bare C socket round. With the ring's
  doorbell (docs/protocol.md, "Trainer <- co-located worker", 4) it asks
  the workers to wake it once three quarters of the grants they hold are
  reported (at most 12), and reads every socket then: 0.19 sleeps per
  batch instead of 1 (0.26 when waking after half), and 0.6 grant writes.
  That is about the issue's 20 µs on this host: under it in quiet
  minutes, at it in busy ones. What is left, by the trainer's profile: a
  quarter the grant writes (each wakes the worker's reactor: an
  inter-processor interrupt, paid by the writer, on a VM), a sixth
  reading reports (mostly freeing one socket buffer per report), a sixth
  sleeping, and user-space work (reports, headers, the book). Holding
  grants back longer (a quarter of the fair share instead of half, all
  sent when the trainer sleeps) cut the writes from 0.6 to 0.4 per batch
  but saved only ~1 µs and cost 8% throughput, so it is not in. Neither
  is holding back, for 50-200 µs after a read, the grants of workers that
  still had a slot: 0.2 writes per batch and 15-17 µs, but 8-10% fewer
  samples/s in two interleaved runs of 8. The way
  well under 20 µs is reports and grants as queues in the doorbell page
  itself, with the socket kept for hand-shake and hang-ups.
  History: 94-106 µs before the consumer thread read the ring's sockets
  itself (2.75 wake-ups of other threads per batch, then 0.34); 41.4 µs
  on 2026-11-22 before the doorbell.
- Absolute rates move with the host from day to day, ratios much less: on
  2026-11-22 torch DataLoader made 5,596 samples/s and Loader's gRPC path
  1.47 GB/s (1.75x torch); on 2026-11-21 the same gRPC code made 1.96 GB/s
  (1.47x a torch at 8,842 samples/s). Only same-run ratios compare
  systems.
- What changed before the 2026-11-23 run, each measured against the build
  before it in interleaved runs of `loaderctl run --samples 64000
  --workers 2`:
  - Workers report deliveries once half their window (`max_outstanding`)
    is delivered, or at once when out of tasks, instead of after every
    batch: the coordinator's CPU per batch went from 77-89 to 44-49 µs
    (`bench/floor/coordinator_cpu.sh 3`, against an external
    `loader-server`; 37-39 µs with the final build of that day), and
    `loaderctl run`'s whole-process CPU per shared-memory batch from
    108-133 to 47-63 µs, at 76k against 72k samples/s (medians of 6).
  - The binaries keep freed batch-sized buffers (`mallopt`,
    `proto/src/heap.rs`): glibc served each ~10 MB gRPC buffer with fresh
    pages (mmap, or an arena trimmed back to the kernel), depending on
    which thread freed what first, so two builds of the same code differed
    by 10-15% over gRPC. Over gRPC, 11.2k against 9.1-9.7k samples/s and
    3.7-3.9 against 4.4-5.1 ms of trainer CPU per batch; shared memory
    unchanged.
- The gRPC path is CPU-bound on this 2-core host (two workers and the
  trainer share it). The trainer's profile (`perf record --call-graph
  dwarf`) is 30% the kernel's copy out of the TCP socket and 20-29% a
  second copy of every byte in tonic's `StreamingInner::poll_frame`, which
  appends each HTTP/2 DATA chunk to its decode buffer (the worker's tonic
  encoder copies each batch once more too, 16% of its profile). Letting a
  whole batch come in one HTTP/2 frame (max frame 16 MiB instead of 1 MiB,
  the step before reading such frames without that copy) made it slower,
  1.26 against 1.50 GB/s in the same minutes: each batch then needs a
  fresh 10 MB receive buffer. Taking tonic's copies out means framing the
  gRPC messages ourselves on both sides; not done.
- The shared-memory path is at the machine's copy limit: the workers' own
  fill of 9.6 MB per batch (memset) is most of its CPU profile.
- Images: an ImageNet-shaped folder made by `bench/make_images.py` (class
  folders of JPEG q90 crops of scikit-image's colour photos, shorter side
  300-500 px), read for `--image-epochs` epochs, batch 64, 2 workers,
  shuffled. Every system decodes, draws a RandomResizedCrop(224) box
  (scale 0.08-1, ratio 3/4-4/3), resizes it with antialiased bilinear,
  flips with p = 0.5 and yields uint8 images and int64 labels. PyTorch:
  torchvision's ImageFolder (PIL) with RandomResizedCrop, RandomHorizontalFlip
  and PILToTensor. tf.data service: TensorFlow's own fast path,
  sample_distorted_bounding_box + decode_and_crop_jpeg (decodes only the
  crop), tf.image.resize(antialias=True), random_flip_left_right, images in
  TensorFlow's HWC layout. Loader: `loaderctl run --dataset imagefolder`, the
  pipeline of docs/images.md (region decode, DCT scaling from 2x, Pillow's
  bilinear), CHW.
- Python loop (`bench/python_loop.py`): the same Python loop over the Python
  SDK and over torch's DataLoader, same data, same run, each system in a
  process of its own, repeats interleaved: take each batch as torch tensors
  (Loader: `batch.torch()`, zero-copy views of the shared-memory slot through
  DLPack) and read a byte of every sample and the labels (only the labels
  for images, whose crops differ; the run stops if the two loops read
  different data). Workers start on the first `next()` for both; samples/s
  and MB/s count from the first batch on. Loader's workers are this
  interpreter re-executed into `loader._worker`, so its first batch includes
  a Python start-up per worker. The Python loop reaches about half of
  `loaderctl run`'s shared-memory rate: the trainer's Python process now
  shares the two cores with both workers (each batch is 9.6 MB the workers
  memset). The images are the folder and pipeline of the JPEG scenario
  (torch: torchvision's ImageFolder with the same transforms, PIL).

## Telemetry overhead: metrics on and traces at 1% vs everything off

`bench/ab/telemetry_overhead.sh target/release/loaderctl 12` (2026-11-25,
2 cores, same binary, same run, 12 interleaved runs per side, medians):
"on" is `loaderctl run --workers 2` with the trainer, its embedded
coordinator and both worker processes serving `/metrics`
(`--metrics-listen`, `LOADER_METRICS_LISTEN`) and exporting traces of 1% of
batches (`OTEL_TRACES_SAMPLER_ARG=0.01`) over OTLP/gRPC to a live receiver
(the `otlp_sink` example, which counted every span); "off" is none of it.

| scenario | off, samples/s | on, samples/s | on/off | trainer-process CPU µs/batch off / on |
| --- | --- | --- | --- | --- |
| zero-compute 3x224x224, batch 64, shared memory (the issue's bar: within 3%) | 102,876 | 102,500 | **0.996** | 38.4 / 39.8 |
| 3x32x32, batch 256, shared memory | 4,259,625 | 4,086,961 | 0.959 | 9.8 / 10.7 |
| 2049 x uint16, batch 1, shared memory (240k batches/s) | 244,458 | 197,022 | 0.806 | 2.5 / 3.1 |

The batch-1 cell, taken apart (`SCENARIOS=tokens1`, 12 runs each, medians):

| "on" is | on/off |
| --- | --- |
| metrics only (`TRACES=0`) | 0.926 |
| traces only, 1% (`METRICS=0`) | 0.867 |
| traces only, 0.1% (`METRICS=0 TRACE_RATIO=0.001`) | 0.947 |
| traces only, exporter running, 0% traced (`TRACE_RATIO=0`) | 0.986 |

What traces cost follows the traced batches per second, not the ratio: an
untraced batch costs one keyed hash at the coordinator (the sampling
decision is made before any span exists; the first version made and
dropped a span per batch and was at 0.725 here), and a traced one four
spans across three processes plus their export. At 64-sample batches 1% is
~15 traces a second and costs nothing measurable; at batch size 1 it is
2,400 a second: there, trace 0.1% or less. Runs of one side vary by
±5-20% on this machine, so the small-batch metric-only cost (0.93-0.97 in
three sessions' runs) is not told apart from noise more finely than that.

A/B of this session's build (traces, the pin stage, Python datasets; telemetry off) against the build before it (cf71a9d), same run,
`SCENARIOS="shm grpc images small tokens1" bench/ab/compare_builds.sh OLD NEW 6 bench/data/imagenet-shaped`
(2026-11-25, 2 cores, medians, new/old): shm 0.968 (re-run alone with 14 repeats: 1.009, trainer CPU
42.4 -> 38.8 µs/batch), grpc 1.013, images 1.029, 3x32x32 b256 1.048, 2049xu16 b1 1.090. The Python loop
(`bench/python_loop.py`) was not A/B'd against the old wheel.

## Host-to-device (GPU): pending a GPU machine

The pin-memory stage (issue 18) has no measured table yet: no machine with
an NVIDIA GPU was available while it was written. On one, this prints the
table to paste here (with the GPU's name from `nvidia-smi -L`):

```
bench/gpu_check.sh
```

It builds `loaderctl` with the feature `cuda` and a venv with torch, then in
one run: (1) correctness: every batch of an epoch, device bytes == host
batch bytes, through `loaderctl --checksum` (Rust) and `batch.torch()`
(Python), 3x224x224 uint8 at batch 256 and tokens (2048 x uint16) at batch
64; (2) H2D GB/s of Loader's device path (Rust and Python), of torch
`DataLoader(pin_memory=True)` + `.cuda(non_blocking=True)`, and of a raw
pinned `cudaMemcpyAsync` loop (the limit), same workloads; the targets are
>= 90% of the raw copy and >= 1.5x torch; (3) GPU idle ms per step of a
matmul-loop training step fed by each loader. Without a GPU,
`bench/gpu_check.sh --host` runs part (1) on the device path's host
backend (it passes on the 2-core machine above).
"""


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--samples", type=int, default=32000)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--image-files", type=int, default=2560,
                   help="JPEG files in the generated image folder (>= 2000)")
    p.add_argument("--image-epochs", type=int, default=2)
    p.add_argument("--only", default=None, help="run only scenarios whose name contains this; the report keeps the "
                        "others' results from the last run")
    p.add_argument("--report-only", action="store_true",
                   help="rewrite docs/benchmarks.md and .png from the raw results of the last run "
                        "(docs/benchmarks.json), e.g. after editing the notes")
    a = p.parse_args()
    raw = ROOT / "docs" / "benchmarks.json"
    if a.report_only:
        saved = json.loads(raw.read_text())
        write_report(saved_results(saved), saved_runs(saved), saved.get("matrix"))
        return
    today = datetime.date.today().isoformat()
    this_run = {"command": command_of(a), "date": today, "machine": machine()}
    results = {}
    for name, systems in scenarios(a.samples, a.image_files, a.image_epochs, a.only).items():
        runs = {label: [] for label, _, _ in systems}
        for r in range(a.repeats):
            for label, cmd, _ in systems:
                res = run_one(cmd)
                print(f"[{name}] run {r + 1}: {label}: {res['samples_per_s']:.0f} samples/s, "
                      f"{res['mb_per_s']:.0f} MB/s, first batch {res['first_batch_s'] * 1000:.0f} ms",
                      flush=True)
                runs[label].append(res)
        same_data(name, runs)
        results[name] = [(label, role, runs[label]) for label, _, role in systems]
    measured = {name: this_run for name in results}
    small = None
    if a.only is None or a.only in matrix.MATRIX:
        small = {"results": matrix.run(run_one, a.repeats), "run": this_run}
    if a.only and raw.exists():
        # A partial run replaces its scenarios in the last report and keeps
        # the others, each still naming the command and date it came from.
        saved = json.loads(raw.read_text())
        old, old_runs = saved_results(saved), saved_runs(saved)
        merged = {name: results.get(name, old[name]) for name in old}
        merged.update(results)
        measured = {name: measured.get(name, old_runs[name]) for name in merged}
        results = merged
    if small is None and raw.exists():
        # A run without the matrix keeps the last one.
        small = json.loads(raw.read_text()).get("matrix")
    args = {k: getattr(a, k) for k in ("samples", "repeats", "image_files", "image_epochs", "only")}
    raw.write_text(json.dumps({"args": args, "date": today, "runs": measured,
                               "results": results, "matrix": small}, indent=1) + "\n")
    write_report(results, measured, small)


def command_of(a):
    """The bench/run.sh command line that `a` (parsed arguments) stands for."""
    return (f"bench/run.sh --samples {a.samples} --repeats {a.repeats} "
            f"--image-files {a.image_files} --image-epochs {a.image_epochs}"
            + (f" --only {shlex.quote(a.only)}" if a.only else ""))


def machine():
    return f"{os.cpu_count()} cores, {platform.platform()}"


def saved_results(saved):
    """The results of docs/benchmarks.json, as a run returns them."""
    return {name: [tuple(s) for s in systems] for name, systems in saved["results"].items()}


def saved_runs(saved):
    """Scenario name -> the command, date and machine that measured it.
    Files written before scenarios were kept across partial runs have one
    run for all (and no machine: this one is assumed)."""
    if "runs" in saved:
        return saved["runs"]
    args = argparse.Namespace(**saved["args"])
    run = {"command": command_of(args), "date": saved["date"], "machine": machine()}
    return {name: run for name in saved["results"]}


def same_data(name, runs):
    """Systems that report a checksum of what they read (bench/python_loop.py)
    must all have read the same data, in every repeat."""
    sums = {label: {r.get("checksum") for r in rs} for label, rs in runs.items()
            if any("checksum" in r for r in rs)}
    if len(set().union(*sums.values())) > 1:
        sys.exit(f"[{name}] the systems read different data (checksums {sums})")


def med(runs, key):
    vals = [r[key] for r in runs if r.get(key) is not None]
    return statistics.median(vals) if vals else None


def write_report(results, measured, small=None):
    """docs/benchmarks.md and .png from `results`; `measured` names the
    command, date and machine of each scenario; `small` is the small-batch
    matrix (bench/matrix.py) with the run that measured it."""
    docs = ROOT / "docs"
    lines = [
        "# Benchmarks",
        "",
        "Measured by one command, which builds Loader, creates its own Python environment",
        "with torch, torchvision and tensorflow-cpu, installs Loader's Python SDK in it, and",
        "runs every system in the same run on the same data, interleaved, medians of the",
        "repeats:",
        "",
    ]
    distinct = {(m["command"], m["date"], m["machine"]) for m in measured.values()}
    if len(distinct) == 1:
        command, date, host = next(iter(distinct))
        lines += ["```", command, "```", "", f"Machine: {host}, {date}.", ""]
    else:
        lines += ["```", "bench/run.sh", "```", "",
                  "The scenarios below come from more than one run (`--only` runs some and keeps",
                  "the others); each names its command, date and machine. Only rows of one",
                  "scenario compare.", ""]
    chart = []
    for name, systems in results.items():
        anchors = [(label, med(runs, "samples_per_s")) for label, role, runs in systems if role == "anchor"]
        best_anchor = max(anchors, key=lambda x: x[1]) if anchors else None
        lines += [f"## {name}", ""]
        if len(distinct) > 1:
            m = measured[name]
            lines += [f"`{m['command']}`, {m['date']}, {m['machine']}.", ""]
        lines += ["| system | samples/s | MB/s | first batch | vs torch DataLoader | vs best anchor |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        torch_sps = next((s for l, s in anchors if l.startswith("torch")), None)
        for label, role, runs in systems:
            sps = med(runs, "samples_per_s")
            mbs = med(runs, "mb_per_s")
            fb = med(runs, "first_batch_s")
            vs_torch = f"{sps / torch_sps:.2f}x" if torch_sps else "-"
            vs_best = f"{sps / best_anchor[1]:.2f}x" if best_anchor else "-"
            extra = ""
            cpu = med(runs, "client_cpu_us_per_batch")
            trainer = med(runs, "trainer_cpu_us_per_batch")
            if trainer is not None and cpu is not None:
                extra = f" (trainer CPU {trainer:.1f} µs/batch; {cpu:.1f} with the embedded coordinator)"
            elif cpu is not None:
                extra = f" (client CPU {cpu:.1f} µs/batch)"
            lines.append(f"| {label}{extra} | {sps:,.0f} | {mbs:,.0f} | {fb * 1000:.0f} ms | {vs_torch} | {vs_best} |")
            chart.append((name, label, sps))
        if best_anchor:
            lines += ["", f"Best anchor: {best_anchor[0]}."]
        lines.append("")
    if small:
        m = small["run"]
        lines += [f"## {matrix.MATRIX}", "",
                  f"`{m['command']}`, {m['date']}, {m['machine']}. Medians of the repeats; 2 workers, "
                  "shuffled. \"Rust loop\" is `loaderctl run` (embedded mode), \"Python loop\" is "
                  "`loader.Loader.local` in bench/python_loop.py, which runs torch's DataLoader too, "
                  "with the same loop body. \"wait\" is the trainer's time blocked in `next()` per "
                  "batch; \"coordinator CPU\" is the embedded coordinator's threads per batch.", ""]
        lines += matrix.render(small["results"], med)
        lines += ["", "Against the bar of issue 15:", ""] + matrix.check(small["results"], med) + [""]
    (docs / "benchmarks.md").write_text("\n".join(lines).rstrip("\n") + "\n\n" + NOTES)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        # One panel per scenario, each on its own scale: the scenarios'
        # rates differ by 50x, so one shared axis would flatten the others.
        names = list(results.keys())
        sizes = [sum(1 for n, _, _ in chart if n == name) for name in names]
        fig, axes = plt.subplots(len(names), 1, figsize=(9, 1.2 * len(names) + 0.45 * len(chart)),
                                 gridspec_kw={"height_ratios": sizes}, squeeze=False)
        for ax, name in zip(axes[:, 0], names):
            bars = [(label, sps) for n, label, sps in chart if n == name]
            torch = next((sps for label, sps in bars if label.startswith("torch")), None)
            ax.barh(range(len(bars)), [sps for _, sps in bars],
                    color=["#2b7bba" if label.lower().startswith("loader") else "#aaaaaa" for label, _ in bars])
            ax.set_yticks(range(len(bars)),
                          [f"{label}  ({sps / torch:.2f}x torch)" if torch else label for label, sps in bars],
                          fontsize=8)
            ax.invert_yaxis()
            ax.set_title(name if len(name) < 90 else name[:87] + "...", fontsize=9, loc="left")
            ax.tick_params(axis="x", labelsize=8)
        axes[-1, 0].set_xlabel("samples/s (median)")
        fig.tight_layout()
        fig.savefig(docs / "benchmarks.png", dpi=110)
    except ImportError:
        print("matplotlib missing: no chart", file=sys.stderr)
    print((docs / "benchmarks.md").read_text())


if __name__ == "__main__":
    main()
