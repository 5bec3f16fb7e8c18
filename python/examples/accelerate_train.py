"""accelerate on Loader: gradient accumulation that steps at each epoch's
end, and ``save_state``/``load_state`` that bring the loader back to the
batch it stood at (``loader.integrations.accelerate``, docs/frameworks.md).

    python python/examples/accelerate_train.py                  # 3 epochs, state saved every 10 optimizer steps
    python python/examples/accelerate_train.py --stop-after 40  # "crash" after batch 40
    python python/examples/accelerate_train.py --resume         # continue, batch for batch

(``accelerate launch`` works too.) The data: sample ``i`` is a point ``x``
in R^8 drawn from seed ``i``, its target ``x . w`` for a fixed ``w``: a
linear regression whose loss falls to ~0.
"""

import argparse
import os

import numpy as np
import torch
from accelerate import Accelerator

import loader
from loader.integrations.accelerate import prepare

W = np.linspace(-1, 1, 8).astype(np.float32)


class Regression:
    """A map-style dataset; its samples are made in Loader's workers."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        x = np.random.default_rng(i).standard_normal(8).astype(np.float32)
        return {"x": x, "y": np.float32(x @ W)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--accumulate", type=int, default=4)
    p.add_argument("--dir", default="/tmp/loader-accelerate")
    p.add_argument("--stop-after", type=int, default=None, help="end after this many batches (to try --resume)")
    p.add_argument("--resume", action="store_true", help="continue from DIR")
    args = p.parse_args()

    accelerator = Accelerator(gradient_accumulation_steps=args.accumulate)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    model, optimizer = accelerator.prepare(model, optimizer)
    # 3000 samples in batches of 64: 47 batches a pass, not a multiple of
    # --accumulate, so each epoch ends on a short accumulation window.
    dl = prepare(accelerator, loader.Loader.local(Regression(3000), batch_size=64, shuffle=True, num_workers=args.workers))
    if args.resume and os.path.isdir(args.dir):
        accelerator.load_state(args.dir)  # the model, the optimizer and the loader's position
        accelerator.print(f"resumed at epoch {dl.loader.epoch}, batch {dl.loader._yielded % len(dl)}")

    batches = steps_taken = 0
    # After load_state the loader's next pass is the rest of the saved one.
    for epoch in range(dl.loader.epoch, args.epochs):
        total, steps = 0.0, 0
        for batch in dl:
            with accelerator.accumulate(model):
                loss = torch.nn.functional.mse_loss(model(batch["x"]).squeeze(1), batch["y"])
                accelerator.backward(loss)
                optimizer.step()
                optimizer.zero_grad()
            total, steps, batches = total + loss.item(), steps + 1, batches + 1
            if accelerator.sync_gradients:
                # Saved after an optimizer step: no gradient is half accumulated.
                steps_taken += 1
                if steps_taken % 10 == 0:
                    accelerator.save_state(args.dir)
            if args.stop_after and batches >= args.stop_after:
                raise SystemExit(f"stopped after {batches} batches; rerun with --resume")
        accelerator.print(f"epoch {epoch}: mean loss {total / max(steps, 1):.4f} over {steps} batches")
    accelerator.save_state(args.dir)


if __name__ == "__main__":
    main()
