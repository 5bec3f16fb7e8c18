"""torchvision's ``ImageFolder`` with its transforms, run in Loader's image
pipeline (``Loader.local(..., native_transforms=True)``).

Most vision code reads images as ``ImageFolder(root, transform=Compose([...]))``.
Through ``Loader.local`` such a dataset runs in Python like any other:
PIL's decode and resize per sample, DataLoader's speed. Loader's own
pipeline (libjpeg-turbo decoding only the region a crop keeps, at the
smallest DCT scale it needs, and a SIMD resize) makes the same samples
several times faster, but asks for a job spec. This module reads the
dataset object instead: when it is torchvision's ``DatasetFolder`` (or
``ImageFolder``) with the default loader, no ``target_transform``, and a
``Compose`` (v1 or v2) made only of steps the native pipeline runs, it
writes the job spec of the same samples: the dataset's own ``samples``
list as a manifest (so ``class_to_idx`` and a subclass that edits
``samples`` are respected) and the transforms as native steps, with the
same output: dtype, layout, value range and label.

The pixels are not bit-identical to PIL's (another resampler, DCT-scaled
decoding; docs/images.md has the measured differences), so it is opt-in.
``describe`` says in one line why a dataset does not qualify, naming the
transform and the argument; ``Loader.local`` raises it as the error of
``native_transforms=True`` and says once in the log when a dataset would
qualify but the keyword is off.

A deployment's job asks for the same with ``native_transforms: true`` in
its own ``python`` entry (``compile_job``): the trainer builds the
factory's dataset once, and the job it submits is the compiled
``image_folder`` one. Its manifest travels with the job as a blob
(``loader_proto::blob::IMAGE_FOLDER_MANIFEST``), so a worker on another host
needs only the images, at the same path.

Only the parts torchvision defines are read: the transform objects'
attributes as their constructors store them (``size``, ``scale``,
``ratio``, ``interpolation``, ``p``, ``mean``, ``std``, ``dtype``,
``scale``), and a transform is recognized by its exact class, so a
subclass (which may override ``forward``) keeps the Python path.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional, Sequence

#: Extensions of the files the native decoder reads (JPEG, PNG); the other
#: formats ImageFolder lists (.bmp, .webp, ...) keep the Python path.
NATIVE_EXTENSIONS = (".jpg", ".jpeg", ".png")

#: The speed-up the hint quotes: torchvision's train and eval transforms,
#: 2 workers, epoch 1 to 3 epochs, against the same loader's Python path
#: (docs/benchmarks.md, bench/torchvision_native.py).
EXPECTED_SPEEDUP = "2.3-2.7x"


class NotNative(Exception):
    """Why a dataset's pipeline cannot run natively, in one line."""


@dataclass
class Compiled:
    """A qualifying dataset as a native job: its image_folder entry (root
    and the manifest to write) and its transforms."""

    root: str
    lines: list[str]
    transforms: list[Any]
    manifest: Optional[str] = field(default=None)

    def write_manifest(self) -> str:
        """Writes the manifest (``path<TAB>label`` per sample, in the
        dataset's order) into the blob directory under the hash of its
        bytes (``_dataset.write_blob``: the caller releases it), so a state
        saved with this job finds the same file in a later loader."""
        from . import _dataset

        text = "\n".join(self.lines) + "\n"
        self.manifest = _dataset.write_blob(text.encode("utf-8", "surrogateescape"))
        return self.manifest

    def dataset_entry(self) -> dict:
        if self.manifest is None:
            raise RuntimeError("write_manifest() first")
        return {"image_folder": {"path": self.root, "manifest": self.manifest}}


def _folder_module() -> Any:
    # Never imports torchvision: a dataset can only be one of its classes
    # when it is already imported.
    return sys.modules.get("torchvision.datasets.folder")


def is_image_folder(dataset: Any) -> bool:
    """True for torchvision's ``DatasetFolder`` (``ImageFolder``) and its
    subclasses."""
    folder = _folder_module()
    return folder is not None and isinstance(dataset, folder.DatasetFolder)


def compile_dataset(dataset: Any) -> Compiled:
    """The native job of ``dataset``, or ``NotNative`` saying in one line
    what keeps it in Python."""
    transforms = _checked(dataset)
    given = os.fspath(dataset.root)
    root = os.path.abspath(given)
    return Compiled(root=root, lines=_manifest_lines(dataset.samples, (root, given)), transforms=transforms)


#: Keys of a ``python`` entry besides ``factory``, ``args`` and
#: ``num_samples``: each a way of running Python on samples or of giving
#: the dataset pickled, which a compiled job has no place for.
_PYTHON_ONLY_KEYS = ("pickle", "pickle_file", "collate", "collate_pickle", "collate_pickle_file",
                     "worker_init_pickle_file", "shard_samples")


def asks(job: Any) -> bool:
    """True for a dict job spec whose own ``python`` entry says
    ``native_transforms: true``."""
    python = _python_entry(job)
    return python is not None and python.get("native_transforms") is True


def compile_job(job: Any) -> tuple[Any, Optional[Compiled]]:
    """A dict job spec as it is submitted, and what was compiled for it.

    Its own ``python`` entry with ``native_transforms: true``: the
    factory's dataset, built here once (called with ``args``), compiled;
    its manifest written (``Compiled.write_manifest``: the caller releases
    it); the entry replaced by the ``image_folder`` one and the job's
    ``transforms`` by the dataset's, every other key of the job kept. A
    dataset that does not qualify raises ``ValueError`` in one line,
    ``native_transforms: <why>``. With ``native_transforms: false`` the key
    is dropped and the entry runs in Python. Anything else comes back as
    it was (the Rust parser refuses ``native_transforms`` where this does
    not look: a spec file, a mixture's source)."""
    python = _python_entry(job)
    if python is None or "native_transforms" not in python:
        return job, None
    python = dict(python)
    native = python.pop("native_transforms")
    if not isinstance(native, bool):
        raise ValueError(f"dataset.python.native_transforms: must be true or false, not {native!r}")
    if not native:
        return {**job, "dataset": {"python": python}}, None
    if "factory" not in python:
        raise ValueError(
            "native_transforms: needs the entry's factory (package.module:function making the ImageFolder); "
            "a pickled dataset goes through Loader.local(dataset, native_transforms=True)"
        )
    for key in _PYTHON_ONLY_KEYS:
        if key in python:
            raise ValueError(f"native_transforms: dataset.python.{key} runs in Python; leave it out or native_transforms off")
    if "transforms" in job:
        raise ValueError("native_transforms: the job's transforms are the dataset's own; leave \"transforms\" out")
    from ._source import make_from_factory

    dataset = make_from_factory(python["factory"], python.get("args") or {})
    try:
        compiled = compile_dataset(dataset)
    except NotNative as e:
        raise ValueError(f"native_transforms: {e}") from None
    given = python.get("num_samples")
    if given is not None and given != len(compiled.lines):
        raise ValueError(
            f"native_transforms: dataset.python.num_samples is {given}, the factory's dataset holds "
            f"{len(compiled.lines)} samples; leave num_samples out"
        )
    compiled.write_manifest()
    native_job = {k: v for k, v in job.items() if k != "dataset"}
    native_job["dataset"] = compiled.dataset_entry()
    native_job["transforms"] = compiled.transforms
    return native_job, compiled


def _python_entry(job: Any) -> Optional[Mapping]:
    dataset = job.get("dataset") if isinstance(job, Mapping) else None
    python = dataset.get("python") if isinstance(dataset, Mapping) else None
    return python if isinstance(python, Mapping) else None


def describe(dataset: Any) -> Optional[str]:
    """None when ``dataset`` qualifies, else the one-line reason: the
    checks of ``compile_dataset`` without writing the manifest's lines
    (a tenth of a second for ImageNet's 1.28 M samples, not one)."""
    try:
        _checked(dataset)
        _manifest_lines(dataset.samples, None)
    except NotNative as e:
        return str(e)
    return None


def _checked(dataset: Any) -> list[Any]:
    """The native steps of ``dataset``'s transform, after the checks of the
    dataset itself (its class, loader, target_transform)."""
    folder = _folder_module()
    if folder is None or not isinstance(dataset, folder.DatasetFolder):
        raise NotNative(f"the dataset is a {type(dataset).__name__}, not torchvision's ImageFolder or DatasetFolder")
    loader = getattr(dataset, "loader", None)
    if loader not in (folder.default_loader, folder.pil_loader):
        raise NotNative(
            f"the dataset's loader is {getattr(loader, '__name__', type(loader).__name__)}, "
            "not torchvision's default_loader (PIL, converted to RGB)"
        )
    if getattr(dataset, "target_transform", None) is not None:
        raise NotNative("target_transform is set: it runs in Python (leave it out, map labels after loading)")
    return _steps(getattr(dataset, "transform", None))


def _manifest_lines(samples: Sequence[Any], roots: Optional[tuple[str, str]]) -> list[str]:
    """The manifest's lines of ``samples`` (paths relative to the root when
    under it, as given or absolute); with ``roots`` None, only the checks."""
    lines: list[str] = []
    prefixes = () if roots is None else tuple({r.rstrip(os.sep) + os.sep for r in roots})
    for i, sample in enumerate(samples):
        try:
            path, label = sample
        except (TypeError, ValueError):
            raise NotNative(f"samples[{i}] is not a (path, class_index) pair") from None
        if isinstance(label, bool) or not isinstance(label, int):
            raise NotNative(f"samples[{i}]: the class index {label!r} is not an int")
        path = os.fspath(path)
        if not path.lower().endswith(NATIVE_EXTENSIONS):
            raise NotNative(
                f"samples[{i}] ({path}) is not a JPEG or PNG file (by its extension); the native decoder reads only those"
            )
        if "\n" in path or "\r" in path:
            raise NotNative(f"samples[{i}]: a file name with a line break cannot go in a manifest")
        if roots is None:
            continue
        under = next((p for p in prefixes if path.startswith(p)), None)
        if under is None:
            path = os.path.abspath(path)
            under = next((p for p in prefixes if path.startswith(p)), "")
        lines.append(f"{path[len(under):]}\t{label}")
    if not samples:
        raise NotNative("the dataset has no samples")
    return lines


# -- Transforms ---------------------------------------------------------------

#: The transforms recognized, by module and class name (v1 and v2).
_V1 = "torchvision.transforms.transforms"
_V2 = "torchvision.transforms.v2."


def _kind(t: Any) -> str:
    """``"v1.Name"``/``"v2.Name"`` for a torchvision transform, else the class name."""
    return _kind_of_class(type(t))


def _kind_of_class(cls: type) -> str:
    module = cls.__module__ or ""
    if module == _V1:
        return f"v1.{cls.__name__}"
    if module.startswith(_V2) and getattr(sys.modules.get("torchvision.transforms.v2"), cls.__name__, None) is cls:
        return f"v2.{cls.__name__}"
    return cls.__name__


def _is_compose(t: Any) -> bool:
    return _kind(t) in ("v1.Compose", "v2.Compose")


class _State:
    """What the samples are after the steps so far."""

    def __init__(self) -> None:
        self.tensor = False  # a PIL image until a to-tensor step
        self.dtype = "uint8"
        self.scaled = False  # float32 values divided by 255
        self.normalized = False
        self.size_fixed = False


def _steps(transform: Any) -> list[Any]:
    if transform is None:
        raise NotNative("transform is None: the samples stay PIL images (add ToTensor or PILToTensor)")
    parts = list(transform.transforms) if _is_compose(transform) else [transform]
    where = "transform.transforms" if _is_compose(transform) else "transform"
    steps: list[Any] = ["decode"]
    state = _State()
    for i, t in enumerate(parts):
        at = f"{where}[{i}]" if where.endswith("transforms") else where
        steps += _step(t, at, state)
    if not state.tensor:
        raise NotNative("the transforms end in a PIL image, which cannot be batched: end with ToTensor or PILToTensor")
    if not state.size_fixed:
        raise NotNative(
            "the output size is not fixed (a one-value Resize keeps each image's aspect ratio): "
            "add CenterCrop or a two-value Resize"
        )
    if state.dtype == "float32" and state.scaled and not state.normalized:
        # ToTensor's x / 255, as a Normalize that moves nothing.
        steps.append({"normalize": {"mean": [0.0] * 3, "std": [1.0] * 3}})
    elif state.dtype == "float32" and not state.scaled and not state.normalized:
        steps.append({"cast": "float32"})
    return steps


def _step(t: Any, at: str, state: _State) -> list[Any]:
    kind = _kind(t)
    name = kind.split(".", 1)[-1]
    if kind in ("v1.Compose", "v2.Compose"):
        raise NotNative(f"{at}: a Compose inside the Compose; flatten it")
    if not kind.startswith(("v1.", "v2.")):
        base = next((c for c in type(t).__mro__[1:] if _kind_of_class(c).startswith(("v1.", "v2."))), None)
        if base is not None and base.__name__ not in ("Transform", "Module", "object"):
            raise NotNative(
                f"{at}: {type(t).__module__}.{name} is not torchvision's own {base.__name__} (a subclass may change what it does)"
            )
    geometric = name in ("Resize", "CenterCrop", "RandomResizedCrop", "RandomHorizontalFlip")
    if geometric and state.tensor:
        raise NotNative(
            f"{at}: {name} after the image became a tensor runs torch's tensor resampling; "
            f"put it before ToTensor/PILToTensor/ToImage"
        )
    if kind in ("v1.Resize", "v2.Resize"):
        if getattr(t, "max_size", None) is not None:
            raise NotNative(f"{at}: Resize(max_size={t.max_size}) has no native equivalent")
        size = _size(t.size, at, "Resize")
        entry: dict[str, Any] = {"size": size}
        _interpolation(t, at, entry)
        state.size_fixed = len(size) == 2
        return [{"resize": entry}]
    if kind in ("v1.CenterCrop", "v2.CenterCrop"):
        state.size_fixed = True
        return [{"center_crop": {"size": _size(t.size, at, "CenterCrop")}}]
    if kind in ("v1.RandomResizedCrop", "v2.RandomResizedCrop"):
        entry = {
            "size": _size(t.size, at, "RandomResizedCrop"),
            "scale": _pair(t.scale, at, "scale"),
            "ratio": _pair(t.ratio, at, "ratio"),
        }
        _interpolation(t, at, entry)
        state.size_fixed = True
        return [{"random_resized_crop": entry}]
    if kind in ("v1.RandomHorizontalFlip", "v2.RandomHorizontalFlip"):
        return [{"horizontal_flip": {"p": float(t.p)}}]
    if kind in ("v1.ToTensor", "v2.ToTensor"):
        _to_tensor(at, name, state)
        state.dtype, state.scaled = "float32", True
        return []
    if kind in ("v1.PILToTensor", "v2.PILToTensor", "v2.ToImage"):
        _to_tensor(at, name, state)
        return []
    if kind in ("v1.ConvertImageDtype", "v2.ConvertImageDtype", "v2.ToDtype"):
        return _dtype(t, at, name, state)
    if kind in ("v1.Normalize", "v2.Normalize"):
        return _normalize(t, at, state)
    raise NotNative(f"{at}: {type(t).__module__}.{type(t).__name__} has no native equivalent")


def _to_tensor(at: str, name: str, state: _State) -> None:
    if state.tensor:
        raise NotNative(f"{at}: {name} on a tensor")
    state.tensor = True


def _dtype(t: Any, at: str, name: str, state: _State) -> list[Any]:
    import torch

    dtype = t.dtype
    scale = name == "ConvertImageDtype" or bool(getattr(t, "scale", False))
    if not state.tensor:
        raise NotNative(f"{at}: {name} on a PIL image")
    if not isinstance(dtype, torch.dtype):
        raise NotNative(f"{at}: {name}(dtype={dtype!r}): only one dtype for the image is supported")
    if dtype == torch.uint8 and state.dtype == "uint8":
        return []
    if dtype != torch.float32:
        raise NotNative(f"{at}: {name}(dtype={dtype}): the native pipeline makes uint8 or float32")
    if state.dtype == "float32":
        return []  # already float32, values as they were
    state.dtype, state.scaled = "float32", scale
    return []


def _normalize(t: Any, at: str, state: _State) -> list[Any]:
    if not state.tensor or state.dtype != "float32":
        raise NotNative(f"{at}: Normalize needs a float tensor before it (ToTensor, or ToDtype(torch.float32, scale=True))")
    if state.normalized:
        raise NotNative(f"{at}: a second Normalize has no native equivalent")
    mean, std = _channels(t.mean, at, "mean"), _channels(t.std, at, "std")
    if any(s == 0 for s in std):
        raise NotNative(f"{at}: Normalize(std=...) has a zero")
    if not state.scaled:
        # Values in 0..255: (x - m) / s == (x / 255 - m / 255) / (s / 255).
        mean, std = [m / 255.0 for m in mean], [s / 255.0 for s in std]
    state.normalized = True
    return [{"normalize": {"mean": mean, "std": std}}]


def _size(size: Any, at: str, name: str) -> list[int]:
    values = [size] if isinstance(size, int) else list(size) if isinstance(size, (list, tuple)) else None
    if not values or len(values) > 2 or not all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in values):
        raise NotNative(f"{at}: {name}(size={size!r}): expected an int or (height, width)")
    return [int(v) for v in values]


def _pair(values: Any, at: str, name: str) -> list[float]:
    try:
        pair = [float(v) for v in values]
    except (TypeError, ValueError):
        pair = []
    if len(pair) != 2:
        raise NotNative(f"{at}: RandomResizedCrop({name}={values!r}): expected (min, max)")
    return pair


def _channels(values: Any, at: str, name: str) -> list[float]:
    try:
        out = [float(v) for v in (values.tolist() if hasattr(values, "tolist") else values)]
    except (TypeError, ValueError):
        out = []
    if len(out) == 1:
        out *= 3
    if len(out) != 3:
        raise NotNative(f"{at}: Normalize({name}={values!r}): expected 1 or 3 values (RGB)")
    return out


_FILTERS = {"bilinear": "bilinear", "bicubic": "bicubic"}


def _interpolation(t: Any, at: str, entry: dict) -> None:
    mode = t.interpolation
    name = str(getattr(mode, "value", mode)).lower()
    if name not in _FILTERS:
        raise NotNative(f"{at}: {type(t).__name__}(interpolation={name}): only bilinear and bicubic are native")
    if name != "bilinear":
        entry["interpolation"] = _FILTERS[name]


def as_pair(batch: Any) -> list:
    """A native batch as ``default_collate`` gives ImageFolder's: ``[images,
    labels]``, torch tensors over the batch's memory (no copy)."""
    tensors = batch.torch()
    return [tensors["image"], tensors["label"]]
