"""Whole resized images of different aspect ratios in one padded uint8 tensor, with each image's
size inside its own row of the tensor, so any batch gathered from it (x[idx], moved to any device,
node-stacked) still says which pixels are image: the batched augmentation reads the sizes on the
device, with no host sync and no side table to index.

Layout (`train_layout="packed"` in a DataSplit), for images resized to shorter side S:

    x: uint8 (N, C, S + 1, L)
    x[i, :, :S, :w_i]   the image, landscape: a portrait image (height > width) is stored
                        transposed, so its S-pixel side always runs along dim -2; w_i in [S, L]
                        is its long side; x[i, :, :S, w_i:] is zero padding
    x[i, 0, S, 0:3]     header: w_i % 256, w_i // 256, 1 if stored transposed else 0
                        (the rest of row S is zero)

The original image (C, H, W) is x[i, :, :S, :w_i], transposed back when the flag is set. An
image whose long side exceeds L is centre-cropped to L along it when packed (`put`), as
torchvision's CenterCrop would; callers report how many (`put` returns whether it cropped).
"""
from __future__ import annotations

import torch

HEADER_BYTES = 3
MAX_LONG = 255 + 256 * 255


def empty(n: int, short: int, long: int, channels: int = 3) -> torch.Tensor:
    """A zeroed packed tensor for n images of shorter side `short` and long side at most `long`."""
    if not short <= long <= MAX_LONG:
        raise ValueError(f"packed images need short <= long <= {MAX_LONG}, got short {short}, long {long}")
    return torch.zeros((n, channels, short + 1, long), dtype=torch.uint8)


def put(out: torch.Tensor, i: int, img: torch.Tensor) -> bool:
    """Store uint8 image (C, H, W) with min(H, W) = S as entry i of packed `out`. Returns True
    when its long side was centre-cropped to out's L."""
    s, cap = out.shape[-2] - 1, out.shape[-1]
    h, w = img.shape[-2:]
    if min(h, w) != s:
        raise ValueError(f"packed entry {i}: image {h}x{w} has shorter side {min(h, w)}, expected {s}")
    transposed = h > w
    land = img.transpose(-1, -2) if transposed else img
    long = land.shape[-1]
    cropped = long > cap
    if cropped:
        start = round((long - cap) / 2.0)
        land, long = land[..., start:start + cap], cap
    out[i].zero_()
    out[i, :, :s, :long] = land
    out[i, 0, s, :HEADER_BYTES] = torch.tensor([long % 256, long // 256, int(transposed)], dtype=torch.uint8)
    return cropped


def geometry(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(height, width, transposed) of each image of packed x (N, C, S + 1, L), as int64, int64,
    bool (N,) tensors on x's device: the original image's size, and whether it is stored
    transposed. Reads the header row only; no host sync."""
    s = x.shape[-2] - 1
    head = x[:, 0, s, :HEADER_BYTES].long()
    long = head[:, 0] + 256 * head[:, 1]
    transposed = head[:, 2] != 0
    short = torch.full_like(long, s)
    return torch.where(transposed, long, short), torch.where(transposed, short, long), transposed


def image(x: torch.Tensor, i: int) -> torch.Tensor:
    """Entry i of packed x as the original uint8 (C, H, W) image (a view)."""
    h, w, t = (int(v[0]) for v in geometry(x[i:i + 1]))
    s = x.shape[-2] - 1
    land = x[i, :, :s, :max(h, w)]
    return land.transpose(-1, -2) if t else land
