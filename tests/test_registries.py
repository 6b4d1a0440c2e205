"""Tests for the registries of the decentralized core: compressor kinds (lpdl_core.decentral.compress),
the algorithms' message declarations (read by the simulator's byte count) and the executors.

The compressor registry replaced two if/elif switches; `_old_compress` / `_old_message_bytes`
below are those switches, frozen, so the registry is checked bit-for-bit against them (same ops,
same process: exact equality is meaningful)."""
from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import lpdl_core
from lpdl_core import config
from lpdl_core.decentral import algorithms
from lpdl_core.decentral import compress as compress_mod
from lpdl_core.decentral.algorithms import GossipCfg, Message
from lpdl_core.decentral.compress import (
    REGISTRY,
    Compressor,
    CompressorCfg,
    compress,
    index_bytes,
    kept_count,
    kept_counts,
    message_bytes,
)
from lpdl_core.config import COMPRESSORS, IN_PROCESS_EXECUTORS as EXECUTORS
from lpdl_core.errors import ConfigError
from lpdl_core.decentral.engine import EngineCfg, Simulator
from lpdl_core.decentral.engine import executors as executors_mod
from lpdl_core.decentral.layout import Layout
from lpdl_core.decentral.topology import Topology

pytestmark = pytest.mark.usefixtures("one_thread")

TINY = Layout.from_shapes([(3, 4), (5,), (1,), (2, 2, 2)])  # numels 12, 5, 1, 8; d = 26
WIDE = Layout.from_shapes([(300,), (70_000,), (3,)])        # 2-, 4- and 1-byte indices


# ----------------------------------------------------------------------------- frozen old code
def _old_uniform(shape, like, generator):
    dtype = torch.float64 if like.dtype == torch.float64 else torch.float32
    device = generator.device if generator is not None else like.device
    return torch.rand(shape, generator=generator, device=device, dtype=dtype).to(like.device)


def _old_is_identity(cfg):
    return (cfg.kind == "identity" or (cfg.kind in ("topk", "randomk") and cfg.ratio == 0.0)
            or (cfg.kind == "qsgd" and cfg.qsgd_level == 32))


def _old_compress(v, layout, cfg, generator=None):
    if _old_is_identity(cfg):
        return v.clone()
    n = v.shape[0]
    out = torch.zeros_like(v) if cfg.kind in ("topk", "randomk") else torch.empty_like(v)
    u = _old_uniform((n, layout.d), v, generator) if cfg.kind in ("randomk", "qsgd") else None
    for seg in layout.segments():
        x = v[:, seg.start:seg.stop]
        o = out[:, seg.start:seg.stop]
        m = seg.numel
        if cfg.kind in ("topk", "randomk"):
            k = kept_count(m, cfg.ratio)
            if k == m:
                o.copy_(x)
                continue
            score = x.abs() if cfg.kind == "topk" else u[:, seg.start:seg.stop]
            idx = torch.topk(score, k, dim=1, sorted=False).indices
            o.scatter_(1, idx, x.gather(1, idx))
        elif cfg.kind == "minmax8":
            levels = 2 ** cfg.bits
            lo = x.amin(dim=1, keepdim=True)
            hi = x.amax(dim=1, keepdim=True)
            scale = ((hi - lo) / (levels - 1)).clamp_min(1e-8)
            q = torch.round(((x - lo) / scale).clamp(0, levels - 1))
            o.copy_(q * scale + lo)
        else:
            s = cfg.qsgd_s
            norm = torch.linalg.vector_norm(x, dim=1, keepdim=True)
            safe = torch.where(norm > 0, norm, torch.ones_like(norm))
            level_float = s * x.abs() / safe
            prev = torch.floor(level_float)
            up = (u[:, seg.start:seg.stop] < (level_float - prev)).to(x.dtype)
            q = torch.sign(x) * norm * (prev + up) / s
            if cfg.qsgd_biased:
                q = q / (1.0 + min(m / s ** 2, math.sqrt(m) / s))
            o.copy_(q)
    return out


def _old_message_bytes(layout, cfg, *, value_bytes=4, push_sum_weight=True):
    d = layout.d
    if cfg.bytes_metric == "legacy":
        if cfg.kind in ("topk", "randomk") and cfg.ratio > 0:
            return 6 * sum(kept_counts(layout, cfg.ratio)) + 3
        return 4 * (d + 1)
    if _old_is_identity(cfg):
        total = value_bytes * d
    elif cfg.kind in ("topk", "randomk"):
        total = 0
        for m in layout.numels:
            k = kept_count(m, cfg.ratio)
            total += k * value_bytes if k == m else k * (value_bytes + index_bytes(m))
    elif cfg.kind == "minmax8":
        total = sum(math.ceil(m * cfg.bits / 8) + 2 * 4 for m in layout.numels)
    else:
        bits_per_level = math.ceil(math.log2(cfg.qsgd_s + 1))
        total = sum(4 + math.ceil(m * (bits_per_level + 1) / 8) for m in layout.numels)
    return total + (4 if push_sum_weight else 0)


CFGS = ([CompressorCfg()]
        + [CompressorCfg(kind=k, ratio=r) for k in ("topk", "randomk") for r in (0.0, 0.099, 0.5, 0.9, 0.99)]
        + [CompressorCfg(kind="minmax8", bits=b) for b in (1, 3, 8, 16)]
        + [CompressorCfg(kind="qsgd", qsgd_level=lv, qsgd_biased=bi) for lv in (1, 2, 8, 32)
           for bi in (False, True)])


# ----------------------------------------------------------------------------- registry shape
def test_compressors_listed_from_registry():
    """Each spec (what a cell sees) has its kernels, and the reverse; each kind names a packed
    wire format that exists, and every format is some kind's."""
    from lpdl_core.specs import compressors as compressor_specs
    from lpdl_core.decentral.wire import FORMATS

    assert COMPRESSORS == ("identity", "topk", "randomk", "minmax8", "qsgd") == tuple(REGISTRY)
    assert tuple(compressor_specs.SPECS) == COMPRESSORS
    assert {e.wire for e in REGISTRY.values()} == set(FORMATS)
    assert all(isinstance(e, Compressor) for e in REGISTRY.values())
    for spec in compressor_specs.SPECS.values():  # a parameter sets a CompressorCfg field, in range
        if spec.param:
            lo, hi = spec.param.lo, spec.param.hi
            CompressorCfg.make(spec.name, param=lo), CompressorCfg.make(spec.name, param=hi)
            with pytest.raises(ValueError, match=f"{spec.param.field} must be an int in \\[{lo}, {hi}\\]"):
                CompressorCfg.make(spec.name, param=hi + 1)


def test_entries_declare_what_they_need():
    from lpdl_core.specs.compressors import SPECS

    flags = {k: (e.random, e.zeroed, SPECS[k].sparse) for k, e in REGISTRY.items()}
    assert flags == {"identity": (False, False, False), "topk": (False, True, True),
                     "randomk": (True, True, True), "minmax8": (False, False, False),
                     "qsgd": (True, False, False)}


def test_is_identity_answered_by_entry():
    for cfg in CFGS:
        assert cfg.is_identity == _old_is_identity(cfg) == REGISTRY[cfg.kind].identity_when(cfg)


def test_compressor_entry_validation():
    ok = REGISTRY["identity"]
    with pytest.raises(ValueError, match="apply"):
        Compressor(apply=None, wire_bytes=ok.wire_bytes)
    with pytest.raises(ValueError, match="random"):
        Compressor(apply=ok.apply, wire_bytes=ok.wire_bytes, random=1)


# ----------------------------------------------------------------------------- bit-for-bit
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("layout", [TINY, WIDE], ids=["tiny", "wide"])
def test_compress_equals_old_switch_bit_for_bit(layout, dtype):
    v = torch.randn(3, layout.d, generator=torch.Generator().manual_seed(7), dtype=dtype)
    v[1, :5] = 0  # a zero-norm / constant stretch
    for cfg in CFGS:
        g_new, g_old = torch.Generator().manual_seed(11), torch.Generator().manual_seed(11)
        new, old = compress(v, layout, cfg, g_new), _old_compress(v, layout, cfg, g_old)
        assert new.dtype == old.dtype and torch.equal(new, old), cfg
        # Same draws consumed: the streams continue identically.
        assert torch.equal(torch.rand(4, generator=g_new), torch.rand(4, generator=g_old)), cfg


@pytest.mark.parametrize("layout", [TINY, WIDE], ids=["tiny", "wide"])
def test_message_bytes_equal_old_switch(layout):
    for cfg in CFGS:
        for metric in ("exact", "legacy"):
            c = CompressorCfg(**{**cfg.__dict__, "bytes_metric": metric})
            for vb in (2, 4):
                for psw in (False, True):
                    assert (message_bytes(layout, c, value_bytes=vb, push_sum_weight=psw)
                            == _old_message_bytes(layout, c, value_bytes=vb, push_sum_weight=psw)), c


# ----------------------------------------------------------------------------- exact bytes, by hand
def test_wire_bytes_per_entry_hand_computed():
    wb = {k: e.wire_bytes for k, e in REGISTRY.items()}
    assert wb["identity"](26, CompressorCfg(), 4) == 104
    assert wb["identity"](26, CompressorCfg(), 2) == 52
    topk9 = CompressorCfg(kind="topk", ratio=0.9)
    # kept(300) = 29 (float rounding), 2-byte indices; kept(70000) = 6999, 4-byte; kept(3) = 1, 1-byte
    assert [wb["topk"](m, topk9, 4) for m in (300, 70_000, 3)] == [29 * 6, 6999 * 8, 1 * 5]
    assert wb["randomk"](300, CompressorCfg(kind="randomk", ratio=0.9), 2) == 29 * 4
    assert wb["topk"](1, topk9, 4) == 4  # sent whole: no index
    assert wb["minmax8"](12, CompressorCfg(kind="minmax8"), 4) == 12 + 8
    assert wb["minmax8"](5, CompressorCfg(kind="minmax8", bits=3), 4) == 2 + 8  # ceil(15/8)
    assert wb["qsgd"](12, CompressorCfg(kind="qsgd"), 4) == 4 + 14  # ceil(12*9/8)
    assert wb["qsgd"](8, CompressorCfg(kind="qsgd", qsgd_level=2), 4) == 4 + 3  # ceil(24/8)


@pytest.mark.parametrize("cfg,exact,legacy", [
    (CompressorCfg(), 26 * 4 + 4, 108),
    (CompressorCfg(kind="topk", ratio=0.5), 6 * 5 + 2 * 5 + 1 * 4 + 4 * 5 + 4, 6 * 13 + 3),
    (CompressorCfg(kind="randomk", ratio=0.5), 68, 81),
    (CompressorCfg(kind="topk", ratio=0.0), 108, 108),
    (CompressorCfg(kind="minmax8"), (12 + 5 + 1 + 8) + 4 * 8 + 4, 108),
    (CompressorCfg(kind="minmax8", bits=3), (5 + 2 + 1 + 3) + 4 * 8 + 4, 108),
    (CompressorCfg(kind="qsgd"), (14 + 6 + 2 + 9) + 4 * 4 + 4, 108),
    (CompressorCfg(kind="qsgd", qsgd_level=2), (5 + 2 + 1 + 3) + 4 * 4 + 4, 108),
    (CompressorCfg(kind="qsgd", qsgd_level=32), 108, 108),
], ids=lambda x: getattr(x, "kind", None) or str(x))
def test_message_bytes_tiny_hand_computed(cfg, exact, legacy):
    assert message_bytes(TINY, cfg) == exact
    assert message_bytes(TINY, cfg, push_sum_weight=False) == exact - 4
    assert message_bytes(TINY, CompressorCfg(**{**cfg.__dict__, "bytes_metric": "legacy"})) == legacy


def test_message_bytes_wide_topk_hand_computed():
    assert message_bytes(WIDE, CompressorCfg(kind="topk", ratio=0.9)) == 174 + 55_992 + 5 + 4
    assert message_bytes(WIDE, CompressorCfg(kind="topk", ratio=0.9, bytes_metric="legacy")) == 6 * 7029 + 3


# ----------------------------------------------------------------------------- a new kind
def _sign_apply(x, out, u, cfg):
    out.copy_(torch.sign(x) * x.abs().mean(dim=1, keepdim=True))


def _dither_apply(x, out, u, cfg):
    out.copy_(x + u)


def _firstk_apply(x, out, u, cfg):
    k = kept_count(x.shape[1], cfg.ratio)
    out[:, :k] = x[:, :k]  # the rest stays zero (zeroed=True)


def test_new_kind_registers_and_works_through_compress_and_bytes(monkeypatch):
    sign = Compressor(apply=_sign_apply, wire_bytes=lambda m, cfg, vb: vb + math.ceil(m / 8))
    dither = Compressor(apply=_dither_apply, wire_bytes=lambda m, cfg, vb: vb * m, random=True)
    firstk = Compressor(apply=_firstk_apply, wire_bytes=lambda m, cfg, vb: kept_count(m, cfg.ratio) * vb,
                        identity_when=lambda cfg: cfg.ratio == 0.0, zeroed=True)
    from lpdl_core.specs import compressors as compressor_specs
    from lpdl_core.specs.compressors import CompressorSpec

    with pytest.raises(ValueError, match="kind"):
        CompressorCfg(kind="sign")
    with monkeypatch.context() as mp:
        for name, entry in (("sign", sign), ("dither", dither), ("firstk", firstk)):
            mp.setitem(compress_mod.REGISTRY, name, entry)
            mp.setitem(compressor_specs.SPECS, name, CompressorSpec(name=name, cell_id=name, sparse=name == "firstk"))
        v = torch.randn(2, TINY.d, generator=torch.Generator().manual_seed(3))

        cfg = CompressorCfg(kind="sign")
        assert not cfg.is_identity
        c = compress(v, TINY, cfg)
        for seg in TINY.segments():
            x = v[:, seg.start:seg.stop]
            assert torch.equal(c[:, seg.start:seg.stop], torch.sign(x) * x.abs().mean(1, keepdim=True))
        assert message_bytes(TINY, cfg) == (4 + 2) + (4 + 1) + (4 + 1) + (4 + 1) + 4
        assert message_bytes(TINY, CompressorCfg(kind="sign", bytes_metric="legacy")) == 4 * 27

        c = compress(v, TINY, CompressorCfg(kind="dither"), torch.Generator().manual_seed(5))
        assert torch.equal(c, v + torch.rand(2, TINY.d, generator=torch.Generator().manual_seed(5)))

        cfg = CompressorCfg(kind="firstk", ratio=0.5)
        c = compress(v, TINY, cfg)
        for seg, k in zip(TINY.segments(), kept_counts(TINY, 0.5)):
            assert torch.equal(c[:, seg.start:seg.start + k], v[:, seg.start:seg.start + k])
            assert torch.all(c[:, seg.start + k:seg.stop] == 0)
        assert message_bytes(TINY, cfg, push_sum_weight=False) == 4 * 13
        assert message_bytes(TINY, CompressorCfg(kind="firstk", ratio=0.5, bytes_metric="legacy")) == 81
        assert CompressorCfg(kind="firstk").is_identity
        assert torch.equal(compress(v, TINY, CompressorCfg(kind="firstk")), v)
    with pytest.raises(ValueError, match="kind"):
        CompressorCfg(kind="sign")  # unregistered again


# ----------------------------------------------------------------------------- algorithm messages
def test_every_algorithm_declares_its_message():
    assert set(algorithms.REGISTRY) == set(algorithms.ALGORITHMS)
    declared = {name: mod.MESSAGE for name, mod in algorithms.REGISTRY.items()}
    assert all(isinstance(m, Message) for m in declared.values())
    # Push-sum algorithms send u_j (Alg. 4/5 line 9); Bagua-LP, AdaGossip and GUT keep u = 1 and send none.
    assert {k: m.push_sum_weight for k, m in declared.items()} == {
        "dpsgd": True, "ds": True, "choco": True, "bagua-lp": False, "adagossip": False, "gut": False}
    with pytest.raises(ValueError):
        Message(push_sum_weight=1)


def _linear() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(3, 2))  # d = 6 + 2 = 8


SIM_CASES = [(name, comp) for name in algorithms.ALGORITHMS
             for comp in (CompressorCfg(), CompressorCfg(kind="minmax8"))
             if name not in ("dpsgd", "gut") or comp.is_identity]  # dpsgd and gut: uncompressed only


@pytest.mark.parametrize("name,comp", SIM_CASES, ids=[f"{a}-{c.kind}" for a, c in SIM_CASES])
def test_simulator_message_bytes_follow_declaration(name, comp):
    sim = Simulator(_linear, topology=Topology(name="ring", n=4),
                    gossip=GossipCfg(algorithm=name, compressor=comp),
                    engine=EngineCfg(executor="loop", device="cpu"))
    payload = message_bytes(sim.layout, comp, push_sum_weight=False)
    assert payload == (32 if comp.is_identity else (6 + 8) + (2 + 8))
    u_bytes = 4 if algorithms.get(name).MESSAGE.push_sum_weight else 0
    assert sim.message_bytes == payload + u_bytes
    assert sim.message_bytes == payload + (0 if name in ("bagua-lp", "adagossip", "gut") else 4)


def test_algorithm_specs_agree_with_the_registry():
    """Each spec has its update rule and each registered rule its spec; an uncompressed one is
    refused a compressor by the cells and by GossipCfg alike."""
    from lpdl_core.specs import algorithms as algorithm_specs

    assert tuple(algorithm_specs.SPECS) == config.ALGORITHMS == tuple(algorithms.REGISTRY)
    for name, spec in algorithm_specs.SPECS.items():
        assert spec.display and spec.name == name
        if spec.uncompressed:
            with pytest.raises(ValueError, match=name):
                GossipCfg(algorithm=name, compressor=CompressorCfg.top_k(0.9), eta=1.0)


def test_model_specs_agree_with_the_builders():
    """Each CNN spec has its network and its mini stand-in, the text model its own; the planner's,
    the bill's and the report's model facts are the specs'."""
    from lpdl_core.models import mini, registry
    from lpdl_core.pipeline.workflow import resources
    from lpdl_core.pipeline.cells import shapes
    from lpdl_core.specs import models as model_specs

    import inspect

    for name in config.CNN_MODELS:  # the builders the specs name exist and take the arguments build_model passes
        params = inspect.signature(registry.builder(name)).parameters
        takes_rest = any(p.kind is p.VAR_KEYWORD for p in params.values())
        assert "dataset" in params and (takes_rest or {"num_classes", "precision", "norm", "qcfg"} <= set(params))
        assert callable(mini.standin_builder(name))
    assert all(s.builder is None for s in model_specs.SPECS.values() if s.kind != "cnn")
    assert tuple(model_specs.SPECS) == config.MODELS and config.TEXT_MODELS == ("distilbert",)
    assert set(config.MINI_STANDINS) == set(config.CNN_MODELS)
    for name, spec in model_specs.SPECS.items():
        assert set(spec.datasets) == set(config.MODEL_DATASETS[name]) <= set(config.PAPER_DATASETS)
        assert resources.PAPER_MEM_MB[name] == spec.mem_mb and shapes.MODEL_NAMES[name] == spec.display


# ----------------------------------------------------------------------------- executors
def test_executors_registry_agrees_with_the_specs():
    """Each spec has its implementation and each implementation its spec: the in-process executors
    are the registry's (the stacked one the vmapped class), the one-process-per-node one is the
    distributed engine's; what a spec says it can do is what the engine does."""
    from lpdl_core.specs import executors as executor_specs
    from lpdl_core.decentral.engine import distributed

    assert EXECUTORS == tuple(executors_mod.REGISTRY) == config.IN_PROCESS_EXECUTORS
    assert config.EXECUTORS == EXECUTORS + (distributed.NAME,) == tuple(executor_specs.SPECS)
    assert executor_specs.PER_NODE_EXECUTOR == distributed.NAME
    assert all(cls.name == k for k, cls in executors_mod.REGISTRY.items())
    for name, spec in executor_specs.SPECS.items():
        assert spec.stacked == (executors_mod.REGISTRY.get(name) is executors_mod.BatchedExecutor), name
        assert spec.packable == (name in executors_mod.REGISTRY) and spec.compilable == spec.stacked
        assert spec.step_executor in executors_mod.REGISTRY   # what one node's step runs
    assert config.DEFAULT_EXECUTOR in executors_mod.REGISTRY
    with pytest.raises(ConfigError, match="executor must be one of loop, batched, distributed, got 'mpi'"):
        executor_specs.executor_spec("mpi")


@pytest.mark.parametrize("kind", EXECUTORS)
def test_make_executor_builds_registered_class(kind):
    layout = Layout.from_module(_linear())
    ex = executors_mod.make_executor(kind, _linear, 2, layout, torch.zeros(2, layout.d), F.cross_entropy)
    assert type(ex) is executors_mod.REGISTRY[kind]
    with pytest.raises(ValueError, match="engine.executor must be one of"):
        executors_mod.make_executor("vmap", _linear, 2, layout, torch.zeros(2, layout.d), F.cross_entropy)


# ----------------------------------------------------------------------------- no switches left
NAMES = "|".join(re.escape(k) for k in (*COMPRESSORS, *algorithms.ALGORITHMS))
SWITCH = re.compile(rf"""(==|!=|\bin\b)\s*[(\[{{]?\s*["']({NAMES})["']"""  # x == "topk", in ("topk", ..)
                    rf"""|["']({NAMES})["']\s*(==|!=)"""                       # "topk" == x
                    r"""|\bkind\s*(==|!=)|\.kind\s+in\b|\.algorithm\s*(==|!=|in\b)""")


def _core_sources():
    root = Path(lpdl_core.__file__).parent / "decentral"
    return [root / "compress.py", root / "compressors.py", *sorted((root / "engine").glob("*.py"))]


def test_no_kind_or_algorithm_switches_in_core():
    for path in _core_sources():
        src = path.read_text()
        hits = [line.strip() for line in src.splitlines() if SWITCH.search(line)]
        assert not hits, f"{path.name}: {hits}"
    for path in (p for p in _core_sources() if p.parent.name == "engine"):
        for name in algorithms.ALGORITHMS:  # the engine never names an algorithm
            assert not re.search(rf"""["']{re.escape(name)}["']""", path.read_text()), (path.name, name)


def test_switch_regex_catches_the_old_forms():
    for line in ('if cfg.kind == "topk":', 'x if cfg.kind in ("topk", "randomk") else y',
                 'push_sum_weight=gossip.algorithm != "bagua-lp"', 'elif "qsgd" == kind:'):
        assert SWITCH.search(line), line
    for line in ('"topk": Compressor(apply=topk_apply,', 'if name == "auto":'):
        assert not SWITCH.search(line), line


def test_every_dataset_spec_has_a_loader_and_every_loader_a_spec():
    """One DatasetSpec table (lpdl_core.specs.datasets) names every dataset, its loader and its
    fetcher; each named function exists (a fetcher only where the loader can download), and the
    facts derived from the specs are theirs."""
    import inspect

    from lpdl_core.config import DATASET_SPECS
    from lpdl_core.data.registry import FETCHING, fetcher, loader
    from lpdl_core.decentral.partition import KNOWN_CLASS_SIZES
    from lpdl_core.pipeline.cells.shapes import DATASET_NAMES
    from lpdl_core.pipeline.workflow.runtime import StepTimes

    for name, spec in DATASET_SPECS.items():
        load = loader(name)
        assert callable(load)
        if spec.fetcher:
            assert list(inspect.signature(fetcher(name)).parameters) == ["name", "root"]
        assert (name in FETCHING) == (spec.fetcher is not None)
        assert (spec.standin_for is None) == bool(spec.display)  # the report names every paper dataset
    assert KNOWN_CLASS_SIZES == {n: s.class_sizes for n, s in DATASET_SPECS.items() if s.class_sizes}
    assert DATASET_NAMES == {n: s.display for n, s in DATASET_SPECS.items() if s.display}
    steps = StepTimes.load(Path(__file__).parents[1] / "config" / "step-times.yaml")
    assert {n: steps.train_samples[n] for n in ("cifar10", "imagenette", "sentlen")} == \
        {"cifar10": 50000, "imagenette": 9469, "sentlen": 100000}
    for spec in DATASET_SPECS.values():
        assert spec.kind in ("image", "text") and spec.classes >= 2
        assert (spec.size is None) == (spec.kind == "text")
        if spec.standin_for:   # a stand-in matches what it stands in for
            paper = DATASET_SPECS[spec.standin_for]
            assert (spec.kind, spec.classes, spec.size) == (paper.kind, paper.classes, paper.size)
