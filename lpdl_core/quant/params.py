r"""Every own-range parameter quantizer of a model in one pass over the stacked node state.

An 8-bit layer quantizes each of its parameter tensors W over W's own range (nearest rounding,
straight-through gradient; `quantizer.fake_quant`):

.. math::
    s_l = \max\!\left(\frac{\max W_l - \min W_l}{2^b - 1}, 10^{-8}\right),\qquad
    Q(W_l) = \mathrm{round}\!\left(\mathrm{clamp}\!\left(\frac{W_l - \min W_l}{s_l}, 0, 2^b - 1\right)\right)
    s_l + \min W_l

Run layer by layer, that is one chain of about twenty small operators per tensor: ResNet-20 has 86
such tensors, a quarter of its batched 8-bit step's operators. Here the same arithmetic runs once
over the whole `(n, d)` buffer: the per-(node, tensor) minima and maxima by two segment
reductions, then the chain above on every quantized column at once, with min and s gathered per
column. Each column sees the same float operations on the same operands as in the layer, so
Q(W) is bitwise the layer's. The straight-through estimator makes dL/dW = dL/dQ(W), so an
executor that hands Q(W) to the layers needs no backward here.

Layers opt in by naming the tensors they quantize over their own range (`quantized_params`) and
reading them through `OwnRangeParams.own_range`; inside `ParamQuant.handed_over(module)` that
returns the tensor unchanged, because the executor already quantized it.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch
from torch import nn

from . import traced
from .quantizer import dequantized, quant_scale, quantize


class OwnRangeParams:
    """Mixin of the 8-bit layers: `quantized_params` names the parameters quantized per tensor over
    their own range (to `self.qcfg.bits`); `own_range(t)` is Q(t), or t while an executor hands
    them over already quantized."""

    quantized_params: tuple[str, ...] = ()
    params_handed_over: bool = False

    def own_range(self, t: torch.Tensor | None) -> torch.Tensor | None:
        if t is None or self.params_handed_over:
            return t
        return quantize(t, self.qcfg.bits)


class ParamQuant:
    """Q over the own-range-quantized columns of a model's stacked node state (n, d).

    module: the model whose `named_parameters()` define `names` (a Layout's, in order); shapes:
    their shapes. Columns of tensors no layer quantizes pass through unchanged.
    """

    def __init__(self, module: nn.Module, names: tuple[str, ...], numels: tuple[int, ...],
                 device: torch.device | None = None):
        # a layer is handed its tensors only when each is node state under its own name (a tensor
        # shared with another module, or not in the layout, stays with the layer's own quantizer)
        self.layers, bits_of, in_layout = [], {}, set(names)
        for prefix, m in module.named_modules():
            if not (isinstance(m, OwnRangeParams) and m.quantized_params):
                continue
            own = {f"{prefix}.{p}" if prefix else p: getattr(m, p) for p in m.quantized_params}
            own = {k: t for k, t in own.items() if t is not None}
            if own and set(own) <= in_layout:
                self.layers.append(m)
                bits_of.update({k: m.qcfg.bits for k in own})
        if len(set(bits_of.values())) > 1:
            raise ValueError(f"ParamQuant needs one bit width for all layers, got {sorted(set(bits_of.values()))}")
        self.bits = next(iter(bits_of.values()), 8)
        seg, self.tensors = [], 0
        for name, numel in zip(names, numels):
            seg.append(torch.full((numel,), self.tensors if name in bits_of else -1, dtype=torch.long))
            self.tensors += name in bits_of
        seg_all = torch.cat(seg) if seg else torch.empty(0, dtype=torch.long)
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self.columns = torch.nonzero(seg_all >= 0).squeeze(1).to(device)   # quantized columns (dq,)
        self.segment = seg_all[seg_all >= 0].to(device)                      # their tensor index (dq,)

    def __bool__(self) -> bool:
        return self.tensors > 0

    def __call__(self, Z: torch.Tensor) -> torch.Tensor:
        """Z (n, d) with every quantized tensor replaced by Q of it (a new tensor; Z is not changed)."""
        if not self:
            return Z
        n = Z.shape[0]
        W = Z.detach().index_select(1, self.columns)                         # (n, dq)
        idx = self.segment.expand(n, -1)
        lo = W.new_empty(n, self.tensors).scatter_reduce_(1, idx, W, "amin", include_self=False)
        hi = W.new_empty(n, self.tensors).scatter_reduce_(1, idx, W, "amax", include_self=False)
        scale = quant_scale(lo, hi, self.bits)
        q = dequantized(W, lo.gather(1, idx), scale.gather(1, idx), self.bits, "nearest")
        return Z.detach().index_copy(1, self.columns, q)

    def new_step(self) -> None:
        """A compiled step's new stochastic-rounding key for the traced 8-bit operators."""
        traced.new_noise_key(self.device)

    @contextlib.contextmanager
    def handed_over(self) -> Iterator[None]:
        """While active, the layers read their quantized parameters as given (already Q'd here)."""
        for m in self.layers:
            m.params_handed_over = True
        try:
            yield
        finally:
            for m in self.layers:
                m.params_handed_over = False
