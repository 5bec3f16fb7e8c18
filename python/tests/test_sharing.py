"""Shared streams (docs/sharing.md): independent trainers subscribed to one
named job each receive every batch, made once, against a real loader-server
and loader-worker processes (the `deployment` fixture of test_elastic)."""

from __future__ import annotations

import pytest

import loader
from conftest import needs_binaries, synthetic
from test_elastic import deployment  # noqa: F401  (a fixture)


def shared_job(name: str) -> dict:
    spec = synthetic(num_samples=96, shape=(4,), batch_size=8, epochs=2, shuffle=True, seed=3)
    spec["name"] = name
    spec["shared"] = True
    return spec


@needs_binaries
def test_two_trainers_on_a_shared_stream_each_get_the_whole_stream(deployment):  # noqa: F811
    spec = shared_job("py-sweep")
    with loader.Loader(deployment, spec) as a, loader.Loader(deployment, spec) as b:
        # Taking turns, as two trials of a sweep in one process would.
        it_a, it_b = iter(a), iter(b)
        got_a, got_b = [], []
        for i in range(len(a)):
            x, y = next(it_a), next(it_b)
            got_a.append((x.seq, list(x.indices), x["data"].tobytes()))
            got_b.append((y.seq, list(y.indices), y["data"].tobytes()))
            if i == 4:
                state = b.state_dict()
    assert got_a == got_b
    assert [s for s, _, _ in got_a] == list(range(len(a)))
    # A solo run of the same job (another name) yields the same batches.
    solo = dict(spec, name="py-solo")
    del solo["shared"]
    with loader.Loader(deployment, solo) as dl:
        it = iter(dl)
        assert [(x.seq, list(x.indices), x["data"].tobytes()) for x in (next(it) for _ in range(len(dl)))] == got_a
    # Each subscriber keeps its own exact state: resumed from the second
    # one's after 5 batches, a new subscriber continues right after them.
    with loader.Loader(deployment, spec) as c:
        c.load_state_dict(state)
        rest = [(x.seq, list(x.indices), x["data"].tobytes()) for x in c]
    assert rest == got_a[5:]


def test_a_shared_stream_without_a_name_is_a_one_line_error():
    spec = shared_job("x")
    del spec["name"]
    with pytest.raises(ValueError, match="shared: a shared stream needs a name") as e:
        loader.Loader("http://127.0.0.1:1", spec)
    assert "\n" not in str(e.value)
