"""Batched, on-device image augmentation over (node-stacked) uint8 batches.

Plain tensor ops (no per-image Python loops, no vmap); CPU and CUDA. All randomness comes from an
explicit `torch.Generator` (sampled on its device and moved to the data's device); without one the
default generator of the data's device is used. Inputs may carry leading dims (n, B, C, H, W):
they are flattened, transformed and restored.

Float images are in [0, 1] (ToTensor convention); uint8 images in [0, 255].

part=(i, k): x holds part i of k equal parts of a batch (one node's row of a node-stacked batch
of k nodes, in a process that trains only that node). The random draws are those of the whole
batch, in the same order, and part i's are applied, so the part equals rows i of the whole
batch's augmentation and the generator ends in the same state (the distributed executor).
Semantics follow the official code's torchvision pipelines (docs/paper-vs-code.md, 'Transforms'):
  crop-flip: RandomHorizontalFlip + RandomCrop(32, padding=4) (zero padding)
  rrc-flip:  RandomResizedCrop(size) (default scale/ratio) + RandomHorizontalFlip, resized with
             antialiased bilinear (as PIL / torchvision antialias=True), computed in float
             without the intermediate rounding to uint8 that the PIL pipeline does. The boxes are
             drawn over each whole image as split.crop_sampling (crops.py: "log-uniform", current
             torchvision; "uniform-swap", the official code's torchvision 0.2.1); images of
             different sizes come packed (packed.py, split.train_layout == "packed")
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .base import DataSplit
from .crops import crop_boxes, draw_uniforms
from .packed import geometry as packed_geometry


def _flat(x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...]]:
    if x.dim() < 3:
        raise ValueError(f"expected images (..., C, H, W), got shape {tuple(x.shape)}")
    return x.reshape(-1, *x.shape[-3:]), tuple(x.shape[:-3])


def _rand(shape, generator, device, kind="rand", high=None) -> torch.Tensor:
    dev = generator.device if generator is not None else device
    if kind == "rand":
        t = torch.rand(shape, generator=generator, device=dev)
    else:
        t = torch.randint(0, high, shape, generator=generator, device=dev)
    return t.to(device)


def normalize(x: torch.Tensor, mean, std) -> torch.Tensor:
    """(x - mean) / std per channel (dim -3) in float32; uint8 input is first divided by 255."""
    xf = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
    m = torch.as_tensor(mean, dtype=torch.float32, device=x.device).view(-1, 1, 1)
    s = torch.as_tensor(std, dtype=torch.float32, device=x.device).view(-1, 1, 1)
    return (xf - m) / s


def _crop_flip_params(n: int, padding: int, flip_p: float, generator, device):
    """Per-image (top, left) offsets into the padded image and flip flags."""
    off = _rand((2, n), generator, device, "randint", 2 * padding + 1)
    flip = _rand((n,), generator, device) < flip_p
    return off[0], off[1], flip


def _part(n: int, part: tuple[int, int] | None) -> tuple[int, slice]:
    """(images whose draws are made, the slice of them that x holds): see the module docstring."""
    i, k = part or (0, 1)
    if not 0 <= i < k:
        raise ValueError(f"part must be (i, k) with 0 <= i < k, got {part}")
    return n * k, slice(i * n, (i + 1) * n)


def random_crop_flip(x: torch.Tensor, padding: int = 4, generator: torch.Generator | None = None,
                     flip_p: float = 0.5, part: tuple[int, int] | None = None) -> torch.Tensor:
    """Zero-pad by `padding`, crop back to H x W at an independent random offset per image, then
    flip horizontally with probability flip_p. Same dtype and shape as x."""
    xf, lead = _flat(x)
    n, c, h, w = xf.shape
    total, mine = _part(n, part)
    top, left, flip = (t[mine] for t in _crop_flip_params(total, padding, flip_p, generator, x.device))
    xp = F.pad(xf, (padding, padding, padding, padding))
    rows = top[:, None] + torch.arange(h, device=x.device)  # (n, h)
    cols = left[:, None] + torch.arange(w, device=x.device)  # (n, w)
    cols = torch.where(flip[:, None], cols.flip(-1), cols)
    idx = torch.arange(n, device=x.device)[:, None, None]
    out = xp[idx, :, rows[:, :, None], cols[:, None, :]]  # (n, h, w, c): advanced dims first
    return out.permute(0, 3, 1, 2).contiguous().reshape(*lead, c, h, w)


def _rrc_params(n: int, height, width, scale, ratio, generator, device, how: str = "log-uniform"):
    """torchvision RandomResizedCrop.get_params for n images at once, sampled as `how`
    (crops.SAMPLINGS): (top, left, h, w) int64. Draws crops.draw_uniforms(n) from `generator`.
    height/width: ints, or (n,) tensors for images of their own sizes."""
    draws = draw_uniforms(n, lambda shape: _rand(shape, generator, device))
    return crop_boxes(draws, height, width, scale=scale, ratio=ratio, how=how)


def _aa_weights(in_size: int, start: torch.Tensor, length: torch.Tensor, out_size: int) -> torch.Tensor:
    """(n, out_size, in_size) resampling matrices for the 1-D boxes [start, start + length):
    bilinear (triangle) filter widened by the scale factor when downsampling, renormalized at the
    box edges -- the same weights as PyTorch's / PIL's antialiased bilinear resize of the crop
    (align_corners=False); for upsampling that is plain bilinear with edge clamping."""
    dev = start.device
    scale = length.float() / out_size  # (n,)
    support = scale.clamp(min=1.0)
    center = (torch.arange(out_size, device=dev, dtype=torch.float32) + 0.5) * scale[:, None]  # (n, out)
    j = torch.arange(in_size, device=dev)[None, :] - start[:, None]  # (n, in) box coordinates
    d = (j[:, None, :].float() + 0.5 - center[:, :, None]) / support[:, None, None]
    w = (1.0 - d.abs()).clamp(min=0.0) * ((j >= 0) & (j < length[:, None]))[:, None, :]
    return (w / w.sum(-1, keepdim=True).clamp(min=1e-12))


def _resize_boxes(xf: torch.Tensor, top, left, ch, cw, size: int) -> torch.Tensor:
    """Resize box (top, left, ch, cw) of each image to size x size: separable antialiased bilinear
    as two batched matmuls (float in, float out). Equals cropping then torchvision's
    resize(antialias=True) up to float rounding."""
    n, c, h, w = xf.shape
    wy = _aa_weights(h, top, ch, size)  # (n, size, h)
    wx = _aa_weights(w, left, cw, size)  # (n, size, w)
    return wy[:, None] @ xf @ wx.transpose(1, 2)[:, None]


def random_resized_crop_flip(x: torch.Tensor, size: int = 224, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
                             generator: torch.Generator | None = None, flip_p: float = 0.5,
                             part: tuple[int, int] | None = None, sampling: str = "log-uniform",
                             packed: bool = False) -> torch.Tensor:
    """RandomResizedCrop(size, scale, ratio) + horizontal flip (p=flip_p), batched, the boxes
    drawn over each whole image as `sampling` (crops.SAMPLINGS). uint8 (..., C, H, W) -> float32
    (..., C, size, size) in [0, 1]. packed: x is a batch of packed.py's layout (..., C, S + 1, L),
    each image of its own size; a transposed (portrait) entry is cropped and resized in storage
    orientation and transposed back, which is the same resampling. Draws: crops.draw_uniforms of
    the whole batch, then one flip uniform per image."""
    xf, lead = _flat(x)
    n, c = xf.shape[:2]
    total, mine = _part(n, part)
    draws = draw_uniforms(total, lambda shape: _rand(shape, generator, x.device))[mine]
    flip = (_rand((total,), generator, x.device) < flip_p)[mine]
    if packed:
        height, width, tr = packed_geometry(xf)
        xf = xf[:, :, :-1]
    else:
        height, width, tr = xf.shape[-2], xf.shape[-1], None
    top, left, ch, cw = crop_boxes(draws, height, width, scale=scale, ratio=ratio, how=sampling)
    src = xf.float() / 255.0 if x.dtype == torch.uint8 else xf.float()
    if tr is None:
        out = _resize_boxes(src, top, left, ch, cw, size)
    else:  # a transposed entry's box, in storage coordinates: rows <-> columns
        box = [torch.where(tr, a, b) for a, b in ((left, top), (top, left), (cw, ch), (ch, cw))]
        out = _resize_boxes(src, *box, size)
        out = torch.where(tr[:, None, None, None], out.transpose(-1, -2), out)
    out = torch.where(flip[:, None, None, None], out.flip(-1), out)
    return out.reshape(*lead, c, size, size)


def center_crop(x: torch.Tensor, size: int) -> torch.Tensor:
    """torchvision CenterCrop(size) (no padding: the image must be at least size x size)."""
    h, w = x.shape[-2:]
    if h < size or w < size:
        raise ValueError(f"center_crop: image {h}x{w} smaller than {size}")
    top, left = int(round((h - size) / 2.0)), int(round((w - size) / 2.0))
    return x[..., top:top + size, left:left + size]


def resize_shorter(x: torch.Tensor, size: int) -> torch.Tensor:
    """torchvision Resize(size) on tensors: shorter side -> size, bilinear, antialias=True.
    uint8 in -> uint8 out (rounded), float in -> float out."""
    xf, lead = _flat(x)
    h, w = xf.shape[-2:]
    if h <= w:
        oh, ow = size, int(size * w / h)
    else:
        oh, ow = int(size * h / w), size
    if (oh, ow) == (h, w):
        return x.clone()
    out = F.interpolate(xf.float(), size=(oh, ow), mode="bilinear", align_corners=False, antialias=True)
    if x.dtype == torch.uint8:
        out = out.round_().clamp_(0, 255).to(torch.uint8)
    return out.reshape(*lead, *out.shape[-3:])


def _crop_flip(x, split, generator, part):
    return random_crop_flip(x, padding=4, generator=generator, part=part)


def _rrc_flip(x, split, generator, part):
    return random_resized_crop_flip(x, size=split.image_size or 224, generator=generator, part=part,
                                    sampling=split.crop_sampling, packed=split.train_layout == "packed")


# DataSplit.augment -> the training augmentation (x, split, generator, part) -> images
AUGMENTS = {"crop-flip": _crop_flip, "rrc-flip": _rrc_flip, "none": lambda x, split, generator, part: x}


def _shared_rows(augment, x: torch.Tensor, split: DataSplit, generator: torch.Generator) -> torch.Tensor:
    """augment over each node row of x (n, B, ...), every row from the same generator state: each
    node draws what one node draws (the official ranks, seeded alike, draw the same crop and flip
    for the j-th sample of their batches). The generator ends as after one row."""
    if generator is None or x.dim() < 5:
        raise ValueError("shared augmentation needs a generator and node-stacked images (n, B, C, H, W)")
    start, rows = generator.get_state(), []
    for row in x:
        generator.set_state(start)
        rows.append(augment(row, split, generator, None))
    return torch.stack(rows)


def augment_batch(x: torch.Tensor, split: DataSplit, train: bool,
                  generator: torch.Generator | None = None, part: tuple[int, int] | None = None,
                  shared: bool = False) -> torch.Tensor:
    """Training: split.augment ('crop-flip' | 'rrc-flip' | 'none'; rrc-flip draws its boxes as
    split.crop_sampling, over whole packed images when split.train_layout is 'packed') then
    normalize. Test: normalize only (test-time resize/center-crop is done by the loaders, so test
    batches are already image_size). Returns float32 of x's leading shape. Text (token ids) passes
    through unchanged. part: see the module docstring. shared: every node row of x (n, B, ...)
    gets the same draws (`_shared_rows`; part is then not needed: a row is a row)."""
    if split.kind == "text":
        return x
    if train:
        if split.augment not in AUGMENTS:
            raise ValueError(f"unknown augment {split.augment!r}; valid: {', '.join(AUGMENTS)}")
        augment = AUGMENTS[split.augment]
        x = _shared_rows(augment, x, split, generator) if shared else augment(x, split, generator, part)
    return normalize(x, split.mean, split.std)
