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
A linear layer is the 1×1 case (sums over its input features). The eager layers hand over the
grid levels q themselves (`QuantMeasure.levels`, `quantizer.own_range_levels`: the fake path's
ranges, noise and rounding, stopped before dequantizing); the compiled step's form reads them back
from the quantized tensors (q = round((v − m)/s), `conv2d`, `own_grid`). Either way the ranges,
stochastic rounding and the STE are those of the fake path, unchanged.

Speed (`_window_sums`, `_combined`): the kernel's output is read once, by the pass that scales
it and writes the standard layout, and the other terms are added in place;
n nodes run as one grouped product (`nodes`), as the batched executor's vmap rule calls them.
Channel sums over uint8 run in int16 where they fit (`_per_group`); a layer computes W's grid
once a step (`weight_grid`, its forward's, reused by its backward).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from .int8_kernels import KERNELS, SHIFT
from .quantizer import quant_scale

LEVELS = 255


def grid(v: torch.Tensor, m: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """q ∈ {0..255} (uint8) with v = s·q + m up to float rounding (one temporary, then in place)."""
    return _levels(v, m, s).to(torch.uint8)


def _levels(v: torch.Tensor, m: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """round(clamp((v − m)/s, 0, 255)) in float32 (integers, exact): the grid arithmetic of `grid`
    and `weight_grid`."""
    return torch.sub(v, m).div_(s).round_().clamp_(0, LEVELS)


def _block_ranges(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(minimum, step) of each row of blocks (k, ·): k tensors each on its own 8-bit range."""
    lo, hi = torch.aminmax(blocks, dim=1)
    return lo, quant_scale(lo, hi, 8)


def own_grid(v: torch.Tensor, nodes: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, s, m) of a tensor quantized over its own range: its minimum is on the grid (q = 0).
    nodes > 1: v's channels (dim 1) are `nodes` blocks, each over its own range; s, m (nodes,)."""
    if nodes == 1:
        lo, s = _block_ranges(v.reshape(1, -1))
        return grid(v, lo.reshape(()), s.reshape(())), s, lo
    lo, s = _block_ranges(v.unflatten(1, (nodes, -1)).transpose(0, 1).reshape(nodes, -1))
    return grid(v, _by_channel(lo, nodes, v.shape[1]), _by_channel(s, nodes, v.shape[1])), s, lo


def weight_grid(w: torch.Tensor, nodes: int = 1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Q(W) = s_w·w8 + m'_w, each of w's `nodes` blocks (along dim 0) over its own range:
    (w8 int8, s_w (nodes,), m'_w (nodes,)). A layer's forward computes it once and hands it to its
    backward (`wq` of the products below); the levels q − 128 are exact in float32."""
    rows = w.reshape(nodes, -1)
    lo, s = _block_ranges(rows)
    w8 = _levels(rows, lo[:, None], s[:, None]).sub_(SHIFT).to(torch.int8)
    return w8.view_as(w), s, lo + SHIFT * s


def _by_channel(v: torch.Tensor, nodes: int, channels: int) -> torch.Tensor:
    """One value per node (nodes,) as one per channel, (1, channels, 1, 1): node i's on block i
    (one node: the value as (1, 1, 1, 1), broadcast)."""
    if nodes == 1:
        return v.reshape(1, 1, 1, 1)
    return v.reshape(nodes, 1).expand(nodes, channels // nodes).reshape(1, channels, 1, 1)


def _per_group(t: torch.Tensor, groups: int, dim: int = 1) -> torch.Tensor:
    """Sum of uint8 t's channels within each of `groups` groups, as float32 (exact: integers below
    2^24). Summed in int16 where a group's sum fits (at most 128 channels of 255), else int32: a
    float32 sum converts t first, several times slower here."""
    shape = t.shape
    per = shape[dim] // groups
    acc = torch.int16 if per * LEVELS <= torch.iinfo(torch.int16).max else torch.int32
    return t.reshape(*shape[:dim], groups, per, *shape[dim + 1:]).sum(dim + 1, dtype=acc).to(torch.float32)


def _ones(hw: tuple[int, int], device: torch.device) -> torch.Tensor:
    """𝟙 of one sample and channel, (1, 1, h, w): the border terms' input, only read. Made once per
    size on a CPU; elsewhere made afresh (a tensor kept from a CUDA graph's capture would live in
    memory the graph reuses)."""
    return _cpu_ones(hw) if device.type == "cpu" else torch.ones(1, 1, *hw, device=device)


@functools.lru_cache(maxsize=64)
def _cpu_ones(hw: tuple[int, int]) -> torch.Tensor:
    return torch.ones(1, 1, *hw)


def _window_sums(t: torch.Tensor, kernel_hw, stride, padding, dilation) -> torch.Tensor:
    """Each channel of t summed over every window of a (zero-padded) convolution: conv(t, 1)
    channel by channel. Undilated, as running sums of shifted slices, rows then columns, on
    planes of 16×16 and more (summing pooling took several times as long there; a one-channel
    convolution runs slowly here); integer-valued sums below 2^24 are exact in any order."""
    if tuple(dilation) != (1, 1):
        ones = t.new_ones(t.shape[1], 1, *kernel_hw)
        return F.conv2d(t, ones, None, stride, padding, dilation, t.shape[1])
    (kh, kw), (ph, pw) = kernel_hw, padding
    if t.shape[-2] * t.shape[-1] < 256 and 2 * ph <= kh and 2 * pw <= kw:
        return F.avg_pool2d(t, kernel_hw, stride, padding, count_include_pad=True, divisor_override=1)
    x = F.pad(t, (pw, pw, ph, ph))
    ho, wo = x.shape[-2] - kh + 1, x.shape[-1] - kw + 1
    rows = x[..., :ho, :].clone()
    for i in range(1, kh):
        rows += x[..., i:i + ho, :]
    out = rows[..., :wo].clone()
    for j in range(1, kw):
        out += rows[..., j:j + wo]
    return out[..., ::stride[0], ::stride[1]]


def _combined(acc: torch.Tensor, s: torch.Tensor, box: torch.Tensor, c_box: torch.Tensor,
              offset: torch.Tensor, groups: int) -> torch.Tensor:
    """s·acc + c_box·box + offset, summed in that order, as a fresh float32 tensor in the standard
    (contiguous) layout: acc is the kernel's output (oneDNN writes it channels last), read once by
    the product s·acc, which writes the standard layout (the in-place sums after it, and the
    layers after, run faster on one layout); s per channel (1, O, 1, 1); box (B, G, H, W), times
    c_box per group (1, G, 1, 1), adds each group's window sums to that group's channels; offset
    (1, O, H, W) adds to every sample."""
    out = torch.mul(acc.to(torch.float32), s, out=torch.empty(acc.shape, dtype=torch.float32, device=acc.device))
    out.unflatten(1, (groups, -1)).add_(box.mul_(c_box).unsqueeze(2))
    return out.add_(offset)


def conv2d(backend: str, x: torch.Tensor, m_x: torch.Tensor, s_x: torch.Tensor, w: torch.Tensor,
           b: torch.Tensor | None, stride, padding, dilation, groups: int, nodes: int = 1) -> torch.Tensor:
    """conv2d(x, w, b) of an 8-bit x on grid (m_x, s_x) and own-range 8-bit w and b (`nodes`
    blocks as in `conv2d_on_grid`, node i's x on grid m_x[i], s_x[i])."""
    m_x, s_x = m_x.reshape(nodes), s_x.reshape(nodes)
    c = x.shape[1]
    q_x = grid(x, _by_channel(m_x, nodes, c), _by_channel(s_x, nodes, c))
    return conv2d_on_grid(backend, q_x, m_x, s_x, w, b, stride, padding, dilation, groups, nodes)


def conv2d_on_grid(backend: str, q_x: torch.Tensor, m_x: torch.Tensor, s_x: torch.Tensor, w: torch.Tensor,
                   b: torch.Tensor | None, stride, padding, dilation, groups: int, nodes: int = 1,
                   wq: tuple | None = None) -> torch.Tensor:
    """conv2d(Q(x), w, b) given x's grid levels q_x (uint8), Q(x) = s_x·q_x + m_x; wq: w's
    `weight_grid`, if already computed.

    nodes > 1: `nodes` nodes' convolutions as one grouped convolution (the vmap rule's form):
    node i holds block i of q_x's channels (its grid m_x[i], s_x[i]), of w's output channels (its
    own range) and of the `groups` groups."""
    m_x, s_x = m_x.reshape(nodes), s_x.reshape(nodes)
    w8, s_w, m_w = wq or weight_grid(w, nodes)
    o = w.shape[0]
    acc = KERNELS[backend].conv(q_x, w8, stride, padding, dilation, groups)
    box = _window_sums(_per_group(q_x, groups), w.shape[2:], stride, padding, dilation)  # conv(q_x, 1)
    mask = _ones(tuple(q_x.shape[2:]), q_x.device)
    border = F.conv2d(mask, w.sum(1, keepdim=True), None, stride, padding, dilation)  # conv(𝟙, Q(W))
    offset = border.mul_(_by_channel(m_x, nodes, o))
    if b is not None:
        offset.add_(b.view(1, -1, 1, 1))
    return _combined(acc, _by_channel(s_x * s_w, nodes, o), box, _by_channel(s_x * m_w, nodes, groups), offset, groups)


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


def _laid_out(t: torch.Tensor, in_hw, kernel_hw, stride, padding, dilation):
    """(t', p'): the input gradient is a stride-1 convolution of t' padded by p'. At stride 1 the
    layout only pads each border by d(k − 1) − p on both sides, so t' = t and the convolution pads
    (no copy); otherwise t' = `_transposed_input` and p' = 0."""
    leads = tuple(d * (k - 1) - p for k, p, d in zip(kernel_hw, padding, dilation))
    if tuple(stride) == (1, 1) and min(leads) >= 0:
        return t, leads
    return _transposed_input(t, in_hw, kernel_hw, stride, padding, dilation), (0, 0)


def _flip_t(w: torch.Tensor, groups: int) -> torch.Tensor:
    """(O, C/G, kh, kw) -> (C, O/G, kh, kw), spatially flipped: the transposed convolution's weight."""
    o, cg, kh, kw = w.shape
    per_group = w.flip(2, 3).reshape(groups, o // groups, cg, kh, kw).transpose(1, 2)
    return per_group.reshape(groups * cg, o // groups, kh, kw)


def conv2d_input_grad(backend: str, g: torch.Tensor, w: torch.Tensor, in_shape, stride, padding, dilation,
                      groups: int, nodes: int = 1) -> torch.Tensor:
    """conv2d's input gradient for an own-range 8-bit g and w: conv^T(Q(g), Q(W)) (`nodes` blocks
    as in `conv2d_on_grid`, each node's g over its own range)."""
    q_g, s_g, m_g = own_grid(g, nodes)
    return conv2d_input_grad_on_grid(backend, q_g, m_g, s_g, w, in_shape, stride, padding, dilation, groups,
                                      nodes)


def conv2d_input_grad_on_grid(backend: str, q_g: torch.Tensor, m_g: torch.Tensor, s_g: torch.Tensor,
                              w: torch.Tensor, in_shape, stride, padding, dilation, groups: int,
                              nodes: int = 1, wq: tuple | None = None) -> torch.Tensor:
    """conv^T(Q(g), Q(W)) given g's grid levels q_g (uint8), Q(g) = s_g·q_g + m_g; `nodes` blocks
    as in `conv2d_on_grid` (in_shape: all nodes' input, its channels in node blocks); wq as there."""
    m_g, s_g = m_g.reshape(nodes), s_g.reshape(nodes)
    w8, s_w, m_w = wq or weight_grid(w, nodes)
    c, kw_ = in_shape[1], tuple(w.shape[2:])
    lay = (in_shape[2:], kw_, stride, padding, dilation)
    spread, pad = _laid_out(q_g, *lay)
    acc = KERNELS[backend].conv(spread, _flip_t(w8, groups), (1, 1), pad, dilation, groups)
    sums, pad = _laid_out(_per_group(q_g, groups), *lay)
    box = _window_sums(sums, kw_, (1, 1), pad, dilation)                               # conv^T(q_g, 1)
    ones_y, pad = _laid_out(_ones(tuple(q_g.shape[2:]), q_g.device), *lay)
    wsum = _flip_t(w, groups).sum(1, keepdim=True)                                     # (C, 1, kh, kw)
    border = F.conv2d(ones_y, wsum, None, 1, pad, dilation)                           # conv^T(𝟙_y, Q(W))
    return _combined(acc, _by_channel(s_g * s_w, nodes, c), box, _by_channel(s_g * m_w, nodes, groups),
                     border.mul_(_by_channel(m_g, nodes, c)), groups)


def linear(backend: str, x: torch.Tensor, m_x: torch.Tensor, s_x: torch.Tensor, w: torch.Tensor,
           b: torch.Tensor | None) -> torch.Tensor:
    """x @ w^T + b of an 8-bit x (…, K) on grid (m_x, s_x) and own-range 8-bit w (O, K) and b."""
    m_x, s_x = m_x.reshape(()), s_x.reshape(())  # one range (kept at x's rank by QuantMeasure)
    return linear_on_grid(backend, grid(x, m_x, s_x), m_x, s_x, w, b)


def linear_on_grid(backend: str, q_x: torch.Tensor, m_x: torch.Tensor, s_x: torch.Tensor, w: torch.Tensor,
                   b: torch.Tensor | None, wq: tuple | None = None) -> torch.Tensor:
    """Q(x) @ w^T + b given x's grid levels q_x (uint8, (…, K)), Q(x) = s_x·q_x + m_x; wq as in
    `conv2d_on_grid`."""
    m_x, s_x = m_x.reshape(()), s_x.reshape(())
    q2 = q_x.reshape(-1, q_x.shape[-1])
    w8, s_w, m_w = wq or weight_grid(w)
    acc = KERNELS[backend].mm(q2, w8.t()).float()
    y = (s_x * s_w) * acc + (s_x * m_w) * q2.sum(1, keepdim=True, dtype=torch.float32) + m_x * w.sum(1)
    y = y.view(*q_x.shape[:-1], w.shape[0])
    return y if b is None else y + b


def linear_input_grad(backend: str, g: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Q(g) @ Q(W) for an own-range 8-bit g (…, O) and w (O, K)."""
    q_g, s_g, m_g = own_grid(g)
    return linear_input_grad_on_grid(backend, q_g, m_g, s_g, w)


def linear_input_grad_on_grid(backend: str, q_g: torch.Tensor, m_g: torch.Tensor, s_g: torch.Tensor,
                              w: torch.Tensor, wq: tuple | None = None) -> torch.Tensor:
    """Q(g) @ Q(W) given g's grid levels q_g (uint8, (…, O)), Q(g) = s_g·q_g + m_g; wq as in
    `conv2d_on_grid`."""
    m_g, s_g = m_g.reshape(()), s_g.reshape(())
    q2 = q_g.reshape(-1, q_g.shape[-1])
    w8, s_w, m_w = wq or weight_grid(w)
    acc = KERNELS[backend].mm(q2, w8).float()
    gx = (s_g * s_w) * acc + (s_g * m_w) * q2.sum(1, keepdim=True, dtype=torch.float32) + m_g * w.sum(0)
    return gx.view(*q_g.shape[:-1], w.shape[1])
