r"""8-bit layers with gradient bifurcation (paper Sec. 3; Banner et al. 2018;
docs/paper-vs-code.md, 'What is quantized' and 'Gradient bifurcation').

A QConv2d/QLinear computes y = op(Q(x), Q(W)) with Q the 8-bit min-max quantizer (activations
via QuantMeasure's range, weights over their own range, nearest rounding), and back-propagates

.. math::
    g_x = \frac{\partial y}{\partial x}^\top Q_{stoch}(g_y)\quad(\text{layer gradient, 8-bit}),\qquad
    g_W = \frac{\partial y}{\partial W}^\top g_y\quad(\text{weight gradient, float32})

with straight-through estimators through Q(x) and Q(W). Unlike the official code (which runs
every op twice, once per gradient branch), the op runs once and only the backward is split, so
the arithmetic is identical at about half the forward cost.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import arithmetic, fused, int8_compiled, int8_ops, traced
from .params import OwnRangeParams
from .quantizer import (QuantCfg, eager_apply, from_levels, levels, own_range_quant, quant_scale, quantize,
                        quantize_grad, rank_of, straight_through)


class QuantMeasure(nn.Module):
    """Quantizes activations to `bits` over a measured range (official `QuantMeasure`).

    Training: range = batch mean of per-sample min and max; running range updated as
    running = momentum·running + (1 − momentum)·batch. Eval: the running range.
    """

    def __init__(self, qcfg: QuantCfg):
        super().__init__()
        self.qcfg = qcfg
        if qcfg.measure_as_parameters:  # official: Parameters, hence gossiped and compressed
            self.running_min = nn.Parameter(torch.zeros(1), requires_grad=False)
            self.running_max = nn.Parameter(torch.zeros(1), requires_grad=False)
            # node state that gossip mixes but no optimizer moves (lpdl_core.decentral.layout)
            self.running_min.gossiped = self.running_max.gossiped = True
        else:
            self.register_buffer("running_min", torch.zeros(1))
            self.register_buffer("running_max", torch.zeros(1))

    def extra_repr(self) -> str:
        """Its settings (so a model's printed tree, and the architecture a checkpoint records, show them)."""
        q = self.qcfg
        return (f"bits={q.bits}, act_rounding={q.act_rounding}, eval_rounding={q.eval_rounding}, "
                f"ranges={'parameters' if q.measure_as_parameters else 'buffers'}, momentum={q.momentum}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quantized(x)[0]

    def quantized(self, x: torch.Tensor, grid: bool = False):
        """(Q(x), its grid (x_min, s) when asked, else None): an integer product reads Q(x) on it."""
        q = self.qcfg
        if self.training and fused.active() and not grid:  # range, running update, Q(x): one kernel
            return fused.measured(x, self.running_min, self.running_max, q.bits, q.act_rounding, q.momentum), None
        x_min, x_max, rounding = self._range(x)
        on_grid = (x_min.detach(), quant_scale(x_min.detach(), x_max.detach(), q.bits)) if grid else None
        return quantize(x, self.qcfg.bits, rounding, x_min, x_max), on_grid

    def levels(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q_x, x_min, s) with Q(x) = s·q_x + x_min, q_x the grid levels as uint8: what an eager
        integer product reads (no Q(x) in float32, and no STE here: the product's Function carries it)."""
        q_x, lo, s = self._float_levels(x)
        return q_x.to(torch.uint8), lo, s

    def quantized_levels(self, x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(Q(x), q_x): `forward`'s Q(x) (same values, same straight-through gradient) and its grid
        levels as `dtype` integers, or None for q_x where two levels round to one float32 value
        (a range tiny beside its offset): Q(x)'s order is then not the levels' order."""
        q_x, lo, s = self._float_levels(x)
        with torch.no_grad():
            grid = from_levels(torch.arange(2 ** self.qcfg.bits, dtype=s.dtype, device=s.device), lo.view(1),
                               s.view(1))
            order = q_x.to(dtype) if bool((grid[1:] > grid[:-1]).all()) else None
        return straight_through(x, from_levels(q_x, lo, s)), order  # from_levels reuses q_x: order first

    def _float_levels(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q_x float32 integers, x_min, s): `quantize`'s grid arithmetic, stopped before Q(x)."""
        x_min, x_max, rounding = self._range(x)
        lo, hi = rank_of(x_min.detach(), x), rank_of(x_max.detach(), x)
        s = quant_scale(lo, hi, self.qcfg.bits)
        with torch.no_grad():
            return levels(x.detach(), lo, s, self.qcfg.bits, rounding), lo, s

    def _range(self, x: torch.Tensor):
        """(x_min, x_max, rounding) of this call: in training the batch's, the running range
        updated; at eval the running range."""
        if not self.training:
            return self.running_min, self.running_max, self.qcfg.eval_rounding
        with torch.no_grad():
            # per-sample min and max (amin and amax: aminmax(dim=1), one op, measured 10x
            # slower on the CPU) and their batch means, kept at x's rank (1, ..., 1) so that no
            # op re-views them: min and max are exact, and the mean of a (B, 1, ..., 1) tensor
            # over dim 0 reduces the same B values in the same order as that of a (B,) tensor
            rest = tuple(range(1, x.dim()))
            x_min = x.amin(rest, keepdim=True).mean(0, keepdim=True)
            x_max = x.amax(rest, keepdim=True).mean(0, keepdim=True)
            m = self.qcfg.momentum
            self.running_min.mul_(m).add_(x_min.view(1) * (1 - m))
            self.running_max.mul_(m).add_(x_max.view(1) * (1 - m))
        return x_min, x_max, self.qcfg.act_rounding


class _BifurcatedConv(torch.autograd.Function):
    """conv2d whose backward takes the input gradient from a quantized g_y, the weight gradient
    from the float g_y. Written with aten ops so torch.func.vmap can batch it."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, w, b, stride, padding, dilation, groups, grad_bits, grad_rounding):
        return F.conv2d(x, w, b, stride, padding, dilation, groups)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w, b, stride, padding, dilation, groups, grad_bits, grad_rounding = inputs
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        ctx.conf = (stride, padding, dilation, groups)
        ctx.grad_bits, ctx.grad_rounding = grad_bits, grad_rounding

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.conf
        conv_bw = torch.ops.aten.convolution_backward
        bias_sizes = [w.shape[0]] if ctx.has_bias else None
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gq = own_range_quant(g, ctx.grad_bits, ctx.grad_rounding)
            gx = conv_bw(gq, x, w, bias_sizes, stride, padding, dilation, False, [0, 0], groups,
                         [True, False, False])[0]
        if ctx.needs_input_grad[1] or (ctx.has_bias and ctx.needs_input_grad[2]):
            _, gw, gb = conv_bw(g, x, w, bias_sizes, stride, padding, dilation, False, [0, 0], groups,
                                [False, True, ctx.has_bias])
        return gx, gw, gb, None, None, None, None, None, None


class _BifurcatedLinear(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x, w, b, grad_bits, grad_rounding):
        return F.linear(x, w, b)

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, w, b, grad_bits, grad_rounding = inputs
        ctx.save_for_backward(x, w)
        ctx.has_bias = b is not None
        ctx.grad_bits, ctx.grad_rounding = grad_bits, grad_rounding

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        gx = gw = gb = None
        if ctx.needs_input_grad[0]:
            gx = own_range_quant(g, ctx.grad_bits, ctx.grad_rounding) @ w
        if ctx.needs_input_grad[1]:
            gw = g.reshape(-1, g.shape[-1]).transpose(0, 1) @ x.reshape(-1, x.shape[-1])
        if ctx.has_bias and ctx.needs_input_grad[2]:
            gb = g.reshape(-1, g.shape[-1]).sum(0)
        return gx, gw, gb, None, None


_conv_eager = eager_apply(_BifurcatedConv)
_linear_eager = eager_apply(_BifurcatedLinear)
_int_conv = eager_apply(int8_ops.IntConv)
_int_linear = eager_apply(int8_ops.IntLinear)


def _conv_apply(*args):
    return (traced.conv2d if traced.active() else _conv_eager)(*args)


def _linear_apply(*args):
    return (traced.linear if traced.active() else _linear_eager)(*args)


class _QuantizedOperands(OwnRangeParams):
    """Shared by QConv2d/QLinear: 8-bit input (measured range), weight and bias (own range)."""

    quantized_params = ("weight", "bias")

    def quantized_operands(self, x: torch.Tensor):
        return self.quantize_input(x), self.own_range(self.weight), self.own_range(self.bias)

    def integer_operands(self, x: torch.Tensor):
        """(the integer kernel backend or None, the input operand, Q(W), Q(b)) for this call. The
        input operand: x's grid (q_x, x_min, s) in an eager integer product; (Q(x), x_min, s) in a
        compiled one (inductor fuses the float32 chain); (Q(x),) in a fake product."""
        q = self.qcfg
        kernel = arithmetic.backend(q.int8_arithmetic, q.bits, q.grad_bits, x)
        if kernel is not None and not traced.active():
            operand = self.quantize_input.levels(x)
        else:
            qx, grid = self.quantize_input.quantized(x, grid=kernel is not None)
            operand = (qx, *grid) if grid else (qx,)
        return kernel, operand, self.own_range(self.weight), self.own_range(self.bias)


class QConv2d(_QuantizedOperands, nn.Conv2d):
    """nn.Conv2d with 8-bit input/weight/bias and gradient bifurcation (same parameters)."""

    def __init__(self, *args, qcfg: QuantCfg, **kwargs):
        super().__init__(*args, **kwargs)
        if self.padding_mode != "zeros" or isinstance(self.padding, str):
            raise ValueError("QConv2d supports numeric zero padding only")
        self.qcfg = qcfg
        self.quantize_input = QuantMeasure(qcfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel, operand, qw, qb = self.integer_operands(x)
        q = self.qcfg
        if kernel is not None and traced.active():  # the compiled step's form
            return int8_compiled.int8_bifurcated_conv2d(kernel, *operand, qw, qb, traced.noise_key(x.device),
                                                   list(self.stride), list(self.padding), list(self.dilation),
                                                   self.groups, q.grad_bits, q.grad_rounding, 1)
        if kernel is not None:  # exact integer products (lpdl_core.quant.integer)
            return _int_conv(kernel, x, *operand, qw, qb, self.stride, self.padding, self.dilation, self.groups,
                             q.grad_bits, q.grad_rounding)
        return _conv_apply(*operand, qw, qb, self.stride, self.padding, self.dilation,
                           self.groups, q.grad_bits, q.grad_rounding)


class QLinear(_QuantizedOperands, nn.Linear):
    """nn.Linear with 8-bit input/weight/bias and gradient bifurcation (same parameters)."""

    def __init__(self, *args, qcfg: QuantCfg, **kwargs):
        super().__init__(*args, **kwargs)
        self.qcfg = qcfg
        self.quantize_input = QuantMeasure(qcfg)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kernel, operand, qw, qb = self.integer_operands(x)
        q = self.qcfg
        if kernel is not None and traced.active():  # the compiled step's form
            return int8_compiled.int8_bifurcated_linear(kernel, *operand, qw, qb, traced.noise_key(x.device),
                                                   q.grad_bits, q.grad_rounding, False)
        if kernel is not None:
            return _int_linear(kernel, x, *operand, qw, qb, q.grad_bits, q.grad_rounding)
        return _linear_apply(*operand, qw, qb, q.grad_bits, q.grad_rounding)


class Add(nn.Module):
    """Full-precision residual add (so FP and LP models share one definition)."""

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b


class QAdd(nn.Module):
    """Quantized residual add (official `Qsum`): both inputs 8-bit, layer gradient 8-bit."""

    def __init__(self, qcfg: QuantCfg):
        super().__init__()
        self.qcfg = qcfg
        self.quantize_a = QuantMeasure(qcfg)
        self.quantize_b = QuantMeasure(qcfg)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        out = self.quantize_a(a) + self.quantize_b(b)
        return quantize_grad(out, self.qcfg.grad_bits, self.qcfg.grad_rounding)


def make_conv(in_ch: int, out_ch: int, kernel_size: int, *, stride: int = 1, padding: int = 0,
              groups: int = 1, bias: bool = False, qcfg: QuantCfg | None = None) -> nn.Conv2d:
    """nn.Conv2d at full precision (qcfg None) or QConv2d at low precision."""
    kw = dict(stride=stride, padding=padding, groups=groups, bias=bias)
    return nn.Conv2d(in_ch, out_ch, kernel_size, **kw) if qcfg is None else \
        QConv2d(in_ch, out_ch, kernel_size, qcfg=qcfg, **kw)


def make_linear(in_f: int, out_f: int, *, bias: bool = True, qcfg: QuantCfg | None = None) -> nn.Linear:
    return nn.Linear(in_f, out_f, bias=bias) if qcfg is None else QLinear(in_f, out_f, bias=bias, qcfg=qcfg)


def make_add(qcfg: QuantCfg | None = None) -> nn.Module:
    return Add() if qcfg is None else QAdd(qcfg)
