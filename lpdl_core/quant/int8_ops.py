"""The integer 8-bit products (lpdl_core.quant.integer) as `torch.library` custom ops, and the
autograd Functions the 8-bit layers call with them.

Each op returns a contiguous tensor (its fake kernel's layout, which a compiled graph asserts).
As custom ops they carry a vmap rule, so the batched executor's `vmap(grad(...))` over the nodes
runs them: the rule runs the nodes one after another on their own slices (each node has its own
grids), and stacks the results. The Functions are written with those ops and vmappable aten ops
only, so torch generates their vmap rules (`generate_vmap_rule`), backward included.

- `IntConv`: y = conv(Q(x), Q(W)) + b in integers; backward: the layer gradient from Q_stoch(g_y)
  in integers, the weight gradient from the float g_y (gradient bifurcation, as
  `layers._BifurcatedConv`).
- `IntLinear`: the same for x @ W^T + b.
- `int8_bifurcated_conv2d`, `int8_bifurcated_linear`: the compiled step's form of the two
  (lpdl_core.quant.traced's contract: one op per layer, its backward registered, the gradient's
  range one per node), which a fullgraph compile traces.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import integer
from .quantizer import own_range_quant


def _conv_size(size: int, k: int, s: int, p: int, d: int) -> int:
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


@torch.library.custom_op("lpdl::int8_conv2d", mutates_args=())
def int8_conv2d(backend: str, x: Tensor, m_x: Tensor, s_x: Tensor, w: Tensor, b: Optional[Tensor],
                stride: list[int], padding: list[int], dilation: list[int], groups: int) -> Tensor:
    return integer.conv2d(backend, x, m_x, s_x, w, b, stride, padding, dilation, groups).contiguous()


@int8_conv2d.register_fake
def _(backend, x, m_x, s_x, w, b, stride, padding, dilation, groups):
    hw = [_conv_size(x.shape[2 + i], w.shape[2 + i], stride[i], padding[i], dilation[i]) for i in range(2)]
    return x.new_empty(x.shape[0], w.shape[0], *hw)


@int8_conv2d.register_vmap
def _(info, in_dims, *args):
    return _per_node(int8_conv2d, info, in_dims, *args)


@torch.library.custom_op("lpdl::int8_conv2d_input_grad", mutates_args=())
def int8_conv2d_input_grad(backend: str, g: Tensor, w: Tensor, in_shape: list[int], stride: list[int],
                           padding: list[int], dilation: list[int], groups: int) -> Tensor:
    return integer.conv2d_input_grad(backend, g, w, in_shape, stride, padding, dilation, groups).contiguous()


@int8_conv2d_input_grad.register_fake
def _(backend, g, w, in_shape, stride, padding, dilation, groups):
    return g.new_empty(in_shape)


@int8_conv2d_input_grad.register_vmap
def _(info, in_dims, backend, g, w, in_shape, *rest):
    return _per_node(int8_conv2d_input_grad, info, in_dims, backend, g, w, in_shape, *rest)


@torch.library.custom_op("lpdl::int8_linear", mutates_args=())
def int8_linear(backend: str, x: Tensor, m_x: Tensor, s_x: Tensor, w: Tensor, b: Optional[Tensor]) -> Tensor:
    return integer.linear(backend, x, m_x, s_x, w, b).contiguous()


@int8_linear.register_fake
def _(backend, x, m_x, s_x, w, b):
    return x.new_empty(*x.shape[:-1], w.shape[0])


@int8_linear.register_vmap
def _(info, in_dims, *args):
    return _per_node(int8_linear, info, in_dims, *args)


@torch.library.custom_op("lpdl::int8_linear_input_grad", mutates_args=())
def int8_linear_input_grad(backend: str, g: Tensor, w: Tensor) -> Tensor:
    return integer.linear_input_grad(backend, g, w).contiguous()


@int8_linear_input_grad.register_fake
def _(backend, g, w):
    return g.new_empty(*g.shape[:-1], w.shape[1])


@int8_linear_input_grad.register_vmap
def _(info, in_dims, *args):
    return _per_node(int8_linear_input_grad, info, in_dims, *args)


class IntConv(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(backend, x, m_x, s_x, w, b, stride, padding, dilation, groups, grad_bits, grad_rounding):
        return int8_conv2d(backend, *_plain(x, m_x, s_x, w, b), list(stride), list(padding), list(dilation), groups)

    @staticmethod
    def setup_context(ctx, inputs, output):
        backend, x, _, _, w, b, stride, padding, dilation, groups, grad_bits, grad_rounding = inputs
        ctx.save_for_backward(x, w)
        ctx.conf = (backend, list(stride), list(padding), list(dilation), groups, grad_bits, grad_rounding,
                    b is not None)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        backend, stride, padding, dilation, groups, grad_bits, grad_rounding, has_bias = ctx.conf
        gx = gw = gb = None
        if ctx.needs_input_grad[1]:
            gq = own_range_quant(g, grad_bits, grad_rounding)
            gx = int8_conv2d_input_grad(backend, *_plain(gq, w), list(x.shape), stride, padding, dilation, groups)
        if ctx.needs_input_grad[4] or (has_bias and ctx.needs_input_grad[5]):
            _, gw, gb = torch.ops.aten.convolution_backward(
                g, x, w, [w.shape[0]] if has_bias else None, stride, padding, dilation, False, [0, 0], groups,
                [False, True, has_bias])
        return None, gx, None, None, gw, gb, None, None, None, None, None, None


class IntLinear(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(backend, x, m_x, s_x, w, b, grad_bits, grad_rounding):
        return int8_linear(backend, *_plain(x, m_x, s_x, w, b))

    @staticmethod
    def setup_context(ctx, inputs, output):
        backend, x, _, _, w, b, grad_bits, grad_rounding = inputs
        ctx.save_for_backward(x, w)
        ctx.conf = (backend, grad_bits, grad_rounding, b is not None)

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        backend, grad_bits, grad_rounding, has_bias = ctx.conf
        gx = gw = gb = None
        if ctx.needs_input_grad[1]:
            gx = int8_linear_input_grad(backend, *_plain(own_range_quant(g, grad_bits, grad_rounding), w))
        if ctx.needs_input_grad[4]:
            gw = g.reshape(-1, g.shape[-1]).transpose(0, 1) @ x.reshape(-1, x.shape[-1])
        if has_bias and ctx.needs_input_grad[5]:
            gb = g.reshape(-1, g.shape[-1]).sum(0)
        return None, gx, None, None, gw, gb, None, None


# --- the compiled step's form (lpdl_core.quant.traced): one op, its backward registered ----------

def _blocks(t: Optional[Tensor], nodes: int, dim: int = 0) -> list:
    return [None] * nodes if t is None else list(t.chunk(nodes, dim))


@torch.library.custom_op("lpdl::int8_bifurcated_conv2d", mutates_args=())
def int8_bifurcated_conv2d(backend: str, x: Tensor, m_x: Tensor, s_x: Tensor, w: Tensor, b: Optional[Tensor],
                           key: Tensor, stride: list[int], padding: list[int], dilation: list[int], groups: int,
                           grad_bits: int, rounding: str, nodes: int) -> Tensor:
    """`traced.conv2d` in integers: `nodes` nodes' convolutions as one grouped convolution (node i:
    block i of the channels, its grid m_x[i], s_x[i]), each node's product on its own grids."""
    m, s = m_x.reshape(-1).expand(nodes), s_x.reshape(-1).expand(nodes)
    return torch.cat([integer.conv2d(backend, xi, m[i], s[i], wi, bi, stride, padding, dilation, groups // nodes)
                      for i, (xi, wi, bi) in enumerate(zip(_blocks(x, nodes, 1), _blocks(w, nodes),
                                                           _blocks(b, nodes)))], 1).contiguous()


@int8_bifurcated_conv2d.register_fake
def _(backend, x, m_x, s_x, w, b, key, stride, padding, dilation, groups, grad_bits, rounding, nodes):
    hw = [_conv_size(x.shape[2 + i], w.shape[2 + i], stride[i], padding[i], dilation[i]) for i in range(2)]
    return x.new_empty(x.shape[0], w.shape[0], *hw)


def _traced_setup(ctx, inputs, output) -> None:
    backend, x, _, _, w, b, key, stride, padding, dilation, groups, grad_bits, rounding, nodes = inputs
    ctx.save_for_backward(x, w, key)
    ctx.conf = (backend, stride, padding, dilation, groups, grad_bits, rounding, nodes, b is not None)


def _traced_backward(ctx, g):
    """g_x from Q(g) (one range per node) in integers, node by node; g_W and g_b from g in float32."""
    from . import traced

    x, w, key = ctx.saved_tensors
    backend, stride, padding, dilation, groups, grad_bits, rounding, nodes, has_bias = ctx.conf
    gq = traced.fake_quant_groups(g, grad_bits, rounding, nodes, key)
    in_shape = [x.shape[0], x.shape[1] // nodes, *x.shape[2:]]
    gx = torch.cat([int8_conv2d_input_grad(backend, gi, wi, in_shape, stride, padding, dilation, groups // nodes)
                    for gi, wi in zip(_blocks(gq.detach(), nodes, 1), _blocks(w.detach(), nodes))], 1)
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
        gx = torch.stack([int8_linear_input_grad(backend, gq[i], w[i].detach()) for i in range(g.shape[0])])
        g2, x2 = g.reshape(g.shape[0], -1, g.shape[-1]), x.reshape(x.shape[0], -1, x.shape[-1])
        gw, gb = g2.transpose(1, 2) @ x2, g2.sum(1)
    else:
        gx = int8_linear_input_grad(backend, gq, w.detach())
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
