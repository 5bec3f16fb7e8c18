"""Trace export from a Python trainer: with ``OTEL_EXPORTER_OTLP_ENDPOINT``
set, a ``Loader.local`` trainer and the workers it starts export every
batch's spans to a real OTLP/gRPC receiver (the ``otlp_sink`` example of
the end-to-end test crate, which ``cargo test --workspace`` builds before
these tests run), flushed when the interpreter exits."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

from conftest import synthetic

SINK = pathlib.Path(
    os.environ.get(
        "LOADER_OTLP_SINK",
        pathlib.Path(__file__).resolve().parents[2] / "target" / "debug" / "examples" / "otlp_sink",
    )
)

TRAINER = """
import json, sys
import loader
spec = json.loads(sys.argv[1])
with loader.Loader.local(spec, workers=1, ready_timeout=20.0) as batches:
    print(sum(1 for _ in batches))
"""


@pytest.mark.skipif(not SINK.exists(), reason=f"no OTLP sink at {SINK} (cargo test --workspace builds it)")
def test_a_python_trainer_and_its_workers_export_every_batch_span():
    sink = subprocess.Popen([str(SINK), "127.0.0.1:0"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        line = sink.stdout.readline()
        assert line.startswith("listening "), line
        endpoint = "http://" + line.split()[1]
        env = dict(os.environ, OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_BSP_SCHEDULE_DELAY="100")
        spec = synthetic(num_samples=256, shape=(64,), batch_size=16)
        trainer = subprocess.run(
            [sys.executable, "-c", TRAINER, json.dumps(spec)], env=env, capture_output=True, text=True, timeout=120
        )
        assert trainer.returncode == 0, trainer.stderr
        assert trainer.stdout.strip() == "16"
    finally:
        # EOF on its stdin: the sink reports what it received and exits.
        out, _ = sink.communicate(input="", timeout=30)
    received = [l for l in out.splitlines() if l.startswith("spans ")]
    assert received, out
    # Per batch: the (embedded) coordinator's root, the worker's produce and
    # deliver, the trainer's consume; and the job's own span. The worker
    # flushed when the trainer stopped it (SIGTERM), the trainer at exit.
    assert int(received[0].split()[1]) == 16 * 4 + 1, out
