r"""Range EvoNorm's arithmetic as one autograd node with a hand-written backward.

Same formula as :class:`~lpdl_core.quant.norms.RangeEvoNorm` (hard-sigmoid gate):

.. math::
    t = x v,\quad u = t/6 + 1/2,\quad h = \mathrm{clamp}(u, 0, 1),\quad n = x h,\quad
    r_{b,g} = \overline{\max}_k - \overline{\min}_k,\quad s = \frac{1}{c\,r + \epsilon},\quad
    y = n\,\big(Q(s)\otimes w\big) + \beta

with Q the per-tensor 8-bit nearest quantizer (straight-through) or the identity, and
(Q(s) ⊗ w)_{b,c} = Q(s)_{b,g(c)} w_c one factor per sample and channel. The composed version
records about 20 autograd nodes per layer; on a CPU their per-op overhead and memory passes, not
the arithmetic, dominated the small models' 8-bit step. The backward below is the chain rule of
the same ops in 13 passes over the activation, with autograd's rules at the edges: the max/min
gradient goes to the element `max(-1)`/`min(-1)` returned (the first on ties), and clamp passes
gradient on its closed interval u ∈ [0, 1]. Where the caller hands over x's 8-bit grid levels
(`order`), those first indices come from `first_extremes`, several times faster than max/min with
indices and the same elements.

.. math::
    \bar g = g\,(Q(s)\otimes w),\quad
    \frac{\partial L}{\partial t} = \tfrac16\,\bar g\,x\,[0 \le u \le 1],\quad
    P_{b,c} = \sum_{hw} g\,n,\quad
    \frac{\partial L}{\partial s_{b,g}} = \sum_{c\in g} P_{b,c}\,w_c,\quad
    \frac{\partial L}{\partial w_c} = \sum_b P_{b,c}\,Q(s)_{b,g(c)},\quad
    \frac{\partial L}{\partial r} = -c\,s^2\,\frac{\partial L}{\partial s}

.. math::
    \frac{\partial L}{\partial x} = \bar g\,h + \frac{\partial L}{\partial t}\,v
        + \text{scatter}_{\arg\max}\!\Big(\tfrac{1}{K}\tfrac{\partial L}{\partial r}\Big)
        - \text{scatter}_{\arg\min}\!\Big(\tfrac{1}{K}\tfrac{\partial L}{\partial r}\Big),\quad
    \frac{\partial L}{\partial v} = \sum \frac{\partial L}{\partial t}\,x,\quad
    \frac{\partial L}{\partial \beta} = \sum g
"""
from __future__ import annotations

import torch

from . import traced
from .quantizer import eager_apply, functorch_wrapped, own_range_quant

# hardtanh_backward(g, u, lo, hi) keeps g where lo < u < hi. With lo just below 0 and hi the
# float32 successor of 1 that is exactly clamp's closed interval 0 <= u <= 1: u = fl(t/6) + 0.5
# is either 0 or at least 2^-26 in magnitude (Sterbenz: the sum near 0 is exact), so no u lies
# in [lo, 0).
_LO, _HI = -1e-30, 1.0000001192092896


def group_scale(sq: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """(sq ⊗ w): sq (B, G) per sample and group, w (1, C, 1, 1) per channel -> (B, C, 1, 1)."""
    B, G = sq.shape
    C = w.shape[1]
    return (sq.unsqueeze(-1) * w.reshape(1, G, C // G)).reshape(B, C, 1, 1)


def level_dtype(m: int, bits: int = 8) -> torch.dtype | None:
    """The integer type that holds `first_extremes`' keys for chunks of m levels of `bits` bits
    (q·2^P + i with 2^P ≥ m): at 8 bits int16 up to m = 128, int32 up to 2^23; None above."""
    p = _position_bits(m)
    return torch.int16 if bits + p <= 15 else torch.int32 if bits + p <= 31 else None


def _position_bits(m: int) -> int:
    """P, the key's low bits that hold a position 0..m − 1."""
    return max(1, (m - 1).bit_length())


# Below this many elements a call's max/min with indices cost less than the keys' dozen small
# operators (about equal near 32K elements a call on a 2-core EPYC; the mini stand-ins have 8K).
ORDER_MIN_NUMEL = 2 ** 16


def reads_order(x: torch.Tensor) -> bool:
    """Whether `range_evonorm` of x reads `order`: on a CPU (on a GPU max/min with indices are
    fast, and checking the levels' grid would wait for the device), for x of at least
    ORDER_MIN_NUMEL elements, when it builds its node with the eager backward (gradients on, no
    torch.func transform, no compiled trace)."""
    return (x.device.type == "cpu" and x.numel() >= ORDER_MIN_NUMEL and torch.is_grad_enabled()
            and not functorch_wrapped(x) and not traced.active())


def first_extremes(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    r"""(argmax, argmin) over the last dim of levels q (..., m) held in `level_dtype(m, bits)`,
    each the first index on ties, as max(-1) and min(-1) return them:

    .. math::
        \arg\max_i q_i = 2^P - 1 - \big(\max_i k_i \bmod 2^P\big),\ k_i = q_i 2^P + (2^P - 1 - i);\qquad
        \arg\min_i q_i = \big(\min_i k'_i\big) \bmod 2^P,\ k'_i = q_i 2^P + i

    (the larger, resp. smaller q wins, then the smaller i). One vectorized amax/amin over the
    keys: max/min with indices track the index element by element, several times slower here.
    Rows of 32 or fewer reduce across rows (transposed), which vectorizes better."""
    m = q.shape[-1]
    p = _position_bits(m)
    low = (1 << p) - 1
    across = m <= 32
    rows = q.reshape(-1, m)
    k = (rows.t().contiguous() if across else rows).bitwise_left_shift(p)
    i = torch.arange(m, dtype=k.dtype, device=k.device)
    dim = 0 if across else 1
    i = i.unsqueeze(1) if across else i
    kmax = (k + (low - i)).amax(dim)
    kmin = k.add_(i).amin(dim)
    return ((low - (kmax & low)).long().view(q.shape[:-1]), (kmin & low).long().view(q.shape[:-1]))


def _forward(x, v, w, b, groups: int, chunks: int, c: float, eps: float, bits: int, order=None, *,
             indices: bool):
    """(y, s, Q(s), u, argmax, argmin); without indices (no backward to come) the chunk extremes
    come from amax/amin, several times faster than max/min with indices, and y is identical.
    order: x's grid levels (`first_extremes`' integers), in x's float order, or None."""
    B = x.shape[0]
    u = (x * v).div_(6).add_(0.5)                                          # t/6 + 1/2
    y = x.reshape(B, groups, chunks, -1)
    if indices and order is not None:
        imx, imn = first_extremes(order.reshape(y.shape))
        mx, mn = y.gather(-1, imx.unsqueeze(-1)).squeeze(-1), y.gather(-1, imn.unsqueeze(-1)).squeeze(-1)
    elif indices:
        (mx, imx), (mn, imn) = y.max(-1), y.min(-1)
    else:
        mx, mn, imx, imn = y.amax(-1), y.amin(-1), None, None
    r = mx.mean(-1) - mn.mean(-1)                                          # (B, G)
    s = 1 / (r * c + eps)
    sq = own_range_quant(s, bits, "nearest") if bits else s
    n = u.clamp(0.0, 1.0).mul_(x)                                          # x h
    return n.mul_(group_scale(sq, w)).add_(b), s, sq, u, imx, imn


class _RangeEvoNormFn(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x, v, w, b, groups: int, chunks: int, c: float, eps: float, bits: int, order):
        return _forward(x, v, w, b, groups, chunks, c, eps, bits, order, indices=True)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, v, w, _b, groups, chunks, c, _eps, _bits, _order = inputs
        _, s, sq, u, imx, imn = output
        ctx.save_for_backward(x, v, w, s, sq, u, imx, imn)
        ctx.groups, ctx.chunks, ctx.c = groups, chunks, c
        ctx.mark_non_differentiable(s, sq, u, imx, imn)
        ctx.set_materialize_grads(False)  # else autograd allocates a zero gradient for u each step

    @staticmethod
    def backward(ctx, g, *_unused):
        x, v, w, s, sq, u, imx, imn = ctx.saved_tensors
        G, K = ctx.groups, ctx.chunks
        B, C = x.shape[:2]
        h = u.clamp(0.0, 1.0)
        gn = g * group_scale(sq, w)                                        # dL/dn
        gt = gn * x
        if functorch_wrapped(gt):  # vmap: out-of-place ops (no batching rules for the in-place ones)
            gt = torch.ops.aten.hardtanh_backward(gt, u, _LO, _HI).div_(6)  # dL/dt
            gx = torch.addcmul(gn.mul_(h), gt, v)
        else:                      # eager: in place, fewer fresh activation-sized buffers
            torch.ops.aten.hardtanh_backward.grad_input(gt, u, _LO, _HI, grad_input=gt).div_(6)
            gx = gn.mul_(h).addcmul_(gt, v)
        gv = gt.mul_(x).sum((0, 2, 3), keepdim=True)
        P = h.mul_(x).mul_(g).sum((2, 3))                                  # (B, C): sum g n
        gs = (P * w.reshape(1, C)).reshape(B, G, -1).sum(-1)               # dL/dsq = dL/ds (STE)
        gwt = (P.reshape(B, G, -1) * sq.unsqueeze(-1)).sum(0).reshape(w.shape)
        gr = (gs * (-ctx.c) * s * s / K).unsqueeze(-1).expand(B, G, K).unsqueeze(-1)
        gx = gx.contiguous()                                               # no-op for NCHW
        grid = gx.view(B, G, K, -1)
        grid.scatter_add_(-1, imx.unsqueeze(-1), gr)
        grid.scatter_add_(-1, imn.unsqueeze(-1), -gr)
        return gx, gv, gwt, g.sum((0, 2, 3), keepdim=True), None, None, None, None, None, None


_apply = eager_apply(_RangeEvoNormFn)


def _composed(x, v, w, b, groups: int, chunks: int, c: float, eps: float, bits: int):
    """`_forward`'s value with the same operations, out of place, for autograd (ties in max/min
    send the gradient to one element, as `_RangeEvoNormFn` does)."""
    B = x.shape[0]
    u = x * v / 6 + 0.5
    y = x.reshape(B, groups, chunks, -1)
    r = y.max(-1).values.mean(-1) - y.min(-1).values.mean(-1)
    s = 1 / (r * c + eps)
    sq = traced.quantize(s, bits, "nearest", None, None) if bits else s
    return u.clamp(0.0, 1.0) * x * group_scale(sq, w) + b


def range_evonorm(x: torch.Tensor, v: torch.Tensor, w: torch.Tensor, b: torch.Tensor, *, groups: int,
                  chunks: int, c: float, eps: float, bits: int = 0, order: torch.Tensor | None = None) -> torch.Tensor:
    """y = x·h(v·x)·(Q(s) ⊗ w) + b in one autograd node (bits=0: s unquantized). Parameters (1, C, 1, 1).
    order: x's grid levels, in `level_dtype` of the chunk size, where x = s_x·order + m_x has
    the order of its levels (`first_extremes`); None: x's max/min with indices.

    With no gradient to compute (evaluation), the same forward runs without the autograd node;
    under torch.compile (traced.active()), the same forward ops composed, differentiated by autograd."""
    if traced.active():
        return _composed(x, v, w, b, groups, chunks, c, eps, bits)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (x, v, w, b)):
        return _apply(x, v, w, b, groups, chunks, c, eps, bits, order)[0]
    return _forward(x, v, w, b, groups, chunks, c, eps, bits, indices=False)[0]
