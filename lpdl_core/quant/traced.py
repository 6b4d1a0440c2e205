r"""The 8-bit operators in a form `torch.compile(fullgraph=True)` can trace under `torch.func.vmap`.

TorchDynamo cannot trace a custom `torch.autograd.Function` inside a functorch transform, and the
eager 8-bit layers are built from four of them (the straight-through quantizer, the gradient
quantizer, the bifurcated convolution and linear layer, the fused Range EvoNorm). While a step
is being compiled (or inside `traced_ops()`, which tests use to run this form eagerly), the
layers use these instead, with the same values and the same gradients:

- **Straight-through Q.** :math:`\hat x = (x - \mathrm{sg}(x)) + \mathrm{sg}(Q(x))`, where sg stops
  the gradient. For finite x, x - x is exactly 0, so the value is Q(x) bitwise, and
  :math:`\partial \hat x / \partial x = 1`.
- **Gradient quantizer** `lpdl::quantize_grad`: a `torch.library` custom op, identity forward
  (a copy), whose registered backward is :math:`Q_{stoch}(g)`, one range per node. Its vmap rule
  moves the node dimension to the front and flags it, so the backward (which autograd runs
  outside vmap, on the stacked gradient) takes one range per node, as the eager vmapped
  `quantize_grad` does.
- **Bifurcation.** :math:`y = \mathrm{QG}(op(x, \mathrm{sg}(W), \mathrm{sg}(b))) + (c - \mathrm{sg}(c))`
  with :math:`c = op(\mathrm{sg}(x), W, b)`: the value is op(x, W, b) (c − c = 0), x receives
  :math:`\partial op^\top Q(g_y)` and W, b receive :math:`\partial op^\top g_y`. The two forward
  ops have identical arguments once the stop-gradients are erased, and the compiler's
  common-subexpression pass keeps one.

The compiled batched step differentiates with `torch.autograd.grad` outside vmap (dynamo traces
it with `trace_autograd_ops`), which is why the gradient quantizer needs the flagged node
dimension rather than vmap's own batching of its backward.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
import torch.nn.functional as F

from .quantizer import dequantized, fake_quant, quant_scale

_FORCED = False  # traced_ops() active


def active() -> bool:
    """Whether the layers should use this module's form: under torch.compile, or inside traced_ops()."""
    return _FORCED or torch.compiler.is_compiling()


@contextlib.contextmanager
def traced_ops() -> Iterator[None]:
    """Run the traceable form eagerly (the tests compare it with the eager custom Functions)."""
    global _FORCED
    before, _FORCED = _FORCED, True
    try:
        yield
    finally:
        _FORCED = before


def fake_quant_rows(x: torch.Tensor, bits: int, rounding: str, rows: bool) -> torch.Tensor:
    """Q(x) over x's own range: one range for the whole tensor, or (rows) one per slice x[i].
    Stochastic noise is torch.rand_like (the compiler's generator), never the eager CPU scratch."""
    if rows:
        flat = x.detach().reshape(x.shape[0], -1)
        shape = (-1,) + (1,) * (x.dim() - 1)
        lo, hi = flat.amin(1).reshape(shape), flat.amax(1).reshape(shape)
    else:
        lo, hi = x.detach().amin().reshape((1,) * x.dim()), x.detach().amax().reshape((1,) * x.dim())
    scale = quant_scale(lo, hi, bits)
    if rounding == "stochastic":
        levels = 2.0 ** bits - 1.0
        t = (x - lo) / scale + (torch.rand_like(x) - 0.5)
        return t.clamp(0.0, levels).round() * scale + lo
    return dequantized(x, lo, scale, bits, rounding)


@torch.library.custom_op("lpdl::quantize_grad", mutates_args=())
def _quantize_grad_op(x: torch.Tensor, bits: int, rounding: str, rows: bool) -> torch.Tensor:
    return x.clone()


@_quantize_grad_op.register_fake
def _(x, bits, rounding, rows):
    return torch.empty_like(x)


def _setup(ctx, inputs, output) -> None:
    ctx.bits, ctx.rounding, ctx.rows = inputs[1], inputs[2], inputs[3]


def _backward(ctx, g):
    return fake_quant_rows(g, ctx.bits, ctx.rounding, ctx.rows), None, None, None


_quantize_grad_op.register_autograd(_backward, setup_context=_setup)


def _vmap_rule(info, in_dims, x, bits, rounding, rows):
    if rows:
        raise NotImplementedError("lpdl::quantize_grad is vmapped over one node dimension only")
    x = x if in_dims[0] is None else x.movedim(in_dims[0], 0)
    return _quantize_grad_op(x, bits, rounding, in_dims[0] is not None), (None if in_dims[0] is None else 0)


_quantize_grad_op.register_vmap(_vmap_rule)


def quantize(x: torch.Tensor, bits: int, rounding: str, x_min: torch.Tensor | None,
             x_max: torch.Tensor | None) -> torch.Tensor:
    """Straight-through Q(x): value Q(x), gradient 1 (see the module docstring)."""
    xd = x.detach()
    q = fake_quant(xd, bits, rounding,
                   None if x_min is None else x_min.detach(), None if x_max is None else x_max.detach())
    return (x - xd) + q


def quantize_grad(x: torch.Tensor, bits: int, rounding: str) -> torch.Tensor:
    return _quantize_grad_op(x, bits, rounding, False)


def _bifurcated(op, x, w, b, grad_bits: int, grad_rounding: str, *conf):
    xd, wd, bd = x.detach(), w.detach(), None if b is None else b.detach()
    y = quantize_grad(op(x, wd, bd, *conf), grad_bits, grad_rounding)
    c = op(xd, w, b, *conf)
    return y + (c - c.detach())


def conv2d(x, w, b, stride, padding, dilation, groups, grad_bits: int, grad_rounding: str):
    return _bifurcated(F.conv2d, x, w, b, grad_bits, grad_rounding, stride, padding, dilation, groups)


def linear(x, w, b, grad_bits: int, grad_rounding: str):
    return _bifurcated(F.linear, x, w, b, grad_bits, grad_rounding)
