"""Runs Loader and its anchors side by side, in one run on the same data, and
writes the tables of that run to docs/benchmarks/run.md (with
docs/benchmarks.png). docs/benchmarks.md, the page users read, is written by
hand from these tables and the other benches' figures: a run never
overwrites it.

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
                   help="rewrite docs/benchmarks/run.md and .png from the raw results of the last run "
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
    """docs/benchmarks/run.md and docs/benchmarks.png from `results`; `measured` names the
    command, date and machine of each scenario; `small` is the small-batch
    matrix (bench/matrix.py) with the run that measured it."""
    docs = ROOT / "docs"
    lines = [
        "# The last `bench/run.sh` run",
        "",
        "Generated by bench/run.py; the page to read is docs/benchmarks.md, which quotes these",
        "tables. Measured by one command, which builds Loader, creates its own Python environment",
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
        lines += ["", "Against the small-batch bar:", ""] + matrix.check(small["results"], med) + [""]
    (docs / "benchmarks").mkdir(exist_ok=True)
    (docs / "benchmarks" / "run.md").write_text("\n".join(lines).rstrip("\n") + "\n")
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
    print((docs / "benchmarks" / "run.md").read_text())


if __name__ == "__main__":
    main()
