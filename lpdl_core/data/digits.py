"""Embedded offline stand-in for image classification: scikit-learn's `load_digits` (1,797 real
8x8 handwritten digits, 10 classes, shipped with scikit-learn). Used by the demo and CI; it is a
stand-in for CIFAR-10, never presented as CIFAR-10."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

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
