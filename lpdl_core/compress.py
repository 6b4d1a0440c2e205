"""Layer-wise message compressors C(v) and their byte counts, vectorized over nodes.

Top-k / QSGD follow the official code (`aparna-aketi/Low_Precision_DL`, adapted from epfml/ChocoSGD;
official-code.md section 2); min-max 8-bit is Bagua's MinMaxUInt8 scheme (section 11).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch

from lpdl_core.layout import Layout

COMPRESSORS = ("identity", "topk", "randomk", "minmax8", "qsgd")
BYTES_METRICS = ("exact", "legacy")

# Official UniformQuantize floors the min-max scale here so constant tensors do not divide by 0.
_MINMAX_SCALE_FLOOR = 1e-8


@dataclass(frozen=True, kw_only=True)
class CompressorCfg:
    """What each node does to a message before sending it.

    Attributes:
        kind: one of `COMPRESSORS`.
        ratio: fraction of each tensor DROPPED (official `--k`): 0.99 keeps the top 1% ("99%
            compression"). Used by topk/randomk only; ignored (but still range-checked) otherwise,
            as the official code ignores `--k` for QSGD.
        bits: minmax8 only; 2**bits evenly spaced levels per tensor (8 -> 256 levels).
        qsgd_level: qsgd only; s = 2**level - 1 levels; 32 returns the tensor unchanged (official).
        qsgd_biased: qsgd only; scale by 1/(1 + min(m/s^2, sqrt(m)/s)), m = tensor numel.
        bytes_metric: "exact" (packed wire format) or "legacy" (the official code's count).
    """

    kind: Literal["identity", "topk", "randomk", "minmax8", "qsgd"] = "identity"
    ratio: float = 0.0
    bits: int = 8
    qsgd_level: int = 8
    qsgd_biased: bool = False
    bytes_metric: Literal["exact", "legacy"] = "exact"

    def __post_init__(self) -> None:
        if self.kind not in COMPRESSORS:
            raise ValueError(f"kind must be one of {COMPRESSORS}, got {self.kind!r}")
        if isinstance(self.ratio, bool) or not isinstance(self.ratio, (int, float)):
            raise ValueError(f"ratio must be a float in [0, 1), got {self.ratio!r}")
        if not (0.0 <= float(self.ratio) < 1.0):  # also rejects NaN
            raise ValueError(f"ratio must be in [0, 1) (fraction dropped), got {self.ratio!r}")
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) or not 1 <= self.bits <= 16:
            raise ValueError(f"bits must be an int in [1, 16], got {self.bits!r}")
        if (isinstance(self.qsgd_level, bool) or not isinstance(self.qsgd_level, int)
                or not 1 <= self.qsgd_level <= 32):
            raise ValueError(f"qsgd_level must be an int in [1, 32], got {self.qsgd_level!r}")
        if not isinstance(self.qsgd_biased, bool):
            raise ValueError(f"qsgd_biased must be a bool, got {self.qsgd_biased!r}")
        if self.bytes_metric not in BYTES_METRICS:
            raise ValueError(f"bytes_metric must be one of {BYTES_METRICS}, got {self.bytes_metric!r}")

    @property
    def is_identity(self) -> bool:
        """True when C(v) == v exactly (so callers may skip compression and error feedback)."""
        return (self.kind == "identity"
                or (self.kind in ("topk", "randomk") and self.ratio == 0.0)
                or (self.kind == "qsgd" and self.qsgd_level == 32))

    @property
    def qsgd_s(self) -> int:
        """QSGD's number of non-zero levels s = 2**level - 1."""
        return 2 ** self.qsgd_level - 1


def kept_count(numel: int, ratio: float) -> int:
    """Entries kept by top-k / random-k in one tensor of `numel` scalars.

    Exactly the official `max(1, int(numel * (1 - k)))`, float rounding included (e.g. numel=100,
    ratio=0.9 keeps 9, not 10), so kept totals match the official measurements.
    """
    if numel < 1:
        raise ValueError(f"numel must be >= 1, got {numel}")
    return max(1, int(numel * (1 - ratio)))


def kept_counts(layout: Layout, ratio: float) -> list[int]:
    """`kept_count` for every tensor of `layout`, in layout order."""
    return [kept_count(m, ratio) for m in layout.numels]


def _uniform(shape: tuple[int, ...], like: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
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
        cfg: which compressor.
        generator: RNG for randomk / qsgd (global RNG if None); unused by the others.

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

    n = v.shape[0]
    out = torch.zeros_like(v) if cfg.kind in ("topk", "randomk") else torch.empty_like(v)
    # One draw for the whole (n, d) block: row i's draws are then the same as a per-node loop
    # would get from the same generator on CPU (sequential stream), which the tests rely on.
    u = _uniform((n, layout.d), v, generator) if cfg.kind in ("randomk", "qsgd") else None

    for seg in layout.segments():
        x = v[:, seg.start:seg.stop]  # (n, m)
        o = out[:, seg.start:seg.stop]
        m = seg.numel
        if cfg.kind in ("topk", "randomk"):
            k = kept_count(m, cfg.ratio)
            if k == m:  # dense segment (tiny tensors with ratio near 0)
                o.copy_(x)
                continue
            # randomk: the k largest of i.i.d. uniforms is a uniform k-subset without replacement.
            score = x.abs() if cfg.kind == "topk" else u[:, seg.start:seg.stop]
            idx = torch.topk(score, k, dim=1, sorted=False).indices  # (n, k)
            o.scatter_(1, idx, x.gather(1, idx))
        elif cfg.kind == "minmax8":
            levels = 2 ** cfg.bits
            lo = x.amin(dim=1, keepdim=True)
            hi = x.amax(dim=1, keepdim=True)
            scale = ((hi - lo) / (levels - 1)).clamp_min(_MINMAX_SCALE_FLOOR)
            q = torch.round(((x - lo) / scale).clamp(0, levels - 1))
            o.copy_(q * scale + lo)
        else:  # qsgd
            s = cfg.qsgd_s
            norm = torch.linalg.vector_norm(x, dim=1, keepdim=True)
            # A zero-norm tensor has |x| = 0 everywhere, so dividing by 1 instead gives level 0.
            safe = torch.where(norm > 0, norm, torch.ones_like(norm))
            level_float = s * x.abs() / safe
            prev = torch.floor(level_float)
            # Round up with probability equal to the fractional part -> unbiased.
            up = (u[:, seg.start:seg.stop] < (level_float - prev)).to(x.dtype)
            q = torch.sign(x) * norm * (prev + up) / s
            if cfg.qsgd_biased:
                q = q / (1.0 + min(m / s ** 2, math.sqrt(m) / s))
            o.copy_(q)
    return out


def index_bytes(numel: int) -> int:
    """Smallest of 1/2/4/8 bytes whose unsigned range holds every index 0..numel-1."""
    for b in (1, 2, 4, 8):
        if numel - 1 < 2 ** (8 * b):
            return b
    raise ValueError(f"numel {numel} too large for 8-byte indices")


def message_bytes(layout: Layout, cfg: CompressorCfg, *, value_bytes: int = 4,
                  push_sum_weight: bool = True) -> int:
    """Bytes of ONE message from one node to one out-neighbour.

    Args:
        layout: parameter layout of the message.
        cfg: compressor; `cfg.bytes_metric` picks the accounting.
        value_bytes: bytes per transmitted value (exact metric only; 4 = float32).
        push_sum_weight: add 4 bytes for the push-sum weight u, sent as float32 (exact only).

    Returns:
        exact: identity value_bytes*d; topk/randomk per tensor kept*(value_bytes + index_bytes),
        with indices omitted for a tensor sent whole (kept == numel, the receiver knows the
        layout); minmax8 per tensor ceil(numel*bits/8) + 8 (min and scale as float32); qsgd per
        tensor 4 (norm) + ceil(numel*(level + 1)/8) (level bits plus a sign bit); plus 4 for u.
        legacy (official bookkeeping, section 2): 4*(d+1) for every dense message, including
        qsgd and minmax8 (the code never packs bits), and 6*K+3 for topk/randomk with ratio > 0,
        K = total kept; `value_bytes` and `push_sum_weight` are ignored (u is built in).
    """
    d = layout.d
    if cfg.bytes_metric == "legacy":
        if cfg.kind in ("topk", "randomk") and cfg.ratio > 0:
            return 6 * sum(kept_counts(layout, cfg.ratio)) + 3
        return 4 * (d + 1)

    if cfg.is_identity:
        total = value_bytes * d
    elif cfg.kind in ("topk", "randomk"):
        total = 0
        for m in layout.numels:
            k = kept_count(m, cfg.ratio)
            total += k * value_bytes if k == m else k * (value_bytes + index_bytes(m))
    elif cfg.kind == "minmax8":
        total = sum(math.ceil(m * cfg.bits / 8) + 2 * 4 for m in layout.numels)
    else:  # qsgd
        bits_per_level = math.ceil(math.log2(cfg.qsgd_s + 1))  # == qsgd_level
        total = sum(4 + math.ceil(m * (bits_per_level + 1) / 8) for m in layout.numels)
    return total + (4 if push_sum_weight else 0)
