r"""Normalization layers for full-precision and 8-bit training (paper Sec. 3; docs/paper-vs-code.md,
'EvoNorm-S0 and Range EvoNorm'). The paper replaces BatchNorm + ReLU by EvoNorm-S0 (Liu et al.
2020) in full precision and by its own **Range EvoNorm** at 8 bits: EvoNorm-S0 with the per-sample
group standard deviation replaced by a scaled range of the activations (Banner et al.'s Range BN
trick) and the sigmoid by a hard sigmoid, so no exp, square or square root is needed. Both use
sample statistics only, so they survive heterogeneous (non-IID) data where batch statistics diverge.

Every kind returned by :func:`make_norm` **contains its nonlinearity** (EvoNorm's x·σ(v·x) gate;
a ReLU after BN/GN/Range BN), so all kinds are drop-in replacements for one another and models
put no separate activation after a norm. Where a ResNet has a norm without ReLU (a residual
branch's last norm, the shortcut's) the ReLU kinds are built with act=False, and the ReLU
follows the residual add instead (`trunk_activation`; official `resnet.py` BasicBlock). Every
kind exposes γ as ``.weight`` ((1, C, 1, 1) for the EvoNorms, (C,) for the BN/GN kinds), which
models set to 0 on a residual branch's last norm.

All ops are plain tensor ops (no .item(), no Python floats taken from tensors), so a forward runs
under ``torch.func.vmap(functional_call)`` over stacked node parameters. Layers with running
statistics (QuantMeasure inside the LP layers, RangeBatchNorm2d) update them in place in
training; under vmap that works only when the executor passes those buffers stacked as well.
Range BN and the range-to-std factor live in ``range_bn.py`` and are re-exported here;
EvoNorm-S0's group variance (two passes on a CPU, with torch.var's backward) in ``variance.py``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ..config import NORMS
from .layers import QuantMeasure
from .params import OwnRangeParams
from .quantizer import QuantCfg, quantize, quantize_grad
from .range_bn import (RANGE_CONST, BatchNormAct, GroupNormAct, RangeBatchNorm2d, RangeBNAct, ReluAfter,  # noqa: F401
                       check_4d, range_scale_fix)
from .range_fused import group_scale, level_dtype, range_evonorm, reads_order
from .variance import group_variance


def hardsigmoid(t: torch.Tensor) -> torch.Tensor:
    """clamp(t/6 + 1/2, 0, 1), written out as in the official RangeEN (paper eq. 2)."""
    return torch.clamp(t / 6 + 0.5, min=0.0, max=1.0)


# Range EvoNorm's gate h in n = x·h(v·x), by name: "hardsigmoid" is the paper's eq. 2 (and the
# official 8-bit ``quantize.RangeEN``), "sigmoid" the official full-precision ``evonorm.RangeEN_full``.
GATES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {"hardsigmoid": hardsigmoid,
                                                            "sigmoid": torch.sigmoid}
ACTIVATIONS = tuple(GATES)  # the gate names (RangeEvoNorm's `activation` argument)


@dataclass(frozen=True)
class NormSpec:
    """A norm kind plus its Range EvoNorm gate: what models pass to :func:`make_norm` as `norm`
    when the gate is not the default (models hand `norm` through unread, so a plain kind name
    and a NormSpec are interchangeable for them). gate applies to the Range EvoNorm kinds only."""

    kind: str
    gate: str = "hardsigmoid"

    def __post_init__(self):
        if self.gate not in GATES:
            raise ValueError(f"gate must be one of {', '.join(GATES)}, got {self.gate!r}")
        if self.gate != "hardsigmoid" and self.kind not in ("range-evonorm", "range-evonorm-fp"):
            raise ValueError(f"norm {self.kind!r} has no gate to choose; only the Range EvoNorm kinds do")


def _check_groups(num_features: int, groups: int) -> None:
    if groups < 1 or num_features < groups or num_features % groups:
        raise ValueError(f"num_features={num_features} must be a positive multiple of groups={groups}")


class EvoNormS0(nn.Module):
    r"""EvoNorm-S0 (Liu et al. 2020; official ``evonorm.EvoNormSample2d``), the FP models' norm:

    .. math::
        y = \frac{x\,\sigma(v x)}{\sqrt{\mathrm{Var}_g(x) + \epsilon}}\,\gamma + \beta

    with Var_g the biased variance per sample over each of G groups of (C/G, H, W). γ=1, β=0, v=1.
    """

    def __init__(self, num_features: int, groups: int = 8, eps: float = 1e-5):
        super().__init__()
        _check_groups(num_features, groups)
        self.num_features, self.groups, self.eps = num_features, groups, eps
        shape = (1, num_features, 1, 1)
        self.weight = nn.Parameter(torch.ones(shape))
        self.bias = nn.Parameter(torch.zeros(shape))
        self.v = nn.Parameter(torch.ones(shape))

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)
        nn.init.ones_(self.v)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_4d(x, self)
        B, C, H, W = x.shape
        n = x * torch.sigmoid(x * self.v)
        # The variance is of x, not of the gated n (as EvoNorm-S0 and the official code).
        std = (group_variance(x.reshape(B, self.groups, -1)) + self.eps).sqrt()
        return (n.reshape(B, self.groups, -1) / std).reshape(B, C, H, W) * self.weight + self.bias

    def extra_repr(self) -> str:
        return f"{self.num_features}, groups={self.groups}, eps={self.eps}"


class RangeEvoNorm(OwnRangeParams, nn.Module):
    r"""Range EvoNorm (the paper's Sec. 3; official ``quantize.RangeEN``).

    .. math::
        n = x_q\,h(v_q x_q),\qquad
        \hat\sigma_{b,g} = \Big(\overline{\max}_k - \overline{\min}_k\Big)\,
            \frac{0.175\,(1+\sqrt{\pi\ln 4})}{\sqrt{2\ln m}},\qquad
        s_{b,g} = Q_8\!\Big(\frac{1}{\hat\sigma_{b,g} + \epsilon}\Big),\qquad
        y = n\,s_{b,g}\,Q_8(\gamma) + Q_8(\beta)

    where x_q = QuantMeasure(x) (8-bit over the measured range), v_q = Q_8(v), h the gate
    (below); per sample b and group g, x_q is cut into `chunks` contiguous chunks of
    m = C·H·W/(groups·chunks) elements (a plain reshape of (B, C, H, W) to (B, G, K, m)), and the
    bars are means over chunks of each chunk's max / min. Q_8 is per-tensor nearest rounding (the
    scale s over all B×G entries), with straight-through gradients; the output's layer gradient is
    quantized to qcfg.grad_bits (``quantize_grad``). The range is taken from x_q, not from n. The
    statistics are per sample: no running stats, so train and eval differ only in QuantMeasure.

    qcfg=None gives **Range EvoNorm at full precision** (the paper's Figure 1 curve): the same
    formula with every Q_8 and the gradient quantization removed. `activation` names the gate h
    (registry ``GATES``):

    .. math::
        h_{\mathrm{hardsigmoid}}(t) = \min\!\big(\max(t/6 + 1/2,\ 0),\ 1\big),\qquad
        h_{\mathrm{sigmoid}}(t) = \sigma(t) = \frac{1}{1 + e^{-t}}

    "hardsigmoid" (default) is what the paper's eq. 2 describes and the LP code uses. "sigmoid"
    is the official full-precision class ``evonorm.RangeEN_full`` (not instantiated by the official
    scripts; github.com/aparna-aketi/Low_Precision_DL, quantized_training/evonorm.py):
    y = (x·σ(v x) ⊙ s_{b,g})·γ + β with s from x as above, no Q_8, γ ~ U(0, 1), β = 0, v = 1, i.e.
    this formula at qcfg=None with h = σ; only the float association n·(s·γ) vs (n·s)·γ differs
    (float32 rounding, measured ≤ 1e-6 on outputs of magnitude ~10).

    Parameters (1, C, 1, 1): γ ~ U(0, 1) (as the official class; ResNet-LP overrides it), β=0, v=1.
    Requires C·H·W divisible by groups·chunks with m ≥ 2 (true for every model here).

    fused=True (default, hard sigmoid only) runs the arithmetic as one autograd node with a
    hand-written backward (``range_fused.py``); fused=False composes autograd ops. Same math; the
    tests compare the two.
    """

    fused = True

    def __init__(self, num_features: int, *, qcfg: QuantCfg | None, groups: int = 8, chunks: int = 16,
                 eps: float = 1e-5, activation: str = "hardsigmoid"):
        super().__init__()
        _check_groups(num_features, groups)
        if chunks < 1:
            raise ValueError(f"chunks must be >= 1, got {chunks}")
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation must be one of {ACTIVATIONS}, got {activation!r}")
        self.num_features, self.groups, self.chunks, self.eps = num_features, groups, chunks, eps
        self.qcfg, self.activation = qcfg, activation
        self.quantized_params = ("v", "weight", "bias") if qcfg is not None else ()
        shape = (1, num_features, 1, 1)
        self.weight = nn.Parameter(torch.empty(shape))
        self.bias = nn.Parameter(torch.zeros(shape))
        self.v = nn.Parameter(torch.ones(shape))
        if qcfg is not None:
            self.quantize_input = QuantMeasure(qcfg)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.uniform_(self.weight)  # official: weight.data.uniform_()
        nn.init.zeros_(self.bias)
        nn.init.ones_(self.v)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_4d(x, self)
        B, C, H, W = x.shape
        G, K = self.groups, self.chunks
        if (C * H * W) % (G * K):
            raise ValueError(f"RangeEvoNorm needs C*H*W={C * H * W} divisible by groups*chunks={G * K}")
        m = C * H * W // (G * K)
        if m < 2:
            raise ValueError(f"RangeEvoNorm needs at least 2 elements per chunk, got m={m} for {tuple(x.shape)}")
        q, order, (v, w, b) = self.qcfg, None, (self.v, self.weight, self.bias)
        if q is not None:  # x_q's levels give the fused backward's max/min indices where it runs eagerly
            dtype = level_dtype(m, q.bits) if self.fused and self.activation == "hardsigmoid" else None
            x, order = (self.quantize_input.quantized_levels(x, dtype) if dtype and reads_order(x) else
                        (self.quantize_input(x), None))
            v, w, b = self.own_range(v), self.own_range(w), self.own_range(b)
        if self.fused and self.activation == "hardsigmoid":
            out = range_evonorm(x, v, w, b, groups=G, chunks=K, c=range_scale_fix(m), eps=self.eps,
                                bits=q.bits if q is not None else 0, order=order)
            return quantize_grad(out, q.grad_bits, q.grad_rounding) if q is not None else out
        t = x * v
        n = x * GATES[self.activation](t)
        y = x.reshape(B, G, K, m)
        # .max(-1).values (not amax): on ties the gradient goes to one element, as in the official code.
        r = y.max(-1).values.mean(-1) - y.min(-1).values.mean(-1)  # (B, G)
        scale = 1 / (r * range_scale_fix(m) + self.eps)
        if q is not None:
            scale = quantize(scale, q.bits)  # one range over all B×G entries
        out = n * group_scale(scale, w) + b  # n·(scale ⊗ γ) + β, as the fused op
        if q is not None:
            out = quantize_grad(out, q.grad_bits, q.grad_rounding)
        return out

    def extra_repr(self) -> str:
        prec = "fp32" if self.qcfg is None else f"{self.qcfg.bits}-bit"
        return (f"{self.num_features}, groups={self.groups}, chunks={self.chunks}, eps={self.eps}, "
                f"activation={self.activation}, {prec}")


# Kinds whose nonlinearity is a ReLU after the norm, as in He et al.'s ResNet and the official
# BN/GN models: there a residual branch's last norm and the shortcut's norm have none, and the
# ReLU follows the residual add (`trunk_activation`). The EvoNorm kinds' gate is the norm itself
# (official EvoNorm models have no ReLU anywhere).
@dataclass(frozen=True)
class NormKind:
    """A registered norm kind: build(num_features, qcfg, gate, act) -> module; whether it carries
    a ReLU (left out by act=False, and put after a residual add: `trunk_activation`); for a full-
    precision-only kind, the 8-bit kind to use instead; whether it needs a QuantCfg."""
    build: Callable[[int, QuantCfg | None, str, bool], nn.Module]
    relu: bool = False
    lp_instead: str | None = None
    needs_qcfg: bool = False


# kind -> NormKind, in config.NORMS order (a test holds the two equal)
REGISTRY: dict[str, NormKind] = {
    "evonorm": NormKind(lambda c, q, gate, act: EvoNormS0(c), lp_instead="range-evonorm"),
    "range-evonorm": NormKind(lambda c, q, gate, act: RangeEvoNorm(c, qcfg=q, activation=gate), needs_qcfg=True),
    "range-evonorm-fp": NormKind(lambda c, q, gate, act: RangeEvoNorm(c, qcfg=None, activation=gate),
                                 lp_instead="range-evonorm"),
    "range-bn": NormKind(lambda c, q, gate, act: RangeBNAct(c, qcfg=q, relu=act), relu=True),
    "bn": NormKind(lambda c, q, gate, act: BatchNormAct(c, relu=act), relu=True, lp_instead="range-bn"),
    "gn": NormKind(lambda c, q, gate, act: GroupNormAct(c, relu=act), relu=True, lp_instead="range-bn"),
}
RELU_KINDS = tuple(k for k, v in REGISTRY.items() if v.relu)


def _kind(kind: str | NormSpec) -> str:
    return kind.kind if isinstance(kind, NormSpec) else kind


def trunk_activation(kind: str | NormSpec) -> nn.Module | None:
    """The nonlinearity after a residual add for this norm kind: a ReLU for RELU_KINDS, else None
    (no module, so the EvoNorm models' architecture, which checkpoints record, is unchanged)."""
    return nn.ReLU() if _kind(kind) in RELU_KINDS else None


def make_norm(kind: str | NormSpec, num_features: int, *, qcfg: QuantCfg | None = None,
              act: bool = True) -> nn.Module:
    """Norm + nonlinearity of one kind (see NORMS), for full precision (qcfg None) or 8 bits;
    a :class:`NormSpec` kind also names the Range EvoNorm gate (default: the hard sigmoid).
    act=False leaves out the ReLU of the RELU_KINDS (a residual branch's last norm, a shortcut's
    norm, MobileNetV2's linear bottleneck); the EvoNorm kinds keep their gate either way.

    ========================  ==========================================  =========
    kind                      module                                      precision
    ========================  ==========================================  =========
    ``evonorm``               EvoNormS0 (G=8)                             FP only
    ``range-evonorm``         RangeEvoNorm(qcfg=qcfg), gate (hard sigm.)  LP only
    ``range-evonorm-fp``      RangeEvoNorm(qcfg=None), gate (hard sigm.)  FP only
    ``range-bn``              RangeBNAct (Range BN + ReLU)                FP or LP
    ``bn``                    BatchNormAct (BatchNorm2d + ReLU)           FP only
    ``gn``                    GroupNormAct (GroupNorm, 2 groups, + ReLU)  FP only
    ========================  ==========================================  =========

    Every kind includes its nonlinearity unless act=False, so no norm is followed by a separate
    ReLU in the models; only a residual add is (`trunk_activation`). A precision mismatch raises
    rather than silently building a full-precision norm into an 8-bit model (or the reverse).
    """
    spec = kind if isinstance(kind, NormSpec) else NormSpec(kind)
    kind, gate = spec.kind, spec.gate
    if kind not in NORMS:
        raise ValueError(f"unknown norm kind {kind!r}; valid kinds: {', '.join(NORMS)}")
    norm = REGISTRY[kind]
    if qcfg is not None and norm.lp_instead:
        raise ValueError(f"norm {kind!r} is full precision only; for 8-bit training use "
                         f"{norm.lp_instead!r} (or pass qcfg=None)")
    if qcfg is None and norm.needs_qcfg:
        raise ValueError("norm 'range-evonorm' is the 8-bit layer and needs a QuantCfg; "
                         "use 'range-evonorm-fp' for Range EvoNorm at full precision")
    return norm.build(num_features, qcfg, gate, act)
