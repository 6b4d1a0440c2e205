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

from . import quantizer
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


_KEYS: dict[torch.device, torch.Tensor] = {}


def noise_key(device: torch.device) -> torch.Tensor:
    """This device's rounding-noise key (a 0-dim int64 tensor, a graph input): new_noise_key()
    draws a fresh one each step."""
    device = torch.device(device)
    if device not in _KEYS:
        _KEYS[device] = torch.zeros((), dtype=torch.int64, device=device)
    return _KEYS[device]


def new_noise_key(device: torch.device) -> None:
    """A new key for this step, from the global generator (seeded runs repeat)."""
    noise_key(device).random_()


def uniform_noise(x: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    r"""ξ ~ U[-1/2, 1/2) shaped like x, for stochastic rounding. On CUDA torch.rand_like (Philox, cheap
    there). On the CPU, whose compiled Philox costs one scalar generator call per element (measured
    3.7x the rest of the quantizer), a counter-based hash that vectorises:

    .. math:: h = \mathrm{mix}(i + k + 2^{20}\,\mathrm{bits}(x_i)),\qquad
              \xi = \lfloor h / 2^{40} \rfloor \bmod 2^{16} / 2^{16} - 1/2

    with i the element's index, k the step's key and mix two rounds of multiply by an odd 64-bit
    constant and xor-shift (splitmix64's finaliser, wrapping int64). For a fixed element, ξ is
    uniform over the key (a bijection of it), so rounding stays unbiased; the value's bits make
    tensors of one shape in one step draw differently. ξ takes 2^16 values, as the eager CPU noise."""
    if x.device.type != "cpu":
        return torch.rand_like(x) - 0.5
    i = torch.arange(x.numel(), device=x.device, dtype=torch.int64).reshape(x.shape)
    h = i + key + x.detach().view(torch.int32).to(torch.int64) * 1048576
    h = h * -7046029254386353131        # 0x9E3779B97F4A7C15 as a signed int64
    h = h ^ (h >> 31)
    h = h * -4658895280553007687        # 0xBF58476D1CE4E5B9
    h = h ^ (h >> 29)
    return ((h >> 40) & 0xFFFF).to(x.dtype) * 2.0 ** -16 - 0.5


def fake_quant_rows(x: torch.Tensor, bits: int, rounding: str, rows: bool, key: torch.Tensor | None = None
                    ) -> torch.Tensor:
    """Q(x) over x's own range: one range for the whole tensor, or (rows) one per slice x[i].
    Stochastic noise is `uniform_noise` (key: the step's noise key), never the eager CPU scratch."""
    if rows:
        flat = x.detach().reshape(x.shape[0], -1)
        shape = (-1,) + (1,) * (x.dim() - 1)
        lo, hi = flat.amin(1).reshape(shape), flat.amax(1).reshape(shape)
    else:
        lo, hi = x.detach().amin().reshape((1,) * x.dim()), x.detach().amax().reshape((1,) * x.dim())
    scale = quant_scale(lo, hi, bits)
    if rounding == "stochastic":
        levels = 2.0 ** bits - 1.0
        t = (x - lo) / scale + uniform_noise(x, noise_key(x.device) if key is None else key)
        return t.clamp(0.0, levels).round() * scale + lo
    return dequantized(x, lo, scale, bits, rounding)


@torch.library.custom_op("lpdl::quantize_grad", mutates_args=())
def _quantize_grad_op(x: torch.Tensor, key: torch.Tensor, bits: int, rounding: str, rows: bool) -> torch.Tensor:
    return x.clone()


@_quantize_grad_op.register_fake
def _(x, key, bits, rounding, rows):
    return torch.empty_like(x)


def _setup(ctx, inputs, output) -> None:
    ctx.save_for_backward(inputs[1])
    ctx.bits, ctx.rounding, ctx.rows = inputs[2], inputs[3], inputs[4]


def _backward(ctx, g):
    (key,) = ctx.saved_tensors
    return fake_quant_rows(g, ctx.bits, ctx.rounding, ctx.rows, key), None, None, None, None


_quantize_grad_op.register_autograd(_backward, setup_context=_setup)


def _vmap_rule(info, in_dims, x, key, bits, rounding, rows):
    if rows or in_dims[1] is not None:
        raise NotImplementedError("lpdl::quantize_grad is vmapped over one node dimension of x only")
    x = x if in_dims[0] is None else x.movedim(in_dims[0], 0)
    return _quantize_grad_op(x, key, bits, rounding, in_dims[0] is not None), (None if in_dims[0] is None else 0)


_quantize_grad_op.register_vmap(_vmap_rule)


def quantize(x: torch.Tensor, bits: int, rounding: str, x_min: torch.Tensor | None,
             x_max: torch.Tensor | None) -> torch.Tensor:
    """Straight-through Q(x): value Q(x), gradient 1 (see the module docstring)."""
    xd = x.detach()
    q = fake_quant(xd, bits, rounding,
                   None if x_min is None else x_min.detach(), None if x_max is None else x_max.detach())
    return (x - xd) + q


def quantize_grad(x: torch.Tensor, bits: int, rounding: str) -> torch.Tensor:
    return _quantize_grad_op(x, noise_key(x.device), bits, rounding, False)


def linear(x, w, b, grad_bits: int, grad_rounding: str):
    """Bifurcated linear layer by two stop-gradient branches (module docstring); the forward runs
    twice where the compiler does not merge them, cheap for the classifier layers that use it."""
    xd, wd, bd = x.detach(), w.detach(), None if b is None else b.detach()
    y = quantize_grad(F.linear(x, wd, bd), grad_bits, grad_rounding)
    c = F.linear(xd, w, b)
    return y + (c - c.detach())


def fake_quant_groups(g: torch.Tensor, bits: int, rounding: str, nodes: int, key: torch.Tensor) -> torch.Tensor:
    """Q(g) with one range per node, the nodes being `nodes` equal blocks of g's channel dimension
    (dim 1), as a vmapped convolution lays them out; nodes = 1: one range for all of g."""
    if nodes == 1:
        return fake_quant_rows(g, bits, rounding, rows=False, key=key)
    B = g.shape[0]
    return fake_quant_rows(g.reshape(B, nodes, -1).transpose(0, 1), bits, rounding, rows=True, key=key
                           ).transpose(0, 1).reshape(g.shape)


@torch.library.custom_op("lpdl::bifurcated_conv2d", mutates_args=())
def _conv_op(x: torch.Tensor, w: torch.Tensor, b: Optional[torch.Tensor], key: torch.Tensor, stride: list[int],
             padding: list[int], dilation: list[int], groups: int, grad_bits: int, rounding: str,
             nodes: int) -> torch.Tensor:
    return F.conv2d(x, w, b, stride, padding, dilation, groups)


@_conv_op.register_fake
def _(x, w, b, key, stride, padding, dilation, groups, grad_bits, rounding, nodes):
    return F.conv2d(x, w, b, stride, padding, dilation, groups)


def _conv_setup(ctx, inputs, output) -> None:
    x, w, b, key, stride, padding, dilation, groups, grad_bits, rounding, nodes = inputs
    ctx.save_for_backward(x, w, key)
    ctx.has_bias = b is not None
    ctx.conf = (stride, padding, dilation, groups)
    ctx.quant = (grad_bits, rounding, nodes)


def _conv_backward(ctx, g):
    """The eager `_BifurcatedConv.backward`: g_x from Q(g) (one range per node), g_W and g_b from g."""
    x, w, key = ctx.saved_tensors
    stride, padding, dilation, groups = ctx.conf
    bias = [w.shape[0]] if ctx.has_bias else None
    conv_bw = torch.ops.aten.convolution_backward
    gx = conv_bw(fake_quant_groups(g, *ctx.quant, key), x, w, bias, stride, padding, dilation, False, [0, 0],
                 groups, [True, False, False])[0]
    _, gw, gb = conv_bw(g, x, w, bias, stride, padding, dilation, False, [0, 0], groups,
                        [False, True, ctx.has_bias])
    return gx, gw, gb, None, None, None, None, None, None, None, None


_conv_op.register_autograd(_conv_backward, setup_context=_conv_setup)


def _conv_vmap(info, in_dims, x, w, b, key, stride, padding, dilation, groups, grad_bits, rounding, nodes):
    """n nodes' convolutions as one grouped convolution (as functorch batches conv2d): node i's
    channels are block i of the channel dimension, so the backward's ranges are per block."""
    n = info.batch_size
    per_node = [t if t is None or d is None else t.movedim(d, 0) for t, d in zip((x, w, b), in_dims[:3])]
    x, w, b = (t if t is None or d is not None else t.expand(n, *t.shape) for t, d in zip(per_node, in_dims[:3]))
    B = x.shape[1]
    out = _conv_op(x.transpose(0, 1).reshape(B, n * x.shape[2], *x.shape[3:]),
                   w.reshape(n * w.shape[1], *w.shape[2:]), None if b is None else b.reshape(-1), key,
                   stride, padding, dilation, groups * n, grad_bits, rounding, nodes * n)
    return out.reshape(B, n, -1, *out.shape[2:]).transpose(0, 1), 0


_conv_op.register_vmap(_conv_vmap)


def conv2d(x, w, b, stride, padding, dilation, groups, grad_bits: int, grad_rounding: str):
    """Bifurcated convolution as one custom op (a single forward convolution)."""
    return _conv_op(x, w, b, noise_key(x.device), list(stride), list(padding), list(dilation), groups,
                    grad_bits, grad_rounding, 1)


quantizer.TRACEABLE.update(active=active, quantize=quantize, quantize_grad=quantize_grad)
