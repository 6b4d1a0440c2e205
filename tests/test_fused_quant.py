"""The fused 8-bit quantizers (lpdl_core.quant.fused, engine.fused_quant): the same quantizer as the
eager chain within a tolerance argued from the arithmetic, at most three launches per chain on
this CPU, and an eager batched 8-bit ResNet-20 step that dispatches at most 2x the FP step's operators.

The tests that compile are slow (marked for CI): each chain compiles once per process and input
rank (inductor, a few seconds each on a 2-core CPU).

Why not bitwise: the compiler may contract `round(t)·s + min` into one fused multiply-add and
reorder the batch mean of the per-sample ranges, so a value can differ from the eager chain's in
its last bits; and where t = (x − min)/s lies within those bits of a half-integer, round picks the
neighbouring level (one step s). A float32 t below 256 carries about 2^-16 absolute error per
rounding, so such ties are rare: a few in 10^5 elements (bounded below at 1e-3).
"""
import re

import pytest
import torch

from lpdl_core.decentral.engine import EngineCfg
from lpdl_core.quant import fused
from lpdl_core.quant.layers import QuantMeasure
from lpdl_core.quant.quantizer import QuantCfg, fake_quant

ULPS = 8 * torch.finfo(torch.float32).eps  # relative: a few roundings of a contracted expression


def _agree(fused_q, eager_q, scale, magnitude):
    """Every element within ULPS·magnitude of the eager value, or exactly one level apart (a tie);
    ties at most 1e-3 of the elements."""
    d = (fused_q - eager_q).abs()
    close = d <= ULPS * magnitude
    tie = (d - scale).abs() <= ULPS * magnitude + 1e-6 * scale
    assert bool((close | tie).all()), d.max()
    assert (~close).float().mean().item() <= 1e-3


@pytest.mark.slow
@pytest.mark.ci
def test_own_range_quant_is_fake_quant_per_node():
    torch.manual_seed(0)
    x = torch.randn(4, 32, 16, 8, 8) * 3 + 1
    f = torch.vmap(lambda t: fused.own_range(t, 8, "nearest"))(x)
    for i in range(4):
        e = fake_quant(x[i], 8)
        _agree(f[i], e, (x[i].max() - x[i].min()) / 255, x[i].abs().max())


@pytest.mark.slow
@pytest.mark.ci
def test_measured_quant_is_quant_measures_forward_and_running_update():
    """Q(x) over the batch mean of per-sample ranges, and running = m·running + (1 − m)·batch."""
    torch.manual_seed(1)
    x = torch.randn(3, 16, 8, 6, 6) * 2 - 0.5
    q = QuantCfg()
    eager = []
    for i in range(3):
        m = QuantMeasure(q).train()
        m.running_min.fill_(-1.0)
        m.running_max.fill_(2.0)
        eager.append((m(x[i]), m.running_min.clone(), m.running_max.clone()))
    rmin, rmax = torch.full((3, 1), -1.0), torch.full((3, 1), 2.0)
    f = torch.vmap(lambda t, a, b: fused.measured(t, a, b, 8, "nearest", q.momentum))(x, rmin, rmax)
    for i, (e, emin, emax) in enumerate(eager):
        lo = x[i].amin((1, 2, 3)).mean()
        hi = x[i].amax((1, 2, 3)).mean()
        _agree(f[i], e, (hi - lo) / 255, x[i].abs().max())
        # m·r + (1 − m)·batch: a few roundings of values of magnitude |r|, so relative to it
        assert torch.allclose(rmin[i], emin, rtol=ULPS, atol=0) and torch.allclose(rmax[i], emax, rtol=ULPS, atol=0)


@pytest.mark.slow
@pytest.mark.ci
def test_stochastic_fused_rounding_is_on_the_grid_unbiased_and_per_node():
    """Each value is min + k·s for an integer k in [0, 255]; E[Q(x) − x] = 0 (the mean error over
    10^5 elements, whose per-element error is uniform on an interval of width s, has standard
    deviation s/sqrt(12·10^5) ≈ 0.001 s: bounded at 0.005 s); nodes draw their own noise."""
    torch.manual_seed(2)
    x = torch.randn(4, 100_000)
    f = torch.vmap(lambda t: fused.own_range(t, 8, "stochastic"), randomness="different")(x)
    lo, s = x.amin(1, keepdim=True), (x.amax(1, keepdim=True) - x.amin(1, keepdim=True)) / 255
    k = (f - lo) / s
    assert (k - k.round()).abs().max() < 1e-3 and k.round().min() >= 0 and k.round().max() <= 255
    assert ((f - x).mean(1) / s.squeeze(1)).abs().max() < 0.005
    assert not torch.equal((f - x)[0], (f - x)[1])
    with pytest.raises(RuntimeError, match="per node"):
        torch.vmap(lambda t: fused.own_range(t, 8, "stochastic"), randomness="same")(x)


@pytest.mark.slow
@pytest.mark.ci
def test_on_a_cpu_fused_stochastic_rounding_draws_the_eager_chains_noise():
    """On a CPU the fused chains read the eager draw (noise.float_lanes): from the same generator
    state, fused and eager stochastic rounding agree as nearest rounding does (within the ties
    above), for the own-range chain and QuantMeasure's."""
    x = torch.randn(8, 16, 12, 12) * 2 + 0.3
    torch.manual_seed(5)
    f = fused.own_range(x, 8, "stochastic")
    torch.manual_seed(5)
    e = fake_quant(x, 8, "stochastic")
    _agree(f, e, (x.max() - x.min()) / 255, x.abs().max())
    q = QuantCfg(act_rounding="stochastic")
    m = QuantMeasure(q).train()
    torch.manual_seed(6)
    e = m(x)
    torch.manual_seed(6)
    f = fused.measured(x, torch.zeros(1), torch.zeros(1), 8, "stochastic", q.momentum)
    _agree(f, e, (x.amax((1, 2, 3)).mean() - x.amin((1, 2, 3)).mean()) / 255, x.abs().max())


@pytest.mark.slow
@pytest.mark.ci
def test_the_compiled_chains_fold_the_bit_width_into_constants():
    """bits (and momentum) are constants of the compiled code: compiled as symbols, each vector
    step of the CPU kernel recomputed 2^b − 1 with a pow, about 4x the chain's cost."""
    from torch._inductor.utils import run_and_get_code

    x, r = torch.randn(4, 16, 6, 6), torch.zeros(1)
    with torch._inductor.config.patch(fx_graph_cache=False), torch.compiler.config.patch(force_disable_caches=True):
        for chain, args, kw in ((fused._own_range_chain, (x,), {}),
                                (fused._measure_chain, (x, r, r.clone()), {"momentum": 0.25})):
            _, code = run_and_get_code(fused._compiled(chain, 0, 7, False), *args, **kw)
            kernel = code[-1]
            assert "pow" not in kernel and "127.0" in kernel, kernel


# A generated `call()`'s launches: its compiled kernels and the aten/extern calls it makes (the
# rounding noise's seed draw).
LAUNCH = re.compile(r"^\s+(cpp_fused_\w+|triton_\w+\.run|aten\.\w+(?:\.\w+)?|extern_kernels\.\w+)\(", re.M)
MAX_LAUNCHES = 3


@pytest.mark.slow
@pytest.mark.ci
@pytest.mark.parametrize("stochastic", [False, True], ids=["nearest", "stochastic"])
def test_each_chain_makes_at_most_three_launches_on_the_cpu(stochastic):
    """What counting a fused operator as at most three launches rests on, on this CPU: inductor's
    code for each chain (range, scale, noise, clamp, round, dequantize; the running update) calls
    one or two kernels, and draws the noise's seed."""
    from torch._inductor.utils import run_and_get_code

    x, r = torch.randn(4, 16, 8, 6, 6), torch.zeros(4, 1)
    chains = [(lambda t: fused._own_range_chain(t, lead=1, bits=8, stochastic=stochastic), (x,)),
              (lambda t, a, b: fused._measure_chain(t, a, b, lead=1, bits=8, stochastic=stochastic, momentum=0.1),
               (x, r, r.clone()))]
    for fn, args in chains:
        _, code = run_and_get_code(torch.compile(fn, dynamic=True, fullgraph=True), *args)
        call = code[-1][code[-1].index("def call("):]
        launches = LAUNCH.findall(call)
        assert len(launches) <= MAX_LAUNCHES and any(k.startswith("cpp_fused_") for k in launches), call


@pytest.mark.slow
@pytest.mark.ci
def test_a_fused_step_computes_the_eager_step():
    """Nearest rounding everywhere (so no noise differs): the batched and the loop executor's
    losses and gradients with the fused quantizers equal the eager ones within the ties above:
    losses to 1e-5, gradients to a cosine of 0.9999 per node."""
    from test_step_ops import _batch, _sim

    from lpdl_core.models.mini import build_standin

    q = QuantCfg(grad_rounding="nearest")
    for executor in ("batched", "loop"):
        out = []
        for on in (False, True):
            torch.manual_seed(0)
            sim = _sim("int8", n=4, qcfg=q, build=build_standin, executor=executor)
            with fused.enabled(on):
                out.append(sim.executor.loss_and_grad(*_batch(4, seed=0, side=8)))
        (l0, g0), (l1, g1) = out
        assert torch.allclose(l0, l1, rtol=1e-5, atol=0), executor
        assert torch.nn.functional.cosine_similarity(g0, g1, dim=1).min() > 0.9999, executor


@pytest.mark.slow
@pytest.mark.ci
def test_the_fused_eager_8bit_step_dispatches_at_most_2x_the_fp_steps_operators():
    """ResNet-20, 8 nodes (the count does not depend on the batch): counting each fused operator
    once, and counting it as the at most three launches its code makes (test above), the 8-bit
    step dispatches at most 2x the FP step's operators. No host synchronisation."""
    from test_step_ops import _batch, _sim

    from lpdl_core.training.opcount import step_op_counts

    x, y = _batch(8)
    fp = step_op_counts(_sim("fp32", n=8), x, y)
    with fused.enabled():
        lp = step_op_counts(_sim("int8", n=8, qcfg=QuantCfg(act_rounding="stochastic")), x, y)
    assert lp["fused_ops"] > 100 and lp["host_syncs"] == 0, lp
    assert lp["aten_ops"] <= 2 * fp["aten_ops"], (lp, fp)
    assert lp["aten_ops"] + (MAX_LAUNCHES - 1) * lp["fused_ops"] <= 2 * fp["aten_ops"], (lp, fp)


def test_engine_refuses_fused_quant_where_it_cannot_run():
    with pytest.raises(ValueError, match="alternatives"):
        EngineCfg(executor="batched", compile=True, fused_quant=True)
    with pytest.raises(ValueError, match="per node"):
        EngineCfg(executor="batched", rng_streams="shared", fused_quant=True)
    EngineCfg(executor="loop", rng_streams="shared", fused_quant=True)


def test_the_settings_refuse_fused_quant_with_compile_and_reach_the_train_command():
    import yaml

    from lpdl_core.cli.parser import build_parser
    from lpdl_core.pipeline.workflow.wfconfig import check_workflow_config
    from lpdl_core.errors import ConfigError
    from lpdl_core.training.bench import bench_step

    cfg = yaml.safe_load(open("config/config.yaml"))
    schema = yaml.safe_load(open("workflow/schemas/config.schema.yaml"))
    assert cfg["fused_quant"] is False
    assert check_workflow_config({**cfg, "fused_quant": True}, schema)["fused_quant"] is True
    with pytest.raises(ConfigError, match="alternatives"):
        check_workflow_config({**cfg, "fused_quant": True, "compile": True, "executor": "batched"}, schema)
    assert build_parser().parse_args(["train", "--cell", "x", "--out", "o", "--fused-quant"]).fused_quant is True
    assert build_parser().parse_args(["bench", "--fused-quant"]).fused_quant is True
    with pytest.raises(ValueError, match="needs --warmup >= 1"):
        bench_step(fused_quant=True, warmup=0)
    # the workflow's train job passes its config's options as lpdl train's flags (tests/test_run_options.py)
    from lpdl_core.run_options import RunOptions
    assert "--fused-quant" in RunOptions.from_config({**cfg, "fused_quant": True}).argv()
    assert "options.argv()" in open("workflow/scripts/train.py").read()
