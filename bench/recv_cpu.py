"""Trainer CPU-seconds per GB received over gRPC, two trainer builds in the
same run (issue 32):

    python bench/recv_cpu.py --old /tmp/loaderctl-before [--new target/release/loaderctl] [--repeats 5]

A real `loader-server` and `--workers` `loader-worker`s (the new build's,
target/release) on loopback, plaintext and then TLS (mutual TLS and the
three role tokens; a throwaway CA made with openssl), and per cell the old
and the new `loaderctl consume --transport grpc` against them, interleaved
(old, new, new, old, ...). The trainer is a process of its own here, so its
CPU (user + sys over the consuming loop, from the report's
`client_cpu_us_per_batch`) is what receiving, checking and handing over
the batches costs, divided by the bytes delivered. Cells: synthetic
3x224x224 uint8 at batch 64 (9.6 MB batches), 3x32x32 uint8 at batch 256
(0.8 MB), tokens 2049 x uint16 at batch 64 (262 KB; the matrix's token
file, bench/matrix.py makes it). Medians; the table goes to stdout.
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
BENCH = ROOT / "bench"
RELEASE = ROOT / "target" / "release"
TIMEOUT_S = 180  # one consume; a hung run fails the benchmark instead of stalling it
START_S = 10  # a coordinator prints its address well within this

sys.path.insert(0, str(BENCH))
import matrix  # noqa: E402  (the matrix's token file)

# (cell name, consume flags without the data path); each run moves ~3 GB
CELLS = [
    ("3x224x224 uint8, batch 64", ["--shape", "3,224,224", "--batch-size", "64", "--samples", "12800", "--epochs", "3"]),
    ("3x32x32 uint8, batch 256", ["--shape", "3,32,32", "--batch-size", "256", "--samples", "100000", "--epochs", "10"]),
    ("tokens 2049 x uint16, batch 64", ["--dataset", "tokens", "--batch-size", "64", "--epochs", "40"]),
]


def make_certs(work):
    """A CA and one certificate for 127.0.0.1 (server and client use), and
    the role tokens: the environment of a TLS deployment."""
    def openssl(*a):
        subprocess.run(["openssl", *a], cwd=work, check=True, capture_output=True)
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "1",
            "-subj", "/CN=bench-ca", "-keyout", "ca.key", "-out", "ca.pem")
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-subj", "/CN=bench",
            "-keyout", "node.key", "-out", "node.csr")
    (work / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth,clientAuth\n")
    openssl("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1",
            "-extfile", "ext", "-out", "node.pem")
    env = {"LOADER_TLS_CERT": work / "node.pem", "LOADER_TLS_KEY": work / "node.key",
           "LOADER_TLS_CLIENT_CA": work / "ca.pem", "LOADER_TLS_CA": work / "ca.pem"}
    for role in ("worker", "trainer", "admin"):
        token = work / f"{role}.token"
        token.write_text(os.urandom(32).hex())
        token.chmod(0o600)  # the binaries refuse a token others can read
        env[f"LOADER_{role.upper()}_TOKEN_FILE"] = token
    return {k: str(v) for k, v in env.items()}


class Service:
    """A coordinator and its workers, stopped on exit."""

    def __init__(self, workers, env, scheme, work):
        self.procs = []
        log = open(work / f"server-{scheme}.log", "w+")
        server = subprocess.Popen([str(RELEASE / "loader-server"), "--listen", "127.0.0.1:0"], env=env,
                                  stdout=log, stderr=subprocess.DEVNULL)
        self.procs.append(server)
        deadline = time.monotonic() + START_S
        address = None
        while address is None:
            if time.monotonic() > deadline or server.poll() is not None:
                self.stop()
                sys.exit("loader-server did not print its address")
            time.sleep(0.05)
            log.seek(0)
            address = next((line.split()[1] for line in log if line.startswith("listening ")), None)
        self.url = f"{scheme}://{address}"
        for _ in range(workers):
            self.procs.append(subprocess.Popen(
                [str(RELEASE / "loader-worker"), "--coordinator", self.url, "--listen", "127.0.0.1:0"], env=env,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def consume(binary, url, flags, env):
    cmd = [binary, "consume", "--coordinator", url, "--json", "--transport", "grpc", *flags]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired:
        sys.exit(f"timed out after {TIMEOUT_S} s: {shlex.join(cmd)}")
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        sys.exit(f"failed ({out.returncode}): {shlex.join(cmd)}\n{out.stderr.strip()[-2000:]}")
    r = json.loads(lines[-1])
    cpu_s = r["client_cpu_us_per_batch"] * r["batches"] / 1e6
    return cpu_s / (r["bytes"] / 1e9), r["mb_per_s"]


def main():
    p = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    p.add_argument("--old", required=True, help="the loaderctl build before the change")
    p.add_argument("--new", default=str(RELEASE / "loaderctl"), help="the build after it")
    p.add_argument("--repeats", type=int, default=5, help="runs of each build per cell and mode, interleaved")
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--modes", default="plaintext,tls", help="plaintext, tls or both (comma-separated)")
    args = p.parse_args()
    for b in (args.old, args.new, RELEASE / "loader-server", RELEASE / "loader-worker"):
        if not Path(b).exists():
            sys.exit(f"{b} is missing (cargo build --release)")
    print("command: " + shlex.join([sys.executable] + sys.argv))
    tokens, _rows = matrix.data_files()
    began = time.perf_counter()
    lines = ["| mode | cell | old CPU-s/GB | new CPU-s/GB | old MB/s | new MB/s | new / old throughput |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for mode in args.modes.split(","):
            env = dict(os.environ)
            for k in list(env):
                if k.startswith("LOADER_"):
                    del env[k]
            if mode == "tls":
                env.update(make_certs(work))
            service = Service(args.workers, env, "https" if mode == "tls" else "http", work)
            try:
                for name, flags in CELLS:
                    if "tokens" in flags:
                        flags = [*flags, "--path", str(tokens), "--context-length", str(matrix.CONTEXT)]
                    got = {"old": [], "new": []}
                    for r in range(args.repeats):
                        for which in (("old", "new") if r % 2 == 0 else ("new", "old")):
                            cpu, mbs = consume(getattr(args, which), service.url, flags, env)
                            got[which].append((cpu, mbs))
                            print(f"[{mode}, {name}] run {r + 1}: {which}: {cpu:.3f} CPU-s/GB, {mbs:,.0f} MB/s",
                                  flush=True)
                    med = {w: (statistics.median(c for c, _ in v), statistics.median(m for _, m in v))
                           for w, v in got.items()}
                    lines.append(f"| {mode} | {name} | {med['old'][0]:.3f} | {med['new'][0]:.3f} | "
                                 f"{med['old'][1]:,.0f} | {med['new'][1]:,.0f} | {med['new'][1] / med['old'][1]:.2f}x |")
            finally:
                service.stop()
    print()
    print(f"{args.repeats} repeats interleaved, {args.workers} workers, loopback; wall {time.perf_counter() - began:.0f} s")
    print()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
