r"""8-bit convolutions and linears as exact integer arithmetic (`int8_arithmetic: integer`; the
paper's "GEMMLOWP integer quantization", Sec. 3). Same results as fake quantization in float32
(`layers._BifurcatedConv`) up to float rounding.

Every 8-bit operand is on an affine grid, v = s·q + m with q ∈ {0..255} (`grid`). Writing the
weight as Q(W) = s_w·w + m'_w with w = q_w − 128 ∈ int8 and m'_w = m_w + 128·s_w, the product
of two quantized operands splits into one integer product and terms of sums:

.. math::
    \mathrm{conv}(Q(x), Q(W)) = s_x s_w\,\mathrm{conv}(q_x, w) + s_x m'_w\,\mathrm{conv}(q_x, 1)
        + m_x\,\mathrm{conv}(\mathbb{1}, Q(W))

where conv(q_x, w) is exact (int32, `int8_kernels`), conv(q_x, 1) sums q_x over each window and
the group's channels (integers below 2^24, exact in float32), and 𝟙 is 1 on the input and 0 on
the padding border (the padded zeros are not on x's grid: m_x·𝟙 puts the offset only where x is).
The layer gradient (backward-data) is the same algebra on the transposed convolution, with the
8-bit gradient Q(g_y) = s_g q_g + m_g on its own range:

.. math::
    g_x = s_g s_w\,\mathrm{conv}^\top(q_g, w) + s_g m'_w\,\mathrm{conv}^\top(q_g, 1)
        + m_g\,\mathrm{conv}^\top(\mathbb{1}_y, Q(W))

and the weight gradient stays float32 (gradient bifurcation): g_W = ∂y/∂W^⊤ g_y with the float g_y.
A linear layer is the 1×1 case (sums over its input features). The grids are read back from the
quantized tensors (q = round((v − m)/s)), so ranges, stochastic rounding and the STE are those of
the fake path, unchanged.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .int8_kernels import KERNELS, SHIFT
from .quantizer import quant_scale

LEVELS = 255


def grid(v: torch.Tensor, m: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """q ∈ {0..255} (uint8) with v = s·q + m up to float rounding."""
    return torch.round((v - m) / s).clamp_(0, LEVELS).to(torch.uint8)


def own_grid(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, s, m) of a tensor quantized over its own range: its minimum is on the grid (q = 0)."""
    lo, hi = torch.aminmax(v)
    s = quant_scale(lo, hi, 8)
    return grid(v, lo, s), s, lo


def _weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q(W) = s_w·w8 + m'_w: (w8 int8, s_w, m'_w)."""
    q, s, m = own_grid(w)
    return (q.to(torch.int16) - SHIFT).to(torch.int8), s, m + SHIFT * s


def _per_group(t: torch.Tensor, groups: int, dim: int = 1) -> torch.Tensor:
    """Sum of t's channels within each of `groups` groups (float32; integer-valued stays exact)."""
    shape = t.shape
    return t.float().reshape(*shape[:dim], groups, shape[dim] // groups, *shape[dim + 1:]).sum(dim + 1)


def _expand(t: torch.Tensor, groups: int, channels: int) -> torch.Tensor:
    """(B, G, ...) -> (B, channels, ...): each group's value on its channels."""
    return t.repeat_interleave(channels // groups, dim=1) if groups > 1 else t.expand(-1, channels, *t.shape[2:])


def conv2d(backend: str, x: torch.Tensor, m_x: torch.Tensor, s_x: torch.Tensor, w: torch.Tensor,
           b: torch.Tensor | None, stride, padding, dilation, groups: int) -> torch.Tensor:
    """conv2d(x, w, b) of an 8-bit x on grid (m_x, s_x) and own-range 8-bit w and b."""
    kernel = KERNELS[backend]
    m_x, s_x = m_x.reshape(()), s_x.reshape(())  # one range (kept at x's rank by QuantMeasure)
    q_x = grid(x, m_x, s_x)
    w8, s_w, m_w = _weight(w)
    o, _, kh, kw = w.shape
    acc = kernel.conv(q_x, w8, stride, padding, dilation, groups).float()
    ones = torch.ones(groups, 1, kh, kw, device=x.device)
    box = F.conv2d(_per_group(q_x, groups), ones, None, stride, padding, dilation, groups)  # conv(q_x, 1)
    mask = torch.ones(1, 1, *x.shape[2:], device=x.device)
    border = F.conv2d(mask, w.sum(1, keepdim=True), None, stride, padding, dilation)  # conv(𝟙, Q(W))
    y = (s_x * s_w) * acc + (s_x * m_w) * _expand(box, groups, o) + m_x * border
    return y if b is None else y + b.view(1, -1, 1, 1)


def _transposed_input(t: torch.Tensor, in_hw, kernel_hw, stride, padding, dilation) -> torch.Tensor:
    """t (B, O, H', W') laid out so that a stride-1 convolution with the flipped, transposed weight
    is conv's input gradient: zeros between t's entries (stride), then each border padded (or
    cropped) to d(k − 1) − p, and the far side by what the input size needs."""
    b, o, ho, wo = t.shape
    sh, sw = stride
    if (sh, sw) != (1, 1):
        z = t.new_zeros(b, o, (ho - 1) * sh + 1, (wo - 1) * sw + 1)
        z[:, :, ::sh, ::sw] = t
        t = z
    pads = []
    for size, k, p, d, full in reversed(list(zip(t.shape[2:], kernel_hw, padding, dilation, in_hw))):
        lead = d * (k - 1) - p
        pads += [lead, full + d * (k - 1) - size - lead]
    return F.pad(t, pads)


def _flip_t(w: torch.Tensor, groups: int) -> torch.Tensor:
    """(O, C/G, kh, kw) -> (C, O/G, kh, kw), spatially flipped: the transposed convolution's weight."""
    o, cg, kh, kw = w.shape
    per_group = w.flip(2, 3).reshape(groups, o // groups, cg, kh, kw).transpose(1, 2)
    return per_group.reshape(groups * cg, o // groups, kh, kw)


def conv2d_input_grad(backend: str, g: torch.Tensor, w: torch.Tensor, in_shape, stride, padding, dilation,
                      groups: int) -> torch.Tensor:
    """conv2d's input gradient for an own-range 8-bit g and w: conv^T(Q(g), Q(W))."""
    q_g, s_g, m_g = own_grid(g)
    w8, s_w, m_w = _weight(w)
    c, kw_ = in_shape[1], tuple(w.shape[2:])
    kh, kw = kw_
    spread = _transposed_input(q_g, in_shape[2:], kw_, stride, padding, dilation)
    acc = KERNELS[backend].conv(spread, _flip_t(w8, groups), (1, 1), (0, 0), dilation, groups).float()
    ones = torch.ones(groups, 1, kh, kw, device=g.device)
    box = F.conv2d(_transposed_input(_per_group(q_g, groups), in_shape[2:], kw_, stride, padding, dilation),
                   ones, None, 1, 0, dilation, groups)                                 # conv^T(q_g, 1)
    ones_y = torch.ones(1, 1, *g.shape[2:], device=g.device)
    wsum = _flip_t(w, groups).sum(1, keepdim=True)                                     # (C, 1, kh, kw)
    border = F.conv2d(_transposed_input(ones_y, in_shape[2:], kw_, stride, padding, dilation), wsum, None,
                      1, 0, dilation)                                                  # conv^T(𝟙_y, Q(W))
    return (s_g * s_w) * acc + (s_g * m_w) * _expand(box, groups, c) + m_g * border


def linear(backend: str, x: torch.Tensor, m_x: torch.Tensor, s_x: torch.Tensor, w: torch.Tensor,
           b: torch.Tensor | None) -> torch.Tensor:
    """x @ w^T + b of an 8-bit x (…, K) on grid (m_x, s_x) and own-range 8-bit w (O, K) and b."""
    m_x, s_x = m_x.reshape(()), s_x.reshape(())  # one range (kept at x's rank by QuantMeasure)
    q_x = grid(x.reshape(-1, x.shape[-1]), m_x, s_x)
    w8, s_w, m_w = _weight(w)
    acc = KERNELS[backend].mm(q_x, w8.t()).float()
    y = (s_x * s_w) * acc + (s_x * m_w) * q_x.sum(1, keepdim=True, dtype=torch.float32) + m_x * w.sum(1)
    y = y.view(*x.shape[:-1], w.shape[0])
    return y if b is None else y + b


def linear_input_grad(backend: str, g: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Q(g) @ Q(W) for an own-range 8-bit g (…, O) and w (O, K)."""
    q_g, s_g, m_g = own_grid(g.reshape(-1, g.shape[-1]))
    w8, s_w, m_w = _weight(w)
    acc = KERNELS[backend].mm(q_g, w8).float()
    gx = (s_g * s_w) * acc + (s_g * m_w) * q_g.sum(1, keepdim=True, dtype=torch.float32) + m_g * w.sum(0)
    return gx.view(*g.shape[:-1], w.shape[1])

