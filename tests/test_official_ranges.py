"""Activation ranges as the official code keeps them (Fidelity quant_ranges="gossiped"): QuantMeasure's
running min/max are parameters there, so they are node state that gossip mixes, top-k keeps and the
byte count includes, which no optimizer moves and the train-mode forward passes update. Against the
official numbers: ResNet-20 LP has 273,380 such scalars (122 ranges), and its 99 % message keeps
2,889 values and counts 17,337 bytes in the official (legacy) metric."""
import pytest
import torch

from lpdl_core.decentral.algorithms.base import GossipCfg
from lpdl_core.decentral.compress import CompressorCfg, kept_counts, message_bytes
from lpdl_core.decentral.engine import EngineCfg, Simulator
from lpdl_core.decentral.layout import Layout
from lpdl_core.decentral.optim import OptimCfg
from lpdl_core.decentral.topology import Topology
from lpdl_core.models.registry import build_model
from lpdl_core.quant.quantizer import QuantCfg

pytestmark = pytest.mark.usefixtures("one_thread")
N = 4
FIRST_MAX = "conv1.quantize_input.running_max"  # measures the raw input batch: independent of weights


def _model(gossiped: bool):
    return build_model("resnet20", precision="int8", qcfg=QuantCfg(measure_as_parameters=gossiped))


def _sim(gossiped: bool, executor: str = "loop", eta: float = 1.0, wd: float = 5e-4) -> Simulator:
    return Simulator(lambda: _model(gossiped), topology=Topology(name="directed-ring", n=N),
                     gossip=GossipCfg(algorithm="ds", eta=eta), optim_cfg=OptimCfg(weight_decay=wd),
                     engine=EngineCfg(executor=executor, device="cpu"))


def _batches(steps: int, seed: int = 0):
    """Node i sees inputs scaled by 3(i + 1), so each node measures a different range (as under skew)."""
    g = torch.Generator().manual_seed(seed)
    scale = 3 * torch.arange(1, N + 1).view(N, 1, 1, 1, 1)
    return [(torch.randn(N, 4, 3, 32, 32, generator=g) * scale, torch.randint(0, 10, (N, 4), generator=g))
            for _ in range(steps)]


def _column(sim: Simulator, name: str, state=None) -> torch.Tensor:
    seg = next(s for s in sim.layout.segments() if s.name == name)
    return (sim.x if state is None else state)[:, seg.start]


def test_official_lp_message_keeps_2889_values_and_counts_17337_bytes():
    official, paper = Layout.from_module(_model(True)), Layout.from_module(_model(False))
    assert (official.d, paper.d) == (273_380, 273_258) and len(official.frozen) == 122 and not paper.frozen
    assert sum(kept_counts(official, 0.99)) == 2_889 and sum(kept_counts(paper, 0.99)) == 2_767
    legacy = CompressorCfg(kind="topk", ratio=0.99, bytes_metric="legacy")
    assert message_bytes(official, legacy) == 17_337 and message_bytes(paper, legacy) == 16_605


@pytest.mark.parametrize("executor", ["loop", "batched"])
def test_gossip_mixes_the_ranges_across_nodes(executor, monkeypatch):
    """η = 1, no compression: x_{t+1} = W x̃ on every column, the ranges included, where x̃ holds
    the ranges the forward just measured. With buffers each node keeps its own."""
    sim = _sim(True, executor)
    seen = {}
    gossip = sim._gossip

    def spy(x_tilde, lr):
        seen["x_tilde"] = x_tilde.clone()
        gossip(x_tilde, lr)
    monkeypatch.setattr(sim, "_gossip", spy)
    W = torch.as_tensor(sim.topology.W(0), dtype=sim.x.dtype)
    for xb, yb in _batches(3):
        sim.train_step(xb, yb, 0.1)
        mixed = W @ _column(sim, FIRST_MAX, seen["x_tilde"])
        torch.testing.assert_close(_column(sim, FIRST_MAX), mixed, rtol=1e-6, atol=0)  # 2-term sums
    after = _column(sim, FIRST_MAX)
    assert after.max() / after.min() < 2.5  # mixed: the local ranges span 4x (scales 3..12)

    local = _sim(False, executor)
    for xb, yb in _batches(3):
        local.train_step(xb, yb, 0.1)
    own = local.executor.stacked_buffers()[FIRST_MAX].flatten()
    assert torch.all(own.diff() > 0) and own[-1] / own[0] > 3.5  # each node kept its own scale


def test_the_ranges_are_the_forward_pass_ema_and_no_optimizer_moves_them():
    """η = 0 (no mixing): a node's input range is exactly the EMA of its batch maxima, although
    weight decay and momentum act on every trainable column; the momentum there stays zero."""
    sim = _sim(True, eta=0.0, wd=0.5)
    m = QuantCfg().momentum
    ema = torch.zeros(N)
    for xb, yb in _batches(3):
        sim.train_step(xb, yb, 0.5)
        ema = ema * m + xb.flatten(2).amax(2).mean(1) * (1 - m)
    torch.testing.assert_close(_column(sim, FIRST_MAX), ema, rtol=1e-6, atol=0)
    assert torch.all(sim.opt_state.buf[:, sim.frozen] == 0) and torch.any(sim.opt_state.buf[:, ~sim.frozen] != 0)


def test_loop_and_batched_agree_with_gossiped_ranges():
    """Both executors update the ranges in the forward pass and gossip them. 16-bit nearest
    rounding makes the run deterministic; the tolerances are test_models_engine's, and why: the
    update may differ by float order and flipped 16-bit decisions (well under 1/8 of its size),
    a range by less than one 8-bit step of itself (2^-8)."""
    fine = QuantCfg(bits=16, grad_bits=16, act_rounding="nearest", grad_rounding="nearest",
                    measure_as_parameters=True)
    make = lambda: build_model("resnet20", precision="int8", qcfg=fine)  # noqa: E731
    sims = {e: Simulator(make, topology=Topology(name="directed-ring", n=N), gossip=GossipCfg(algorithm="ds"),
                         engine=EngineCfg(executor=e, device="cpu")) for e in ("loop", "batched")}
    (xb, yb), = _batches(1)
    x0 = sims["loop"].x.clone()
    for s in sims.values():
        s.train_step(xb, yb, 0.1)
    loop, bat = sims["loop"], sims["batched"]
    assert (bat.x - loop.x)[:, ~loop.frozen].norm() <= 2 ** -3 * (loop.x - x0)[:, ~loop.frozen].norm()
    torch.testing.assert_close(bat.x[:, loop.frozen], loop.x[:, loop.frozen], rtol=2 ** -8, atol=2 ** -20)
    assert not torch.equal(loop.x[:, loop.frozen], x0[:, loop.frozen])  # the ranges did move


def test_a_final_round_forward_updates_the_ranges_then_gossips():
    sim = _sim(True)
    (xb, yb), (xb2, yb2) = _batches(2)
    sim.train_step(xb, yb, 0.1)
    before = _column(sim, FIRST_MAX).clone()
    sim.gossip_round()
    gossip_only = _column(sim, FIRST_MAX).clone()
    torch.testing.assert_close(gossip_only.sum(), before.sum(), rtol=1e-6, atol=0)  # mixing keeps the mass
    t = sim.t
    sim.forward_round(xb2, yb2)
    assert sim.t == t + 1 and not torch.allclose(_column(sim, FIRST_MAX).sum(), gossip_only.sum())


def test_checkpoint_carries_the_ranges_and_resumes_bit_exactly():
    a = _sim(True)
    batches = _batches(3)
    for xb, yb in batches[:2]:
        a.train_step(xb, yb, 0.1)
    b = _sim(True)
    b.load_state_dict(a.state_dict())
    for s in (a, b):
        torch.manual_seed(7)  # the stochastic roundings' draws (train() checkpoints the torch RNG too)
        s.train_step(*batches[2], 0.1)
    assert torch.equal(a.x, b.x) and torch.equal(_column(a, FIRST_MAX), _column(b, FIRST_MAX))
