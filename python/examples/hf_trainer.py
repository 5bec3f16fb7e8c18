"""transformers' Trainer on Loader: a tiny GPT-2 made from a config (no
download) trained on synthetic token sequences, ``max_steps`` past the
first epoch, checkpoints that hold the loader's position, and a resume that
continues with the next batch (``loader.integrations.transformers``,
docs/frameworks.md).

    python python/examples/hf_trainer.py                   # 60 steps, a checkpoint every 20
    python python/examples/hf_trainer.py --stop-after 30   # "crash" after step 30
    python python/examples/hf_trainer.py --resume          # continue from the last checkpoint

The data: sequence ``i`` counts up by a step drawn from seed ``i`` (mod the
vocabulary): a pattern the model learns in a few dozen steps.
"""

import argparse

import numpy as np
from transformers import GPT2Config, GPT2LMHeadModel, TrainerCallback, TrainingArguments, set_seed

import loader
from loader.integrations.transformers import LoaderTrainer

VOCAB, LENGTH = 64, 16


class Counting:
    """A map-style dataset of token sequences; made in Loader's workers."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        rng = np.random.default_rng(i)
        start, step = rng.integers(VOCAB), rng.integers(1, 4)
        ids = (start + step * np.arange(LENGTH)) % VOCAB
        return {"input_ids": ids.astype(np.int64), "labels": ids.astype(np.int64)}


class StopAfter(TrainerCallback):
    """Ends training after a step, as a preempted job would (no save)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step >= self.step:
            raise SystemExit(f"stopped after step {state.global_step}; rerun with --resume")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--max-steps", type=int, default=60)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--dir", default="/tmp/loader-hf-trainer")
    p.add_argument("--stop-after", type=int, default=None, help="end after this step (to try --resume)")
    p.add_argument("--resume", action="store_true", help="continue from the last checkpoint in --dir")
    args = p.parse_args()

    set_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=LENGTH, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)
    # 600 sequences in batches of 16: 38 batches an epoch, so 60 steps of 2
    # accumulated batches run into a fourth epoch.
    dl = loader.Loader.local(Counting(600), batch_size=16, shuffle=True, num_workers=args.workers)
    training = TrainingArguments(
        output_dir=args.dir, max_steps=args.max_steps, gradient_accumulation_steps=2,
        learning_rate=1e-2, save_steps=20, logging_steps=10, report_to="none", use_cpu=True, disable_tqdm=True,
    )
    callbacks = [StopAfter(args.stop_after)] if args.stop_after else []
    trainer = LoaderTrainer(model=model, args=training, train_loader=dl, callbacks=callbacks)
    result = trainer.train(resume_from_checkpoint=True if args.resume else None)
    print(f"done: {trainer.state.global_step} steps, loss {result.training_loss:.3f}")


if __name__ == "__main__":
    main()
