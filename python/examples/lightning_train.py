"""Lightning on Loader: a LightningModule whose dataloaders are
``loader.Loader.local``, checkpointed mid-epoch and resumed exactly. Nothing
Lightning-specific is needed: Lightning saves a train loader's
``state_dict()`` in its checkpoints and calls ``sampler.set_epoch`` itself
(docs/frameworks.md).

    python python/examples/lightning_train.py                 # 3 epochs, a checkpoint every 20 steps
    python python/examples/lightning_train.py --stop-after 30 # "crash" after step 30
    python python/examples/lightning_train.py --resume        # continue from last.ckpt, batch for batch

The data: sample ``i`` is a point ``x`` in R^4 drawn from seed ``i`` and its
label ``sum(x) > 0``; a linear model learns it in a few hundred steps.
"""

import argparse

import lightning.pytorch as L
import numpy as np
import torch

import loader


class Points:
    """A map-style dataset; its samples are made in Loader's workers."""

    def __init__(self, n: int, offset: int = 0) -> None:
        self.n, self.offset = n, offset

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        x = np.random.default_rng(self.offset + i).standard_normal(4).astype(np.float32)
        return {"x": x, "y": np.float32(x.sum() > 0)}


class Classifier(L.LightningModule):
    def __init__(self, workers: int) -> None:
        super().__init__()
        self.workers = workers
        self.net = torch.nn.Linear(4, 1)

    def train_dataloader(self):
        return loader.Loader.local(Points(2048), batch_size=64, shuffle=True, num_workers=self.workers)

    def val_dataloader(self):
        return loader.Loader.local(Points(1024, offset=10**6), batch_size=256, num_workers=1)

    def training_step(self, batch, batch_idx):
        loss = torch.nn.functional.binary_cross_entropy_with_logits(self.net(batch["x"]).squeeze(1), batch["y"])
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        correct = ((self.net(batch["x"]).squeeze(1) > 0).float() == batch["y"]).float().mean()
        self.log("val_acc", correct, prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.5)


class StopAfter(L.Callback):
    """Ends training after a step, as a preempted job would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        if trainer.global_step >= self.step:
            raise SystemExit(f"stopped after step {trainer.global_step}; rerun with --resume")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--dir", default="/tmp/loader-lightning")
    p.add_argument("--stop-after", type=int, default=None, help="end after this step (to try --resume)")
    p.add_argument("--resume", action="store_true", help="continue from DIR/last.ckpt")
    args = p.parse_args()

    every = L.callbacks.ModelCheckpoint(dirpath=args.dir, every_n_train_steps=20, save_last=True, save_top_k=-1)
    callbacks = [every] + ([StopAfter(args.stop_after)] if args.stop_after else [])
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=args.epochs, callbacks=callbacks, logger=False,
        enable_model_summary=False, num_sanity_val_steps=2,
    )
    trainer.fit(Classifier(args.workers), ckpt_path="last" if args.resume else None)
    print(f"done: {trainer.global_step} steps, val_acc {float(trainer.callback_metrics['val_acc']):.3f}")


if __name__ == "__main__":
    main()
