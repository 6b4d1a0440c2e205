r"""Range EvoNorm's arithmetic as one autograd node with a hand-written backward.

Same formula as :class:`~lpdl_core.quant.norms.RangeEvoNorm` (hard-sigmoid gate):

.. math::
    t = x v,\quad h = \mathrm{clamp}(t/6 + 1/2, 0, 1),\quad n = x h,\quad
    r_{b,g} = \overline{\max}_k - \overline{\min}_k,\quad s = \frac{1}{c\,r + \epsilon},\quad
    y = n\,Q(s)\,w + \beta

with Q the per-tensor 8-bit nearest quantizer (straight-through) or the identity. The composed
version records about 20 autograd nodes per layer; on a CPU their per-op overhead, not the
arithmetic, dominated the small models' 8-bit step. The backward below is the chain rule of the
same ops, with the same tie rule as autograd: the max/min gradient goes to the element `max(-1)`
returned, and clamp passes gradient on its closed interval [0, 1].

.. math::
    \bar g = g\,w\,Q(s),\quad
    \frac{\partial L}{\partial s_{b,g}} = \sum_{i\in(b,g)} g_i w_i n_i,\quad
    \frac{\partial L}{\partial r} = -c\,s^2\,\frac{\partial L}{\partial s},\quad
    \frac{\partial L}{\partial x} = \bar g\,(h + t\,h') + \text{scatter}_{\arg\max}\!\Big(\tfrac{1}{K}\tfrac{\partial L}{\partial r}\Big)
        - \text{scatter}_{\arg\min}\!\Big(\tfrac{1}{K}\tfrac{\partial L}{\partial r}\Big)

with h' = 1/6 on the clamp's linear part, and ∂L/∂v = Σ ḡ x² h', ∂L/∂w = Σ g n Q(s), ∂L/∂β = Σ g.
"""
from __future__ import annotations

import torch

from .quantizer import eager_apply, fake_quant


def _scale_groups(a: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """a (B, C, H, W) times s (B, G), one factor per sample and channel group."""
    B, G = s.shape
    return (a.reshape(B, G, -1) * s.unsqueeze(-1)).reshape(a.shape)


class _RangeEvoNormFn(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x, v, w, b, groups: int, chunks: int, c: float, eps: float, bits: int):
        B = x.shape[0]
        t = x * v
        h = torch.clamp(t / 6 + 0.5, min=0.0, max=1.0)
        y = x.reshape(B, groups, chunks, -1)
        mx, imx = y.max(-1)
        mn, imn = y.min(-1)
        r = mx.mean(-1) - mn.mean(-1)                                      # (B, G)
        s = 1 / (r * c + eps)
        sq = fake_quant(s, bits) if bits else s
        n = x * h
        return _scale_groups(n, sq) * w + b, s, sq, imx, imn

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        x, v, w, _b, groups, chunks, c, _eps, _bits = inputs
        _, s, sq, imx, imn = output
        ctx.save_for_backward(x, v, w, s, sq, imx, imn)
        ctx.groups, ctx.chunks, ctx.c = groups, chunks, c
        ctx.mark_non_differentiable(s, sq, imx, imn)

    @staticmethod
    def backward(ctx, g, *_unused):
        x, v, w, s, sq, imx, imn = ctx.saved_tensors
        G, K = ctx.groups, ctx.chunks
        B, C, H, W = x.shape
        t = x * v
        u = t / 6 + 0.5
        h = torch.clamp(u, min=0.0, max=1.0)
        n = x * h
        gw_n = g * w                                                       # dL/d(n·sq)
        gs = (gw_n * n).reshape(B, G, -1).sum(-1)                          # dL/dsq = dL/ds (STE)
        gr = gs * (-ctx.c) * s * s / K                                     # per chunk max/min
        gn = _scale_groups(gw_n, sq)
        hp = ((u >= 0) & (u <= 1)).to(x.dtype) / 6
        gt = gn * x * hp                                                   # dL/dt
        gx = gn * h + gt * v
        grid = torch.zeros_like(x).reshape(B, G, K, -1)
        grid = grid.scatter_add(-1, imx.unsqueeze(-1), gr.unsqueeze(-1).expand(B, G, K).unsqueeze(-1))
        grid = grid.scatter_add(-1, imn.unsqueeze(-1), -gr.unsqueeze(-1).expand(B, G, K).unsqueeze(-1))
        gx = gx + grid.reshape(B, C, H, W)
        dims = (0, 2, 3)
        gv = (gt * x).sum(dims, keepdim=True)
        gwt = (g * _scale_groups(n, sq)).sum(dims, keepdim=True)
        return gx, gv, gwt, g.sum(dims, keepdim=True), None, None, None, None, None


_apply = eager_apply(_RangeEvoNormFn)


def range_evonorm(x: torch.Tensor, v: torch.Tensor, w: torch.Tensor, b: torch.Tensor, *, groups: int,
                  chunks: int, c: float, eps: float, bits: int = 0) -> torch.Tensor:
    """y = x·h(v·x)·Q(s)·w + b in one autograd node (bits=0: s unquantized). Parameters (1, C, 1, 1)."""
    return _apply(x, v, w, b, groups, chunks, c, eps, bits)[0]
