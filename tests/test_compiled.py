"""The compiled training iteration (lpdl_core.decentral.engine.compiled) and the traceable 8-bit
operators it runs (lpdl_core.quant.traced).

The fast tests run the traceable form eagerly against the eager custom autograd Functions; the
slow ones compile the whole iteration (minutes on a CPU) and follow the eager run for 20 steps.
"""
import pytest
import torch
from torch.func import vmap

from lpdl_core.decentral.algorithms.base import GossipCfg
from lpdl_core.decentral.compress import CompressorCfg
from lpdl_core.decentral.engine import EngineCfg, Simulator
from lpdl_core.decentral.optim import OptimCfg
from lpdl_core.decentral.topology import Topology
from lpdl_core.models.mini import build_standin
from lpdl_core.quant import traced
from lpdl_core.quant.params import ParamQuant
from lpdl_core.quant.quantizer import QuantCfg, fake_quant
from lpdl_core.training.bench import bench_step

# 16-bit nearest layer gradients: deterministic, and a rounding decision that a last-bit
# difference flips moves that layer gradient by one step of a 2^16-level grid (1.5e-5 of its range)
DETERMINISTIC = QuantCfg(grad_bits=16, grad_rounding="nearest")


def _sim(precision, *, algorithm="ds", topology="ring", compression=0, momentum="nesterov",
         compile=False, qcfg=DETERMINISTIC):
    gossip = GossipCfg(algorithm=algorithm) if compression == 0 else GossipCfg(
        algorithm=algorithm, eta=0.01, compressor=CompressorCfg(kind="topk", ratio=compression / 100))
    q = qcfg if precision == "int8" else None
    return Simulator(lambda: build_standin("resnet20", precision=precision, qcfg=q),
                     topology=Topology(name=topology, n=4), gossip=gossip, optim_cfg=OptimCfg(momentum=momentum),
                     engine=EngineCfg(executor="batched", device="cpu", compile=compile), param_transform=ParamQuant)


def _batch(n=4, b=4, side=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, b, 3, side, side, generator=g), torch.randint(0, 10, (n, b), generator=g)


def test_traced_straight_through_q_is_q_bitwise_with_unit_gradient():
    x = torch.randn(5, 7, requires_grad=True)
    lo, hi = torch.tensor([-0.5]), torch.tensor([0.7])
    y = traced.quantize(x, 8, "nearest", lo, hi)
    assert torch.equal(y, fake_quant(x.detach(), 8, "nearest", lo, hi))  # x - x = 0 exactly
    (y * torch.arange(35.0).reshape(5, 7)).sum().backward()
    assert torch.equal(x.grad, torch.arange(35.0).reshape(5, 7))


def test_the_gradient_quantizer_takes_one_range_per_node_under_vmap():
    """vmap over nodes, autograd outside it: the backward sees the stacked gradient and must still
    quantize each node's slice over that node's own range, as the eager vmapped Function does."""
    x = torch.randn(3, 4, 5, requires_grad=True)
    scale = torch.tensor([1.0, 100.0, 0.01]).reshape(3, 1, 1) * torch.randn(3, 4, 5)
    out = vmap(lambda t: traced.quantize_grad(t, 4, "nearest"))(x)
    assert torch.equal(out, x.detach())
    (g,) = torch.autograd.grad((out * scale).sum(), x)
    assert torch.equal(g, torch.stack([fake_quant(s, 4, "nearest") for s in scale]))


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_traced_form_matches_the_eager_functions(precision):
    """Same forward operations on the same operands: losses and the buffers the forward updates
    (activation ranges) are bitwise equal. Gradients come from another autograd graph (grad of the
    vmapped sum instead of vmap of grad; composed Range EvoNorm instead of its hand-written
    backward), so summation orders differ: a few float32 ulps of the largest gradient, plus at
    most one step of a 16-bit layer-gradient grid where a rounding flips. 1e-4 of max |g| bounds
    both with a margin of about 6 (1.5e-5 per flip)."""
    torch.manual_seed(0)
    eager, tr = _sim(precision), _sim(precision)
    x, y = _batch()
    l0, g0 = eager.executor.loss_and_grad(x, y)
    with traced.traced_ops():
        l1, g1 = tr.executor.traced_loss_and_grad(x, y)
    assert torch.equal(l0, l1)
    for k, b in eager.executor.buffers.items():
        assert torch.equal(b, tr.executor.buffers[k]), k
    assert (g1 - g0).abs().max() <= 1e-4 * g0.abs().max()


@pytest.mark.parametrize("change,message", [
    (dict(gossip=GossipCfg(algorithm="choco", compressor=CompressorCfg(kind="randomk", ratio=0.5))),
     "deterministic compressor"),
])
def test_settings_a_compiled_step_does_not_cover_fail_in_one_line(change, message):
    with pytest.raises(ValueError, match=message):
        Simulator(lambda: build_standin("resnet20", precision="fp32"), topology=Topology(name="ring", n=2),
                  engine=EngineCfg(executor="batched", compile=True, device="cpu"), **change)


@pytest.mark.parametrize("kw,message", [(dict(executor="loop"), "engine: compile .* needs executor batched"),
                                        (dict(executor="batched", compile_mode="fast"),
                                         "compile_mode must be one of")])
def test_engine_settings_are_checked_where_they_are_made(kw, message):
    with pytest.raises(ValueError, match=message):
        EngineCfg(compile=True, **kw)


def test_the_workflow_config_refuses_compile_without_the_batched_executor():
    import yaml
    from lpdl_core.pipeline.workflow.wfconfig import check_workflow_config
    from lpdl_core.errors import ConfigError
    cfg = yaml.safe_load(open("config/config.yaml"))
    schema = yaml.safe_load(open("workflow/schemas/config.schema.yaml"))
    assert check_workflow_config({**cfg, "compile": True, "executor": "batched"}, schema)["compile"] is True
    with pytest.raises(ConfigError, match="compile .* needs executor batched, got executor loop"):
        check_workflow_config({**cfg, "compile": True, "executor": "loop"}, schema)


@pytest.mark.parametrize("kw,message", [(dict(executor="loop"), "bench: compile .* needs executor batched"),
                                        (dict(executor="batched", warmup=0), "needs --warmup >= 1")])
def test_bench_compile_refuses_before_building(kw, message):
    with pytest.raises(ValueError, match=message):
        bench_step(compile=True, **kw)


CASES = {  # every axis covered by two compilations (each takes minutes here); the FP one also
    # runs the two-graph form that torch releases without dynamo's traced autograd.grad get
    "fp32-ds-static-0pct-two-graphs": (dict(precision="fp32", algorithm="ds", topology="ring", compression=0),
                                       False),
    "int8-choco-time-varying-99pct-qgm": (dict(precision="int8", algorithm="choco",
                                               topology="time-varying-exponential", compression=99,
                                               momentum="qgm"), True),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.ci) if CASES[c][1] else c for c in CASES])
def test_the_compiled_iteration_follows_the_eager_one_for_20_steps(case, monkeypatch):
    """fullgraph=True: a graph break is an error, so compiling at all means one graph with no
    .item() or nonzero in it (both break a graph under dynamo's defaults). One compilation serves
    all 20 steps (lr, round counter and mixing matrix are tensors).

    Tolerance. The first step starts from the same parameters, so its losses differ only by
    inductor's fused summation orders (float32 reassociation over at most ~10^5 terms: well under
    1e-5 relative). After that the runs differ by float summation order until a discrete decision
    flips (a coordinate entering or leaving the 1 % top-k, a 16-bit rounding step); from there they
    are two nearby trajectories of a quantized, momentum-driven system, and single coordinates can
    part by more than their float error (one run: 0.032 on a largest |x| of 1.04). So the test
    bounds what a wrong operator would blow up at once: every step's losses within 2 % (the first
    within 1e-5), x within 5 % in relative L2 norm, the per-node buffers (activation ranges: batch
    extremes, the most sensitive) within 10 %. One run on this machine measured 0.31 % and 0.9 %.
    The compiled math itself is checked op for op by the fast tests above (traced form == eager)."""
    from lpdl_core.decentral.engine.compiled import CompiledStep
    settings, one_graph = CASES[case]
    if one_graph and not CompiledStep.ONE_GRAPH:
        pytest.skip("this torch's dynamo cannot trace torch.autograd.grad")
    monkeypatch.setattr(CompiledStep, "ONE_GRAPH", one_graph)
    torch._dynamo.reset()
    eager, comp = _sim(**settings), _sim(**settings, compile=True)
    frames = torch._dynamo.utils.counters["stats"]["unique_graphs"]
    for step in range(20):
        x, y = _batch(seed=step)
        lr = 0.05 if step < 10 else 0.02  # a schedule change must not recompile
        if step == 10:  # the CUDA-graph bookkeeping (step marks, outputs copied out) runs on the CPU too
            comp.compiled.cuda_graphs = True
        la, lb = eager.train_step(x, y, lr), comp.train_step(x, y, lr)
        if step == 0:  # same parameters: only inductor's fused summation orders differ
            assert (la - lb).abs().max() <= 1e-5 * la.abs().max()
        assert (la - lb).abs().max() <= 2e-2 * la.abs().max(), step
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] - frames == (1 if one_graph else 2)
    rel = float((eager.x - comp.x).norm() / eager.x.norm())
    assert rel <= 5e-2
    assert torch.allclose(eager.u, comp.u, rtol=1e-6)
    assert torch.equal(eager.bytes_sent, comp.bytes_sent)
    assert eager.t == comp.t == 20 and comp.opt_state.step == 20
    if eager.executor.buffers:  # the 8-bit nets' activation ranges: batch extremes, more sensitive
        be = torch.cat([b.flatten() for b in eager.executor.buffers.values()])
        bc = torch.cat([comp.executor.buffers[k].flatten() for k in eager.executor.buffers])
        assert (be - bc).norm() <= 0.1 * be.norm()
    # the next cell of a job (same shapes) compiles from the on-disk caches
    hits = torch._dynamo.utils.counters["inductor"]["fxgraph_cache_hit"]
    _sim(**settings, compile=True).train_step(*_batch(), 0.05)
    assert torch._dynamo.utils.counters["inductor"]["fxgraph_cache_hit"] > hits


@pytest.mark.slow
def test_a_compiled_transformer_with_adam_follows_the_eager_one():
    """The tiny DistilBERT of the mini profile, 8-bit, Adam (whose bias correction reads the step
    count as a tensor in the graph), dropout off so that both runs draw nothing. The first losses
    differ by summation order only. Adam moves each coordinate by about lr·m̂/(√v̂+ε), at most
    a few lr per step, and normalises away the gradient's scale, so a coordinate whose gradient is
    near zero can take a different step on a last-bit difference: |Δx| <= 2·lr·steps bounds it."""
    from lpdl_core.models.transformer import SequenceClassifier, distilbert_classifier
    tiny = dict(dim=64, n_layers=1, n_heads=2, hidden_dim=128, vocab_size=100, max_position_embeddings=16,
                dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0)

    def sim(compile):
        return Simulator(lambda: SequenceClassifier(distilbert_classifier(4, precision="int8", qcfg=DETERMINISTIC,
                                                                          pretrained=None, config_overrides=tiny)),
                         topology=Topology(name="ring", n=2), optim_cfg=OptimCfg(momentum="adam", beta2=0.9),
                         engine=EngineCfg(executor="batched", device="cpu", compile=compile),
                         param_transform=ParamQuant)
    eager, comp = sim(False), sim(True)
    g = torch.Generator().manual_seed(0)
    lr, steps = 1e-3, 5
    for step in range(steps):
        x, y = torch.randint(0, 100, (2, 4, 16), generator=g), torch.randint(0, 4, (2, 4), generator=g)
        la, lb = eager.train_step(x, y, lr), comp.train_step(x, y, lr)
        if step == 0:  # as above: summation order only
            assert (la - lb).abs().max() <= 1e-5 * la.abs().max()
    assert (eager.x - comp.x).abs().max() <= 2 * lr * steps
    assert comp.opt_state.step == steps


def test_the_cpu_rounding_noise_is_uniform_and_rounds_without_bias():
    """uniform_noise on the CPU (a hash of index, key and value): 2^16 levels in [-1/2, 1/2). Over
    4096 keys, round(t + ξ) averages to t: the standard error is at most 0.5/√4096 = 0.0078 per
    element (5σ: 0.039) and 0.5/√(4096·64) = 0.00098 for the mean error over 64 elements (5σ:
    0.0049), plus ξ's 2^-17 offset."""
    x = torch.linspace(0.0, 5.0, 64)
    key = torch.zeros((), dtype=torch.int64)
    draws = []
    for k in range(4096):
        key.fill_(k * 7919)
        draws.append(traced.uniform_noise(x, key))
    xi = torch.stack(draws)
    assert xi.min() >= -0.5 and xi.max() < 0.5
    assert torch.equal(xi * 65536, (xi * 65536).round())       # 2^16 levels
    assert abs(float(xi.mean())) < 0.5 / (4096 * 64) ** 0.5 * 5  # mean 0 (ξ's 2^-17 offset is below this)
    t = x * 3.3
    err = (t + xi).round().mean(0) - t
    assert err.abs().max() < 0.039 and abs(float(err.mean())) < 0.0049 + 2.0 ** -17
    # tensors of one shape in one step draw differently
    assert not torch.equal(traced.uniform_noise(x, key), traced.uniform_noise(x + 1, key))
