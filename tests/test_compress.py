"""Tests for lpdl_core.decentral.compress: kept counts and byte metrics against
docs/paper-vs-code.md, 'Compression and byte counts' and 'Invariants', and each compressor
against a per-node reference loop."""
import math

import pytest
import torch

from lpdl_core.config import COMPRESSORS
from lpdl_core.decentral.compress import (
    CompressorCfg,
    compress,
    index_bytes,
    kept_count,
    kept_counts,
    message_bytes,
)
from lpdl_core.decentral.layout import Layout


def resnet20_fp_shapes() -> list[tuple[int, ...]]:
    """ResNet-20 (CIFAR) with EvoNorm-S0, by hand: each norm has gamma, beta, v of (1, C, 1, 1)."""
    def norm(c):
        return [(1, c, 1, 1)] * 3

    shapes = [(16, 3, 3, 3), *norm(16)]
    c_in = 16
    for width in (16, 32, 64):
        for b in range(3):
            shapes += [(width, c_in, 3, 3), *norm(width), (width, width, 3, 3), *norm(width)]
            if b == 0 and width != c_in:  # 1x1 projection shortcut + norm (stages 2 and 3)
                shapes += [(width, c_in, 1, 1), *norm(width)]
            c_in = width
    shapes += [(10, 64), (10,)]
    return shapes


RESNET20 = Layout.from_shapes(resnet20_fp_shapes())
TINY = Layout.from_shapes([(3, 4), (5,), (1,), (2, 2, 2)])  # d = 12 + 5 + 1 + 8 = 26


def randn(n, layout, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, layout.d, generator=g, dtype=dtype)


def gen(seed):
    return torch.Generator().manual_seed(seed)


# ----------------------------------------------------------------------------- official counts
def test_resnet20_shape_list():
    assert len(RESNET20.shapes) == 86
    assert RESNET20.d == 273_258


@pytest.mark.parametrize("ratio,total", [(0.99, 2_767), (0.9, 27_290), (0.099, 246_152)])
def test_kept_totals_match_official(ratio, total):
    assert sum(kept_counts(RESNET20, ratio)) == total


def test_kept_count_formula():
    assert kept_count(100, 0.9) == 9  # float rounding of 100*(1-0.9), exactly as official
    assert kept_count(16, 0.99) == 1  # max(1, .) floor
    assert kept_count(7, 0.0) == 7
    with pytest.raises(ValueError):
        kept_count(0, 0.5)


def test_legacy_bytes_official_examples():
    dense = CompressorCfg(bytes_metric="legacy")
    assert message_bytes(RESNET20, dense) == 1_093_036
    assert message_bytes(RESNET20, CompressorCfg(kind="topk", ratio=0.99, bytes_metric="legacy")) == 16_605
    # QSGD and minmax8 are never bit-packed by the official bookkeeping.
    for cfg in (CompressorCfg(kind="qsgd", qsgd_level=4, bytes_metric="legacy"),
                CompressorCfg(kind="minmax8", bytes_metric="legacy"),
                CompressorCfg(kind="topk", ratio=0.0, bytes_metric="legacy")):
        assert message_bytes(RESNET20, cfg) == 1_093_036


# ----------------------------------------------------------------------------- exact bytes
def test_index_bytes():
    assert [index_bytes(m) for m in (1, 2, 256, 257, 65536, 65537, 2**32, 2**32 + 1)] == [1, 1, 1, 2, 2, 4, 4, 8]


def test_exact_bytes_tiny_layout():
    # TINY numels: 12, 5, 1, 8 (d = 26)
    assert message_bytes(TINY, CompressorCfg()) == 4 * 26 + 4
    assert message_bytes(TINY, CompressorCfg(), push_sum_weight=False) == 104
    assert message_bytes(TINY, CompressorCfg(), value_bytes=2, push_sum_weight=False) == 52
    # topk ratio 0.5: kept 6, 2 (int(2.5)), 1 (dense -> no index), 4; indices 1 byte each
    cfg = CompressorCfg(kind="topk", ratio=0.5)
    assert kept_counts(TINY, 0.5) == [6, 2, 1, 4]
    assert message_bytes(TINY, cfg) == 6 * 5 + 2 * 5 + 1 * 4 + 4 * 5 + 4
    assert message_bytes(TINY, CompressorCfg(kind="randomk", ratio=0.5)) == message_bytes(TINY, cfg)
    # minmax8: ceil(m*8/8) + 8 per tensor
    assert message_bytes(TINY, CompressorCfg(kind="minmax8"), push_sum_weight=False) == (12 + 5 + 1 + 8) + 4 * 8
    # 3 bits: ceil(36/8)=5, ceil(15/8)=2, 1, 3
    assert message_bytes(TINY, CompressorCfg(kind="minmax8", bits=3)) == (5 + 8) + (2 + 8) + (1 + 8) + (3 + 8) + 4
    # qsgd level 2 (s = 3): 3 bits per element incl. sign -> ceil(36/8)=5, 2, 1, 3; + 4 per norm
    assert message_bytes(TINY, CompressorCfg(kind="qsgd", qsgd_level=2)) == (5 + 2 + 1 + 3) + 4 * 4 + 4
    assert message_bytes(TINY, CompressorCfg(kind="qsgd", qsgd_level=32)) == 108  # identity


def test_exact_bytes_resnet20_topk_uses_2byte_and_4byte_indices():
    k = kept_counts(RESNET20, 0.99)
    expect = sum(kk * 4 if kk == m else kk * (4 + index_bytes(m)) for kk, m in zip(k, RESNET20.numels)) + 4
    assert message_bytes(RESNET20, CompressorCfg(kind="topk", ratio=0.99)) == expect
    assert expect < 16_605 * 2  # sanity: same order as the legacy count


# ----------------------------------------------------------------------------- config
@pytest.mark.parametrize("kwargs,field", [
    (dict(kind="sparsify"), "kind"), (dict(ratio=1.0), "ratio"), (dict(ratio=-0.1), "ratio"),
    (dict(ratio=float("nan")), "ratio"), (dict(ratio="0.5"), "ratio"), (dict(bits=0), "bits"),
    (dict(bits=17), "bits"), (dict(bits=8.0), "bits"), (dict(qsgd_level=0), "qsgd_level"),
    (dict(qsgd_level=33), "qsgd_level"), (dict(qsgd_biased=1), "qsgd_biased"),
    (dict(bytes_metric="fast"), "bytes_metric"),
])
def test_cfg_validation(kwargs, field):
    with pytest.raises(ValueError, match=field):
        CompressorCfg(**kwargs)


def test_cfg_is_identity():
    assert CompressorCfg().is_identity
    assert CompressorCfg(kind="topk").is_identity and CompressorCfg(kind="randomk").is_identity
    assert CompressorCfg(kind="qsgd", qsgd_level=32).is_identity
    assert not CompressorCfg(kind="topk", ratio=0.5).is_identity
    assert not CompressorCfg(kind="qsgd").is_identity
    assert not CompressorCfg(kind="minmax8").is_identity


def test_compress_shape_validation():
    with pytest.raises(ValueError):
        compress(torch.zeros(2, TINY.d + 1), TINY, CompressorCfg(kind="topk", ratio=0.5))
    with pytest.raises(ValueError):
        compress(torch.zeros(2, TINY.d, dtype=torch.int64), TINY, CompressorCfg())


# ----------------------------------------------------------------------------- identity
@pytest.mark.parametrize("cfg", [CompressorCfg(), CompressorCfg(kind="topk"),
                                 CompressorCfg(kind="qsgd", qsgd_level=32)])
def test_identity_paths(cfg):
    v = randn(3, TINY)
    c = compress(v, TINY, cfg)
    assert torch.equal(c, v) and c.data_ptr() != v.data_ptr()


# ----------------------------------------------------------------------------- top-k
def topk_loop(v, layout, ratio):
    out = torch.zeros_like(v)
    for i in range(v.shape[0]):
        for seg in layout.segments():
            x = v[i, seg.start:seg.stop]
            k = kept_count(seg.numel, ratio)
            idx = torch.argsort(x.abs(), descending=True)[:k]
            out[i, seg.start + idx] = x[idx]
    return out


@pytest.mark.parametrize("ratio", [0.5, 0.9, 0.99])
def test_topk_counts_values_and_error_feedback(ratio):
    v = randn(4, RESNET20, seed=1)
    c = compress(v, RESNET20, CompressorCfg(kind="topk", ratio=ratio))
    assert c.shape == v.shape and c.dtype == v.dtype
    for seg, k in zip(RESNET20.segments(), kept_counts(RESNET20, ratio)):
        assert torch.all(torch.count_nonzero(c[:, seg.start:seg.stop], dim=1) == k)
    kept = c != 0
    assert torch.equal(c[kept], v[kept])  # kept values are copied, not altered
    delta = v - c  # Deep-Squeeze error feedback
    assert torch.all(delta[kept] == 0) and torch.all(delta[~kept] != 0)


def test_topk_matches_loop_reference():
    v = randn(3, TINY, seed=2)
    for ratio in (0.3, 0.5, 0.8):
        assert torch.equal(compress(v, TINY, CompressorCfg(kind="topk", ratio=ratio)), topk_loop(v, TINY, ratio))
    layout = Layout.from_shapes(resnet20_fp_shapes()[:12])
    v = randn(3, layout, seed=3)
    assert torch.equal(compress(v, layout, CompressorCfg(kind="topk", ratio=0.9)), topk_loop(v, layout, 0.9))


def test_topk_float64_and_per_node_independent():
    v = randn(3, TINY, seed=4, dtype=torch.float64)
    cfg = CompressorCfg(kind="topk", ratio=0.5)
    c = compress(v, TINY, cfg)
    assert c.dtype == torch.float64
    for i in range(3):  # vectorized == each node alone
        assert torch.equal(c[i:i + 1], compress(v[i:i + 1], TINY, cfg))


# ----------------------------------------------------------------------------- random-k
def test_randomk_counts_deterministic_and_subset():
    v = randn(4, RESNET20, seed=5)
    cfg = CompressorCfg(kind="randomk", ratio=0.99)
    c1 = compress(v, RESNET20, cfg, gen(7))
    c2 = compress(v, RESNET20, cfg, gen(7))
    c3 = compress(v, RESNET20, cfg, gen(8))
    assert torch.equal(c1, c2) and not torch.equal(c1, c3)
    for seg, k in zip(RESNET20.segments(), kept_counts(RESNET20, 0.99)):
        assert torch.all(torch.count_nonzero(c1[:, seg.start:seg.stop], dim=1) == k)
    kept = c1 != 0
    assert torch.equal(c1[kept], v[kept])  # no unbiasing rescale
    # different nodes get different masks
    assert not torch.equal(kept[0], kept[1])


def test_randomk_vectorized_equals_node_loop_with_same_stream():
    # On CPU one (n, d) draw consumes the generator row by row, like a per-node loop does.
    v = randn(3, TINY, seed=6)
    cfg = CompressorCfg(kind="randomk", ratio=0.5)
    c = compress(v, TINY, cfg, gen(11))
    g = gen(11)
    loop = torch.cat([compress(v[i:i + 1], TINY, cfg, g) for i in range(3)])
    assert torch.equal(c, loop)


def test_randomk_uniform_coverage():
    layout = Layout.from_shapes([(10,)])
    v = torch.ones(2000, 10)
    c = compress(v, layout, CompressorCfg(kind="randomk", ratio=0.7), gen(3))  # keeps 3 of 10
    freq = (c != 0).float().mean(0)
    assert torch.allclose(freq, torch.full((10,), 0.3), atol=0.04)


# ----------------------------------------------------------------------------- min-max 8-bit
def test_minmax8_levels_error_and_extremes():
    v = randn(4, RESNET20, seed=9) * 3 + 1
    c = compress(v, RESNET20, CompressorCfg(kind="minmax8"))
    assert c.shape == v.shape and c.dtype == v.dtype
    for seg in RESNET20.segments():
        x, q = v[:, seg.start:seg.stop], c[:, seg.start:seg.stop]
        lo, hi = x.amin(1, keepdim=True), x.amax(1, keepdim=True)
        # Half a step, (hi - lo)/510, plus float32 rounding: each of the ~5 elementwise ops
        # (x - lo, /s, s = (hi - lo)/255, q·s, + lo) errs by at most u = 2^-24 of its operands,
        # so < 8u·(|hi| + |lo| + hi - lo) <= 16u·(|hi| + |lo|) < 1e-6·(|hi| + |lo|).
        tol = 1e-6 * (hi.abs() + lo.abs() + 1)
        assert torch.all((q - x).abs() <= (hi - lo) / 510 + tol)
        # The max maps to level 255 and back to 255·s + lo = hi up to three roundings of
        # hi - lo (difference, /255, ·255) and one of the sum: u·(3(hi - lo) + |hi|).
        u = 2.0 ** -24
        assert torch.all((q.amax(1, keepdim=True) - hi).abs() <= 4 * u * ((hi - lo) + hi.abs()))
        assert torch.equal(q.amin(1, keepdim=True), lo)  # level 0: 0·s + lo is lo exactly
        for i in range(q.shape[0]):
            assert q[i].unique().numel() <= 256


def test_minmax_bits_and_constant_tensors():
    layout = Layout.from_shapes([(50,), (7,), (1,)])
    v = torch.randn(3, layout.d, generator=gen(1))
    v[:, 50:57] = 2.5  # constant tensor -> exact
    c = compress(v, layout, CompressorCfg(kind="minmax8", bits=2))
    assert torch.all(c[:, 50:57] == 2.5) and torch.equal(c[:, 57], v[:, 57])
    for i in range(3):
        assert c[i, :50].unique().numel() <= 4


def test_minmax_vectorized_equals_node_loop():
    v = randn(5, TINY, seed=12)
    cfg = CompressorCfg(kind="minmax8")
    c = compress(v, TINY, cfg)
    assert torch.equal(c, torch.cat([compress(v[i:i + 1], TINY, cfg) for i in range(5)]))


# ----------------------------------------------------------------------------- QSGD
def qsgd_loop(v, layout, s, u, biased):
    out = torch.empty_like(v)
    for i in range(v.shape[0]):
        for seg in layout.segments():
            x = v[i, seg.start:seg.stop]
            norm = x.norm()
            lf = s * x.abs() / norm
            nl = torch.floor(lf) + (u[i, seg.start:seg.stop] < lf - torch.floor(lf)).float()
            q = torch.sign(x) * norm * nl / s
            if biased:
                m = seg.numel
                q = q / (1 + min(m / s ** 2, math.sqrt(m) / s))
            out[i, seg.start:seg.stop] = q
    return out


@pytest.mark.parametrize("biased", [False, True])
def test_qsgd_matches_loop_reference(biased):
    v = randn(3, TINY, seed=13)
    cfg = CompressorCfg(kind="qsgd", qsgd_level=2, qsgd_biased=biased)
    c = compress(v, TINY, cfg, gen(21))
    u = torch.rand(3, TINY.d, generator=gen(21))
    assert torch.allclose(c, qsgd_loop(v, TINY, 3, u, biased), atol=1e-6, rtol=1e-6)
    g = gen(21)
    loop = torch.cat([compress(v[i:i + 1], TINY, cfg, g) for i in range(3)])
    assert torch.equal(c, loop)


def test_qsgd_unbiased_and_levels():
    v = randn(1, TINY, seed=14)
    cfg = CompressorCfg(kind="qsgd", qsgd_level=1)  # s = 1: values in {0, +-||x||}
    reps = 20000
    c = compress(v.expand(reps, -1).contiguous(), TINY, cfg, gen(5))
    assert torch.allclose(c.mean(0), v[0], atol=0.05)
    for seg in TINY.segments():
        norm = v[0, seg.start:seg.stop].norm()
        vals = c[:, seg.start:seg.stop].abs()
        assert torch.all((vals == 0) | torch.isclose(vals, norm.expand_as(vals)))
        assert torch.all(torch.sign(c[:, seg.start:seg.stop]) * torch.sign(v[:, seg.start:seg.stop]) >= 0)


def test_qsgd_zero_tensor_and_high_level_close():
    v = randn(2, TINY, seed=15)
    v[:, :12] = 0
    c = compress(v, TINY, CompressorCfg(kind="qsgd", qsgd_level=16), gen(0))
    assert torch.all(c[:, :12] == 0) and torch.isfinite(c).all()
    assert torch.allclose(c, v, atol=1e-3)


def test_all_kinds_keep_dtype_and_device():
    v = randn(2, TINY, seed=16)
    for kind in COMPRESSORS:
        c = compress(v, TINY, CompressorCfg(kind=kind, ratio=0.5), gen(0))
        assert c.shape == v.shape and c.dtype == v.dtype and c.device == v.device


def test_top_k_is_the_one_constructor_of_the_papers_compression():
    """A cell's percent, the official k and the demo's fraction all become CompressorCfg.top_k(drop)."""
    from lpdl_core.pipeline.cells.tables import load_cells
    from lpdl_core.pipeline.run.runcell import plan_cell
    assert CompressorCfg.top_k(0) == CompressorCfg()
    assert CompressorCfg.top_k(0.99, bytes_metric="legacy") == CompressorCfg(kind="topk", ratio=0.99,
                                                                             bytes_metric="legacy")
    for c in load_cells(tables=["table2"])[:12]:
        comp = plan_cell(c, "paper").gossip.compressor
        assert comp == CompressorCfg.top_k(c.drop) and c.drop == c.compression / 100
    with pytest.raises(ValueError, match="ratio must be in"):
        CompressorCfg.top_k(1.0)
