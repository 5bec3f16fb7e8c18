"""Loader in the training frameworks, run for real (no mocks): Lightning,
accelerate, transformers' Trainer, torch.distributed.checkpoint and
torchdata's ``Stateful``. Tiny CPU models over ``Indexed`` samples, whose
``i`` says which samples each step trained on, so "exact" is checked as
equal lists of indices (and equal weights where the optimizer steps
matter). Each test is bounded by an alarm and every batch by a timeout."""

from __future__ import annotations

import os
import signal
import warnings

import pytest

import loader
from sample_datasets import Indexed

torch = pytest.importorskip("torch")

pytestmark = [
    # Lightning's own notices, not about Loader.
    pytest.mark.filterwarnings("ignore:.*LeafSpec.*is deprecated"),
    pytest.mark.filterwarnings("ignore:You defined a `validation_step` but have no `val_dataloader`"),
    pytest.mark.filterwarnings("ignore:Be aware that when using `ckpt_path`"),
]

#: Seconds a test may take (they start real worker processes and frameworks).
TEST_SECONDS = 180
#: Seconds one batch may take.
BATCH_TIMEOUT = 30


@pytest.fixture(autouse=True)
def bounded():
    """Fails a test that runs past ``TEST_SECONDS`` instead of hanging the
    suite (SIGALRM in the main thread; the exception unwinds through the
    ``with`` blocks, which close the loaders)."""

    def expired(signum, frame):
        raise TimeoutError(f"test ran past {TEST_SECONDS}s")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(TEST_SECONDS)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def make(n=40, batch_size=8, seed=7, num_workers=2, **kwargs):
    return loader.Loader.local(
        Indexed(n), batch_size=batch_size, shuffle=True, seed=seed, num_workers=num_workers, timeout=BATCH_TIMEOUT,
        **kwargs,
    )


def ids(batch):
    return [int(i) for i in batch["i"]]


def reference_passes(n_passes, **kwargs):
    """Each pass's batches as index lists, from a loader iterated plainly."""
    with make(**kwargs) as dl:
        return [[ids(b) for b in dl] for _ in range(n_passes)]


def flat(passes):
    return [b for p in passes for b in p]


# -- Lightning ----------------------------------------------------------------


def _lightning():
    return pytest.importorskip("lightning.pytorch")


def lightning_module(train, val=None):
    """A LightningModule (made here: its class needs the import) that
    records the indices of every training and validation batch."""
    L = _lightning()

    class Recording(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 1)
            self.trained = []  # batches, in order
            self.train_epochs = []  # the epoch of each
            self.val_runs = []  # (sanity?, indices) per validation run

        def train_dataloader(self):
            return train() if callable(train) else train

        def training_step(self, batch, batch_idx):
            self.trained.append(ids(batch))
            self.train_epochs.append(self.current_epoch)
            return (self.lin(batch["x"]) ** 2).mean()

        def on_validation_epoch_start(self):
            self.val_runs.append((self.trainer.sanity_checking, []))

        def validation_step(self, batch, batch_idx):
            self.val_runs[-1][1].extend(ids(batch))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

    if val is not None:
        Recording.val_dataloader = lambda self: val
    return Recording()


def lightning_trainer(tmp_path, **kwargs):
    L = _lightning()
    options = dict(
        accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
        enable_model_summary=False, enable_checkpointing=False, default_root_dir=str(tmp_path),
    )
    options.update(kwargs)
    return L.Trainer(**options)


def test_lightning_two_epochs_with_validation_see_every_sample_of_every_pass(tmp_path):
    with make(40, 8) as train, make(24, 8, seed=1) as val:
        model = lightning_module(train, val)
        lightning_trainer(tmp_path, max_epochs=2, num_sanity_val_steps=2).fit(model)
    assert model.train_epochs == [0] * 5 + [1] * 5
    epochs = [flat(model.trained[:5]), flat(model.trained[5:])]
    assert all(sorted(e) == list(range(40)) for e in epochs), "every sample once per training epoch"
    assert epochs[0] != epochs[1], "each epoch its own shuffle (Lightning's sampler.set_epoch)"
    assert flat(reference_passes(2, n=40)) == model.trained, "the loader's passes 0 and 1, in order"
    sanity, *runs = model.val_runs
    assert sanity[0] and len(sanity[1]) == 16, "the sanity check's 2 batches"
    assert len(runs) == 2 and not any(s for s, _ in runs)
    assert all(sorted(seen) == list(range(24)) for _, seen in runs), "full validation passes after the sanity break"


@pytest.mark.parametrize("resume_step", [3, 5, 7])
def test_lightning_mid_epoch_checkpoint_resumes_exactly(tmp_path, resume_step):
    L = _lightning()
    ckpts = tmp_path / "ckpt"
    with make(40, 8) as train:
        model = lightning_module(train)
        every = L.callbacks.ModelCheckpoint(dirpath=ckpts, filename="{step}", every_n_train_steps=1, save_top_k=-1)
        lightning_trainer(tmp_path, max_epochs=3, enable_checkpointing=True, callbacks=[every]).fit(model)
    uninterrupted = model.trained
    assert len(uninterrupted) == 15
    ckpt = ckpts / f"step={resume_step}.ckpt"
    saved = torch.load(ckpt, weights_only=False)["loops"]["fit_loop"]["state_dict"]["combined_loader"]
    assert len(saved) == 1 and saved[0]["next_seq"] == resume_step, "Lightning saved the loader's position"
    with make(40, 8, seed=7) as train, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        resumed = lightning_module(train)
        lightning_trainer(tmp_path, max_epochs=3).fit(resumed, ckpt_path=str(ckpt))
    assert not [w for w in caught if "not resumable" in str(w.message)], "Lightning sees a resumable loader"
    assert resumed.trained == uninterrupted[resume_step:], "the rest of the run, batch for batch"
    assert resumed.train_epochs == [s // 5 for s in range(resume_step, 15)]


def test_lightning_reload_dataloaders_every_epoch_reshuffles(tmp_path):
    made = []

    def fresh():
        # A new loader each epoch, as reload_dataloaders_every_n_epochs asks.
        dl = make(40, 8)
        made.append(dl)
        return dl

    try:
        model = lightning_module(fresh)
        lightning_trainer(tmp_path, max_epochs=3, reload_dataloaders_every_n_epochs=1).fit(model)
    finally:
        for dl in made:
            dl.close()
    assert len(made) == 3
    epochs = [flat(model.trained[k * 5 : (k + 1) * 5]) for k in range(3)]
    assert all(sorted(e) == list(range(40)) for e in epochs)
    assert len({tuple(e) for e in epochs}) == 3, "each reloaded loader shuffles its epoch anew"
    assert model.trained == flat(reference_passes(3, n=40)), "epoch e is pass e (set_epoch on the new loader)"


# -- accelerate ---------------------------------------------------------------


@pytest.fixture
def accelerate():
    """accelerate's process-wide state reset around each test (its own test
    suite does the same): each test builds its own Accelerator."""
    acc = pytest.importorskip("accelerate")
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield acc
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def accelerated(acc, steps=1):
    accelerator = acc.Accelerator(cpu=True, gradient_accumulation_steps=steps)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    model, optimizer = accelerator.prepare(model, optimizer)
    return accelerator, model, optimizer


def test_accelerate_accumulation_steps_at_the_end_of_each_pass(accelerate):
    from loader.integrations.accelerate import prepare

    accelerator, model, optimizer = accelerated(accelerate, steps=3)
    with make(40, 8) as raw:  # 5 batches a pass: not a multiple of 3
        dl = prepare(accelerator, raw)
        assert len(dl) == 5 and dl.batch_size == 8 and dl.dataset is raw.dataset
        syncs, ends, seen = [], [], []
        for epoch in range(2):
            for batch in dl:
                with accelerator.accumulate(model):
                    seen.append(ids(batch))
                    loss = (model(batch["x"]) ** 2).mean()
                    accelerator.backward(loss)
                    syncs.append(accelerator.sync_gradients)
                    ends.append(accelerator.gradient_state.end_of_dataloader)
                    optimizer.step()
                    optimizer.zero_grad()
            assert not accelerator.gradient_state.in_dataloader, "unregistered at the end of the pass"
        # A break leaves the gradient state too.
        for batch in dl:
            assert accelerator.gradient_state.active_dataloader is dl
            break
        assert not accelerator.gradient_state.in_dataloader
    assert syncs == [False, False, True, False, True] * 2, "the partial window steps at the pass's end"
    assert ends == [False, False, False, False, True] * 2
    assert seen == flat(reference_passes(2, n=40))


def test_accelerate_save_state_load_state_is_exact(accelerate, tmp_path):
    from loader.integrations.accelerate import prepare, skip_first_batches

    accelerator, model, optimizer = accelerated(accelerate)
    with make(40, 8) as raw:
        dl = prepare(accelerator, raw)
        for _ in dl:
            pass
        it = iter(dl)
        head = [ids(next(it)), ids(next(it))]
        accelerator.save_state(str(tmp_path / "ckpt"))
        rest = [ids(b) for b in it]
        after = [ids(b) for b in dl]
    passes = reference_passes(3, n=40)
    assert head == passes[1][:2] and rest == passes[1][2:] and after == passes[2]

    accelerate.state.AcceleratorState._reset_state(True)
    accelerator, model, optimizer = accelerated(accelerate)
    with make(40, 8, num_workers=1) as raw:
        dl = prepare(accelerator, raw)
        accelerator.load_state(str(tmp_path / "ckpt"))
        # The skip accelerate's examples do after load_state: a no-op here.
        assert skip_first_batches(dl, 2) is dl
        assert [ids(b) for b in dl] == passes[1][2:], "the rest of the saved pass"
        assert [ids(b) for b in dl] == passes[2], "then the next pass"


def test_skip_first_batches_starts_the_next_pass_at_batch_n(accelerate):
    from loader.integrations.accelerate import prepare, skip_first_batches

    accelerator, _, _ = accelerated(accelerate)
    passes = reference_passes(3, n=40)
    with make(40, 8) as raw:
        dl = prepare(accelerator, raw)
        assert [ids(b) for b in skip_first_batches(dl, 3)] == passes[0][3:]
        assert [ids(b) for b in dl] == passes[1], "later loops: whole passes"
        for _ in dl:
            break  # pass 2 left part-read: the next pass is 3
        skip_first_batches(raw, 4)
        dl.set_epoch(2)
        skip_first_batches(dl, 1)
        assert [ids(b) for b in dl] == passes[2][1:], "the epoch set_epoch chose"
    with pytest.raises(TypeError, match="not a loader.Loader"):
        skip_first_batches(torch.utils.data.DataLoader(Indexed(4)), 1)


# -- transformers' Trainer ----------------------------------------------------


class TinyModel(torch.nn.Module):
    """A Trainer model: takes the batch's keys, returns {"loss": ...}, and
    records the indices it trained on."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(2, 1)
        self.seen = []

    def forward(self, i, x):
        self.seen.append([int(v) for v in i])
        return {"loss": ((self.lin(x / 40) - 1) ** 2).mean()}


def trainer_run(tmp_path, resume=None, ignore_data_skip=False, n=20):
    """max_steps 8 over 5 batches a pass with 2 accumulation steps: 3
    optimizer steps an epoch (the last of one batch), 3 epochs, a
    checkpoint every 4 steps (mid epoch 1)."""
    pytest.importorskip("transformers")
    from transformers import TrainingArguments

    from loader.integrations.transformers import LoaderTrainer

    args = TrainingArguments(
        output_dir=str(tmp_path / "out"), max_steps=8, gradient_accumulation_steps=2, save_steps=4,
        save_strategy="steps", logging_steps=100, report_to="none", use_cpu=True, disable_tqdm=True,
        learning_rate=0.05, ignore_data_skip=ignore_data_skip, seed=0,
    )
    model = TinyModel()
    with make(n, 4) as dl:
        trainer = LoaderTrainer(model=model, args=args, train_loader=dl)
        trainer.train(resume_from_checkpoint=resume)
    return model


def test_trainer_max_steps_past_an_epoch_and_resume_are_exact(tmp_path):
    accelerate = pytest.importorskip("accelerate")
    trainer_module = pytest.importorskip("transformers.trainer")

    full = trainer_run(tmp_path)
    assert trainer_module.skip_first_batches is accelerate.skip_first_batches, "restored after train()"
    passes = reference_passes(3, n=20, batch_size=4)
    # 3 epochs: 5 + 5 batches, then 2 steps of 2 batches of the third.
    assert full.seen == passes[0] + passes[1] + passes[2][:4], "Trainer's epochs are the loader's passes"
    checkpoint = tmp_path / "out" / "checkpoint-4"
    assert (checkpoint / "loader_state.json").is_file()

    resumed = trainer_run(tmp_path, resume=str(checkpoint))
    # Step 4 ended after 5 + 2 batches.
    assert resumed.seen == full.seen[7:], "the rest of the run, batch for batch"
    for a, b in zip(full.parameters(), resumed.parameters()):
        assert torch.equal(a, b), "the same optimizer steps (the epoch's short window included)"


def test_trainer_resume_true_and_ignore_data_skip(tmp_path):
    import shutil

    full = trainer_run(tmp_path)
    # resume_from_checkpoint=True: the last checkpoint in output_dir.
    shutil.rmtree(tmp_path / "out" / "checkpoint-8")
    assert trainer_run(tmp_path, resume=True).seen == full.seen[7:]
    # ignore_data_skip: Trainer starts epoch 1 over, and the loader with it.
    again = trainer_run(tmp_path, resume=str(tmp_path / "out" / "checkpoint-4"), ignore_data_skip=True)
    assert again.seen == full.seen[5:10] + full.seen[10:12]


def test_trainer_checkpoint_without_loader_state_resumes_from_trainers_count(tmp_path):
    full = trainer_run(tmp_path)
    checkpoint = tmp_path / "out" / "checkpoint-4"
    os.remove(checkpoint / "loader_state.json")
    resumed = trainer_run(tmp_path, resume=str(checkpoint))
    assert resumed.seen == full.seen[7:]


# -- torch.distributed.checkpoint and torchdata's Stateful --------------------


def test_loader_is_stateful_for_torchdata_and_dcp():
    from torch.distributed.checkpoint.stateful import Stateful as DCPStateful

    torchdata = pytest.importorskip("torchdata.stateful_dataloader")
    with make() as dl:
        assert isinstance(dl, torchdata.Stateful) and isinstance(dl, DCPStateful)


@pytest.mark.parametrize("adapter", [True, False], ids=["DCPState", "the loader itself"])
def test_dcp_save_load_is_exact(tmp_path, adapter):
    import torch.distributed.checkpoint as dcp

    from loader.integrations.dcp import DCPState

    wrap = DCPState if adapter else (lambda dl: dl)
    passes = reference_passes(2)
    with make() as dl:
        it = iter(dl)
        head = [ids(next(it)) for _ in range(3)]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "assuming ... a single process"
            dcp.save({"loader": wrap(dl), "w": torch.ones(2)}, checkpoint_id=str(tmp_path / "dcp"))
    assert head == passes[0][:3]
    with make(num_workers=1) as dl:
        state = {"loader": wrap(dl), "w": torch.zeros(2)}
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            dcp.load(state, checkpoint_id=str(tmp_path / "dcp"))
        assert torch.equal(state["w"], torch.ones(2))
        assert [ids(b) for b in dl] == passes[0][3:]
        assert [ids(b) for b in dl] == passes[1]
