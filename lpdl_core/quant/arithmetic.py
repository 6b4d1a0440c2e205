"""Which arithmetic an 8-bit layer call takes (fidelity `int8_arithmetic`), and the record of it.

`integer` asks for exact integer products (lpdl_core.quant.integer) where an exact kernel exists
for the tensor's device (int8_kernels.backend_for); a call falls back to `fake` (float32
simulation, the same values up to float rounding) where none exists. Each fallback reason is
said once per process on stderr; `taken()` tells what the calls of a run took, for its metrics.json.
"""
from __future__ import annotations

import sys
from collections import Counter

import torch

from . import int8_kernels

INTEGER_BITS = 8  # the integer kernels hold one byte per operand

_calls: Counter = Counter()   # path -> layer calls that took it, since reset()
_said: set[str] = set()


def reset(device: torch.device | str = "cpu") -> None:
    """Start a run's record, and probe the device's int8 kernels (eagerly: a compiled step's trace
    reads the answer, it cannot run the probe)."""
    _calls.clear()
    int8_kernels.backend_for(device)


def _fake(why: str) -> None:
    """Record a fallback, and say its reason once per process."""
    _calls[f"fake ({why})"] += 1
    if why not in _said:
        _said.add(why)
        print(f"lpdl: int8_arithmetic integer: {why}; these 8-bit layers compute fake quantization "
              f"(the same values up to float rounding)", file=sys.stderr, flush=True)


def _choice(requested: str, bits: int, grad_bits: int, x: torch.Tensor) -> tuple[str | None, str]:
    """(the kernel backend, '') or (None, why fake)."""
    if requested != "integer":
        return None, ""
    if bits != INTEGER_BITS or grad_bits != INTEGER_BITS:
        return None, f"{bits}-bit operands and {grad_bits}-bit gradients (integer kernels are 8-bit)"
    if torch.compiler.is_compiling():
        name, why = int8_kernels.chosen(x.device) or (None, "the int8 kernels were not probed before compiling")
    else:
        name, why = int8_kernels.backend_for(x.device)
    return name, "" if name else why


def backend(requested: str, bits: int, grad_bits: int, x: torch.Tensor) -> str | None:
    """The integer kernel backend this layer call uses, or None for the fake path (recorded)."""
    name, why = _choice(requested, bits, grad_bits, x)
    if torch.compiler.is_compiling():
        # nothing recorded while tracing (dynamo would guard on the record and recompile every step);
        # the run's eager calls (its evaluations) make the same choice and record it
        return name
    if name is not None:
        _calls[f"integer ({name})"] += 1
    elif why:
        _fake(why)
    else:
        _calls["fake"] += 1
    return name


def taken() -> str:
    """What the 8-bit layer calls since reset() took: one path ('integer (onednn)', 'fake', or
    'fake (why)'), or each with its share (a compiled step's traced calls are not counted; its
    evaluations are); '' when no 8-bit layer ran (an FP run)."""
    total = sum(_calls.values())
    if not total:
        return ""
    if len(_calls) == 1:
        return next(iter(_calls))
    return "; ".join(f"{path}: {100 * n / total:.0f}% of calls" for path, n in _calls.most_common())
