"""Embedded offline stand-in for image classification: scikit-learn's `load_digits` (1,797 real
8x8 handwritten digits, 10 classes, shipped with scikit-learn). Used by the demo and CI; it is a
stand-in for CIFAR-10 (32 px) or Imagenette (224 px), never presented as either.

`load()` — the original 1x8x8 float split (kept for callers that use it);
`load_digits_standin()` — DataSplit of uint8 3-channel images upsampled for the paper's CNNs."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..config import DATASET_SPECS
from .base import DataSplit

NAME = "digits (stand-in: scikit-learn load_digits, 8x8 grey)"


@dataclass(frozen=True)
class Split:
    x_train: torch.Tensor  # (N, 1, 8, 8) float32, normalized
    y_train: torch.Tensor  # (N,) int64
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int = 10


def load(test_fraction: float = 0.2, seed: int = 0) -> Split:
    """Stratified train/test split, pixels scaled to [0, 1] then standardized with train stats."""
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x = (d.images.astype(np.float32) / 16.0)[:, None]
    y = d.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=test_fraction, stratify=y, random_state=seed)
    mean, std = float(xtr.mean()), float(xtr.std())
    norm = lambda a: torch.from_numpy((a - mean) / std)
    return Split(norm(xtr), torch.from_numpy(ytr), norm(xte), torch.from_numpy(yte))


# --------------------------------------------------------------------------------------------
# The CNN stand-in: the same 1,797 digits as DataSplit images that every paper CNN accepts.

_SRC = 8  # load_digits images are 8x8
AUGMENTS = {"crop-flip": "pad-4 random crop + horizontal flip",
            "rrc-flip": "RandomResizedCrop + horizontal flip", "none": "none"}


def _digits_source() -> str:
    """What the split is built from: the sha256 of scikit-learn's digits data file, found
    without importing scikit-learn (seconds); its version if the file cannot be found."""
    import importlib.metadata
    import importlib.util
    from pathlib import Path

    from .cache import file_sha256

    spec = importlib.util.find_spec("sklearn")
    for loc in (spec.submodule_search_locations or []) if spec else []:
        f = Path(loc) / "datasets" / "data" / "digits.csv.gz"
        if f.is_file():
            return f"digits.csv.gz sha256 {file_sha256(f)}"
    return f"scikit-learn {importlib.metadata.version('scikit-learn')}"


def _split_8x8(test_fraction: float, seed: int):
    """The stratified 8x8 uint8 split, cached as .npz under the data root: importing scikit-learn
    costs seconds, and the mini grid starts one process per cell. The cache is used only if it
    was built from the same scikit-learn data and split settings and its content checksum holds
    (`data.cache`); otherwise it is rebuilt."""
    from .base import data_root
    from .cache import load_cache, save_cache

    cache = data_root() / "lpdl-cache" / f"digits-split-{test_fraction:g}-{seed}.npz"
    source = f"{_digits_source()} | test_fraction {test_fraction!r} | seed {seed}"
    z = load_cache(cache, source)
    if z is not None and {"xtr", "xte", "ytr", "yte"} <= set(z):
        return z["xtr"], z["xte"], z["ytr"], z["yte"]
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    d = load_digits()
    x8 = np.rint(d.images * (255.0 / 16.0)).astype(np.uint8)  # (N, 8, 8)
    y = d.target.astype(np.int64)
    xtr, xte, ytr, yte = train_test_split(x8, y, test_size=test_fraction, stratify=y, random_state=seed)
    save_cache(cache, source, {"xtr": xtr, "xte": xte, "ytr": ytr, "yte": yte})
    return xtr, xte, ytr, yte


def load_digits_standin(*, standin_for: str = "cifar10", image_size: int | None = None,
                        test_fraction: float = 0.2, seed: int = 0, augment: str | None = None) -> DataSplit:
    """scikit-learn `load_digits` (1,797 real 8x8 grey handwritten digits, 10 classes) mapped to
    the image format of a paper dataset, for offline runs of the paper's CNNs.

    Mapping: stratified train/test split (`train_test_split(test_size=test_fraction,
    stratify=y, random_state=seed)`: 1,437 / 360 at the defaults); pixels 0..16 -> uint8
    round(v * 255 / 16); grey replicated to 3 channels; nearest-neighbour upsampling by the
    integer factor image_size / 8, so every source pixel becomes a constant k x k block
    (32 px: 4x4 blocks, for the CIFAR models; 224 px: 28x28 blocks, for ResNet-18 / VGG-11 on
    Imagenette). image_size must be a multiple of 8; default 224 when standin_for is
    "imagenette", else 32. Augmentation follows the replaced dataset: "crop-flip" (pad-4 random
    crop + horizontal flip) up to 64 px, "rrc-flip" (RandomResizedCrop + flip) above; horizontal
    flips are applied as in the paper even though digits are not mirror-symmetric (the point is
    to exercise the paper's pipeline, not to maximise digit accuracy). mean/std: per-channel
    statistics of the train split in [0, 1] units (equal across channels). augment: override
    ("crop-flip" | "rrc-flip" | "none"); at the native 8 px (the mini profile) the default is
    "none": a pad-4 crop of an 8-px digit would cut away half of it.
    The name is "digits" at 32 px and "digits-<size>" otherwise (the registry's names).
    """
    if image_size is None:
        image_size = DATASET_SPECS[standin_for].size
    if image_size < _SRC or image_size % _SRC:
        raise ValueError(f"image_size must be a positive multiple of {_SRC}, got {image_size}")
    k = image_size // _SRC
    xtr, xte, ytr, yte = _split_8x8(test_fraction, seed)
    # nearest-neighbour upsampling leaves the pixel distribution unchanged (every pixel is
    # repeated k*k times), so the statistics are computed on the 8x8 train images.
    m, sd = float(xtr.mean() / 255.0), float(xtr.std() / 255.0)

    def to_images(a: np.ndarray) -> torch.Tensor:
        t = torch.from_numpy(np.ascontiguousarray(a))[:, None]  # (N, 1, 8, 8)
        t = t.repeat_interleave(k, dim=2).repeat_interleave(k, dim=3)
        return t.expand(-1, 3, -1, -1).contiguous()

    if augment is None:
        augment = "none" if image_size == _SRC else "crop-flip" if image_size <= 64 else "rrc-flip"
    if augment not in AUGMENTS:
        raise ValueError(f"augment must be one of {', '.join(AUGMENTS)}, got {augment!r}")
    aug_text = AUGMENTS[augment]
    n_tr, n_te = len(ytr), len(yte)
    size = (f"nearest-neighbour upsampled x{k} to {image_size}x{image_size} (each pixel a {k}x{k} "
            f"block) so the paper's CNNs accept it unchanged" if k > 1 else "kept at the native 8x8")
    flips = ("; horizontal flips are applied as in the paper even though digits are not "
             "mirror-symmetric" if "flip" in augment else "")
    desc = (f"STAND-IN for {standin_for}: scikit-learn load_digits (1,797 real 8x8 greyscale "
            f"handwritten digits, 10 classes; not {standin_for}). Stratified split {n_tr} train / "
            f"{n_te} test (seed {seed}); pixels 0..16 scaled to uint8 0..255, grey replicated to 3 "
            f"channels, {size}. Augmentation: {aug_text}{flips}. Normalization: train-split mean "
            f"{m:.4f} / std {sd:.4f} (all channels).")
    return DataSplit(
        name="digits" if image_size == 32 else f"digits-{image_size}", kind="image",
        num_classes=10, x_train=to_images(xtr), y_train=torch.from_numpy(ytr),
        x_test=to_images(xte), y_test=torch.from_numpy(yte), standin_for=standin_for,
        description=desc, class_names=tuple(str(i) for i in range(10)),
        mean=(m, m, m), std=(sd, sd, sd), augment=augment, image_size=image_size,
        extras={"source": "sklearn.datasets.load_digits", "upsample_factor": k, "seed": seed},
    )


def load_digits_32(**kw) -> DataSplit:
    """The "digits" stand-in (lpdl_core.specs.datasets): CIFAR-10's format and size (unless kw say
    otherwise, as the mini profile's plans do)."""
    return _as_spec("digits", kw)


def load_digits_224(**kw) -> DataSplit:
    """The "digits-224" stand-in: Imagenette's format and size."""
    return _as_spec("digits-224", kw)


def _as_spec(name: str, kw: dict) -> DataSplit:
    spec = DATASET_SPECS[name]
    return load_digits_standin(**{"standin_for": spec.standin_for, "image_size": spec.size, **kw})
