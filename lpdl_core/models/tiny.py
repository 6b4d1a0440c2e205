"""A small CNN for 8x8 inputs (the demo's model on the digits stand-in; not a paper model)."""
from __future__ import annotations

from torch import nn


def tiny_cnn(in_channels: int = 1, num_classes: int = 10, width: int = 16) -> nn.Module:
    # (B, C, 8, 8) -> (B, w, 8, 8) -> (B, 2w, 4, 4) -> (B, 32w) -> (B, classes)
    return nn.Sequential(
        nn.Conv2d(in_channels, width, 3, padding=1), nn.ReLU(),
        nn.Conv2d(width, 2 * width, 3, padding=1, stride=2), nn.ReLU(),
        nn.Flatten(), nn.Linear(2 * width * 16, num_classes),
    )
