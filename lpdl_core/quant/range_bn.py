r"""Range BatchNorm (Banner et al. 2018), the range-based std estimate the Range norms share, and
the norm kinds with a ReLU after them (Range BN, BatchNorm, GroupNorm).

Split from ``norms.py`` (which re-exports every name here); ``make_norm`` builds these as the
``range-bn``, ``bn`` and ``gn`` kinds. All ops are plain tensor ops, so a forward runs under
``torch.func.vmap(functional_call)`` (with the running buffers stacked when training).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .layers import QuantMeasure
from .quantizer import QuantCfg, quantize, quantize_grad

# Banner et al.'s code constant, 0.5·0.35·(1+√(π ln 4)) = 0.5402: for Gaussian data the mean chunk
# range of m samples grows like √(2 ln m)·σ, so range·RANGE_CONST/√(2 ln m) estimates σ (measured:
# 0.68σ at m=4, 0.90σ at m=128, 0.96σ at m=8192), without squares or square roots.
RANGE_CONST = 0.5 * 0.35 * (1.0 + math.sqrt(math.pi * math.log(4.0)))


def range_scale_fix(m: int) -> float:
    """Factor turning a mean chunk range of m elements per chunk into a std estimate."""
    return RANGE_CONST / math.sqrt(2.0 * math.log(m))


def check_4d(x: torch.Tensor, layer: nn.Module) -> None:
    if x.dim() != 4:
        raise ValueError(f"{type(layer).__name__} expects a 4-D (N, C, H, W) input, "
                         f"got shape {tuple(x.shape)}")


class RangeBatchNorm2d(nn.Module):
    r"""Range BatchNorm (Banner et al. 2018, "Scalable methods for 8-bit training of neural
    networks", Sec. 5 / their ``RangeBN``; present but not selectable in the official code):

    .. math::
        \mu_c = \mathrm{mean}_{B,H,W}(x_c),\qquad
        s_c = \frac{1}{(\overline{\max}_k - \overline{\min}_k)\cdot
              \frac{0.5\cdot 0.35\,(1+\sqrt{\pi\ln 4})}{\sqrt{2\ln m}} + \epsilon},\qquad
        y = (x - \mu_c)\,s_c\,\gamma_c + \beta_c

    per channel c: the B·H·W values (in (B, H, W) order) are cut into `chunks` chunks of m each,
    the bars are means over chunks of each chunk's max / min. Training uses the batch μ, s and
    updates running buffers as running = momentum·running + (1 − momentum)·batch (Banner's and
    QuantMeasure's convention, momentum weighting the *old* value; official 0.1); eval uses them.
    Gradients flow through μ and s as in Banner's code.

    LP (qcfg given): x via its own QuantMeasure, s, γ and β 8-bit per tensor (nearest, as Banner
    also quantizes s), output layer gradient quantized (``quantize_grad``). Parameters (C,):
    γ=1, β=0 (Banner: γ ~ U(0,1)); running scale starts at 1, not Banner's 0 (which would zero the
    output in eval before any training step). Training needs B·H·W divisible by `chunks`, m ≥ 2.
    The in-place running-stat updates need the executor's support under vmap (stacked buffers).
    """

    def __init__(self, num_features: int, *, qcfg: QuantCfg | None = None, chunks: int = 16,
                 momentum: float = 0.1, eps: float = 1e-5):
        super().__init__()
        if chunks < 1:
            raise ValueError(f"chunks must be >= 1, got {chunks}")
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {momentum}")
        self.num_features, self.chunks, self.momentum, self.eps = num_features, chunks, momentum, eps
        self.qcfg = qcfg
        self.weight = nn.Parameter(torch.ones(num_features))
        self.bias = nn.Parameter(torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_scale", torch.ones(num_features))
        if qcfg is not None:
            self.quantize_input = QuantMeasure(qcfg)

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)
        self.running_mean.zero_()
        self.running_scale.fill_(1.0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        check_4d(x, self)
        q = self.qcfg
        if q is not None:
            x = self.quantize_input(x)
        B, C, H, W = x.shape
        if self.training:
            K = self.chunks
            if (B * H * W) % K or B * H * W // K < 2:
                raise ValueError(f"RangeBatchNorm2d needs B*H*W={B * H * W} divisible by chunks={K} "
                                 f"with at least 2 elements per chunk")
            m = B * H * W // K
            y = x.transpose(0, 1).reshape(C, K, m)
            mean = y.reshape(C, -1).mean(-1)
            r = y.max(-1).values.mean(-1) - y.min(-1).values.mean(-1)
            scale = 1 / (r * range_scale_fix(m) + self.eps)
            with torch.no_grad():
                mom = self.momentum
                self.running_mean.mul_(mom).add_(mean.detach() * (1 - mom))
                self.running_scale.mul_(mom).add_(scale.detach() * (1 - mom))
        else:
            mean, scale = self.running_mean, self.running_scale
        w, b = self.weight, self.bias
        if q is not None:
            scale, w, b = quantize(scale, q.bits), quantize(w, q.bits), quantize(b, q.bits)
        out = (x - mean.view(1, C, 1, 1)) * scale.view(1, C, 1, 1) * w.view(1, C, 1, 1) + b.view(1, C, 1, 1)
        if q is not None:
            out = quantize_grad(out, q.grad_bits, q.grad_rounding)
        return out

    def extra_repr(self) -> str:
        prec = "fp32" if self.qcfg is None else f"{self.qcfg.bits}-bit"
        return f"{self.num_features}, chunks={self.chunks}, momentum={self.momentum}, eps={self.eps}, {prec}"


class ReluAfter:
    """Mixin for a norm module: its output, then ReLU; relu=False (set by the subclass): the norm
    alone. A plain attribute, so the module's parameters and buffers are the norm's."""

    relu: bool

    def extra_repr(self) -> str:
        return super().extra_repr() + ("" if self.relu else ", relu=False")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = super().forward(x)
        return F.relu(y) if self.relu else y


class RangeBNAct(ReluAfter, RangeBatchNorm2d):
    """RangeBatchNorm2d then ReLU (a drop-in for the activation-carrying EvoNorms);
    relu=False: the norm alone."""

    def __init__(self, num_features: int, *, relu: bool = True, **kwargs):
        super().__init__(num_features, **kwargs)
        self.relu = relu


class BatchNormAct(ReluAfter, nn.BatchNorm2d):
    """nn.BatchNorm2d then ReLU (same parameters/buffers as BatchNorm2d: .weight is γ);
    relu=False: the norm alone (where a ResNet's BN has no ReLU after it)."""

    def __init__(self, num_features: int, *, relu: bool = True):
        super().__init__(num_features)
        self.relu = relu


class GroupNormAct(ReluAfter, nn.GroupNorm):
    """nn.GroupNorm (official: 2 groups) then ReLU; .weight is γ; relu=False: the norm alone."""

    def __init__(self, num_features: int, groups: int = 2, eps: float = 1e-5, *, relu: bool = True):
        super().__init__(groups, num_features, eps=eps)
        self.relu = relu
