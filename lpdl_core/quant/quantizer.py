r"""Asymmetric min-max fake quantization (GEMMLOWP-style, simulated in float32), as the official
`quantized_training/quantize.py` (docs/paper-vs-code.md, 'The quantizer'):

.. math::
    s = \max\!\left(\frac{x_{max} - x_{min}}{2^b - 1}, 10^{-8}\right),\quad
    q = \mathrm{round}\!\left(\mathrm{clamp}\!\left(\frac{x - x_{min}}{s} + \xi, 0, 2^b - 1\right)\right),\quad
    Q(x) = q\,s + x_{min}

with ξ = 0 (nearest) or ξ ~ U[−½, ½) (stochastic). Backward is the straight-through estimator.
Everything is plain tensor ops (no .item(), no torch.fake_quantize_*), so it runs under
torch.func.vmap and never synchronises with the device.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import FIDELITY_CHOICES
from . import fused, noise
from .eager import eager_apply

ROUNDINGS = FIDELITY_CHOICES["act_rounding"]  # the fidelity option's values, declared once
# quantize/quantize_grad in the form torch.compile traces, with the switch that selects it: set by
# lpdl_core.quant.traced when imported (it reads this module's arithmetic, so this one cannot import it)
TRACEABLE: dict = {}


@dataclass(frozen=True, kw_only=True)
class QuantCfg:
    """8-bit training settings of one run.

    bits: weights/activations/norm parameters; grad_bits: layer gradients (bifurcation).
    act_rounding: activation rounding in training. "nearest" (default) is what Banner et al.'s
        QuantMeasure asks for; "stochastic" (with eval_rounding="stochastic") reproduces the
        official code, whose positional-argument bug turns it on in training and eval alike.
    grad_rounding: layer-gradient rounding ("stochastic", the paper/Banner et al.; "nearest" makes
        a run deterministic, used by the loop == batched test).
    eval_rounding: activation rounding at eval. "nearest" (default, the paper's intent);
        "stochastic" reproduces the official code's positional-argument bug (stochastic in eval too).
    measure_as_parameters: False (default) keeps QuantMeasure's running min/max as buffers (not
        gossiped, compressed or counted); True reproduces the official code, where they are
        nn.Parameters(requires_grad=False) and therefore gossiped and sparsified.
    momentum: running-range update, running = momentum·running + (1 − momentum)·batch (official 0.1).
    int8_arithmetic: "fake" (float32 simulation, the library default: no run's arithmetic changes
        unasked) | "integer" (exact integer products where a kernel exists, lpdl_core.quant.integer;
        the paper-text fidelity asks for it).
    """

    bits: int = 8
    grad_bits: int = 8
    act_rounding: str = "nearest"      # each of the three: one of ROUNDINGS
    grad_rounding: str = "stochastic"
    eval_rounding: str = "nearest"
    measure_as_parameters: bool = False
    momentum: float = 0.1
    int8_arithmetic: str = "fake"      # one of FIDELITY_CHOICES["int8_arithmetic"]

    def __post_init__(self) -> None:
        for name in ("bits", "grad_bits"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or not 2 <= v <= 16:
                raise ValueError(f"quant.{name} must be an integer in [2, 16], got {v!r}")
        for name in ("act_rounding", "grad_rounding", "eval_rounding"):
            if getattr(self, name) not in ROUNDINGS:
                raise ValueError(f"quant.{name} must be one of {ROUNDINGS}, got {getattr(self, name)!r}")
        if self.int8_arithmetic not in FIDELITY_CHOICES["int8_arithmetic"]:
            raise ValueError(f"quant.int8_arithmetic must be one of {FIDELITY_CHOICES['int8_arithmetic']}, "
                             f"got {self.int8_arithmetic!r}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"quant.momentum must be in [0, 1), got {self.momentum}")


def functorch_wrapped(t: torch.Tensor) -> bool:
    """True inside torch.func transforms (vmap/grad), where in-place ops may lack batching rules;
    also while torch.compile traces (it cannot look inside this check, and the out-of-place
    variants it guards are valid everywhere)."""
    return torch.compiler.is_compiling() or torch._C._functorch.is_functorch_wrapped_tensor(t)


def rank_of(r: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """A per-tensor range r (one element) shaped to x's rank. Under vmap this saves the batching
    rules' re-views and scalar copies in every op that broadcasts r (same values, same arithmetic)."""
    return r.reshape((1,) * x.dim()) if r.numel() == 1 and r.dim() != x.dim() else r


def fake_quant(x: torch.Tensor, bits: int = 8, rounding: str = "nearest",
               x_min: torch.Tensor | None = None, x_max: torch.Tensor | None = None) -> torch.Tensor:
    """Quantize-dequantize x to 2**bits levels over [x_min, x_max] (default: x's own range).

    No gradient handling: use `quantize` for the STE version. x_min/x_max may be 0-dim tensors
    or broadcastable to x (e.g. per-sample ranges). The arithmetic is the official (Banner et
    al.'s) in-place sequence: add(-min).div(s), [+ noise], clamp, round, mul(s).add(min).
    """
    if x_min is None or x_max is None:  # at x's rank (keepdim), so no op re-views them
        lo, hi = torch.aminmax(x.detach() if x.requires_grad else x, keepdim=True)
        x_min = lo if x_min is None else x_min
        x_max = hi if x_max is None else x_max
    x_min, x_max = rank_of(x_min, x), rank_of(x_max, x)
    return dequantized(x, x_min, quant_scale(x_min, x_max, bits), bits, rounding)


def quant_scale(x_min: torch.Tensor, x_max: torch.Tensor, bits: int) -> torch.Tensor:
    """s = max((x_max - x_min) / (2**bits - 1), 1e-8): the step of `fake_quant`'s grid."""
    return ((x_max - x_min) / (2.0 ** bits - 1.0)).clamp(min=1e-8)


def levels(x: torch.Tensor, x_min: torch.Tensor, scale: torch.Tensor, bits: int, rounding: str) -> torch.Tensor:
    """q = round(clamp((x - x_min)/s [+ ξ], 0, 2**bits - 1)): x's grid levels, integers held in
    float32 (a new tensor; `dequantized` is q·s + x_min)."""
    t = (x - x_min).div_(scale)  # a fused x*(1/s) - min/s differs in the last bit at .5 ties
    if rounding == "stochastic":
        t = noise.add_uniform_noise_(t, functorch_wrapped(t))  # official order: noise, then clamp, then round
    # in place except under vmap, which has no batching rule for clamp_
    top = 2.0 ** bits - 1.0
    t = t.clamp(0.0, top) if functorch_wrapped(t) else t.clamp_(0.0, top)
    return t.round_()


def dequantized(x: torch.Tensor, x_min: torch.Tensor, scale: torch.Tensor, bits: int,
                rounding: str) -> torch.Tensor:
    """round(clamp((x - x_min)/s [+ ξ], 0, 2**bits - 1))·s + x_min: `fake_quant` given its range
    and step (each broadcastable to x; a new tensor)."""
    return from_levels(levels(x, x_min, scale, bits, rounding), x_min, scale)


def from_levels(q: torch.Tensor, x_min: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Q = q·s + x_min from grid levels q (float32 levels, or the uint8 an integer product keeps):
    the one place the dequantization's arithmetic is written, so both give the same values."""
    return q.to(scale.dtype).mul_(scale).add_(x_min)


def own_range_levels(x: torch.Tensor, bits: int, rounding: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(q, s, x_min) with Q(x) = q·s + x_min over x's own range: `fake_quant`'s arithmetic and
    noise, stopped before the dequantization (an integer product reads q; lpdl_core.quant.integer)."""
    lo, hi = torch.aminmax(x.detach() if x.requires_grad else x)
    s = quant_scale(lo, hi, bits)
    return levels(x, lo, s, bits, rounding), s, lo


def own_range_quant(x: torch.Tensor, bits: int, rounding: str) -> torch.Tensor:
    """Q(x) over x's own range (a layer gradient's quantizer; Range EvoNorm's scale), by its fused
    kernel while `fused.active()`, else `fake_quant`. No gradient handling."""
    return fused.own_range(x, bits, rounding) if fused.active() else fake_quant(x, bits, rounding)


class _Quantize(torch.autograd.Function):
    """Forward Q(x); backward identity (straight-through estimator), with no extra graph nodes."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, bits, rounding, x_min, x_max):
        return fake_quant(x, bits, rounding, x_min, x_max)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        pass

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None, None, None


_quantize_apply = eager_apply(_Quantize)


def quantize(x: torch.Tensor, bits: int = 8, rounding: str = "nearest",
             x_min: torch.Tensor | None = None, x_max: torch.Tensor | None = None) -> torch.Tensor:
    """Fake-quantize with a straight-through estimator: forward Q(x), backward identity."""
    if x_min is not None and x_min.requires_grad:  # ranges are constants of the STE
        x_min = x_min.detach()
    if x_max is not None and x_max.requires_grad:
        x_max = x_max.detach()
    if TRACEABLE and TRACEABLE["active"]():
        return TRACEABLE["quantize"](x, bits, rounding, x_min, x_max)
    return _quantize_apply(x, bits, rounding, x_min, x_max)


class _StraightThrough(torch.autograd.Function):
    """Forward q (an already quantized x, computed without autograd); backward identity to x:
    the STE of `quantize` for a Q(x) built elsewhere. Eager only (no vmap rule)."""

    @staticmethod
    def forward(ctx, x, q):
        return q.view_as(q)

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def straight_through(x: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """q's values with x's gradient passing straight through (q computed from x without autograd)."""
    return _StraightThrough.apply(x, q)


class _QuantizeGrad(torch.autograd.Function):
    """Identity forward; backward quantizes the incoming gradient (stochastic or nearest)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, bits: int, rounding: str) -> torch.Tensor:
        return x.view_as(x)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.bits, ctx.rounding = inputs[1], inputs[2]

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return own_range_quant(grad, ctx.bits, ctx.rounding), None, None


_quantize_grad_apply = eager_apply(_QuantizeGrad)


def quantize_grad(x: torch.Tensor, bits: int = 8, rounding: str = "stochastic") -> torch.Tensor:
    """Mark x so that the gradient flowing back through it is quantized to `bits`."""
    if TRACEABLE and TRACEABLE["active"]():
        return TRACEABLE["quantize_grad"](x, bits, rounding)
    return _quantize_grad_apply(x, bits, rounding)
