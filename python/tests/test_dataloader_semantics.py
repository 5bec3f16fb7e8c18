"""Loader.local as DataLoader's drop-in in behaviour: every iter() is the
next pass (a break loses nothing of it), no epoch limit unless one is set,
set_epoch reached through ``loader.sampler``, resume continuing the saved
pass then going on, DataLoader's signature and keywords, and any
collate_fn output."""

from __future__ import annotations

import collections
import dataclasses
import inspect

import numpy as np
import pytest

import loader
from conftest import synthetic
from sample_datasets import Indexed

torch = pytest.importorskip("torch", reason="DataLoader's keywords are torch's")


def order(batches):
    return [int(i) for b in batches for i in b["i"]]


def passes(dl, n):
    return [order(dl) for _ in range(n)]


def test_every_iter_is_the_next_pass_with_no_epoch_limit():
    with loader.Loader.local(Indexed(40), batch_size=8, shuffle=True, num_workers=2) as dl:
        assert dl.epochs is None and len(dl) == 5
        seen = passes(dl, 4)
        assert all(sorted(p) == list(range(40)) for p in seen), "each pass is every sample once"
        assert len({tuple(p) for p in seen}) == 4, "each pass has its own order (RandomSampler's behaviour)"
        assert dl.epoch == 4


def test_a_break_loses_nothing_of_the_next_pass():
    with loader.Loader.local(Indexed(40), batch_size=8, shuffle=True, seed=3) as reference:
        uninterrupted = passes(reference, 3)
    with loader.Loader.local(Indexed(40), batch_size=8, shuffle=True, seed=3) as dl:
        for k, batch in enumerate(dl):
            if k == 1:
                break
        # The second loop sees a full pass: pass 1, as in the uninterrupted run.
        assert order(dl) == uninterrupted[1]
        it = iter(dl)
        first = next(it)
        assert order([first]) == uninterrupted[2][:8]
        # A new iter() ends the old iterator, as a DataLoader's.
        again = iter(dl)
        assert list(it) == []
        assert len(again) == len(dl)


def test_a_resumed_loader_continues_the_pass_then_goes_on_in_the_same_order():
    with loader.Loader.local(Indexed(40), batch_size=8, shuffle=True, seed=5) as reference:
        uninterrupted = passes(reference, 3)
    with loader.Loader.local(Indexed(40), batch_size=8, shuffle=True, seed=5) as dl:
        order(dl)
        it = iter(dl)
        head = order([next(it), next(it)])
        state = dl.state_dict()
    assert head == uninterrupted[1][:16]
    with loader.Loader.local(Indexed(40), batch_size=8, shuffle=True, seed=5, num_workers=1) as resumed:
        resumed.load_state_dict(state)
        assert resumed.epoch == 1
        assert order(resumed) == uninterrupted[1][16:], "the rest of the saved pass"
        assert order(resumed) == uninterrupted[2], "then the next pass, as uninterrupted"


def test_set_epoch_through_the_sampler_as_frameworks_call_it():
    with loader.Loader.local(Indexed(40), batch_size=8, shuffle=True, seed=1) as dl:
        reference = passes(dl, 3)
        dl.sampler.set_epoch(2)
        assert order(dl) == reference[2]
        dl.batch_sampler.sampler.set_epoch(0)
        assert order(dl) == reference[0]
        assert len(dl.sampler) == 40 and len(dl.batch_sampler) == 5
        assert dl.batch_size == 8 and dl.drop_last is False


def test_an_epoch_bound_is_kept_when_given():
    with loader.Loader.local(Indexed(16), batch_size=8, epochs=2) as dl:
        assert dl.epochs == 2
        passes(dl, 2)
        with pytest.raises(loader.LoaderError, match="all 2 epochs"):
            iter(dl)


def test_a_state_is_a_position_and_the_loaders_arguments_its_configuration():
    with loader.Loader.local(Indexed(48), batch_size=8, shuffle=True, seed=2) as dl:
        it = iter(dl)
        head = order([next(it), next(it)])
        state = dl.state_dict()
    with loader.Loader.local(Indexed(48), batch_size=4, shuffle=True, seed=2) as resumed:
        resumed.load_state_dict(state)
        rest = list(resumed)
        assert all(len(b["i"]) == 4 for b in rest), "this loader's batch size applies"
        assert sorted(head + order(rest)) == list(range(48)), "every sample of the pass once"
    with loader.Loader.local(Indexed(48), batch_size=8, shuffle=True, seed=9) as other:
        with pytest.raises(ValueError, match="seed 2.*seed 9"):
            other.load_state_dict(state)
    with loader.Loader.local(Indexed(50), batch_size=8, shuffle=True, seed=2) as other:
        with pytest.raises(ValueError, match="48 samples.*50"):
            other.load_state_dict(state)


def test_dataloaders_signature_and_positional_order():
    params = list(inspect.signature(torch.utils.data.DataLoader.__init__).parameters)[1:]
    ours = list(inspect.signature(loader.Loader.local).parameters)
    positional = [p for p in params if inspect.signature(torch.utils.data.DataLoader.__init__).parameters[p].kind
                  is inspect.Parameter.POSITIONAL_OR_KEYWORD]
    assert ours[: len(positional)] == positional
    missing = [p for p in params if p not in ours]
    assert missing == [], f"DataLoader keywords Loader.local lacks: {missing}"
    # DataLoader(ds, 4): batch size 4.
    with loader.Loader.local(Indexed(8), 4) as dl:
        assert dl.batch_size == 4 and len(dl) == 2


def test_dataloader_keywords_mean_what_they_mean_there():
    ds = Indexed(24)
    with loader.Loader.local(ds, batch_size=8, sampler=torch.utils.data.SequentialSampler(ds), num_workers=0,
                             persistent_workers=True, prefetch_factor=2, pin_memory=False, timeout=30,
                             in_order=True) as dl:
        assert order(dl) == list(range(24))
        assert len(dl.worker_pids()) == 1, "num_workers=0: one worker"
        assert dl.dataset is ds
    g = torch.Generator().manual_seed(11)
    with loader.Loader.local(ds, batch_size=8, sampler=torch.utils.data.RandomSampler(ds, generator=g)) as a, \
            loader.Loader.local(ds, batch_size=8, shuffle=True, seed=11) as b:
        assert order(a) == order(b), "the sampler's generator seeds the job"
    bs = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(ds), batch_size=5, drop_last=True)
    with loader.Loader.local(ds, batch_sampler=bs) as dl:
        assert [len(b["i"]) for b in dl] == [5] * 4
    with loader.Loader.local(ds, batch_size=8, shuffle=True, generator=torch.Generator().manual_seed(4)) as a, \
            loader.Loader.local(ds, batch_size=8, shuffle=True, seed=4) as b:
        assert order(a) == order(b)


class EveryOther(torch.utils.data.Sampler):
    """A sampler written for DataLoader: the even indices, then the odd
    ones, rotated by the epoch DistributedSampler-style."""

    def __init__(self, n):
        self.n, self.epoch = n, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return self.n

    def __iter__(self):
        order = list(range(0, self.n, 2)) + list(range(1, self.n, 2))
        k = self.epoch % self.n
        return iter(order[k:] + order[:k])


class Unseeded(torch.utils.data.Sampler):
    def __init__(self, n):
        self.n = n

    def __len__(self):
        return self.n

    def __iter__(self):
        import os

        return iter(sorted(range(self.n), key=lambda _: os.urandom(4)))


def test_a_users_sampler_runs_once_per_pass_and_resumes_exactly():
    ds = Indexed(30)
    with loader.Loader.local(ds, batch_size=4, sampler=EveryOther(30), num_workers=2) as dl:
        seen = passes(dl, 2)
    want = [[*range(0, 30, 2), *range(1, 30, 2)]]
    want.append(want[0][1:] + want[0][:1])
    assert seen == want, "pass e is the sampler's order after set_epoch(e)"
    weights = [0.0] * 10 + [1.0] * 20
    weighted = torch.utils.data.WeightedRandomSampler(weights, num_samples=24, generator=torch.Generator().manual_seed(0))
    with loader.Loader.local(ds, batch_size=6, sampler=weighted, seed=7) as dl:
        assert len(dl) == 4
        uninterrupted = passes(dl, 3)
    assert all(len(p) == 24 and min(p) >= 10 for p in uninterrupted), "the weights hold"
    assert uninterrupted[0] != uninterrupted[1], "a new draw each pass"
    with loader.Loader.local(ds, batch_size=6, sampler=weighted, seed=7) as dl:
        it = iter(dl)
        head = order([next(it)])
        state = dl.state_dict()
    with loader.Loader.local(ds, batch_size=6, sampler=weighted, seed=7, num_workers=1) as resumed:
        resumed.load_state_dict(state)
        assert head + order(resumed) == uninterrupted[0]
        assert order(resumed) == uninterrupted[1]


def test_a_sampler_that_loader_cannot_make_repeat_is_said(caplog):
    with caplog.at_level("WARNING", logger="loader"):
        dl = loader.Loader.local(Indexed(16), batch_size=4, sampler=Unseeded(16))
    dl.close()
    assert "gives another order each time" in caplog.text


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        ({"batch_sampler": [[0, 1]]}, TypeError, "batch_sampler: a list"),
        ({"sampler": "OUTSIDE"}, ValueError, "yields index 9, outside the dataset's 8 samples"),
        ({"shuffle": True, "sampler": "SEQ"}, ValueError, "sampler option is mutually exclusive with shuffle"),
        ({"batch_sampler": "BATCH", "batch_size": 4}, ValueError, "batch_sampler option is mutually exclusive with batch_size"),
        ({"num_workers": 2, "workers": 2}, TypeError, "num_workers and workers"),
        ({"num_workers": -1}, ValueError, "num_workers option should be non-negative"),
        ({"timeout": -1}, ValueError, "timeout option should be non-negative"),
        ({"prefetch_factor": 2, "prefetch": 4}, TypeError, "prefetch_factor"),
        ({"generator": 5}, TypeError, "generator must be a torch.Generator"),
        ({"pin_memory_device": "cuda"}, TypeError, "pin_memory_device"),
        ({"sampler": "DIST"}, ValueError, "DistributedSampler for rank 1 of 2"),
    ],
)
def test_keywords_loader_cannot_honour_are_refused_by_name(kwargs, error, words):
    ds = Indexed(8)
    made = {
        "OUTSIDE": [0, 9],
        "SEQ": torch.utils.data.SequentialSampler(ds),
        "BATCH": torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(ds), 2, False),
        "DIST": torch.utils.data.DistributedSampler(ds, num_replicas=2, rank=1),
    }
    kwargs = {k: made.get(v, v) if isinstance(v, str) else v for k, v in kwargs.items()}
    with pytest.raises(error) as e:
        loader.Loader.local(ds, **kwargs)
    assert words in str(e.value) and "\n" not in str(e.value)


def test_pin_memory_without_a_gpu_stays_on_the_host_with_a_warning(caplog):
    with loader.Loader.local(Indexed(8), batch_size=4, pin_memory=True) as dl:
        with caplog.at_level("WARNING", logger="loader"):
            batches = list(dl)
    assert [b["x"].device.type for b in batches] in (["cpu", "cpu"], ["cuda", "cuda"])
    if batches[0]["x"].device.type == "cpu":
        assert "no usable GPU" in caplog.text


@dataclasses.dataclass
class Pair:
    images: object
    names: list


Point = collections.namedtuple("Point", ["x", "tag"])


class Box:
    def __init__(self, t):
        self.t = t


def dataclass_collate(samples):
    return Pair(torch.stack([torch.as_tensor(s["x"]) for s in samples]), [f"s{s['i']}" for s in samples])


def namedtuple_collate(samples):
    return Point(np.stack([s["x"] for s in samples]), "tag")


def strings_collate(samples):
    return [f"sample {s['i']}" for s in samples]


def nested_collate(samples):
    return {"a": [{"x": torch.tensor([s["i"] for s in samples]), "n": None}, "text"], "b": Box(torch.zeros(2))}


def test_any_collate_fn_output_comes_through_as_dataloader_gives_it():
    ds = Indexed(8)
    with loader.Loader.local(ds, batch_size=4, collate_fn=dataclass_collate) as dl:
        got = list(dl)
    assert isinstance(got[0], Pair) and got[0].names == ["s0", "s1", "s2", "s3"]
    assert isinstance(got[1].images, torch.Tensor) and got[1].images[:, 0].tolist() == [4, 5, 6, 7]
    with loader.Loader.local(ds, batch_size=4, collate_fn=namedtuple_collate) as dl:
        p = next(iter(dl))
    assert isinstance(p, Point) and p.tag == "tag" and isinstance(p.x, np.ndarray) and p.x.shape == (4, 2)
    with loader.Loader.local(ds, batch_size=4, collate_fn=strings_collate) as dl:
        assert list(dl) == [[f"sample {i}" for i in range(4)], [f"sample {i}" for i in range(4, 8)]]
    with loader.Loader.local(ds, batch_size=4, collate_fn=nested_collate) as dl:
        b = next(iter(dl))
    assert b["a"][0]["x"].tolist() == [0, 1, 2, 3] and b["a"][0]["n"] is None and b["a"][1] == "text"
    assert isinstance(b["b"], Box) and b["b"].t.tolist() == [0.0, 0.0]


def test_a_batch_rebuilds_as_a_dict_of_its_tensors():
    with loader.Loader.local(synthetic(num_samples=8, batch_size=4), workers=1) as dl:
        batch = next(iter(dl))
        # transformers' _prepare_input does type(data)({k: ... for k, v in data.items()}).
        rebuilt = type(batch)({k: v for k, v in batch.items()})
        assert isinstance(rebuilt, dict) and set(rebuilt) == {"data", "label"}
        assert type(batch)(data=1) == {"data": 1}


def test_worker_init_fn_globals_reach_getitem_of_a_main_defined_dataset(child):
    pytest.importorskip("cloudpickle")
    c = child(
        """
        import loader
        FLAG = "unset"

        def init(worker_id):
            global FLAG
            FLAG = f"set by worker {worker_id}"

        class DS:
            def __len__(self):
                return 4
            def __getitem__(self, i):
                import numpy as np
                return {"ok": np.int64(FLAG.startswith("set by worker"))}

        with loader.Loader.local(DS(), batch_size=4, worker_init_fn=init, num_workers=1) as dl:
            print("OK", [int(v) for v in next(iter(dl))["ok"]], flush=True)
        """
    )
    assert c.expect("OK", timeout=60) == "[1, 1, 1, 1]"
