"""The anchors of bench/storage.py: LitData and Mosaic Streaming reading the
same bytes from the same store, each in its own format made with its own
tool, through torch's DataLoader as their docs show. Run by storage.py in a
virtualenv that has them (their pins clash with the test venv's:
mosaicml-streaming wants numpy < 2.2 and transformers < 5).

    python storage_anchor.py convert {litdata,mosaic} {images,tokens} SRC OUT
    python storage_anchor.py read {litdata,mosaic} {images,tokens} URL CACHE EPOCHS WORKERS

`read` prints one JSON line: samples/s of each epoch. Images: decode +
RandomResizedCrop(224) + horizontal flip with torchvision on PIL, uint8 CHW
(what `loaderctl run --dataset imagefolder` makes); tokens: windows of
2,049 uint16 ids.
"""

from __future__ import annotations

import io
import json
import os
import sys
import time
from pathlib import Path

CONTEXT = 2048
BATCH = 64


def image_items(root: Path) -> list[tuple[str, int]]:
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    return [(str(p), c) for c, name in enumerate(classes) for p in sorted((root / name).rglob("*")) if p.is_file()]


def token_windows(path: Path) -> int:
    return (path.stat().st_size // 2 - 1) // CONTEXT


def read_window(path: str, i: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(i * CONTEXT * 2)
        return f.read((CONTEXT + 1) * 2)


def litdata_image(item):
    path, label = item
    with open(path, "rb") as f:
        return {"image": f.read(), "label": label}


def litdata_tokens(args):
    import numpy as np
    import torch

    path, start, end = args
    for i in range(start, end):
        yield torch.from_numpy(np.frombuffer(read_window(path, i), dtype=np.uint16).astype(np.int32))


def convert(lib: str, kind: str, src: Path, out: Path) -> None:
    if lib == "litdata":
        import litdata as ld

        if kind == "images":
            ld.optimize(fn=litdata_image, inputs=image_items(src), output_dir=str(out), chunk_bytes="64MB", num_workers=2)
        else:
            n = token_windows(src)
            step = max(1, n // 8)
            inputs = [(str(src), s, min(n, s + step)) for s in range(0, n, step)]
            ld.optimize(fn=litdata_tokens, inputs=inputs, output_dir=str(out), chunk_size=(CONTEXT + 1) * 1024,
                        item_loader=ld.TokensLoader(), num_workers=2)
    else:
        from streaming import MDSWriter

        if kind == "images":
            with MDSWriter(out=str(out), columns={"image": "bytes", "label": "int"}, size_limit="64mb") as w:
                for path, label in image_items(src):
                    with open(path, "rb") as f:
                        w.write({"image": f.read(), "label": label})
        else:
            with MDSWriter(out=str(out), columns={"tokens": "bytes"}, size_limit="64mb") as w:
                for i in range(token_windows(src)):
                    w.write({"tokens": read_window(str(src), i)})


def image_transform():
    from torchvision import transforms

    return transforms.Compose([
        transforms.RandomResizedCrop(224),
        transforms.RandomHorizontalFlip(),
        transforms.PILToTensor(),
    ])


def read(lib: str, kind: str, url: str, cache: str, epochs: int, workers: int) -> None:
    import numpy as np
    import torch
    from PIL import Image

    transform = image_transform()

    def image(raw: bytes):
        return transform(Image.open(io.BytesIO(raw)).convert("RGB"))

    if lib == "litdata":
        import litdata as ld
        import litdata.streaming.downloader as downloader

        # The store here speaks plain HTTP (a loopback relay); LitData's
        # object-store client options leave `allow_http` off, which only
        # its options can turn on. The same setting a user with an http://
        # MinIO would need; nothing else of LitData changes.
        downloader._OBSTORE_CLIENT_OPTIONS = {**downloader._OBSTORE_CLIENT_OPTIONS, "allow_http": True}

        if kind == "images":
            class Images(ld.StreamingDataset):
                def __getitem__(self, i):
                    d = super().__getitem__(i)
                    return image(d["image"]), d["label"]

            ds = Images(url, shuffle=True, cache_dir=cache)
        else:
            ds = ld.StreamingDataset(url, item_loader=ld.TokensLoader(block_size=CONTEXT + 1), shuffle=True, cache_dir=cache)
        loader = ld.StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers)
    else:
        from streaming import StreamingDataset
        from streaming.base.util import clean_stale_shared_memory

        # A previous run's shared memory (its workers are gone) would be
        # taken for this run's.
        clean_stale_shared_memory()

        class Mds(StreamingDataset):
            def __getitem__(self, i):
                d = super().__getitem__(i)
                if kind == "images":
                    return image(d["image"]), d["label"]
                return torch.from_numpy(np.frombuffer(d["tokens"], dtype=np.uint16).astype(np.int32))

        ds = Mds(remote=url, local=cache, shuffle=True, batch_size=BATCH)
        # Mosaic made its S3 client here, to fetch index.json, and keeps it
        # with its open connection. DataLoader's workers are forked, so both
        # would inherit that one socket and send their requests down it,
        # each reading the other's responses: a run here wrote shard 4's
        # first 8 MB into shard 3's file (then `IndexError` decoding a
        # sample, or "Relative sample index ... is not present"). Under the
        # spawn start method Mosaic drops the client as the dataset is
        # pickled (`S3Downloader.__getstate__`); drop it the same way here,
        # so that each worker makes its own.
        for stream in ds.streams:
            stream._downloader.clean_up()
        loader = torch.utils.data.DataLoader(ds, batch_size=BATCH, num_workers=workers)
    rates = []
    for _ in range(epochs):
        start, n = time.perf_counter(), 0
        for batch in loader:
            n += len(batch[0]) if isinstance(batch, (list, tuple)) else len(batch)
        rates.append(n / (time.perf_counter() - start))
    print(json.dumps({"epochs_samples_per_s": rates}), flush=True)


if __name__ == "__main__":
    cmd, lib, kind = sys.argv[1:4]
    if cmd == "convert":
        convert(lib, kind, Path(sys.argv[4]), Path(sys.argv[5]))
    else:
        read(lib, kind, sys.argv[4], sys.argv[5], int(sys.argv[6]), int(sys.argv[7]))
    # Mosaic's and LitData's worker pools may linger; the numbers are out.
    sys.stdout.flush()
    os._exit(0)
