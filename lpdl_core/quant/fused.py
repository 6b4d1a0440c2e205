r"""The 8-bit quantizer chains as fused kernels (``quant.fused: true``).

Eager, `quantizer.fake_quant` is a chain of about a dozen small operators per call (range,
scale, noise, clamp, round, dequantize; plus the running-range update in `QuantMeasure`), and a
ResNet-20 step makes about 130 such calls. On a GPU each operator is a kernel launch, and the
launches, not the arithmetic, set the step time (`lpdl_core.training.opcount`). Here each chain
is one custom operator (``lpdl::measure_quant``, ``lpdl::own_range_quant``) whose body inductor
compiles, once per process and input rank, into fused kernels: one C++ loop nest on a CPU, Triton
kernels on a GPU. Around them the step stays eager.

The switch is `enabled(True)` around a training step (`EngineCfg.fused_quant`: how a run runs,
like `compile`, not what it computes); while it is on, `QuantMeasure`'s training forward and every
own-range quantizer that `quantizer.own_range_quant` serves (layer gradients, Range EvoNorm's
scale) run fused. The weights' quantizers are already one pass over all tensors (`params.py`).

The math is `fake_quant`'s (docs of `quantizer`):

.. math::
    s = \max\!\left(\frac{x_{max} - x_{min}}{2^b - 1}, 10^{-8}\right),\quad
    Q(x) = \mathrm{round}\!\left(\mathrm{clamp}\!\left(\frac{x - x_{min}}{s} + \xi, 0, 2^b - 1\right)\right) s + x_{min}

with `measure_quant`'s range the batch mean of per-sample minima and maxima and its running range
updated in the same kernel (running = m·running + (1 − m)·batch), and `own_range_quant`'s range
the tensor's own (per node under vmap). The settings (bits, momentum) are constants of the
compiled code, so 2^b − 1 folds into it (compiled as symbols, every vector step recomputed a
power: the CPU kernels ran about 4x slower). Two things differ from the eager chain, so a fused
run is not bitwise an eager one:
- on a GPU the rounding noise ξ ~ U[−½, ½) comes from inductor's generator (seeded from torch's
  global one). On a CPU it is the eager draw (`noise.float_lanes`, the same values as the eager
  chain's from the same generator state), read by the kernel: inductor's per-element CPU
  generator cost several times the chain's arithmetic;
- the compiler may reorder float arithmetic, so an element that lies within a rounding error of
  a half-step can round to the neighbouring level (tests bound how often).

On a CPU, Range EvoNorm's input quantizer stays eager even while fused quantizers are on, where
its grid levels give the norm's max/min indices (`range_fused.reads_order`: inputs of at least
64K elements), which saves more there than fusing that one chain.

Under `torch.func.vmap` the vmap rules run each operator once over the stacked nodes, with one
more leading dimension; noise is drawn per node (vmap's ``randomness="different"``). Gradients
are straight-through (`_MeasureSTE`); the layer-gradient quantizer is called inside backward
passes, where no gradient of it is taken.
"""
from __future__ import annotations

import contextlib
import functools
from typing import Iterator

import torch
from torch import Tensor

from ..compile_cache import use_versioned_cache
from . import noise
from .eager import eager_apply

_ACTIVE = False


def active() -> bool:
    """True while a training step runs with fused quantizers."""
    return _ACTIVE


@contextlib.contextmanager
def enabled(on: bool = True) -> Iterator[None]:
    """Fused quantizers on (or off) for the steps run inside; restores the previous state."""
    global _ACTIVE
    before, _ACTIVE = _ACTIVE, on
    try:
        yield
    finally:
        _ACTIVE = before


def _dequantized(x: Tensor, lo: Tensor, hi: Tensor, bits: int, stochastic: bool, lanes: Tensor | None) -> Tensor:
    levels = 2.0 ** bits - 1.0
    s = ((hi - lo) / levels).clamp(min=1e-8)
    t = (x - lo) / s
    if lanes is not None:  # official order: noise, then clamp, then round
        t = t + lanes * noise.SCALE
    elif stochastic:
        t = t + (torch.rand_like(t) - 0.5)
    return t.clamp(0.0, levels).round() * s + lo


def _measure_chain(x: Tensor, running_min: Tensor, running_max: Tensor, *, lead: int, bits: int,
                   stochastic: bool, momentum: float, lanes: Tensor | None = None) -> Tensor:
    rest = tuple(range(lead + 1, x.dim()))  # per sample (dim `lead`), then the batch mean
    lo = x.amin(rest, keepdim=True).mean(lead, keepdim=True)
    hi = x.amax(rest, keepdim=True).mean(lead, keepdim=True)
    running_min.mul_(momentum).add_(lo.reshape(running_min.shape) * (1 - momentum))
    running_max.mul_(momentum).add_(hi.reshape(running_max.shape) * (1 - momentum))
    return _dequantized(x, lo, hi, bits, stochastic, lanes)


def _own_range_chain(x: Tensor, *, lead: int, bits: int, stochastic: bool, lanes: Tensor | None = None) -> Tensor:
    rest = tuple(range(lead, x.dim()))
    return _dequantized(x, x.amin(rest, keepdim=True), x.amax(rest, keepdim=True), bits, stochastic, lanes)


def _lanes(x: Tensor, stochastic: bool) -> Tensor | None:
    """The rounding noise's lanes for x (k with ξ = k·2^-16), drawn eagerly on a CPU
    (`noise.float_lanes`), else None (no noise, or inductor's generator on a GPU)."""
    return noise.float_lanes(x.numel(), x.dtype).view(x.shape) if stochastic and x.device.type == "cpu" else None


# One graph per chain, rank, settings and memory layout of the input (sizes are dynamic): a
# ResNet-20 step compiles about 15. The default limit (8 per code object) is for a model's one
# forward, not for a family of small kernels.
_RECOMPILE_LIMIT = 256


@functools.cache
def _compiled(chain, lead: int, bits: int, stochastic: bool):
    """chain compiled once per process for these settings."""
    def fn(x, *tensors, **kwargs):
        return chain(x, *tensors, lead=lead, bits=bits, stochastic=stochastic, **kwargs)
    use_versioned_cache()
    compiled = torch.compile(fn, dynamic=True, fullgraph=True)

    def call(*args, **kwargs):
        with torch._dynamo.config.patch(recompile_limit=_RECOMPILE_LIMIT, specialize_int=True, specialize_float=True,
                                        accumulated_recompile_limit=4 * _RECOMPILE_LIMIT):
            return compiled(*args, **kwargs)
    return call


@torch.library.custom_op("lpdl::measure_quant", mutates_args=("running_min", "running_max"))
def measure_quant(x: Tensor, running_min: Tensor, running_max: Tensor, lead: int, bits: int,
                  stochastic: bool, momentum: float) -> Tensor:
    """Q(x) over the batch-mean per-sample range of x (samples along dim `lead`, nodes before
    it); the running range (shaped (*x.shape[:lead], 1)) updated in place."""
    return _compiled(_measure_chain, lead, bits, stochastic)(x, running_min, running_max, momentum=momentum,
                                                             lanes=_lanes(x, stochastic))


@measure_quant.register_fake
def _(x, running_min, running_max, lead, bits, stochastic, momentum):
    return torch.empty_like(x)


@torch.library.custom_op("lpdl::own_range_quant", mutates_args=())
def own_range_quant(x: Tensor, lead: int, bits: int, stochastic: bool) -> Tensor:
    """Q(x) over the range of x's dims from `lead` on (each leading index its own range)."""
    return _compiled(_own_range_chain, lead, bits, stochastic)(x, lanes=_lanes(x, stochastic))


@own_range_quant.register_fake
def _(x, lead, bits, stochastic):
    return torch.empty_like(x)


def _batched(info, dim: int | None, x: Tensor) -> Tensor:
    return x.expand(info.batch_size, *x.shape) if dim is None else x.movedim(dim, 0)


def _check_randomness(info, stochastic: bool) -> None:
    if stochastic and info.randomness != "different":
        raise RuntimeError("quant.fused draws rounding noise per node; it needs vmap randomness="
                           f"'different' (rng_streams: per-node), got {info.randomness!r}")


@measure_quant.register_vmap
def _(info, in_dims, x, running_min, running_max, lead, bits, stochastic, momentum):
    _check_randomness(info, stochastic)
    if in_dims[1] != 0 or in_dims[2] != 0:
        raise RuntimeError("quant.fused needs the running ranges stacked per node (dim 0) under vmap")
    return measure_quant(_batched(info, in_dims[0], x), running_min, running_max, lead + 1, bits,
                         stochastic, momentum), 0


@own_range_quant.register_vmap
def _(info, in_dims, x, lead, bits, stochastic):
    _check_randomness(info, stochastic)
    return own_range_quant(_batched(info, in_dims[0], x), lead + 1, bits, stochastic), 0


class _MeasureSTE(torch.autograd.Function):
    """measure_quant forward, identity backward (straight-through)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x, running_min, running_max, bits, stochastic, momentum):
        return measure_quant(x, running_min, running_max, 0, bits, stochastic, momentum)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        """Nothing to keep: the backward is the identity."""

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None, None, None, None


class _OwnRangeSTE(torch.autograd.Function):
    generate_vmap_rule = True

    @staticmethod
    def forward(x, bits, stochastic):
        return own_range_quant(x, 0, bits, stochastic)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        """Nothing to keep: the backward is the identity."""

    @staticmethod
    def backward(ctx, grad):
        return grad, None, None


_measure_ste = eager_apply(_MeasureSTE)
_own_range_ste = eager_apply(_OwnRangeSTE)


def measured(x: Tensor, running_min: Tensor, running_max: Tensor, bits: int, rounding: str,
             momentum: float) -> Tensor:
    """QuantMeasure's training forward fused: Q(x) with straight-through gradient, running range
    updated (no gradient flows into it)."""
    return _measure_ste(x, running_min.detach(), running_max.detach(), bits, rounding == "stochastic", momentum)


def own_range(x: Tensor, bits: int, rounding: str) -> Tensor:
    """fake_quant(x, bits, rounding) over x's own range, fused; straight-through when differentiated."""
    stochastic = rounding == "stochastic"
    if torch.is_grad_enabled() and x.requires_grad:
        return _own_range_ste(x, bits, stochastic)
    return own_range_quant(x, 0, bits, stochastic)
