"""torchvision's ImageFolder run in Loader's image pipeline
(``Loader.local(..., native_transforms=True)``, ``loader._native_transforms``):
the same samples, labels and tensors as torchvision gives, pixels within a
measured error of PIL's, torchvision's random draws, and a one-line refusal
naming whatever keeps a dataset in Python.

The images are made here: photo-like content (smooth fields, sharp-edged
shapes, fine noise) at many sizes and aspect ratios, as RGB, greyscale and
CMYK JPEGs and as PNGs."""

from __future__ import annotations

import logging
import math
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")
from PIL import Image, ImageDraw  # noqa: E402
from torchvision import datasets  # noqa: E402
from torchvision import transforms as T  # noqa: E402
from torchvision.transforms import functional as F  # noqa: E402
from torchvision.transforms import v2 as V  # noqa: E402

import loader  # noqa: E402
from loader import _native, _native_transforms  # noqa: E402

MEAN = [0.485, 0.456, 0.406]
STD = [0.229, 0.224, 0.225]

#: (width, height) of the images: landscape, portrait, square, smaller than
#: the crop, large enough for DCT-scaled decoding, extreme aspect ratios.
SIZES = [
    (500, 375), (375, 500), (640, 480), (300, 300), (1024, 683), (683, 1024),
    (180, 240), (240, 180), (1600, 1200), (900, 300), (300, 900), (257, 256),
    (2048, 1365), (120, 90), (800, 533), (448, 448),
]
#: Images per size and kind: 16 sizes x (RGB + greyscale + CMYK + PNG) x 4.
PER_SIZE = 4


def photo(rng: np.random.Generator, w: int, h: int) -> Image.Image:
    """Photo-like content: a smooth colour field (a few control points
    upsampled bicubically), shapes with sharp edges, and fine noise."""
    cw, ch = int(rng.integers(3, 9)), int(rng.integers(3, 9))
    field = Image.fromarray(rng.integers(0, 256, size=(ch, cw, 3), dtype=np.uint8)).resize((w, h), Image.BICUBIC)
    draw = ImageDraw.Draw(field)
    for _ in range(int(rng.integers(2, 7))):
        x0, y0 = int(rng.integers(0, w)), int(rng.integers(0, h))
        x1, y1 = x0 + int(rng.integers(w // 10 + 1, w // 2 + 2)), y0 + int(rng.integers(h // 10 + 1, h // 2 + 2))
        colour = tuple(int(c) for c in rng.integers(0, 256, size=3))
        (draw.ellipse if rng.random() < 0.5 else draw.rectangle)((x0, y0, x1, y1), fill=colour)
    pixels = np.asarray(field).astype(np.int16) + rng.integers(-6, 7, size=(h, w, 3), dtype=np.int16)
    return Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8))


@pytest.fixture(scope="module")
def photos(tmp_path_factory) -> str:
    """Three class folders of JPEGs (RGB, greyscale, CMYK) and PNGs."""
    root = tmp_path_factory.mktemp("photos")
    rng = np.random.default_rng(54)
    n = 0
    for w, h in SIZES:
        for _ in range(PER_SIZE):
            for kind in ("rgb", "grey", "cmyk", "png"):
                image = photo(rng, w, h)
                folder = root / f"class{n % 3}"
                folder.mkdir(exist_ok=True)
                if kind == "png":
                    image.save(folder / f"{n:04d}.png")
                else:
                    image = image.convert({"rgb": "RGB", "grey": "L", "cmyk": "CMYK"}[kind])
                    image.save(folder / f"{n:04d}.jpg", quality=90)
                n += 1
    return str(root)


def native_all(dataset, batch_size: int = 32, **kwargs) -> tuple:
    """Every sample of ``dataset`` in order through the native pipeline."""
    images, labels = [], []
    with loader.Loader.local(dataset, batch_size, False, num_workers=2, native_transforms=True, **kwargs) as dl:
        for x, y in dl:
            images.append(x.clone())
            labels.append(y.clone())
    return torch.cat(images), torch.cat(labels)


def in_uint8_units(x: "torch.Tensor", normalized: bool, scaled: bool) -> "torch.Tensor":
    """Back to 0..255 pixel values, so errors read in uint8 steps."""
    x = x.double()
    if normalized:
        x = x * torch.tensor(STD, dtype=torch.float64).view(3, 1, 1) + torch.tensor(MEAN, dtype=torch.float64).view(3, 1, 1)
    return x * 255 if scaled else x


def errors(got: "torch.Tensor", want: "torch.Tensor") -> tuple[float, float]:
    """(mean absolute error, PSNR in dB) of one image in uint8 units."""
    diff = got - want
    mse = float((diff**2).mean())
    return float(diff.abs().mean()), math.inf if mse == 0 else 10 * math.log10(255**2 / mse)


def assert_close_to_torchvision(dataset, normalized: bool, scaled: bool) -> None:
    got, labels = native_all(dataset)
    assert len(got) == len(dataset)
    worst = []
    for i in range(len(dataset)):
        want, label = dataset[i]
        assert int(labels[i]) == label, f"sample {i}: label {int(labels[i])}, torchvision {label}"
        assert got[i].dtype == torch.as_tensor(want).dtype and got[i].shape == want.shape, f"sample {i}"
        mae, psnr = errors(in_uint8_units(got[i], normalized, scaled), in_uint8_units(torch.as_tensor(want), normalized, scaled))
        worst.append((mae, psnr, dataset.samples[i][0]))
    bad = [w for w in worst if w[0] > 1.0 or w[1] < 38.0]
    print(f"max MAE {max(w[0] for w in worst):.3f}, min PSNR {min(w[1] for w in worst):.1f} dB over {len(worst)} images")
    assert not bad, f"{len(bad)} images beyond MAE 1.0 / PSNR 38 dB, e.g. {bad[:3]}"


EVAL_V1 = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)])


@pytest.mark.parametrize(
    "transform, normalized, scaled",
    [
        pytest.param(EVAL_V1, True, True, id="v1-eval"),
        pytest.param(T.Compose([T.Resize((160, 200)), T.ToTensor()]), False, True, id="v1-resize-tuple"),
        pytest.param(
            T.Compose([T.Resize(256, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(224), T.PILToTensor()]),
            False, False, id="v1-bicubic-uint8",
        ),
        pytest.param(
            V.Compose([V.Resize(256), V.CenterCrop((224, 192)), V.ToImage(), V.ToDtype(torch.float32, scale=True), V.Normalize(MEAN, STD)]),
            True, True, id="v2-eval",
        ),
    ],
)
def test_deterministic_transforms_match_torchvision(photos, transform, normalized, scaled):
    assert_close_to_torchvision(datasets.ImageFolder(photos, transform=transform), normalized, scaled)


def test_classes_targets_and_edited_samples_come_from_the_dataset(photos):
    """A subclass that edits ``samples`` (drops some, relabels) is read as
    edited: the manifest is the dataset's own list."""

    class Relabelled(datasets.ImageFolder):
        def __init__(self, root, transform):
            super().__init__(root, transform=transform)
            self.samples = [(p, 2 - t) for p, t in self.samples[::3]]
            self.targets = [t for _, t in self.samples]

    ds = Relabelled(photos, transform=T.Compose([T.Resize((64, 64)), T.PILToTensor()]))
    got, labels = native_all(ds)
    assert labels.tolist() == ds.targets
    assert got.dtype == torch.uint8 and tuple(got.shape[1:]) == (3, 64, 64)


def draws(dataset, index: int, seed: int, epoch: int = 0) -> tuple:
    """The native pipeline's random draws for a sample (the test hook):
    the RandomResizedCrop box and the flip, for transforms [RRC, flip, ...]
    (native steps 1 and 2, after decode)."""
    rrc, flip = dataset.transform.transforms[0], dataset.transform.transforms[1]
    w, h = Image.open(dataset.samples[index][0]).size
    box = _native.random_resized_crop_box(w, h, list(rrc.scale), list(rrc.ratio), seed, epoch, index, 1)
    return box, _native.flip_drawn(float(flip.p), seed, epoch, index, 2)


def test_random_transforms_equal_torchvision_at_the_same_draws(photos):
    """With the parameters forced to the native draws, torchvision's
    deterministic functions give the native pixels."""
    ds = datasets.ImageFolder(
        photos, transform=T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    )
    seed = 7
    got, _ = native_all(ds, seed=seed)
    flips = 0
    for i in range(len(ds)):
        (left, top, w, h), flip = draws(ds, i, seed)
        image = ds.loader(ds.samples[i][0])
        want = F.resized_crop(image, top, left, h, w, [224, 224], antialias=True)
        if flip:
            want = F.hflip(want)
            flips += 1
        want = F.normalize(F.to_tensor(want), MEAN, STD)
        mae, psnr = errors(in_uint8_units(got[i], True, True), in_uint8_units(want, True, True))
        assert mae <= 1.0 and psnr >= 38.0, f"{ds.samples[i][0]}: MAE {mae:.3f}, PSNR {psnr:.1f} dB at box {(left, top, w, h)}"
    assert 0 < flips < len(ds)


def ks_statistic(a: np.ndarray, b: np.ndarray) -> float:
    """Two-sample Kolmogorov-Smirnov statistic."""
    values = np.sort(np.concatenate([a, b]))
    fa = np.searchsorted(np.sort(a), values, side="right") / len(a)
    fb = np.searchsorted(np.sort(b), values, side="right") / len(b)
    return float(np.abs(fa - fb).max())


@pytest.mark.parametrize("size, scale, ratio", [((500, 375), (0.08, 1.0), (3 / 4, 4 / 3)), ((300, 900), (0.3, 0.9), (0.5, 2.0))])
def test_random_resized_crop_draws_boxes_as_torchvision_does(size, scale, ratio):
    """Area fraction and aspect ratio of the native boxes against
    torchvision's ``get_params``, 4,000 each: a two-sample
    Kolmogorov-Smirnov test at the 0.1% level, and the same share of
    centre-crop fallbacks."""
    w, h = size
    n = 4000
    native = np.array([_native.random_resized_crop_box(w, h, list(scale), list(ratio), 3, 0, i, 1) for i in range(n)])
    torch.manual_seed(3)
    image = Image.new("RGB", (w, h))
    tv = np.array([T.RandomResizedCrop.get_params(image, list(scale), list(ratio)) for _ in range(n)])
    # get_params gives (top, left, h, w); the native box is (left, top, w, h).
    tv = tv[:, [1, 0, 3, 2]]
    critical = 1.95 * math.sqrt(2 / n)  # c(0.001) * sqrt((n + m) / (n m))
    for name, of in (("area", lambda b: b[:, 2] * b[:, 3] / (w * h)), ("aspect", lambda b: np.log(b[:, 2] / b[:, 3]))):
        d = ks_statistic(of(native), of(tv))
        assert d < critical, f"{name}: KS statistic {d:.4f} >= {critical:.4f}"
    for name, col, side in (("left", 0, 2), ("top", 1, 3)):
        # Position within the room the box leaves: uniform in both.
        room = np.array([w, h])[col] - native[:, side]
        free = room > 0
        rel_native = native[free, col] / room[free]
        room_tv = np.array([w, h])[col] - tv[:, side]
        rel_tv = tv[room_tv > 0, col] / room_tv[room_tv > 0]
        d = ks_statistic(rel_native, rel_tv)
        assert d < critical * 1.5, f"{name}: KS statistic {d:.4f}"


# -- Refusals and the hint ------------------------------------------------------


class MyResize(T.Resize):
    pass


def constant_loader(path):
    return Image.new("RGB", (8, 8))


REFUSALS = [
    (T.Compose([T.RandomResizedCrop(224), T.ColorJitter(0.4), T.ToTensor()]), "transform.transforms[1]: torchvision.transforms.transforms.ColorJitter has no native equivalent"),
    (T.Compose([T.Resize(256, max_size=300), T.CenterCrop(224), T.ToTensor()]), "transform.transforms[0]: Resize(max_size=300)"),
    (T.Compose([T.Resize(256, interpolation=T.InterpolationMode.NEAREST), T.CenterCrop(224), T.ToTensor()]), "Resize(interpolation=nearest): only bilinear and bicubic"),
    (T.Compose([T.RandomResizedCrop(224, interpolation=T.InterpolationMode.LANCZOS), T.ToTensor()]), "RandomResizedCrop(interpolation=lanczos)"),
    (T.Compose([T.ToTensor(), T.Resize(256), T.CenterCrop(224)]), "transform.transforms[1]: Resize after the image became a tensor"),
    (T.Compose([T.Resize(256), T.Normalize(MEAN, STD), T.ToTensor()]), "transform.transforms[1]: Normalize needs a float tensor"),
    (T.Compose([T.Resize(256), T.CenterCrop(224)]), "the transforms end in a PIL image"),
    (T.Compose([T.Resize(256), T.ToTensor()]), "the output size is not fixed"),
    (T.Compose([MyResize((32, 32)), T.ToTensor()]), "MyResize is not torchvision's own Resize"),
    (T.Compose([T.Resize((32, 32)), T.PILToTensor(), T.ConvertImageDtype(torch.float16)]), "ConvertImageDtype(dtype=torch.float16)"),
    (V.Compose([V.Resize((32, 32)), V.ToImage(), V.ToDtype(torch.float64, scale=True)]), "ToDtype(dtype=torch.float64)"),
    (T.Compose([T.Resize((32, 32)), T.Lambda(lambda x: x), T.ToTensor()]), "transform.transforms[1]: torchvision.transforms.transforms.Lambda has no native equivalent"),
    (None, "transform is None"),
]


@pytest.mark.parametrize("transform, says", REFUSALS, ids=[r[1].split(":")[0][:40] for r in REFUSALS])
def test_a_pipeline_that_cannot_run_natively_says_which_step_in_one_line(photos, transform, says):
    ds = datasets.ImageFolder(photos, transform=transform)
    with pytest.raises(ValueError) as e:
        loader.Loader.local(ds, 8, num_workers=1, native_transforms=True)
    message = str(e.value)
    assert message.startswith("native_transforms: ") and says in message, message
    assert "\n" not in message


def test_dataset_settings_that_cannot_run_natively_say_so(photos, tmp_path):
    ok = T.Compose([T.Resize((32, 32)), T.ToTensor()])
    cases = [
        (datasets.ImageFolder(photos, transform=ok, target_transform=lambda t: t + 1), "target_transform is set"),
        (datasets.DatasetFolder(photos, loader=constant_loader, extensions=(".jpg",), transform=ok), "loader is constant_loader"),
        (torch.utils.data.TensorDataset(torch.zeros(4, 3)), "the dataset is a TensorDataset, not torchvision's ImageFolder"),
    ]
    (tmp_path / "a").mkdir()
    Image.new("RGB", (16, 16)).save(tmp_path / "a" / "x.bmp")
    cases.append((datasets.ImageFolder(str(tmp_path), transform=ok), "x.bmp) is not a JPEG or PNG file"))
    for ds, says in cases:
        with pytest.raises(ValueError, match="native_transforms: ") as e:
            loader.Loader.local(ds, 2, num_workers=1, native_transforms=True)
        assert says in str(e.value) and "\n" not in str(e.value), str(e.value)
    for keyword, value in (("collate_fn", lambda b: b), ("worker_init_fn", lambda i: None)):
        with pytest.raises(ValueError, match=f"native_transforms: {keyword} runs on Python samples"):
            loader.Loader.local(datasets.ImageFolder(photos, transform=ok), 2, num_workers=1, native_transforms=True, **{keyword: value})


def test_a_qualifying_dataset_without_the_keyword_is_hinted_once(photos, caplog):
    loader._hinted.clear()
    ds = datasets.ImageFolder(photos, transform=EVAL_V1)
    with caplog.at_level(logging.WARNING, logger="loader"):
        for _ in range(2):
            loader.Loader.local(ds, 8, num_workers=1).close()
        loader.Loader.local(datasets.ImageFolder(photos, transform=T.Compose([T.Resize(256), T.ToTensor()])), 8, num_workers=1).close()
    hints = [r.getMessage() for r in caplog.records if "native_transforms=True" in r.getMessage()]
    assert len(hints) == 1, hints
    assert _native_transforms.EXPECTED_SPEEDUP in hints[0]


def test_epochs_resume_and_cache_work_as_for_a_built_in_image_job(photos):
    """The compiled job is a built-in image job: kept frames (``cache=``)
    give the same pixels, and a saved state resumes where it stopped."""
    ds = datasets.ImageFolder(photos, transform=T.Compose([T.RandomResizedCrop(96), T.RandomHorizontalFlip(), T.PILToTensor()]))

    def epochs(**kwargs):
        out = []
        with loader.Loader.local(ds, 16, True, num_workers=2, native_transforms=True, epochs=2, seed=5, **kwargs) as dl:
            for _ in range(2):
                out.append([(x.clone(), y.clone()) for x, y in dl])
        return out

    plain, cached = epochs(), epochs(cache="256MiB")
    for a, b in zip(plain, cached):
        assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))
    assert not torch.equal(plain[0][0][0], plain[1][0][0]), "a new epoch draws new crops"

    with loader.Loader.local(ds, 16, True, num_workers=2, native_transforms=True, epochs=2, seed=5) as dl:
        it = iter(dl)
        first = [next(it) for _ in range(3)]
        state = dl.state_dict()
    with loader.Loader.local(ds, 16, True, num_workers=1, native_transforms=True, epochs=2, seed=5) as dl:
        dl.load_state_dict(state)
        rest = [(x.clone(), y.clone()) for x, y in dl]
    got = [(x, y) for x, y in first] + rest
    assert len(got) == len(plain[0])
    assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(got, plain[0]))


def test_the_manifest_goes_with_the_loader(photos):
    ds = datasets.ImageFolder(photos, transform=T.Compose([T.Resize((32, 32)), T.PILToTensor()]))
    dl = loader.Loader.local(ds, 64, num_workers=1, native_transforms=True)
    manifest = dl._manifest
    assert manifest is not None and os.path.exists(manifest)
    next(iter(dl))
    dl.close()
    assert not os.path.exists(manifest)


def test_a_corrupt_image_follows_on_corrupt(tmp_path):
    """A file that is not an image fails the job naming it (``"fail"``, the
    default), or is left out and the rest delivered (``"skip"``)."""
    rng = np.random.default_rng(1)
    for c in range(2):
        (tmp_path / f"c{c}").mkdir()
        for k in range(6):
            photo(rng, 96, 80).save(tmp_path / f"c{c}" / f"{k}.jpg", quality=90)
    (tmp_path / "c1" / "3.jpg").write_bytes(b"\xff\xd8\xff\xe0 not really a JPEG")
    ds = datasets.ImageFolder(str(tmp_path), transform=T.Compose([T.Resize((32, 32)), T.PILToTensor()]))
    with loader.Loader.local(ds, 4, num_workers=1, native_transforms=True) as dl:
        with pytest.raises(loader.LoaderError, match="3.jpg"):
            list(dl)
    with loader.Loader.local(ds, 4, num_workers=1, native_transforms=True, on_corrupt="skip") as dl:
        labels = [int(v) for _, y in dl for v in y]
    assert sorted(labels) == [0] * 6 + [1] * 5
