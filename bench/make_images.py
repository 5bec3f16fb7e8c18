"""Builds an ImageNet-shaped folder of real photos for the image benchmark:
class folders of JPEGs (quality 90), shorter side 300-500 px, aspect ratio
3:4 to 4:3 either way, each a random crop of one of the colour photos that
scikit-image ships (so the data is made here, with nothing downloaded).

The folder is a pure function of (--files, --classes, --seed): a second run
with the same arguments finds it complete and does nothing."""

import argparse
import sys
from pathlib import Path

import numpy as np
from PIL import Image


def sources():
    """The colour photographs bundled with scikit-image (no download)."""
    import skimage.data as d

    left, right, _ = d.stereo_motorcycle()
    photos = [d.astronaut(), d.chelsea(), d.coffee(), d.hubble_deep_field(),
              d.immunohistochemistry(), d.retina(), d.rocket(), left, right]
    return [Image.fromarray(np.ascontiguousarray(p[..., :3])) for p in photos]


def make(out, files, classes, seed):
    rng = np.random.default_rng(seed)
    photos = sources()
    for i in range(files):
        path = out / f"class{i % classes:03d}" / f"img{i:06d}.jpg"
        # Draw every number even when the file exists, so a partial folder
        # completes to the same bytes as a fresh one.
        src = photos[int(rng.integers(len(photos)))]
        aspect = float(np.exp(rng.uniform(np.log(3 / 4), np.log(4 / 3))))
        short = int(rng.integers(300, 501))
        frac = float(rng.uniform(0.5, 1.0))
        fx, fy, flip = float(rng.random()), float(rng.random()), bool(rng.random() < 0.5)
        if path.exists():
            continue
        w, h = src.size
        # Largest box of this aspect inside the photo, scaled by frac.
        bw = min(w, h * aspect) * frac
        bh = bw / aspect
        x0, y0 = fx * (w - bw), fy * (h - bh)
        if aspect >= 1:
            size = (round(short * aspect), short)
        else:
            size = (short, round(short / aspect))
        img = src.resize(size, Image.BICUBIC, box=(x0, y0, x0 + bw, y0 + bh))
        if flip:
            img = img.transpose(Image.FLIP_LEFT_RIGHT)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        img.save(tmp, "JPEG", quality=90)
        tmp.rename(path)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "data" / "imagenet-shaped")
    p.add_argument("--files", type=int, default=2560)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    make(a.out, a.files, a.classes, a.seed)
    print(a.out)
    sys.stdout.flush()


if __name__ == "__main__":
    main()
