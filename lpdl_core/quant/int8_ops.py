"""The integer 8-bit products (lpdl_core.quant.integer) as `torch.library` custom ops, and the
autograd Functions the 8-bit layers call with them.

Each op returns a contiguous tensor (its fake kernel's layout, which a compiled graph asserts).
As custom ops they carry a vmap rule, so the batched executor's `vmap(grad(...))` over the nodes
runs them: the convolutions' rule runs the n nodes as one grouped convolution, each node's
product on its own grids (`integer.conv2d_on_grid`'s node blocks); the linears' runs the nodes
one after another on their own slices and stacks the results. The Functions are written with
those ops and vmappable aten ops only, so torch generates their vmap rules (`generate_vmap_rule`),
backward included.

- `IntConv`: y = conv(Q(x), Q(W)) + b in integers; backward: the layer gradient from Q_stoch(g_y)
  in integers, the weight gradient from the float g_y (gradient bifurcation, as
  `layers._BifurcatedConv`).
- `IntLinear`: the same for x @ W^T + b.

Outside torch.func transforms (the loop executor, a single model) the Functions' `eager_forward`
calls those bodies directly: a custom op's dispatch cost about 25 µs a call here, a seventh of a
mini-profile layer call. The compiled step's form of the two layers is in `int8_compiled`.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import integer
from .quantizer import from_levels, own_range_levels


def conv_size(size: int, k: int, s: int, p: int, d: int) -> int:
    return (size + 2 * p - d * (k - 1) - 1) // s + 1


def _plain(*tensors):
    """The operands as the ops take them: the Functions define the gradients, so the ops need none."""
    return [t.detach() if t is not None else None for t in tensors]


def _per_node(op, info, in_dims, *args):
    """op on each node's slice of the batched arguments, stacked along dim 0."""
    out = []
    for i in range(info.batch_size):
        sliced = [a.select(d, i) if isinstance(a, Tensor) and d is not None else a for a, d in zip(args, in_dims)]
        out.append(op(*sliced))
    return torch.stack(out), 0


def _front(t: Optional[Tensor], dim: Optional[int], n: int) -> Optional[Tensor]:
    """A vmap rule's argument with its node dimension first (expanded where it has none)."""
    if t is None:
        return None
    return t.movedim(dim, 0) if dim is not None else t.expand(n, *t.shape)


def _channels(t: Tensor) -> Tensor:
    """(n, B, C, ...) -> (B, n·C, ...): the nodes' channels side by side, node-major."""
    return t.transpose(0, 1).reshape(t.shape[1], -1, *t.shape[3:])


@torch.library.custom_op("lpdl::int8_conv2d", mutates_args=())
def int8_conv2d(backend: str, q_x: Tensor, m_x: Tensor, s_x: Tensor, w: Tensor, b: Optional[Tensor],
                stride: list[int], padding: list[int], dilation: list[int], groups: int, nodes: int) -> Tensor:
    return integer.conv2d_on_grid(backend, q_x, m_x, s_x, w, b, stride, padding, dilation, groups,
                                  nodes).contiguous()


@int8_conv2d.register_fake
def _(backend, q_x, m_x, s_x, w, b, stride, padding, dilation, groups, nodes):
    hw = [conv_size(q_x.shape[2 + i], w.shape[2 + i], stride[i], padding[i], dilation[i]) for i in range(2)]
    return w.new_empty(q_x.shape[0], w.shape[0], *hw)


@int8_conv2d.register_vmap
def _(info, in_dims, backend, q_x, m_x, s_x, w, b, stride, padding, dilation, groups, nodes):
    """The n nodes as one grouped convolution (`integer.conv2d_on_grid`'s node blocks)."""
    n = info.batch_size
    q_x, m_x, s_x, w, b = (_front(t, d, n) for t, d in zip((q_x, m_x, s_x, w, b), in_dims[1:6]))
    out = int8_conv2d(backend, _channels(q_x), m_x.reshape(-1), s_x.reshape(-1), w.reshape(-1, *w.shape[2:]),
                      None if b is None else b.reshape(-1), stride, padding, dilation, groups * n, nodes * n)
    return out.view(out.shape[0], n, -1, *out.shape[2:]), 1


@torch.library.custom_op("lpdl::int8_conv2d_input_grad", mutates_args=())
def int8_conv2d_input_grad(backend: str, q_g: Tensor, m_g: Tensor, s_g: Tensor, w: Tensor, in_shape: list[int],
                           stride: list[int], padding: list[int], dilation: list[int], groups: int,
                           nodes: int) -> Tensor:
    return integer.conv2d_input_grad_on_grid(backend, q_g, m_g, s_g, w, in_shape, stride, padding, dilation,
                                             groups, nodes).contiguous()


@int8_conv2d_input_grad.register_fake
def _(backend, q_g, m_g, s_g, w, in_shape, stride, padding, dilation, groups, nodes):
    return w.new_empty(in_shape)


@int8_conv2d_input_grad.register_vmap
def _(info, in_dims, backend, q_g, m_g, s_g, w, in_shape, stride, padding, dilation, groups, nodes):
    n = info.batch_size
    q_g, m_g, s_g, w = (_front(t, d, n) for t, d in zip((q_g, m_g, s_g, w), in_dims[1:5]))
    shape = [in_shape[0], in_shape[1] * n, *in_shape[2:]]
    out = int8_conv2d_input_grad(backend, _channels(q_g), m_g.reshape(-1), s_g.reshape(-1),
                                 w.reshape(-1, *w.shape[2:]), shape, stride, padding, dilation, groups * n,
                                 nodes * n)
    return out.view(out.shape[0], n, -1, *out.shape[2:]), 1


@torch.library.custom_op("lpdl::int8_linear", mutates_args=())
def int8_linear(backend: str, q_x: Tensor, m_x: Tensor, s_x: Tensor, w: Tensor, b: Optional[Tensor]) -> Tensor:
    return integer.linear_on_grid(backend, q_x, m_x, s_x, w, b).contiguous()


@int8_linear.register_fake
def _(backend, q_x, m_x, s_x, w, b):
    return w.new_empty(*q_x.shape[:-1], w.shape[0])


@int8_linear.register_vmap
def _(info, in_dims, *args):
    return _per_node(int8_linear, info, in_dims, *args)


@torch.library.custom_op("lpdl::int8_linear_input_grad", mutates_args=())
def int8_linear_input_grad(backend: str, q_g: Tensor, m_g: Tensor, s_g: Tensor, w: Tensor) -> Tensor:
    return integer.linear_input_grad_on_grid(backend, q_g, m_g, s_g, w).contiguous()


@int8_linear_input_grad.register_fake
def _(backend, q_g, m_g, s_g, w):
    return w.new_empty(*q_g.shape[:-1], w.shape[1])


@int8_linear_input_grad.register_vmap
def _(info, in_dims, *args):
    return _per_node(int8_linear_input_grad, info, in_dims, *args)


def _on_grid(op, body, wq, *args):
    """The product `op` (a custom op, for vmap's rules) or, in a Function's eager form, where the
    forward handed over W's grid wq, the op's own body called directly with it."""
    return op(*args) if wq is None else body(*args, wq=wq).contiguous()


def _grad_grid(g: Tensor, grad_bits: int, grad_rounding: str) -> tuple[Tensor, Tensor, Tensor]:
    """(q_g uint8, m_g, s_g): the layer gradient's 8-bit grid over its own range, by the fake
    quantizer's arithmetic and noise (quantizer.own_range_levels), with no dequantization."""
    q, s, m = own_range_levels(g.detach(), grad_bits, grad_rounding)
    return q.to(torch.uint8), m, s


class IntConv(torch.autograd.Function):
    """y = conv(Q(x), Q(W)) + b from x's grid (q_x, m_x, s_x), with the straight-through estimator
    to x (the raw input, as `quantizer.quantize` has it). Saves q_x (one byte an element) and
    rebuilds Q(x) for the float32 weight gradient.

    `eager_forward` (no torch.func transform active, `quantizer.eager_apply`) calls the products
    of lpdl_core.quant.integer directly, the ops' own bodies, without the custom-op dispatch, and
    hands W's grid (`integer.weight_grid`) from the forward to the backward."""

    generate_vmap_rule = True

    @staticmethod
    def forward(backend, x, q_x, m_x, s_x, w, b, stride, padding, dilation, groups, grad_bits, grad_rounding):
        return int8_conv2d(backend, *_plain(q_x, m_x, s_x, w, b), list(stride), list(padding), list(dilation),
                           groups, 1)

    @staticmethod
    def setup_context(ctx, inputs, output):
        backend, x, q_x, m_x, s_x, w, b, stride, padding, dilation, groups, grad_bits, grad_rounding = inputs
        ctx.save_for_backward(q_x, m_x, s_x, w)
        ctx.conf = (backend, list(stride), list(padding), list(dilation), groups, grad_bits, grad_rounding,
                    b is not None)
        ctx.wq = None

    @staticmethod
    def eager_forward(ctx, backend, x, q_x, m_x, s_x, w, b, stride, padding, dilation, groups, grad_bits,
                      grad_rounding):
        IntConv.setup_context(ctx, (backend, x, q_x, m_x, s_x, w, b, stride, padding, dilation, groups, grad_bits,
                                    grad_rounding), None)
        ctx.wq = integer.weight_grid(w.detach())
        return _on_grid(int8_conv2d, integer.conv2d_on_grid, ctx.wq, backend, *_plain(q_x, m_x, s_x, w, b),
                        *ctx.conf[1:5], 1)

    @staticmethod
    def backward(ctx, g):
        q_x, m_x, s_x, w = ctx.saved_tensors
        backend, stride, padding, dilation, groups, grad_bits, grad_rounding, has_bias = ctx.conf
        gx = gw = gb = None
        if ctx.needs_input_grad[1]:
            gx = _on_grid(int8_conv2d_input_grad, integer.conv2d_input_grad_on_grid, ctx.wq, backend,
                          *_grad_grid(g, grad_bits, grad_rounding), w.detach(), list(q_x.shape), stride, padding,
                          dilation, groups, 1)
        if ctx.needs_input_grad[5] or (has_bias and ctx.needs_input_grad[6]):
            _, gw, gb = torch.ops.aten.convolution_backward(
                g, from_levels(q_x, m_x, s_x), w, [w.shape[0]] if has_bias else None, stride, padding, dilation,
                False, [0, 0], groups, [False, True, has_bias])
        return None, gx, None, None, None, gw, gb, None, None, None, None, None, None


class IntLinear(torch.autograd.Function):
    """y = Q(x) @ Q(W)^T + b from x's grid, as `IntConv` (its eager form included)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(backend, x, q_x, m_x, s_x, w, b, grad_bits, grad_rounding):
        return int8_linear(backend, *_plain(q_x, m_x, s_x, w, b))

    @staticmethod
    def setup_context(ctx, inputs, output):
        backend, x, q_x, m_x, s_x, w, b, grad_bits, grad_rounding = inputs
        ctx.save_for_backward(q_x, m_x, s_x, w)
        ctx.conf = (backend, grad_bits, grad_rounding, b is not None)
        ctx.wq = None

    @staticmethod
    def eager_forward(ctx, backend, x, q_x, m_x, s_x, w, b, grad_bits, grad_rounding):
        IntLinear.setup_context(ctx, (backend, x, q_x, m_x, s_x, w, b, grad_bits, grad_rounding), None)
        ctx.wq = integer.weight_grid(w.detach())
        return _on_grid(int8_linear, integer.linear_on_grid, ctx.wq, backend, *_plain(q_x, m_x, s_x, w, b))

    @staticmethod
    def backward(ctx, g):
        q_x, m_x, s_x, w = ctx.saved_tensors
        backend, grad_bits, grad_rounding, has_bias = ctx.conf
        gx = gw = gb = None
        if ctx.needs_input_grad[1]:
            gx = _on_grid(int8_linear_input_grad, integer.linear_input_grad_on_grid, ctx.wq, backend,
                          *_grad_grid(g, grad_bits, grad_rounding), w.detach())
        if ctx.needs_input_grad[5]:
            x = from_levels(q_x, m_x, s_x)
            gw = g.reshape(-1, g.shape[-1]).transpose(0, 1) @ x.reshape(-1, x.shape[-1])
        if has_bias and ctx.needs_input_grad[6]:
            gb = g.reshape(-1, g.shape[-1]).sum(0)
        return None, gx, None, None, None, gw, gb, None, None
