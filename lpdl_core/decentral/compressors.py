"""The per-kind arithmetic of the message compressors: what each kind does to one tensor (layout
segment) of every node's message at once, and what that tensor costs on the wire.

`lpdl_core.decentral.compress` registers these functions as the `Compressor` entries of its
`REGISTRY`; the packed wire format (`lpdl_core.decentral.wire`) reuses the same arithmetic
(`kept_indices`, `minmax_levels`, `qsgd_levels`, `qsgd_value`) so a receiver decodes exactly
what its sender applied.

Top-k / QSGD follow the official code (`aparna-aketi/Low_Precision_DL`, adapted from epfml/ChocoSGD;
docs/paper-vs-code.md, 'Compression and byte counts'); min-max 8-bit is Bagua's MinMaxUInt8
scheme (docs/paper-vs-code.md, "8-bit messages (Bagua's min-max quantizer)").
"""
from __future__ import annotations

import math
from typing import Protocol

import torch

# Official UniformQuantize floors the min-max scale here so constant tensors do not divide by 0.
_MINMAX_SCALE_FLOOR = 1e-8


class CompressorParams(Protocol):
    """The fields of `compress.CompressorCfg` the kinds read (a Protocol, so this module does not
    import compress.py, which imports it)."""

    @property
    def ratio(self) -> float: ...

    @property
    def bits(self) -> int: ...

    @property
    def qsgd_level(self) -> int: ...

    @property
    def qsgd_biased(self) -> bool: ...

    @property
    def qsgd_s(self) -> int: ...


def kept_count(numel: int, ratio: float) -> int:
    """Entries kept by top-k / random-k in one tensor of `numel` scalars.

    Exactly the official `max(1, int(numel * (1 - k)))`, float rounding included (e.g. numel=100,
    ratio=0.9 keeps 9, not 10), so kept totals match the official measurements.
    """
    if numel < 1:
        raise ValueError(f"numel must be >= 1, got {numel}")
    return max(1, int(numel * (1 - ratio)))


def index_bytes(numel: int) -> int:
    """Smallest of 1/2/4/8 bytes whose unsigned range holds every index 0..numel-1."""
    for b in (1, 2, 4, 8):
        if numel - 1 < 2 ** (8 * b):
            return b
    raise ValueError(f"numel {numel} too large for 8-byte indices")


# ----------------------------------------------------------------------------- identity
def identity_apply(x, out, u, cfg) -> None:
    out.copy_(x)


def dense_bytes(m: int, cfg: CompressorParams, value_bytes: int) -> int:
    """value_bytes·m: every value, no indices (the receiver knows the layout)."""
    return value_bytes * m


# ----------------------------------------------------------------------------- top-k / random-k
def kept_indices(score: torch.Tensor, ratio: float) -> torch.Tensor | None:
    """(n, k) positions of each row's kept_count(m, ratio) largest scores; None: all kept."""
    k = kept_count(score.shape[1], ratio)
    return None if k == score.shape[1] else torch.topk(score, k, dim=1, sorted=False).indices


def _keep_by_score(x: torch.Tensor, out: torch.Tensor, score: torch.Tensor, ratio: float) -> None:
    """Scatter into (zeroed) out the kept_count(m, ratio) entries of each row with largest score."""
    idx = kept_indices(score, ratio)
    if idx is None:  # dense segment (tiny tensors with ratio near 0)
        out.copy_(x)
        return
    out.scatter_(1, idx, x.gather(1, idx))


def topk_apply(x, out, u, cfg) -> None:
    """Top-k: per node the kept_count(m, ratio) largest |x|."""
    _keep_by_score(x, out, x.abs(), cfg.ratio)


def randomk_apply(x, out, u, cfg) -> None:
    """Random-k: the k largest of i.i.d. uniforms is a uniform k-subset without replacement.
    No unbiasing factor m/k (the official random_k does not rescale either)."""
    _keep_by_score(x, out, u, cfg.ratio)


def sparse_bytes(m: int, cfg: CompressorParams, value_bytes: int) -> int:
    """k·(value_bytes + index_bytes(m)), k = kept_count(m, ratio); no indices when k == m."""
    k = kept_count(m, cfg.ratio)
    return k * value_bytes if k == m else k * (value_bytes + index_bytes(m))


def keeps_all(cfg: CompressorParams) -> bool:
    return cfg.ratio == 0.0


# ----------------------------------------------------------------------------- min-max
def minmax_levels(x: torch.Tensor, cfg: CompressorParams) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(lo, s, q) per row of x: min, step s = max((hi - lo)/(L - 1), 1e-8), integer levels q
    (as floats) = round(clamp((x - lo)/s, 0, L - 1)), L = 2^bits. C(x) = q·s + lo."""
    levels = 2 ** cfg.bits
    lo = x.amin(dim=1, keepdim=True)
    hi = x.amax(dim=1, keepdim=True)
    scale = ((hi - lo) / (levels - 1)).clamp_min(_MINMAX_SCALE_FLOOR)
    return lo, scale, torch.round(((x - lo) / scale).clamp(0, levels - 1))


def minmax_apply(x, out, u, cfg) -> None:
    r"""Min-max affine quantization to L = 2^bits levels, nearest rounding, dequantized:
    s = max((hi - lo)/(L - 1), 1e-8), C(x) = lo + s·round(clamp((x - lo)/s, 0, L - 1))."""
    lo, scale, q = minmax_levels(x, cfg)
    out.copy_(q * scale + lo)


def minmax_bytes(m: int, cfg: CompressorParams, value_bytes: int) -> int:
    """ceil(m·bits/8) packed levels + 8 (min and scale as float32)."""
    return math.ceil(m * cfg.bits / 8) + 2 * 4


# ----------------------------------------------------------------------------- QSGD
def qsgd_levels(x: torch.Tensor, u: torch.Tensor, cfg: CompressorParams) -> tuple[torch.Tensor, torch.Tensor]:
    """(||x||, ξ) per row: ξ = s|x|/||x|| rounded up with probability its fractional part (u the
    uniforms), integers in [0, s] as floats; 0 where ||x|| = 0."""
    norm = torch.linalg.vector_norm(x, dim=1, keepdim=True)
    # A zero-norm tensor has |x| = 0 everywhere, so dividing by 1 instead gives level 0.
    safe = torch.where(norm > 0, norm, torch.ones_like(norm))
    level_float = cfg.qsgd_s * x.abs() / safe
    prev = torch.floor(level_float)
    return norm, prev + (u < (level_float - prev)).to(x.dtype)


def qsgd_value(sign: torch.Tensor, norm: torch.Tensor, level: torch.Tensor, cfg: CompressorParams) -> torch.Tensor:
    """sign·||x||·ξ/s, divided by 1 + min(m/s², √m/s) when biased (m = level.shape[-1])."""
    s, m = cfg.qsgd_s, level.shape[-1]
    q = sign * norm * level / s
    return q / (1.0 + min(m / s ** 2, math.sqrt(m) / s)) if cfg.qsgd_biased else q


def qsgd_apply(x, out, u, cfg) -> None:
    r"""QSGD: C(x) = sign(x)·||x||·ξ/s, ξ = stochastic rounding of s|x|/||x|| (up with probability
    its fractional part, so unbiased); biased: also divided by 1 + min(m/s², √m/s). An all-zero
    tensor maps to zeros where the official code would produce NaN."""
    norm, level = qsgd_levels(x, u, cfg)
    out.copy_(qsgd_value(torch.sign(x), norm, level, cfg))


def qsgd_bytes(m: int, cfg: CompressorParams, value_bytes: int) -> int:
    """4 (norm, float32) + ceil(m·(level + 1)/8): level bits plus a sign bit per scalar."""
    bits_per_level = math.ceil(math.log2(cfg.qsgd_s + 1))  # == qsgd_level
    return 4 + math.ceil(m * (bits_per_level + 1) / 8)


def qsgd_exact(cfg: CompressorParams) -> bool:
    return cfg.qsgd_level == 32  # official: level 32 returns the tensor unchanged
