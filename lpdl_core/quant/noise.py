r"""The rounding noise of stochastic rounding, ξ ~ U[−½, ½), drawn cheaply on a CPU.

On a CPU, `torch.rand_like` (one mt19937 draw per element, then a conversion pass) dominated the
8-bit step, and inductor's per-element generator made a compiled quantizer chain several times
slower than its arithmetic. Here one 64-bit draw feeds four int16 lanes k, and the noise is

.. math::
    \xi = k / 2^{16},\qquad k \in \{-2^{15}, \dots, 2^{15} - 1\}

uniform on the 2^16 values k/2^16 in [−½, ½), whose mean −2^-17 biases the rounding by less than
2^-16 of a step, the float32 resolution of a level near 255 itself. `add_uniform_noise_` adds it
in place (the eager quantizer, `quantizer.levels`); `lanes` hands the int16 lanes to a fused
kernel, which converts and adds them in its one pass (`fused`), so both draw the same noise from
torch's CPU generator. Under torch.func transforms and on GPUs, rand_like is used (vmap needs its
own random ops for per-node noise; Philox on a GPU is already cheap).
"""
from __future__ import annotations

import torch

SCALE = 2.0 ** -16  # one int16 lane k is the noise k·2^-16

# Reused CPU scratch (the int64 words, and float lanes per dtype), grown to the largest tensor
# seen and sliced: fresh activation-sized buffers cost more here (first-touch page faults) than
# refilling warm ones. Shared per process, so not for concurrent training loops in threads of one
# process.
_SCRATCH: dict[torch.dtype, torch.Tensor] = {}


def _buffer(dtype: torch.dtype, n: int) -> torch.Tensor:
    buf = _SCRATCH.get(dtype)
    if buf is None or buf.numel() < n:
        buf = _SCRATCH[dtype] = torch.empty(n, dtype=dtype)
    return buf[:n]


def lanes(k: int) -> torch.Tensor:
    """k fresh random int16 lanes (CPU), four from each 64-bit draw; a view of the scratch, valid
    until the next draw."""
    words = _buffer(torch.int64, (k + 3) // 4)
    words.random_(-2 ** 63, None)  # all 64 bits random
    return words.view(torch.int16)[:k]


def float_lanes(k: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """`lanes(k)` converted to `dtype` (exact: |k| ≤ 2^15): a view of the scratch, valid until the
    next draw. A fused kernel reads these, not the int16 lanes, which inductor's CPU code does not
    vectorize."""
    out = _buffer(dtype, k)
    return out.copy_(lanes(k))


def add_uniform_noise_(t: torch.Tensor, transformed: bool = False) -> torch.Tensor:
    """t += ξ, shaped like t, in place. transformed: t is inside a torch.func transform (then, and
    off the CPU, ξ = rand_like − ½)."""
    if t.device.type != "cpu" or transformed:
        return t.add_(torch.rand_like(t).sub_(0.5))
    return t.add_(float_lanes(t.numel(), t.dtype).view(t.shape), alpha=SCALE)
