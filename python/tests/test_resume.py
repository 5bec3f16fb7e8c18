"""state_dict() / load_state_dict(): exact resumption, mid-epoch and across
epochs, in a new loader with another number of workers."""

import json

import loader
from conftest import synthetic

SPEC = synthetic(num_samples=100, batch_size=8, epochs=2, shuffle=True, seed=3)


def every_batch(dl):
    return [(b.seq, b.indices) for e in range(dl.epochs) for b in (dl.set_epoch(e) or dl)]


def test_state_dict_round_trip_resumes_at_the_right_batch():
    with loader.Loader.local(SPEC, workers=2) as dl:
        reference = every_batch(dl)
    assert [s for s, _ in reference] == list(range(26))

    with loader.Loader.local(SPEC, workers=2) as first:
        it = iter(first)
        for _ in range(9):
            next(it)
        # Mid-epoch: 9 of 13 batches of epoch 0 yielded.
        state = first.state_dict()
    state = json.loads(json.dumps(state))  # as saved in a checkpoint
    assert state["next_seq"] == 9

    with loader.Loader.local(SPEC, workers=1) as second:
        second.load_state_dict(state)
        assert (len(second), second.epochs, second.epoch) == (13, 2, 0)
        rest = []
        for epoch in range(second.epoch, second.epochs):
            second.set_epoch(epoch)
            rest.extend((b.seq, b.indices) for b in second)
    assert rest == reference[9:]


def test_state_taken_across_an_epoch_boundary():
    with loader.Loader.local(SPEC, workers=1) as dl:
        reference = every_batch(dl)
    with loader.Loader.local(SPEC, workers=1) as dl:
        for epoch in range(2):
            dl.set_epoch(epoch)
            for batch in dl:
                if batch.seq == 16:
                    break
            else:
                continue
            break
        state = dl.state_dict()
    with loader.Loader.local(SPEC, workers=2) as dl:
        dl.load_state_dict(state)
        assert dl.epoch == 1
        dl.set_epoch(1)
        assert [(b.seq, b.indices) for b in dl] == reference[17:]


def test_state_dict_before_iterating_starts_at_the_beginning():
    with loader.Loader.local(SPEC, workers=1) as dl:
        state = dl.state_dict()
        assert state["next_seq"] == 0 and state["world_size"] == 1
        first = next(iter(dl)).seq
        assert first == 0
