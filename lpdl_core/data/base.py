"""The one shape every dataset takes once loaded, real or stand-in, and the data root.

Images are kept as uint8 (N, C, H, W) tensors so that a whole dataset can live on the training
device; augmentation and normalization run batched there (`augment.py`). Text is kept as int64
token ids (N, T) with pad id 0 unless stated.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import torch

from ..config import DATA_KINDS, FIDELITY_CHOICES
from ..errors import LpdlError

DEFAULT_ROOT = Path("data")


class DatasetMissing(LpdlError, FileNotFoundError):
    """A dataset is not on disk and cannot be downloaded here. The message says what to put where."""


class ChecksumError(LpdlError, RuntimeError):
    """A downloaded or supplied archive does not match its published checksum."""


def data_root(root: str | os.PathLike | None = None) -> Path:
    """Resolve the data root: explicit argument (config key `data_root`), else $LPDL_DATA, else ./data."""
    from ..rehearsal_mark import resolve_root

    return resolve_root(root)


@dataclass(frozen=True, kw_only=True)
class DataSplit:
    """A loaded dataset: train/test tensors plus what the training loop needs to feed them.

    name: registry name ("cifar10", "digits", ...). standin_for: the paper dataset this one
    replaces (None for a real paper dataset); every report names stand-ins as such.
    kind: "image" (x uint8 (N, C, H, W)) or "text" (x int64 token ids (N, T)).
    mean/std: per-channel normalization applied after augmentation (images only).
    augment: "crop-flip" (pad-4 random crop + horizontal flip, CIFAR), "rrc-flip"
    (RandomResizedCrop to image_size + flip, Imagenette), or "none".
    image_size: side of the images fed to the model (after augmentation / test crop).
    crop_sampling: how "rrc-flip" draws its crop boxes (config.FIDELITY_CHOICES; augment.py's
    crops.SAMPLINGS): "log-uniform" (current torchvision) or "uniform-swap" (torchvision 0.2.1,
    the official code's); set from a run's Fidelity by registry.load_dataset.
    train_layout: "dense" (x_train (N, C, H, W), one size) or "packed" (packed.py: whole images
    of their own sizes, padded, each with its size in a header row; Imagenette's training set).
    """

    name: str
    kind: str                   # one of lpdl_core.config.DATA_KINDS
    num_classes: int
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    standin_for: str | None = None
    description: str = ""
    class_names: tuple[str, ...] = ()
    mean: tuple[float, ...] | None = None
    std: tuple[float, ...] | None = None
    augment: Literal["crop-flip", "rrc-flip", "none"] = "none"
    image_size: int | None = None
    crop_sampling: str = "log-uniform"
    train_layout: Literal["dense", "packed"] = "dense"
    pad_id: int = 0
    extras: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in DATA_KINDS:
            raise ValueError(f"kind must be one of {', '.join(DATA_KINDS)}, got {self.kind!r}")
        for a, b, what in ((self.x_train, self.y_train, "train"), (self.x_test, self.y_test, "test")):
            if len(a) != len(b):
                raise ValueError(f"{self.name}: {what} inputs ({len(a)}) and labels ({len(b)}) differ")
        if self.kind == "image" and (self.mean is None or self.std is None):
            raise ValueError(f"{self.name}: image datasets need mean and std")
        if self.crop_sampling not in FIDELITY_CHOICES["crop_sampling"]:
            raise ValueError(f"{self.name}: crop_sampling {self.crop_sampling!r} is not one of "
                             f"{', '.join(FIDELITY_CHOICES['crop_sampling'])}")
        if self.train_layout not in ("dense", "packed"):
            raise ValueError(f"{self.name}: train_layout must be 'dense' or 'packed', got {self.train_layout!r}")

    @property
    def class_sizes(self) -> tuple[int, ...]:
        return tuple(torch.bincount(self.y_train, minlength=self.num_classes).tolist())

    @property
    def label(self) -> str:
        """How reports name it: 'digits (stand-in for cifar10)' or 'cifar10'."""
        return f"{self.name} (stand-in for {self.standin_for})" if self.standin_for else self.name
