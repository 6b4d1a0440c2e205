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
- **Bifurcated convolution** `lpdl::bifurcated_conv2d`: a custom op whose registered backward is
  the eager one (x receives :math:`\partial op^\top Q(g_y)`, W and b receive
  :math:`\partial op^\top g_y`); its vmap rule runs the n nodes as one grouped convolution (as
  functorch does) and tells the backward that the channel dimension holds n blocks, one range each.
- **Bifurcated linear layer** :math:`y = \mathrm{QG}(op(x, \mathrm{sg}(W), \mathrm{sg}(b))) + (c - \mathrm{sg}(c))`
  with :math:`c = op(\mathrm{sg}(x), W, b)`: the value is op(x, W, b) (c − c = 0), x receives
  :math:`\partial op^\top Q(g_y)` and W, b receive :math:`\partial op^\top g_y`, at the price
  of a second forward product (classifier layers only).

The compiled batched step differentiates with `torch.autograd.grad` outside vmap (dynamo traces
it with `trace_autograd_ops`), which is why the gradient quantizer needs the flagged node
dimension rather than vmap's own batching of its backward.
"""
from __future__ import annotations

import contextlib
from typing import Iterator, Optional

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


def linear(x, w, b, grad_bits: int, grad_rounding: str):
    """Bifurcated linear layer by two stop-gradient branches (module docstring); the forward runs
    twice where the compiler does not merge them, cheap for the classifier layers that use it."""
    xd, wd, bd = x.detach(), w.detach(), None if b is None else b.detach()
    y = quantize_grad(F.linear(x, wd, bd), grad_bits, grad_rounding)
    c = F.linear(xd, w, b)
    return y + (c - c.detach())


def fake_quant_groups(g: torch.Tensor, bits: int, rounding: str, nodes: int) -> torch.Tensor:
    """Q(g) with one range per node, the nodes being `nodes` equal blocks of g's channel dimension
    (dim 1), as a vmapped convolution lays them out; nodes = 1: one range for all of g."""
    if nodes == 1:
        return fake_quant_rows(g, bits, rounding, rows=False)
    B = g.shape[0]
    return fake_quant_rows(g.reshape(B, nodes, -1).transpose(0, 1), bits, rounding, rows=True
                           ).transpose(0, 1).reshape(g.shape)


@torch.library.custom_op("lpdl::bifurcated_conv2d", mutates_args=())
def _conv_op(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], stride: list[int],
             padding: list[int], dilation: list[int], groups: int, grad_bits: int, rounding: str,
             nodes: int) -> torch.Tensor:
    return F.conv2d(x, w, b, stride, padding, dilation, groups)


@_conv_op.register_fake
def _(x, w, b, stride, padding, dilation, groups, grad_bits, rounding, nodes):
    return F.conv2d(x, w, b, stride, padding, dilation, groups)


def _conv_setup(ctx, inputs, output) -> None:
    x, w, b, stride, padding, dilation, groups, grad_bits, rounding, nodes = inputs
    ctx.save_for_backward(x, w)
    ctx.has_bias = b is not None
    ctx.conf = (stride, padding, dilation, groups)
    ctx.quant = (grad_bits, rounding, nodes)


def _conv_backward(ctx, g):
    """The eager `_BifurcatedConv.backward`: g_x from Q(g) (one range per node), g_W and g_b from g."""
    x, w = ctx.saved_tensors
    stride, padding, dilation, groups = ctx.conf
    bias = [w.shape[0]] if ctx.has_bias else None
    conv_bw = torch.ops.aten.convolution_backward
    gx = conv_bw(fake_quant_groups(g, *ctx.quant), x, w, bias, stride, padding, dilation, False, [0, 0],
                 groups, [True, False, False])[0]
    _, gw, gb = conv_bw(g, x, w, bias, stride, padding, dilation, False, [0, 0], groups,
                        [False, True, ctx.has_bias])
    return gx, gw, gb, None, None, None, None, None, None, None


_conv_op.register_autograd(_conv_backward, setup_context=_conv_setup)


def _conv_vmap(info, in_dims, x, w, b, stride, padding, dilation, groups, grad_bits, rounding, nodes):
    """n nodes' convolutions as one grouped convolution (as functorch batches conv2d): node i's
    channels are block i of the channel dimension, so the backward's ranges are per block."""
    n = info.batch_size
    per_node = [t if t is None or d is None else t.movedim(d, 0) for t, d in zip((x, w, b), in_dims[:3])]
    x, w, b = (t if t is None or d is not None else t.expand(n, *t.shape) for t, d in zip(per_node, in_dims[:3]))
    B = x.shape[1]
    out = _conv_op(x.transpose(0, 1).reshape(B, n * x.shape[2], *x.shape[3:]),
                   w.reshape(n * w.shape[1], *w.shape[2:]), None if b is None else b.reshape(-1),
                   stride, padding, dilation, groups * n, grad_bits, rounding, nodes * n)
    return out.reshape(B, n, -1, *out.shape[2:]).transpose(0, 1), 0


_conv_op.register_vmap(_conv_vmap)


def conv2d(x, w, b, stride, padding, dilation, groups, grad_bits: int, grad_rounding: str):
    """Bifurcated convolution as one custom op (a single forward convolution)."""
    return _conv_op(x, w, b, list(stride), list(padding), list(dilation), groups, grad_bits, grad_rounding, 1)
