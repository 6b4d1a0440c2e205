"""The packed wire format of one gossip message: the bytes that cross the network from node j to
an out-neighbour (lpdl_core.decentral.engine.distributed sends them).

A message is, for each layout segment in layout order, the compressed tensor C(v_j) in packed
form, then the sender's push-sum weight u_j (float32) when its algorithm sends one
(`Message.push_sum_weight`). Its length is exactly the simulator's "exact" byte metric,
`compress.message_bytes` (docs/paper-vs-code.md, 'Compression and byte counts'), for float32
values. Per segment of m scalars (one `Codec` per format, `FORMATS`, named by each kind's
`compress.REGISTRY` entry, `Compressor.wire`):

- identity (and any kind whose config is the identity): the m values;
- topk / randomk: the k kept values, then their k positions as index_bytes(m)-byte unsigned
  little-endian integers; the m values alone when k == m;
- minmax8: the m levels at `bits` bits each, then the minimum lo and step s (float32);
- qsgd: ||x|| (float32), then per scalar its level ξ and a sign bit (qsgd_level + 1 bits).

Bits are packed least significant first. Decoding rebuilds C(v_j) with the compressor's own
arithmetic (`compress.minmax_levels`, `qsgd_value`, ...), so `unpack(pack(v))` equals
`compress(v)` bit for bit and a receiver sees exactly the payload its sender applied.
"""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from .compress import REGISTRY, CompressorCfg
from .compressors import index_bytes, kept_count, kept_indices, minmax_levels, qsgd_levels, qsgd_value
from .layout import Layout

WEIGHT_DTYPE = torch.float32  # the push-sum weight u_j on the wire (4 bytes, as the byte metric)

# encode(x, u, cfg) -> byte strings of one segment (x: its m values, u: its uniforms or None)
Encode = Callable[[torch.Tensor, Optional[torch.Tensor], CompressorCfg], list[torch.Tensor]]
# decode(buf, m, cfg, dtype) -> the segment's m values C(x), from exactly its wire bytes
Decode = Callable[[torch.Tensor, int, CompressorCfg, torch.dtype], torch.Tensor]


@dataclass(frozen=True, kw_only=True)
class Codec:
    """How one compressor kind packs a compressed segment into bytes and back."""

    encode: Encode
    decode: Decode


def as_bytes(t: torch.Tensor) -> torch.Tensor:
    """The raw bytes of t (host byte order, little-endian: see the check below), 1-D uint8."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


def from_bytes(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of `as_bytes` (copies, so a slice at any offset can be reinterpreted)."""
    return b.clone().view(dtype)


def pack_bits(values: torch.Tensor, width: int) -> torch.Tensor:
    """Non-negative integers < 2^width, `width` bits each, into ceil(m·width/8) bytes."""
    if width == 8:
        return values.to(torch.uint8)
    bits = ((values.long()[:, None] >> torch.arange(width, device=values.device)) & 1).reshape(-1)
    bits = torch.cat([bits, bits.new_zeros((-bits.numel()) % 8)])
    return (bits.view(-1, 8) << torch.arange(8, device=values.device)).sum(1).to(torch.uint8)


def unpack_bits(buf: torch.Tensor, m: int, width: int) -> torch.Tensor:
    """Inverse of `pack_bits`: m integers (int64)."""
    if width == 8:
        return buf.long()
    bits = ((buf.long()[:, None] >> torch.arange(8, device=buf.device)) & 1).reshape(-1)
    return (bits[:m * width].view(m, width) << torch.arange(width, device=buf.device)).sum(1)


def _dense_encode(x, u, cfg) -> list[torch.Tensor]:
    return [as_bytes(x)]


def _dense_decode(buf, m, cfg, dtype) -> torch.Tensor:
    return from_bytes(buf, dtype)


def _sparse_encode(x, u, cfg) -> list[torch.Tensor]:
    score = x.abs() if u is None else u  # topk: largest |x|; randomk: largest uniforms
    idx = kept_indices(score[None], cfg.ratio)
    if idx is None:
        return [as_bytes(x)]
    idx = idx[0]
    b = index_bytes(x.numel())
    return [as_bytes(x[idx]), idx.view(torch.uint8).view(-1, 8)[:, :b].reshape(-1)]


def _sparse_decode(buf, m, cfg, dtype) -> torch.Tensor:
    k = kept_count(m, cfg.ratio)
    if k == m:
        return from_bytes(buf, dtype)
    nv = k * torch.empty((), dtype=dtype).element_size()
    b = index_bytes(m)
    wide = buf.new_zeros((k, 8))
    wide[:, :b] = buf[nv:].view(k, b)
    return torch.zeros(m, dtype=dtype, device=buf.device).scatter_(0, wide.view(torch.int64).view(-1),
                                                                    from_bytes(buf[:nv], dtype))


def _minmax_encode(x, u, cfg) -> list[torch.Tensor]:
    lo, scale, q = minmax_levels(x[None], cfg)
    return [pack_bits(q[0].long(), cfg.bits), as_bytes(lo), as_bytes(scale)]


def _minmax_decode(buf, m, cfg, dtype) -> torch.Tensor:
    nq, vb = math.ceil(m * cfg.bits / 8), torch.empty((), dtype=dtype).element_size()
    q = unpack_bits(buf[:nq], m, cfg.bits).to(dtype)
    lo, scale = from_bytes(buf[nq:nq + vb], dtype), from_bytes(buf[nq + vb:nq + 2 * vb], dtype)
    return q * scale + lo  # compress's own dequantization, element by element


def _qsgd_encode(x, u, cfg) -> list[torch.Tensor]:
    norm, level = qsgd_levels(x[None], u[None], cfg)
    fields = level[0].long() | ((x < 0).long() << cfg.qsgd_level)
    return [as_bytes(norm), pack_bits(fields, cfg.qsgd_level + 1)]


def _qsgd_decode(buf, m, cfg, dtype) -> torch.Tensor:
    vb = torch.empty((), dtype=dtype).element_size()
    norm = from_bytes(buf[:vb], dtype)
    fields = unpack_bits(buf[vb:], m, cfg.qsgd_level + 1)
    level = (fields & (2 ** cfg.qsgd_level - 1)).to(dtype)
    sign = 1.0 - 2.0 * (fields >> cfg.qsgd_level).to(dtype)  # ±1; C(0) = 0 either way (level 0)
    return qsgd_value(sign, norm, level, cfg)


DENSE = Codec(encode=_dense_encode, decode=_dense_decode)
FORMATS: dict[str, Codec] = {
    "dense": DENSE,
    "sparse": Codec(encode=_sparse_encode, decode=_sparse_decode),
    "minmax": Codec(encode=_minmax_encode, decode=_minmax_decode),
    "qsgd": Codec(encode=_qsgd_encode, decode=_qsgd_decode),
}


def codec_of(cfg: CompressorCfg) -> Codec:
    """The packed format of cfg's messages; ValueError (one line) for a kind that has none."""
    if sys.byteorder != "little":
        raise RuntimeError("the wire format is little-endian; this host is not")
    if cfg.is_identity:
        return DENSE
    name = REGISTRY[cfg.kind].wire
    if name not in FORMATS:
        raise ValueError(f"compressor {cfg.kind!r} has no packed wire format (its Compressor.wire is {name!r}, "
                         f"not one of {', '.join(FORMATS)}): one process per node cannot send it; "
                         f"use an in-process executor")
    return FORMATS[name]


def _segment_bytes(m: int, cfg: CompressorCfg, value_bytes: int) -> int:
    return value_bytes * m if cfg.is_identity else REGISTRY[cfg.kind].wire_bytes(m, cfg, value_bytes)


def message_size(layout: Layout, cfg: CompressorCfg, *, dtype: torch.dtype, push_sum_weight: bool) -> int:
    """Bytes of one packed message."""
    vb = torch.empty((), dtype=dtype).element_size()
    weight = torch.empty((), dtype=WEIGHT_DTYPE).element_size() if push_sum_weight else 0
    return sum(_segment_bytes(m, cfg, vb) for m in layout.numels) + weight


def pack(v: torch.Tensor, layout: Layout, cfg: CompressorCfg, *, draws: torch.Tensor | None = None,
         weight: torch.Tensor | None = None) -> torch.Tensor:
    """One node's message: v (d,) before compression, draws (d,) its uniforms (random kinds),
    weight its push-sum weight (or None) -> the packed bytes (1-D uint8)."""
    if REGISTRY[cfg.kind].random and not cfg.is_identity and draws is None:
        raise ValueError(f"compressor {cfg.kind!r} draws uniforms: pass draws")
    codec = codec_of(cfg)
    parts = []
    for s in layout.segments():
        parts += codec.encode(v[s.start:s.stop], None if draws is None else draws[s.start:s.stop], cfg)
    if weight is not None:
        parts.append(as_bytes(weight.to(WEIGHT_DTYPE)))
    return torch.cat(parts)


def unpack(buf: torch.Tensor, layout: Layout, cfg: CompressorCfg, *, dtype: torch.dtype,
           push_sum_weight: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Inverse of `pack`: (C(v) as (d,) values of `dtype`, the push-sum weight or None)."""
    expected = message_size(layout, cfg, dtype=dtype, push_sum_weight=push_sum_weight)
    if buf.dtype != torch.uint8 or buf.numel() != expected:
        raise ValueError(f"a message of this layout has {expected} bytes, got {buf.numel()} {buf.dtype}")
    codec, vb = codec_of(cfg), torch.empty((), dtype=dtype).element_size()
    out, at = [], 0
    for m in layout.numels:
        nb = _segment_bytes(m, cfg, vb)
        out.append(codec.decode(buf[at:at + nb], m, cfg, dtype))
        at += nb
    weight = from_bytes(buf[at:], WEIGHT_DTYPE).to(dtype)[0] if push_sum_weight else None
    return torch.cat(out), weight
