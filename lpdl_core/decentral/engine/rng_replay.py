"""Every draw a forward/backward takes from the global CPU generator, recorded and replayed.

The loop executor runs the n nodes' forward/backward one after another on one global generator
(mt19937), so node i's draws (8-bit stochastic rounding, dropout masks, ...) start where nodes
0..i−1 stopped. A rank of the distributed executor computes node i alone; to draw what node i
draws in the loop executor it advances the generator by the other nodes' share, and mt19937
cannot jump ahead. So it records which random ops one forward/backward issues and replays them:
the same ops, on fresh tensors of the same shapes, dtypes and arguments, consume the generator
exactly as the originals did (the numbers are thrown away).

Recording runs under a TorchDispatchMode, which sees every ATen op below autograd, the backward
pass's included. A draw is an op on CPU tensors with a `generator` argument left at None (the
global one: random_, uniform_, bernoulli_, normal_, ...); composite ops such as dropout arrive
decomposed into those. Ops given their own generator (the compressor's, the augmentation's) are
not draws of this stream.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode


class _Spec(tuple):
    """A tensor argument as a replay needs it: (shape, stride, dtype)."""


def _spec(a: Any) -> Any:
    """A call's argument as recorded: tensors as _Spec, sequences element by element."""
    if isinstance(a, torch.Tensor):
        return _Spec((tuple(a.shape), tuple(a.stride()), a.dtype))
    if isinstance(a, (list, tuple)):
        return tuple(_spec(x) for x in a)
    return a


def _fresh(a: Any) -> Any:
    """A recorded argument as a replay passes it: a fresh tensor for each _Spec."""
    if isinstance(a, _Spec):
        shape, stride, dtype = a
        return torch.empty_strided(shape, stride, dtype=dtype)
    if isinstance(a, tuple):
        return [_fresh(x) for x in a]
    return a


def draws_global_cpu(func, args, kwargs) -> bool:
    """Whether this ATen call draws from the global CPU generator."""
    schema = func._schema
    names = [a.name for a in schema.arguments]
    if "generator" not in names:
        return False
    k = names.index("generator")
    gen = kwargs.get("generator", args[k] if k < len(args) else None)
    if gen is not None:
        return False
    tensors = [a for a in (*args, *kwargs.values()) if isinstance(a, torch.Tensor)]
    device = kwargs.get("device")
    on_cpu = all(t.device.type == "cpu" for t in tensors) and (device is None or torch.device(device).type == "cpu")
    return on_cpu


class _Recorder(TorchDispatchMode):
    def __init__(self, log: list):
        super().__init__()
        self.log = log

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if draws_global_cpu(func, args, kwargs):
            self.log.append((func, _spec(tuple(args)), tuple(sorted((k, _spec(v)) for k, v in kwargs.items()))))
        return func(*args, **kwargs)


class GlobalDraws:
    """The recorder the distributed executor takes as `noise`: `record()` yields the list the draws
    of its block are appended to (entries compare equal when the ops, shapes and arguments are
    equal); `replay(draws)` consumes the global generator exactly as those draws did."""

    @contextlib.contextmanager
    def record(self) -> Iterator[list]:
        drawn: list = []
        with _Recorder(drawn):
            yield drawn

    def replay(self, draws: list) -> None:
        with torch.no_grad():
            for func, args, kwargs in draws:
                func(*(_fresh(a) for a in args), **{k: _fresh(v) for k, v in kwargs})


GLOBAL_DRAWS = GlobalDraws()
