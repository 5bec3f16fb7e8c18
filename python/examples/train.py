"""A small training loop on Loader, on the CPU: the DataLoader loop you know,
with exact resumption.

    pip install ./python torch
    python python/examples/train.py --epochs 3 --workers 2
    python python/examples/train.py --resume   # after an interruption: continue exactly

With ``--resume``, the job (and its number of epochs) comes from the checkpoint.

The dataset is Loader's generated ``synthetic`` one: sample ``i`` is a
3x16x16 uint8 image of brightness ``i % 251`` (its first bytes spell ``i``)
and a ``label`` ``i``. The model learns the image's brightness decile: enough
to watch the loss fall.
"""

import argparse
import os
import time

import torch
from torch import nn

import loader


def job(epochs: int) -> dict:
    return {
        "dataset": {"synthetic": {"num_samples": 20_000, "shape": [3, 16, 16], "dtype": "uint8"}},
        "batch_size": 128,
        "epochs": epochs,
        "sampler": {"shuffle": True, "seed": 0},
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--checkpoint", default="/tmp/loader-train-ckpt.pt")
    p.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    args = p.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 16 * 16, 256), nn.ReLU(), nn.Linear(256, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    data = loader.Loader.local(job(args.epochs), workers=args.workers)

    if args.resume and os.path.exists(args.checkpoint):
        ckpt = torch.load(args.checkpoint)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["optimizer"])
        data.load_state_dict(ckpt["loader"])  # exactly after the last batch trained on
        print(f"resumed at epoch {data.epoch}")

    with data:
        for epoch in range(data.epoch, data.epochs):
            data.set_epoch(epoch)
            start, seen, total_loss = time.monotonic(), 0, 0.0
            for step, batch in enumerate(data):
                t = batch.torch()  # zero-copy views of the shared-memory slot
                x = t["data"].float().div_(255.0)  # .float() copies: the slot is free once `t` goes
                y = (t["label"] % 251) * 10 // 251  # brightness decile
                del t, batch
                loss = nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                seen += len(y)
                total_loss += loss.item() * len(y)
                if step % 50 == 0:
                    torch.save(
                        {"model": model.state_dict(), "optimizer": opt.state_dict(),
                         "loader": data.state_dict()},
                        args.checkpoint,
                    )
            rate = seen / (time.monotonic() - start)
            print(f"epoch {epoch}: loss {total_loss / max(seen, 1):.3f}, {rate:,.0f} samples/s")


if __name__ == "__main__":
    main()
