"""Flat parameter layout: how a model's tensors sit in one stacked `(n, d)` buffer.

Every node's parameters live in row i of an `(n, d)` tensor; tensor l occupies columns
`[offset_l, offset_l + numel_l)` and is viewed with its own shape. Compression is
layer-wise (per parameter tensor, docs/paper-vs-code.md, 'Layer-wise top-k, QSGD and the identity'),
so compressors walk these segments; gossip is a single `W @ X` over the whole row.

Node state = the trainable parameters, plus any non-trainable parameter flagged `gossiped = True`
(the official code's activation ranges, which it keeps as Parameters and so gossips, compresses
and counts with the weights). Such a *frozen* tensor is mixed by gossip but never moved by the
optimizer: it changes only through the forward pass that owns it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterator, Sequence

import torch
from torch import nn


@dataclass(frozen=True)
class Segment:
    name: str
    start: int
    stop: int
    shape: tuple[int, ...]

    @property
    def numel(self) -> int:
        return self.stop - self.start


def node_parameters(module: nn.Module) -> list[tuple[str, nn.Parameter]]:
    """(name, parameter) of the node state in `named_parameters()` order: the trainable ones and
    the non-trainable ones flagged `gossiped = True`."""
    return [(k, p) for k, p in module.named_parameters() if p.requires_grad or getattr(p, "gossiped", False)]


@dataclass(frozen=True)
class Layout:
    """Names and shapes of a model's parameter tensors, in `named_parameters()` order.
    frozen: the names of tensors that gossip mixes but the optimizer never moves."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    frozen: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if len(self.names) != len(self.shapes):
            raise ValueError("names and shapes must have the same length")
        if not self.shapes:
            raise ValueError("a layout needs at least one tensor")
        if not self.frozen <= set(self.names):
            raise ValueError("frozen tensors must be in the layout")

    @classmethod
    def from_shapes(cls, shapes: Sequence[Sequence[int]]) -> "Layout":
        shapes_t = tuple(tuple(int(s) for s in sh) for sh in shapes)
        return cls(names=tuple(f"t{i}" for i in range(len(shapes_t))), shapes=shapes_t)

    @classmethod
    def from_module(cls, module: nn.Module) -> "Layout":
        """The node state of `module` (node_parameters): trainable tensors and flagged frozen ones."""
        items = node_parameters(module)
        return cls(names=tuple(k for k, _ in items), shapes=tuple(tuple(p.shape) for _, p in items),
                   frozen=frozenset(k for k, p in items if not p.requires_grad))

    def frozen_mask(self, device=None) -> torch.Tensor | None:
        """(d,) bool, True on frozen columns; None when there are none."""
        if not self.frozen:
            return None
        mask = torch.zeros(self.d, dtype=torch.bool, device=device)
        for s in self.segments():
            if s.name in self.frozen:
                mask[s.start:s.stop] = True
        return mask

    @property
    def numels(self) -> tuple[int, ...]:
        return tuple(math.prod(s) for s in self.shapes)

    @property
    def d(self) -> int:
        """Total number of scalars (the paper's model dimension d)."""
        return sum(self.numels)

    def segments(self) -> Iterator[Segment]:
        start = 0
        for name, shape, numel in zip(self.names, self.shapes, self.numels):
            yield Segment(name, start, start + numel, shape)
            start += numel

    def views(self, flat: torch.Tensor) -> list[torch.Tensor]:
        """Views of a `(..., d)` tensor, one per parameter, shaped `(..., *shape)`."""
        lead = flat.shape[:-1]
        return [flat[..., s.start:s.stop].view(*lead, *s.shape) for s in self.segments()]

    def flatten(self, tensors: Sequence[torch.Tensor], lead: int = 0) -> torch.Tensor:
        """Inverse of `views`: concatenate tensors with `lead` leading batch dims."""
        return torch.cat([t.reshape(*t.shape[:lead], -1) for t in tensors], dim=-1)
