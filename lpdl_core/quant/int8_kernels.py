r"""Exact 8-bit integer products: the kernels behind `int8_arithmetic: integer` (lpdl_core.quant.integer).

Two products, each over an unsigned 8-bit left operand a ∈ {0..255} and a signed 8-bit right
operand b ∈ {−128..127}, accumulated exactly (int32 sums):

.. math::
    \mathrm{mm}(a, b)_{no} = \sum_k a_{nk} b_{ko},\qquad
    \mathrm{conv}(a, b) = \text{conv2d of } a \text{ (zero-padded) with } b

Backends (`KERNELS`), each a pair (mm, conv):

- ``onednn``: oneDNN's int8 convolution and linear (the ops inductor's x86 lowering calls,
  `torch.ops.onednn.qconv2d_pointwise` / `qlinear_pointwise`), with scales 1 and zero points 0 and a
  float32 output, which is the int32 accumulator converted to float32 (exact below 2^24, a float32
  rounding above). Without VNNI, x86 oneDNN adds pairs of u8·s8 products in int16 with saturation
  (`vpmaddubsw`), so full-range operands come out wrong; `exact()` probes that.
- ``int_mm``: `torch._int_mm` (int8 × int8 → int32) on an im2col of the input: int8 tensor cores
  on CUDA (cuBLASLt). It also runs on the CPU, bit-exact but many times slower than a float32
  product there, so on a CPU it serves as the exact reference of the CUDA path's code.

`backend_for(device)` picks the fastest exact one, or None (the layers then compute `fake`).
"""
from __future__ import annotations

import functools
from typing import Callable, NamedTuple

import torch
import torch.nn.functional as F

SHIFT = 128  # b = q − 128 for an 8-bit grid q ∈ {0..255}; a = q as is


class Kernel(NamedTuple):
    mm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]      # (N, K) u8, (K, O) s8 -> (N, O)
    conv: Callable[..., torch.Tensor]  # (B, C, H, W) u8, (O, C/G, kh, kw) s8, stride, padding, dilation, groups


# --- torch._int_mm on an im2col ------------------------------------------------------------------

def _round_up(v: int, m: int) -> int:
    return -(-v // m) * m


def _mm_s8(a8: torch.Tensor, b8: torch.Tensor) -> torch.Tensor:
    """a8 (N, K) @ b8 (K, O), int8 operands, int32 result, padded to what cuBLASLt needs
    (N > 16; K and O multiples of 8); zero padding adds zero products."""
    n, k = a8.shape
    o = b8.shape[1]
    n2, k2, o2 = max(n, 17), _round_up(k, 8), _round_up(o, 8)
    if (n2, k2) != (n, k):
        a8 = F.pad(a8, (0, k2 - k, 0, n2 - n))
    if (k2, o2) != (k, o):
        b8 = F.pad(b8, (0, o2 - o, 0, k2 - k))
    return torch._int_mm(a8.contiguous(), b8.contiguous())[:n, :o]


def _int_mm_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Σ_k a_nk b_ko with a shifted to int8: Σ (a − 128) b + 128 Σ_k b_ko."""
    a8 = (a.to(torch.int16) - SHIFT).to(torch.int8)
    return _mm_s8(a8, b) + SHIFT * b.sum(0, dtype=torch.int32)


def _int_mm_conv(a, b, stride, padding, dilation, groups):
    """im2col of a (shifted to int8, padded with the shifted 0), one _int_mm per group."""
    (sh, sw), (ph, pw), (dh, dw) = stride, padding, dilation
    o, cg, kh, kw = b.shape
    a8 = (a.to(torch.int16) - SHIFT).to(torch.int8)
    a8 = F.pad(a8, (pw, pw, ph, ph), value=-SHIFT)
    cols = a8.unfold(2, dh * (kh - 1) + 1, sh).unfold(3, dw * (kw - 1) + 1, sw)[..., ::dh, ::dw]
    bsz, _, ho, wo = cols.shape[:4]
    og = o // groups
    out = []
    for g in range(groups):
        cg_cols = cols[:, g * cg:(g + 1) * cg].permute(0, 2, 3, 1, 4, 5).reshape(bsz * ho * wo, cg * kh * kw)
        bg = b[g * og:(g + 1) * og].reshape(og, cg * kh * kw).t()
        out.append(_mm_s8(cg_cols, bg) + SHIFT * bg.sum(0, dtype=torch.int32))
    return torch.cat(out, 1).view(bsz, ho, wo, o).permute(0, 3, 1, 2)


# --- oneDNN int8 convolution and linear ----------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _unit_scale() -> tuple[torch.Tensor, torch.Tensor]:
    """The weight's scale 1 and zero point 0, one for the whole tensor (per-channel ones give the
    same products, but oneDNN's prepacking then reads every channel's scale back one by one);
    made once, only read."""
    return torch.ones(1, dtype=torch.float32), torch.zeros(1, dtype=torch.int64)


def _onednn_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    scale, zero = _unit_scale()
    packed = torch.ops.onednn.qlinear_prepack(b.t().contiguous(), list(a.shape))
    return torch.ops.onednn.qlinear_pointwise(a.contiguous(), 1.0, 0, packed, scale, zero, None, 1.0, 0,
                                              torch.float32, "none", [], "")


def _onednn_conv(a, b, stride, padding, dilation, groups):
    scale, zero = _unit_scale()
    packed = torch.ops.onednn.qconv_prepack(b.contiguous(), scale, 1.0, 0, list(stride), list(padding),
                                            list(dilation), groups, list(a.shape))
    return torch.ops.onednn.qconv2d_pointwise(a.contiguous(), 1.0, 0, packed, scale, zero, None, list(stride),
                                              list(padding), list(dilation), groups, 1.0, 0, torch.float32,
                                              "none", [], "")


KERNELS: dict[str, Kernel] = {
    "onednn": Kernel(_onednn_mm, _onednn_conv),
    "int_mm": Kernel(_int_mm_mm, _int_mm_conv),
}
# the backends a device may use, fastest first (int_mm on a CPU: exact but slower than float32)
PREFERENCE: dict[str, tuple[str, ...]] = {"cpu": ("onednn",), "cuda": ("int_mm",)}


def worst_case(device: torch.device | str = "cpu") -> tuple[torch.Tensor, torch.Tensor, int]:
    """Operands whose every product is 255 · (−128), with K = 576 terms (a 3×3 convolution over
    64 channels, ResNet-20's widest): a saturating int16 pair sum, or a lost bit, shows."""
    k = 576
    return (torch.full((32, k), 255, dtype=torch.uint8, device=device),
            torch.full((k, 16), -SHIFT, dtype=torch.int8, device=device), k)


@functools.lru_cache(maxsize=None)
def exact(name: str, device: str = "cpu") -> bool:
    """Whether backend `name` computes the worst-case products exactly on `device`."""
    try:
        a, b, k = worst_case(device)
        mm = KERNELS[name].mm(a, b)
        x = torch.full((2, 64, 4, 4), 255, dtype=torch.uint8, device=device)
        w = torch.full((8, 64, 3, 3), -SHIFT, dtype=torch.int8, device=device)
        conv = KERNELS[name].conv(x, w, (1, 1), (0, 0), (1, 1), 1)
    except (RuntimeError, NotImplementedError):  # op missing on this build or device
        return False
    return bool((mm.double() == 255.0 * -SHIFT * k).all()) and bool((conv.double() == 255.0 * -SHIFT * 576).all())


def cpu_isa() -> str:
    return torch.backends.cpu.get_cpu_capability()


_CHOSEN: dict[str, tuple[str | None, str]] = {}  # device -> backend_for's answer, once probed


def backend_for(device: torch.device | str) -> tuple[str | None, str]:
    """(the fastest exact backend on `device`, or None; why, in a few words), probed once per device."""
    key = str(torch.device(device))
    if key not in _CHOSEN:
        kind = torch.device(device).type
        name = next((n for n in PREFERENCE.get(kind, ()) if exact(n, key)), None)
        why = (f"{name} on {kind}" if name else
               f"no exact int8 kernel on this CPU (ISA {cpu_isa()}: oneDNN's int8 products need VNNI to be exact)"
               if kind == "cpu" else f"no exact int8 kernel on {kind}")
        _CHOSEN[key] = (name, why)
    return _CHOSEN[key]


def chosen(device: torch.device | str) -> tuple[str | None, str] | None:
    """backend_for's answer if `device` was probed already, else None (a compiled trace reads this:
    running the probe inside a trace would break the graph)."""
    return _CHOSEN.get(str(torch.device(device)))
