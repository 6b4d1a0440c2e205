"""RandomResizedCrop's crop boxes for a batch of images of their own sizes, in two samplings
(`Fidelity.crop_sampling`), from uniforms drawn beforehand (`draw_uniforms`) so a part of a
batch can be boxed with the whole batch's draws (augment.py's `part`).

Both samplings make up to ten attempts per image of an H x W image (area A = H W), scale range
(s0, s1) = (0.08, 1) and ratio range (r0, r1) = (3/4, 4/3), and take the first valid one:

  log-uniform (current torchvision ``RandomResizedCrop.get_params``, the paper's standard
  augmentation):
      a = A (s0 + (s1 - s0) u1);  r = exp(log r0 + (log r1 - log r0) u2)
      w = round(sqrt(a r)), h = round(sqrt(a / r));  valid if 0 < w <= W and 0 < h <= H
      fallback (no valid attempt): the centred crop of the whole image with its ratio W / H
      clamped into [r0, r1] (w = W, h = round(W / r0) if W / H < r0; h = H, w = round(H r1) if
      W / H > r1; the whole image otherwise)

  uniform-swap (torchvision 0.2.1, which the official code's environment pins):
      a = A (s0 + (s1 - s0) u1);  r = r0 + (r1 - r0) u2          (uniform, not log-uniform)
      w = round(sqrt(a r)), h = round(sqrt(a / r));  (w, h) <- (h, w) if u3 < 1/2
      valid if w <= W and h <= H
      fallback: the centred min(H, W) square

  offsets of a valid box: top = floor(v1 (H - h + 1)), left = floor(v2 (W - w + 1)), i.e.
  randint(0, H - h) and randint(0, W - w); a fallback box is centred: ((H - h) // 2, (W - w) // 2).

round() is round-half-to-even (Python's and torch's). u1, u2, u3 are the attempt's three uniforms
(u1, u2 the same in both samplings; log-uniform leaves u3 unused), v1, v2 the image's two offset
uniforms; the box arithmetic is float64 (as torchvision's Python floats). Box sizes are
batched over all images and attempts: no Python loop, no host sync.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

ATTEMPTS = 10

Sizes = Callable[[torch.Tensor, torch.Tensor, tuple, tuple], tuple[torch.Tensor, torch.Tensor]]
Fallback = Callable[[torch.Tensor, torch.Tensor, tuple], tuple[torch.Tensor, torch.Tensor]]


@dataclass(frozen=True, kw_only=True)
class CropDraws:
    """The uniforms of n images' crop boxes: u (3, n, ATTEMPTS) per attempt (u1, u2, u3) and
    v (2, n) for the offsets, float32 in [0, 1)."""

    u: torch.Tensor
    v: torch.Tensor

    def __getitem__(self, rows: slice) -> CropDraws:
        return CropDraws(u=self.u[:, rows], v=self.v[:, rows])


def draw_uniforms(n: int, draw: Callable[[tuple[int, ...]], torch.Tensor]) -> CropDraws:
    """n images' uniforms, from `draw(shape)` (a seeded torch.rand): u first, then v."""
    u = draw((3, n, ATTEMPTS))
    return CropDraws(u=u, v=draw((2, n)))


def _log_uniform_sizes(area, u, scale, ratio):
    target = area[:, None] * (scale[0] + (scale[1] - scale[0]) * u[0])
    lr = (math.log(ratio[0]), math.log(ratio[1]))
    ar = torch.exp(lr[0] + (lr[1] - lr[0]) * u[1])
    return torch.round(torch.sqrt(target * ar)), torch.round(torch.sqrt(target / ar))


def _uniform_swap_sizes(area, u, scale, ratio):
    target = area[:, None] * (scale[0] + (scale[1] - scale[0]) * u[0])
    ar = ratio[0] + (ratio[1] - ratio[0]) * u[1]
    w, h = torch.round(torch.sqrt(target * ar)), torch.round(torch.sqrt(target / ar))
    swap = u[2] < 0.5
    return torch.where(swap, h, w), torch.where(swap, w, h)


def _clamped_ratio_fallback(height, width, ratio):
    in_ratio = width / height
    lo, hi = min(ratio), max(ratio)
    w = torch.where(in_ratio > hi, torch.round(height * hi), width)
    h = torch.where(in_ratio < lo, torch.round(width / lo), height)
    return w, h


def _square_fallback(height, width, ratio):
    side = torch.minimum(height, width)
    return side, side


@dataclass(frozen=True, kw_only=True)
class Sampling:
    """One crop sampling: candidate (w, h) per attempt, whether 0-sized boxes are rejected (the
    0.2.1 check has no `0 <`; it only matters for images of a few pixels), and the fallback."""

    sizes: Sizes
    reject_empty: bool
    fallback: Fallback


SAMPLINGS: dict[str, Sampling] = {
    "log-uniform": Sampling(sizes=_log_uniform_sizes, reject_empty=True, fallback=_clamped_ratio_fallback),
    "uniform-swap": Sampling(sizes=_uniform_swap_sizes, reject_empty=False, fallback=_square_fallback),
}


def sampling(name: str) -> Sampling:
    if name not in SAMPLINGS:
        raise ValueError(f"unknown crop sampling {name!r}; valid: {', '.join(SAMPLINGS)}")
    return SAMPLINGS[name]


def crop_boxes(draws: CropDraws, height, width, *, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
               how: str = "log-uniform") -> tuple[torch.Tensor, ...]:
    """(top, left, h, w) int64 (n,) of n images of sizes height x width (ints, or (n,) tensors
    for images of their own sizes), from `draws` (n images' uniforms), sampled as `how`."""
    s = sampling(how)
    u, v = draws.u.double(), draws.v.double()
    n, dev = u.shape[1], u.device
    H = torch.as_tensor(height, device=dev).double().expand(n)
    W = torch.as_tensor(width, device=dev).double().expand(n)
    cw, ch = s.sizes(H * W, u, tuple(map(float, scale)), tuple(map(float, ratio)))
    ok = (cw <= W[:, None]) & (ch <= H[:, None])
    if s.reject_empty:
        ok &= (cw > 0) & (ch > 0)
    first = ok.long().argmax(dim=1, keepdim=True)  # the first valid attempt (0 if none)
    found = ok.any(dim=1)
    fw, fh = s.fallback(H, W, ratio)
    cw = torch.where(found, cw.gather(1, first)[:, 0], fw)
    ch = torch.where(found, ch.gather(1, first)[:, 0], fh)
    # float64: v (a multiple of 2^-24) times an integer below 2^29 is exact, so floor is exact
    top = torch.where(found, torch.floor(v[0] * (H - ch + 1)).clamp(max=H - ch),
                      torch.div(H - ch, 2, rounding_mode="floor"))
    left = torch.where(found, torch.floor(v[1] * (W - cw + 1)).clamp(max=W - cw),
                       torch.div(W - cw, 2, rounding_mode="floor"))
    return top.long(), left.long(), ch.long(), cw.long()
