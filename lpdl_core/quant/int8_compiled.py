"""The 8-bit layers' integer products in the compiled step's form (lpdl_core.quant.traced's
contract: one op per layer, its backward registered, the gradient's range one per node), which a
fullgraph compile traces: `int8_bifurcated_conv2d`, `int8_bifurcated_linear`. The eager form, and
the ops both call, are in `int8_ops`.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import integer
from .int8_ops import conv_size, int8_conv2d_input_grad, int8_linear_input_grad



def _regrid(gq: Tensor, nodes: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    """(q, m, s) of a gradient already quantized over its own range, per node block of its channels
    (the compiled step quantizes in float32, where inductor fuses the chain)."""
    q, s, m = integer.own_grid(gq, nodes)
    return q, m, s


@torch.library.custom_op("lpdl::int8_bifurcated_conv2d", mutates_args=())
def int8_bifurcated_conv2d(backend: str, x: Tensor, m_x: Tensor, s_x: Tensor, w: Tensor, b: Optional[Tensor],
                           key: Tensor, stride: list[int], padding: list[int], dilation: list[int], groups: int,
                           grad_bits: int, rounding: str, nodes: int) -> Tensor:
    """`traced.conv2d` in integers: `nodes` nodes' convolutions as one grouped convolution (node i:
    block i of the channels, its grid m_x[i], s_x[i]), each node's product on its own grids."""
    m, s = m_x.reshape(-1).expand(nodes), s_x.reshape(-1).expand(nodes)
    return integer.conv2d(backend, x, m, s, w, b, stride, padding, dilation, groups, nodes).contiguous()


@int8_bifurcated_conv2d.register_fake
def _(backend, x, m_x, s_x, w, b, key, stride, padding, dilation, groups, grad_bits, rounding, nodes):
    hw = [conv_size(x.shape[2 + i], w.shape[2 + i], stride[i], padding[i], dilation[i]) for i in range(2)]
    return x.new_empty(x.shape[0], w.shape[0], *hw)


def _traced_setup(ctx, inputs, output) -> None:
    backend, x, _, _, w, b, key, stride, padding, dilation, groups, grad_bits, rounding, nodes = inputs
    ctx.save_for_backward(x, w, key)
    ctx.conf = (backend, stride, padding, dilation, groups, grad_bits, rounding, nodes, b is not None)


def _traced_backward(ctx, g):
    """g_x from Q(g) (one range per node) in integers, the nodes as one grouped convolution; g_W and
    g_b from g in float32."""
    from . import traced

    x, w, key = ctx.saved_tensors
    backend, stride, padding, dilation, groups, grad_bits, rounding, nodes, has_bias = ctx.conf
    gq = traced.fake_quant_groups(g, grad_bits, rounding, nodes, key)
    gx = int8_conv2d_input_grad(backend, *_regrid(gq.detach(), nodes), w.detach(), list(x.shape), stride, padding,
                                dilation, groups, nodes)
    _, gw, gb = torch.ops.aten.convolution_backward(g, x, w, [w.shape[0]] if has_bias else None, stride, padding,
                                                    dilation, False, [0, 0], groups, [False, True, has_bias])
    return None, gx, None, None, gw, gb, None, None, None, None, None, None, None, None


int8_bifurcated_conv2d.register_autograd(_traced_backward, setup_context=_traced_setup)


@int8_bifurcated_conv2d.register_vmap
def _(info, in_dims, backend, x, m_x, s_x, w, b, key, stride, padding, dilation, groups, grad_bits, rounding, nodes):
    """n nodes as one grouped convolution, as `traced._conv_vmap` lays them out."""
    n = info.batch_size
    x, m_x, s_x, w, b = (t if t is None else (t.movedim(d, 0) if d is not None else t.expand(n, *t.shape))
                         for t, d in zip((x, m_x, s_x, w, b), in_dims[1:6]))
    batch = x.shape[1]
    out = int8_bifurcated_conv2d(backend, x.transpose(0, 1).reshape(batch, n * x.shape[2], *x.shape[3:]),
                                 m_x.reshape(-1), s_x.reshape(-1), w.reshape(n * w.shape[1], *w.shape[2:]),
                                 None if b is None else b.reshape(-1), key, stride, padding, dilation, groups * n,
                                 grad_bits, rounding, nodes * n)
    return out.reshape(batch, n, -1, *out.shape[2:]).transpose(0, 1), 0


@torch.library.custom_op("lpdl::int8_bifurcated_linear", mutates_args=())
def int8_bifurcated_linear(backend: str, x: Tensor, m_x: Tensor, s_x: Tensor, w: Tensor, b: Optional[Tensor],
                           key: Tensor, grad_bits: int, rounding: str, stacked: bool) -> Tensor:
    """`traced.linear` in integers; stacked: x, w, b, m_x, s_x carry the nodes along dim 0, each
    node's product on its own grids."""
    if not stacked:
        return integer.linear(backend, x, m_x, s_x, w, b).contiguous()
    m, s = m_x.reshape(x.shape[0], -1), s_x.reshape(x.shape[0], -1)
    return torch.stack([integer.linear(backend, x[i], m[i], s[i], w[i], None if b is None else b[i])
                        for i in range(x.shape[0])]).contiguous()


@int8_bifurcated_linear.register_fake
def _(backend, x, m_x, s_x, w, b, key, grad_bits, rounding, stacked):
    return x.new_empty(*x.shape[:-1], w.shape[-2])


def _traced_linear_setup(ctx, inputs, output) -> None:
    backend, x, _, _, w, b, key, grad_bits, rounding, stacked = inputs
    ctx.save_for_backward(x, w, key)
    ctx.conf = (backend, grad_bits, rounding, stacked, b is not None)


def _traced_linear_backward(ctx, g):
    """g_x from Q(g) (one range per node) in integers; g_W and g_b from g in float32."""
    from . import traced

    x, w, key = ctx.saved_tensors
    backend, grad_bits, rounding, stacked, has_bias = ctx.conf
    gq = traced.fake_quant_rows(g, grad_bits, rounding, rows=stacked, key=key).detach()
    if stacked:
        gx = torch.stack([int8_linear_input_grad(backend, *_regrid(gq[i]), w[i].detach()) for i in range(g.shape[0])])
        g2, x2 = g.reshape(g.shape[0], -1, g.shape[-1]), x.reshape(x.shape[0], -1, x.shape[-1])
        gw, gb = g2.transpose(1, 2) @ x2, g2.sum(1)
    else:
        gx = int8_linear_input_grad(backend, *_regrid(gq), w.detach())
        g2 = g.reshape(-1, g.shape[-1])
        gw, gb = g2.t() @ x.reshape(-1, x.shape[-1]), g2.sum(0)
    return None, gx, None, None, gw, gb if has_bias else None, None, None, None, None


int8_bifurcated_linear.register_autograd(_traced_linear_backward, setup_context=_traced_linear_setup)


@int8_bifurcated_linear.register_vmap
def _(info, in_dims, backend, x, m_x, s_x, w, b, key, grad_bits, rounding, stacked):
    if stacked:
        raise NotImplementedError("lpdl::int8_bifurcated_linear is vmapped over one node dimension only")
    n = info.batch_size
    x, m_x, s_x, w, b = (t if t is None else (t.movedim(d, 0) if d is not None else t.expand(n, *t.shape))
                         for t, d in zip((x, m_x, s_x, w, b), in_dims[1:6]))
    return int8_bifurcated_linear(backend, x, m_x.reshape(n), s_x.reshape(n), w, b, key, grad_bits, rounding,
                                  True), 0
