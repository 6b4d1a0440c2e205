"""Layer-wise message compressors C(v) and their byte counts, vectorized over nodes.

Each kind is one `Compressor` entry of `REGISTRY`: how it compresses one tensor (layout segment)
of every node's message at once, and what that tensor costs on the wire. `compress` and
`message_bytes` only walk the layout and dispatch to the entry, so a new kind is one entry.
The built-in kinds' arithmetic lives in `lpdl_core.decentral.compressors` (top-k / QSGD after the
official code `aparna-aketi/Low_Precision_DL`, min-max 8-bit after Bagua's MinMaxUInt8), whose
shared helpers (`kept_count`, `index_bytes`, `kept_indices`, `minmax_levels`, `qsgd_levels`,
`qsgd_value`) this module re-exports.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import torch

from lpdl_core.decentral.compressors import (
    dense_bytes,
    identity_apply,
    keeps_all,
    minmax_apply,
    minmax_bytes,
    qsgd_apply,
    qsgd_bytes,
    qsgd_exact,
    randomk_apply,
    sparse_bytes,
    topk_apply,
    index_bytes as index_bytes,
    kept_count as kept_count,
    kept_indices as kept_indices,
    minmax_levels as minmax_levels,
    qsgd_levels as qsgd_levels,
    qsgd_value as qsgd_value,
)
from lpdl_core.specs.compressors import SPECS
from lpdl_core.config import FIDELITY_CHOICES
from lpdl_core.decentral.layout import Layout

BYTES_METRICS = FIDELITY_CHOICES["bytes_metric"]  # the fidelity option's values, declared once


@dataclass(frozen=True, kw_only=True)
class CompressorCfg:
    """What each node does to a message before sending it.

    Attributes:
        kind: a key of `REGISTRY` and of lpdl_core.specs.compressors.SPECS (a test holds the two equal).
        ratio: fraction of each tensor DROPPED (official `--k`): 0.99 keeps the top 1% ("99%
            compression"). Used by topk/randomk only; ignored (but still range-checked) otherwise,
            as the official code ignores `--k` for QSGD.
        bits: minmax8 only; 2**bits evenly spaced levels per tensor (8 -> 256 levels).
        qsgd_level: qsgd only; s = 2**level - 1 levels; 32 returns the tensor unchanged (official).
        qsgd_biased: qsgd only; scale by 1/(1 + min(m/s^2, sqrt(m)/s)), m = tensor numel.
        bytes_metric: "exact" (packed wire format) or "legacy" (the official code's count).
    """

    kind: str = "identity"           # a key of the REGISTRY below
    ratio: float = 0.0
    bits: int = 8
    qsgd_level: int = 8
    qsgd_biased: bool = False
    bytes_metric: str = "exact"      # FIDELITY_CHOICES["bytes_metric"]

    def __post_init__(self) -> None:
        if self.kind not in REGISTRY:
            raise ValueError(f"kind must be one of {tuple(REGISTRY)}, got {self.kind!r}")
        if isinstance(self.ratio, bool) or not isinstance(self.ratio, (int, float)):
            raise ValueError(f"ratio must be a float in [0, 1), got {self.ratio!r}")
        if not (0.0 <= float(self.ratio) < 1.0):  # also rejects NaN
            raise ValueError(f"ratio must be in [0, 1) (fraction dropped), got {self.ratio!r}")
        for p in (s.param for s in SPECS.values() if s.param):  # bits, qsgd_level: the specs' ranges
            value = getattr(self, p.field)
            if isinstance(value, bool) or not isinstance(value, int) or not p.lo <= value <= p.hi:
                raise ValueError(f"{p.field} must be an int in [{p.lo}, {p.hi}], got {value!r}")
        if not isinstance(self.qsgd_biased, bool):
            raise ValueError(f"qsgd_biased must be a bool, got {self.qsgd_biased!r}")
        if self.bytes_metric not in BYTES_METRICS:
            raise ValueError(f"bytes_metric must be one of {BYTES_METRICS}, got {self.bytes_metric!r}")

    @classmethod
    def make(cls, kind: str, *, drop: float = 0.0, param: int | None = None,
             bytes_metric: str = "exact") -> "CompressorCfg":
        """A cell's compressor (lpdl_core.pipeline.cells.tables): topk/randomk dropping the fraction
        `drop`, QSGD at level `param`, min-max at `param` bits, or identity; a compressor that
        leaves messages unchanged (a sparsifier at drop 0) is the identity."""
        if kind not in SPECS:
            raise ValueError(f"kind must be one of {tuple(SPECS)}, got {kind!r}")
        cfg = cls(kind=kind, bytes_metric=bytes_metric, **SPECS[kind].settings(drop, param))
        return cls(bytes_metric=bytes_metric) if cfg.is_identity else cfg

    @classmethod
    def top_k(cls, drop: float, *, bytes_metric: str = "exact") -> "CompressorCfg":
        """The paper's compression: layer-wise top-k dropping the fraction `drop` of each tensor
        (the official `--k`; a cell's "99 %" is drop = 0.99, its compression percent / 100), or no
        compression (identity) at drop 0."""
        return cls.make("topk", drop=drop, bytes_metric=bytes_metric)

    @property
    def is_identity(self) -> bool:
        """True when C(v) == v exactly (so callers may skip compression and error feedback)."""
        return REGISTRY[self.kind].identity_when(self)

    @property
    def is_random(self) -> bool:
        """True when C draws random numbers (a random kind that is not the identity here)."""
        return REGISTRY[self.kind].random and not self.is_identity

    @property
    def qsgd_s(self) -> int:
        """QSGD's number of non-zero levels s = 2**level - 1."""
        return 2 ** self.qsgd_level - 1


# apply(x, out, u, cfg): write C(x) into out; x, out (and u when given) are (n, m) column slices.
SegmentApply = Callable[[torch.Tensor, torch.Tensor, Optional[torch.Tensor], CompressorCfg], None]
# wire_bytes(m, cfg, value_bytes): exact bytes of one compressed tensor of m scalars.
SegmentBytes = Callable[[int, CompressorCfg, int], int]


def _never(cfg: CompressorCfg) -> bool:
    return False


def _always(cfg: CompressorCfg) -> bool:
    return True


@dataclass(frozen=True, kw_only=True)
class Compressor:
    """One compressor kind, applied to each tensor (layout segment) of the message on its own.

    apply: C on one segment of all n nodes at once, written into `out` (a view of the result).
    wire_bytes: exact packed size of one compressed segment (the "exact" byte metric).
    identity_when: cfg -> True when C(v) == v exactly for that config (compress then clones v).
    random: draws uniforms: `compress` passes each segment its (n, m) slice of ONE (n, d) draw.
    zeroed: `out` starts as zeros (apply writes the kept coordinates only), else uninitialized.
    wire: the packed format its messages travel in between processes (a key of
        lpdl_core.decentral.wire.FORMATS, whose length per segment is `wire_bytes`); None: it has
        none, and the one-process-per-node executor refuses it before training.
    Whether it is sparse (K = Σ_l kept_count(m_l, ratio) values plus indices, counted 6K+3 by the
    legacy metric; dense kinds count 4(d+1) there) is its spec's (lpdl_core.specs.compressors).
    """

    apply: SegmentApply
    wire_bytes: SegmentBytes
    identity_when: Callable[[CompressorCfg], bool] = _never
    random: bool = False
    zeroed: bool = False
    wire: str | None = None

    def __post_init__(self) -> None:
        for name in ("apply", "wire_bytes", "identity_when"):
            if not callable(getattr(self, name)):
                raise ValueError(f"Compressor.{name} must be callable, got {getattr(self, name)!r}")
        for name in ("random", "zeroed"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"Compressor.{name} must be a bool, got {getattr(self, name)!r}")


def kept_counts(layout: Layout, ratio: float) -> list[int]:
    """`kept_count` for every tensor of `layout`, in layout order."""
    return [kept_count(m, ratio) for m in layout.numels]


# ----------------------------------------------------------------------------- the kinds
REGISTRY: dict[str, Compressor] = {
    "identity": Compressor(apply=identity_apply, wire_bytes=dense_bytes, identity_when=_always, wire="dense"),
    "topk": Compressor(apply=topk_apply, wire_bytes=sparse_bytes, identity_when=keeps_all, zeroed=True,
                       wire="sparse"),
    "randomk": Compressor(apply=randomk_apply, wire_bytes=sparse_bytes, identity_when=keeps_all,
                          random=True, zeroed=True, wire="sparse"),
    "minmax8": Compressor(apply=minmax_apply, wire_bytes=minmax_bytes, wire="minmax"),
    "qsgd": Compressor(apply=qsgd_apply, wire_bytes=qsgd_bytes, identity_when=qsgd_exact, random=True,
                       wire="qsgd"),
}

# ----------------------------------------------------------------------------- dispatch
def uniform_draws(shape: tuple[int, ...], like: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    # Sample on the generator's own device (a CPU generator cannot drive CUDA sampling), then move,
    # so a seeded CPU generator gives the same draws whatever device the state lives on.
    dtype = torch.float64 if like.dtype == torch.float64 else torch.float32
    device = generator.device if generator is not None else like.device
    return torch.rand(shape, generator=generator, device=device, dtype=dtype).to(like.device)


def compress(v: torch.Tensor, layout: Layout, cfg: CompressorCfg,
             generator: torch.Generator | None = None) -> torch.Tensor:
    """Apply the layer-wise compressor to every node's message at once.

    Args:
        v: `(n, d)` floating tensor, row i = node i's message, columns laid out by `layout`.
        layout: parameter layout; each segment (tensor) is compressed on its own.
        cfg: which compressor (`REGISTRY[cfg.kind]`).
        generator: RNG for the random kinds (randomk, qsgd; global RNG if None); unused otherwise.

    Returns:
        Dense `(n, d)` tensor C(v), same dtype/device as `v`, zeros at dropped coordinates.
        topk: per node per tensor the `kept_count` largest |v|. randomk: `kept_count` uniform
        coordinates per node per tensor, without replacement and WITHOUT the unbiasing factor
        numel/kept (the official random_k does not rescale either; it is a biased, contractive
        operator like top-k, suitable for error feedback). minmax8: per node per tensor min-max
        affine quantization to 2**bits levels, nearest rounding, dequantized. qsgd: official QSGD
        (stochastic rounding of s|x|/||x||, sign kept); an all-zero tensor maps to zeros where the
        official code would produce NaN.
    """
    if v.dim() != 2 or v.shape[1] != layout.d:
        raise ValueError(f"v must have shape (n, {layout.d}), got {tuple(v.shape)}")
    if not v.is_floating_point():
        raise ValueError(f"v must be floating point, got {v.dtype}")
    if cfg.is_identity:
        return v.clone()

    entry = REGISTRY[cfg.kind]
    out = torch.zeros_like(v) if entry.zeroed else torch.empty_like(v)
    # One draw for the whole (n, d) block: row i's draws are then the same as a per-node loop
    # would get from the same generator on CPU (sequential stream), which the tests rely on.
    u = uniform_draws((v.shape[0], layout.d), v, generator) if entry.random else None
    for seg in layout.segments():
        cols = slice(seg.start, seg.stop)
        entry.apply(v[:, cols], out[:, cols], None if u is None else u[:, cols], cfg)
    return out


def message_bytes(layout: Layout, cfg: CompressorCfg, *, value_bytes: int = 4,
                  push_sum_weight: bool = True) -> int:
    """Bytes of ONE message from one node to one out-neighbour.

    Args:
        layout: parameter layout of the message.
        cfg: compressor; `cfg.bytes_metric` picks the accounting.
        value_bytes: bytes per transmitted value (exact metric only; 4 = float32).
        push_sum_weight: add 4 bytes for the push-sum weight u, sent as float32 (exact only).

    Returns:
        exact: Σ_l wire_bytes(m_l) of the kind's entry, or value_bytes*d when C is the identity;
        plus 4 for u. Per tensor of m scalars: identity value_bytes*m; topk/randomk
        kept*(value_bytes + index_bytes(m)), with indices omitted for a tensor sent whole
        (kept == m, the receiver knows the layout); minmax8 ceil(m*bits/8) + 8 (min and scale as
        float32); qsgd 4 (norm) + ceil(m*(level + 1)/8) (level bits plus a sign bit).
        legacy (official bookkeeping, docs/paper-vs-code.md, 'The 6k+3 byte count'): 4*(d+1) for
        every dense message, including qsgd and minmax8 (the code never packs bits), and 6*K+3
        for sparse kinds (topk/randomk) with ratio > 0, K = total kept; `value_bytes` and
        `push_sum_weight` are ignored (u is built in).
    """
    entry = REGISTRY[cfg.kind]
    if cfg.bytes_metric == "legacy":
        if SPECS[cfg.kind].sparse and not cfg.is_identity:
            return 6 * sum(kept_counts(layout, cfg.ratio)) + 3
        return 4 * (layout.d + 1)

    if cfg.is_identity:
        total = value_bytes * layout.d
    else:
        total = sum(entry.wire_bytes(m, cfg, value_bytes) for m in layout.numels)
    return total + (4 if push_sum_weight else 0)
