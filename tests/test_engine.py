"""Tests for lpdl_core.decentral.engine: the two executors agree, the loop executor's in-place aliasing,
the simulator's iteration order, evaluation, byte accounting, gossip-only rounds and EngineCfg
validation. Tiny models on random 8x8 inputs, n = 4."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from lpdl_core.decentral import algorithms, optim
from lpdl_core.decentral.algorithms import GossipCfg
from lpdl_core.decentral.compress import CompressorCfg, message_bytes
from lpdl_core.decentral.engine import EngineCfg, Simulator, evaluate, resolve_device
from lpdl_core.decentral.optim import OptimCfg
from lpdl_core.decentral.topology import Topology

N = 4
B = 6
CUDA = torch.cuda.is_available()


pytestmark = pytest.mark.usefixtures("one_thread")


# Smooth activations (no ReLU kink): the executors differ in float summation order only (vmap's
# grouped convolution and batched matmul, CPU-dependent), and with no kink such a difference moves
# every gradient continuously, by about as much as it moves the values.
def conv_model() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.Tanh(), nn.Flatten(), nn.Linear(256, 10))


def mlp_model() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Dropout(p=0.0),
                         nn.Linear(16, 10))


MODELS = {"conv": conv_model, "mlp": mlp_model}


def batches(steps: int, n: int = N, *, skewed: bool = False, seed: int = 0, device="cpu"):
    """Node-stacked batches (n, B, 1, 8, 8), (n, B). skewed: node i only sees labels {2i, 2i+1}."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):
        xb = torch.randn(n, B, 1, 8, 8, generator=g)
        if skewed:
            yb = 2 * torch.arange(n)[:, None] + torch.randint(0, 2, (n, B), generator=g)
            xb = xb + yb[:, :, None, None, None].float() * 0.3  # learnable signal
        else:
            yb = torch.randint(0, 10, (n, B), generator=g)
        out.append((xb.to(device), yb.to(device)))
    return out


def make_sim(model="conv", graph="directed-ring", gossip=GossipCfg(), executor="loop",
             optim_cfg=OptimCfg(), device="cpu", n=N, seed=1234):
    return Simulator(MODELS[model], topology=Topology(name=graph, n=n),
                     gossip=gossip, optim_cfg=optim_cfg,
                     engine=EngineCfg(executor=executor, device=device, seed=seed))


DS_TOPK = GossipCfg(algorithm="ds", eta=0.5, compressor=CompressorCfg(kind="topk", ratio=0.9))
CHOCO_ID = GossipCfg(algorithm="choco", eta=1.0)
# For comparing the executors: top-k keeps the largest |v|, so a summation-order difference can
# swap two entries of near-equal magnitude at the cut (a jump of their full size); random-k keeps
# the entries picked by the simulator's seeded draws, the same in both executors.
DS_RANDK = GossipCfg(algorithm="ds", eta=0.5, compressor=CompressorCfg(kind="randomk", ratio=0.9))


# --- 11. batched == loop --------------------------------------------------------------------

def _compare_executors(model, gossip, graph, device="cpu", optim_cfg=OptimCfg(), steps=5):
    """Float order differs between the executors, nothing else: a relative ~1e-7 per op on these
    smooth nets (K <= 256 terms per sum), carried through 5 steps of lr 0.1 on O(1) values. The
    rtol/atol 1e-5 allow 100x that; any difference in math (another node's batch or parameters,
    a missing gradient term) is of the order of the update lr·g, O(1e-2) here."""
    sims = {ex: make_sim(model, graph, gossip, ex, optim_cfg, device) for ex in ("loop", "batched")}
    assert torch.equal(sims["loop"].x, sims["batched"].x)  # same seeded initialization
    for xb, yb in batches(steps, device=device):
        l_loop = sims["loop"].train_step(xb, yb, lr=0.1)
        l_bat = sims["batched"].train_step(xb, yb, lr=0.1)
        assert l_loop.shape == l_bat.shape == (N,)
        torch.testing.assert_close(l_loop, l_bat, rtol=1e-5, atol=1e-5)
    for attr in ("x", "z", "u"):
        torch.testing.assert_close(getattr(sims["loop"], attr), getattr(sims["batched"], attr),
                                   rtol=1e-5, atol=1e-5)
    assert sims["loop"].t == sims["batched"].t == steps
    return sims


@pytest.mark.parametrize("model", list(MODELS))
@pytest.mark.parametrize("gossip", [DS_RANDK, CHOCO_ID], ids=["ds-randomk0.9-eta0.5", "choco-identity"])
def test_batched_equals_loop(model, gossip):
    sims = _compare_executors(model, gossip, "directed-ring")
    assert float((sims["loop"].x - sims["loop"].x[0]).abs().max()) > 0  # something happened


def test_batched_equals_loop_push_sum_and_qgm():
    """Irregular graph (u ≠ 1) and QGM: same math in both executors."""
    sims = _compare_executors("mlp", GossipCfg(algorithm="dpsgd"), "random-directed",
                              optim_cfg=OptimCfg(momentum="qgm"))
    assert float((sims["loop"].u - 1).abs().max()) > 0.05


def test_batched_logits_equal_loop_logits():
    sims = {ex: make_sim("conv", "directed-ring", DS_RANDK, ex) for ex in ("loop", "batched")}
    for xb, yb in batches(3, skewed=True):
        for s in sims.values():
            s.train_step(xb, yb, lr=0.1)
    x_test = torch.randn(20, 1, 8, 8)
    torch.testing.assert_close(sims["loop"].executor.logits(x_test),
                               sims["batched"].executor.logits(x_test), rtol=1e-5, atol=1e-5)


# --- simulator iteration order: grad at z = x/u, local step on x, then gossip ----------------

def test_train_step_equals_manual_pipeline():
    gossip = GossipCfg(algorithm="ds", eta=0.7, compressor=CompressorCfg(kind="topk", ratio=0.5))
    ocfg = OptimCfg(momentum="nesterov", weight_decay=1e-3)
    sim = make_sim("mlp", "random-directed", gossip, "loop", ocfg)
    x, u = sim.x.clone(), sim.u.clone()
    algo = algorithms.get("ds")
    astate = algo.init(x, topology=sim.topology, cfg=gossip)
    ostate = optim.init(x)
    ref = mlp_model()
    for t, (xb, yb) in enumerate(batches(4, seed=5)):
        lr = 0.05 * (t + 1)
        z = x / u[:, None]
        grads = []
        for i in range(N):
            params = dict(zip(sim.layout.names,
                              [v.clone().requires_grad_(True) for v in sim.layout.views(z[i])]))
            loss = F.cross_entropy(torch.func.functional_call(ref, params, (xb[i],)), yb[i])
            gs = torch.autograd.grad(loss, list(params.values()))
            grads.append(sim.layout.flatten(list(gs)))
        g = torch.stack(grads)
        x_tilde, ostate = optim.local_step(x, g, ostate, lr, ocfg)
        W = torch.as_tensor(sim.topology.W(t), dtype=x.dtype)
        r = algo.step(astate, x=x, x_tilde=x_tilde, u=u, W=W, t=t, cfg=gossip, layout=sim.layout)
        x, u, astate = r.x, r.u, r.state
        sim.train_step(xb, yb, lr)
        torch.testing.assert_close(sim.x, x, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(sim.u, u, rtol=0, atol=1e-7)
        torch.testing.assert_close(sim.z, x / u[:, None], rtol=1e-5, atol=1e-6)
    assert float((sim.u - 1).abs().max()) > 0.05


# --- 12. loop executor aliasing -------------------------------------------------------------

@pytest.mark.parametrize("model", list(MODELS))
def test_loop_executor_aliases_z_and_grad_buffer(model):
    sim = make_sim(model, "directed-ring", DS_TOPK, "loop")
    ex = sim.executor

    def check():
        for i, m in enumerate(ex.models):
            params = [p for p in m.parameters() if p.requires_grad]
            for p, zv, gv in zip(params, sim.layout.views(sim.z[i]), sim.layout.views(ex.G[i])):
                assert p.data_ptr() == zv.data_ptr()
                assert p.shape == zv.shape
                assert p.grad is not None and p.grad.data_ptr() == gv.data_ptr()
                assert torch.equal(p.detach(), zv)

    check()
    z_ptr = sim.z.data_ptr()
    for xb, yb in batches(3, skewed=True):
        sim.train_step(xb, yb, lr=0.1)
        check()
    assert sim.z.data_ptr() == z_ptr and ex.Z is sim.z
    # the gradients land in G: recompute the last one and compare
    xb, yb = batches(1, seed=9)[0]
    _, G = ex.loss_and_grad(xb, yb)
    assert G is ex.G
    check()
    for i, _ in enumerate(ex.models):
        m2 = MODELS[model]()
        with torch.no_grad():
            for p2, zv in zip(m2.parameters(), sim.layout.views(sim.z[i])):
                p2.copy_(zv)
        F.cross_entropy(m2(xb[i]), yb[i]).backward()
        g2 = sim.layout.flatten([p.grad for p in m2.parameters()])
        torch.testing.assert_close(G[i], g2, rtol=1e-5, atol=1e-6)
    # gossip writes are visible to the modules without any copy
    with torch.no_grad():
        sim.z[1].zero_()
    assert all(float(p.detach().abs().sum()) == 0 for p in ex.models[1].parameters())


# --- 13. initialisation, evaluation, bytes --------------------------------------------------

@pytest.mark.parametrize("executor", ["loop", "batched"])
def test_identical_initial_models(executor):
    sim = make_sim("conv", "ring", DS_TOPK, executor)
    assert torch.equal(sim.x, sim.x[:1].expand_as(sim.x))
    assert torch.equal(sim.z, sim.x) and torch.equal(sim.u, torch.ones(N))
    assert sim.consensus_distance() == 0.0
    if executor == "loop":
        ref = [p.detach() for p in sim.executor.models[0].parameters()]
        for m in sim.executor.models[1:]:
            for p, q in zip(m.parameters(), ref):
                assert torch.equal(p.detach(), q)
    # same seed -> same x0; another seed -> another x0
    assert torch.equal(make_sim("conv", "ring", DS_TOPK, executor).x, sim.x)
    assert not torch.equal(make_sim("conv", "ring", DS_TOPK, executor, seed=7).x, sim.x)


def _manual_acc(make_model, flat, layout, x, y, batch_size=16):
    """Accuracy of the model `flat`, on the chunks `evaluate` uses: the same float ops on the same
    shapes, so no argmax near-tie can go another way than in `evaluate` (a kernel chosen for
    another batch size may sum in another order)."""
    m = make_model()
    with torch.no_grad():
        for p, v in zip(m.parameters(), layout.views(flat)):
            p.copy_(v)
        m.eval()
        logits = torch.cat([m(x[s:s + batch_size]) for s in range(0, len(x), batch_size)])
        return float(100.0 * (logits.argmax(-1) == y).float().mean())


@pytest.mark.parametrize("executor", ["loop", "batched"])
def test_evaluate(executor):
    sim = make_sim("conv", "random-directed", GossipCfg(algorithm="dpsgd"), executor)
    g = torch.Generator().manual_seed(3)
    x_test = torch.randn(50, 1, 8, 8, generator=g)
    y_test = torch.randint(0, 10, (50,), generator=g)
    ev0 = evaluate(sim, x_test, y_test, batch_size=16)
    assert len(ev0.node_acc) == N
    assert ev0.consensus_distance == 0.0
    assert len(set(ev0.node_acc)) == 1  # identical models
    for xb, yb in batches(6, skewed=True):
        sim.train_step(xb, yb, lr=0.2)
    ev = evaluate(sim, x_test, y_test, batch_size=16)
    assert len(ev.node_acc) == N
    assert ev.mean_acc == pytest.approx(sum(ev.node_acc) / N, abs=1e-9)
    for i in range(N):
        assert ev.node_acc[i] == pytest.approx(
            _manual_acc(conv_model, sim.z[i], sim.layout, x_test, y_test), abs=1e-4)
    assert ev.avg_model_acc == pytest.approx(
        _manual_acc(conv_model, sim.z.mean(0), sim.layout, x_test, y_test), abs=1e-4)
    assert ev.consensus_distance > 0
    assert ev.consensus_distance == pytest.approx(
        float(((sim.z - sim.z.mean(0)) ** 2).sum(1).mean().sqrt()), rel=1e-5)
    nll = torch.stack([F.cross_entropy(sim.executor.logits(x_test)[i], y_test) for i in range(N)])
    assert ev.mean_loss == pytest.approx(float(nll.mean()), rel=1e-4)
    d = ev.as_dict()
    assert d["node_acc"] == list(ev.node_acc) and d["mean_acc"] == ev.mean_acc
    if executor == "loop":
        # evaluating the averaged model through functional_call must not break the aliasing
        for i, m in enumerate(sim.executor.models):
            for p, zv in zip(m.parameters(), sim.layout.views(sim.z[i])):
                assert p.data_ptr() == zv.data_ptr()


BAGUA = GossipCfg(algorithm="bagua-lp", compressor=CompressorCfg(kind="minmax8"))
BYTES_CASES = [(g, deg, name, cfg) for g, deg in (("directed-ring", 1), ("ring", 2), ("complete", 3))
               for name, cfg in (("ds", DS_TOPK), ("choco", CHOCO_ID), ("bagua", BAGUA))
               if not (name == "bagua" and g == "directed-ring")]  # bagua: symmetric graphs


@pytest.mark.parametrize("graph,deg,name,gossip", BYTES_CASES,
                         ids=[f"{c[0]}-{c[2]}" for c in BYTES_CASES])
def test_bytes_sent_static_graph(graph, deg, name, gossip):
    sim = make_sim("mlp", graph, gossip)
    mb = message_bytes(sim.layout, gossip.compressor,
                       push_sum_weight=gossip.algorithm != "bagua-lp")
    assert sim.message_bytes == mb
    assert torch.equal(sim.bytes_sent, torch.zeros(N, dtype=torch.float64))
    steps = batches(3)
    for t, (xb, yb) in enumerate(steps, start=1):
        sim.train_step(xb, yb, lr=0.1)
        assert torch.equal(sim.bytes_sent, torch.full((N,), float(t * deg * mb), dtype=torch.float64))
    sim.gossip_round()
    assert torch.equal(sim.bytes_sent, torch.full((N,), float(4 * deg * mb), dtype=torch.float64))
    assert sim.t == 4


# --- 14. gossip-only rounds -----------------------------------------------------------------

@pytest.mark.parametrize("gossip", [GossipCfg(), DS_TOPK,
                                    GossipCfg(algorithm="choco", eta=0.5, choco_form="code",
                                              compressor=CompressorCfg(kind="topk", ratio=0.5))],
                         ids=["ds-identity", "ds-topk", "choco-topk"])
def test_gossip_round_conserves_mass(gossip):
    sim = make_sim("mlp", "directed-ring", gossip)
    for xb, yb in batches(4, skewed=True):
        sim.train_step(xb, yb, lr=0.3)
    for _ in range(5):
        total = sim.x.double().sum(0)
        opt_buf = sim.opt_state.buf.clone()
        sim.gossip_round()
        torch.testing.assert_close(sim.x.double().sum(0), total, rtol=1e-5, atol=1e-5)
        assert torch.equal(sim.opt_state.buf, opt_buf)  # no optimizer step


def test_load_state_dict_copies_instead_of_aliasing():
    """A simulator loaded from another's state_dict() never writes into the source's tensors."""
    gossip = GossipCfg(algorithm="ds", eta=0.5, compressor=CompressorCfg(kind="topk", ratio=0.5))
    src, dst = make_sim("mlp", "directed-ring", gossip), make_sim("mlp", "directed-ring", gossip)
    for xb, yb in batches(2, skewed=True):
        src.train_step(xb, yb, lr=0.3)
    sd = src.state_dict()
    before = {k: v.clone() for k, v in sd.items() if isinstance(v, torch.Tensor)}
    dst.load_state_dict(sd)
    for xb, yb in batches(2, skewed=True):
        dst.train_step(xb, yb, lr=0.3)
    assert all(torch.equal(sd[k], v) for k, v in before.items())


def test_gossip_rounds_reach_consensus():
    sim = make_sim("conv", "directed-ring", GossipCfg(algorithm="ds", eta=1.0))
    for xb, yb in batches(4, skewed=True):
        sim.train_step(xb, yb, lr=0.3)
    c0 = sim.consensus_distance()
    assert c0 > 1e-3
    avg0 = sim.average.clone()
    dists = [c0]
    for _ in range(60):
        sim.gossip_round()
        dists.append(sim.consensus_distance())
    # W is circulant (normal) with SLEM 0.707: a strict contraction until float32 rounding
    assert all(b < 0.75 * a for a, b in zip(dists, dists[1:]) if a > 1e-4 * c0)
    assert dists[-1] < 1e-5 * c0
    torch.testing.assert_close(sim.average, avg0, rtol=1e-5, atol=1e-6)  # u ≡ 1: z̄ = x̄ kept


def test_consensus_distance_grows_with_skewed_data():
    sim = make_sim("mlp", "directed-ring", DS_TOPK)
    assert sim.consensus_distance() == 0.0
    for xb, yb in batches(3, skewed=True):
        sim.train_step(xb, yb, lr=0.2)
    assert sim.consensus_distance() > 0.0


# --- 15. EngineCfg / device -----------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [{"executor": "vmap"}, {"device": "tpu"}, {"device": "gpu"}])
def test_engine_cfg_rejects(kwargs):
    with pytest.raises(ValueError):
        EngineCfg(**kwargs)


def test_engine_cfg_defaults():
    cfg = EngineCfg()
    assert (cfg.executor, cfg.device, cfg.seed) == ("loop", "auto", 1234)
    assert resolve_device("cpu") == torch.device("cpu")
    assert resolve_device("auto").type == ("cuda" if CUDA else "cpu")


def test_unknown_executor_rejected_by_factory():
    from lpdl_core.decentral.engine.executors import make_executor
    with pytest.raises(ValueError):
        make_executor("vmap", mlp_model, N, None, torch.zeros(N, 1), F.cross_entropy)


def test_layout_mismatch_rejected():
    from lpdl_core.decentral.engine.executors import BatchedExecutor, LoopExecutor
    from lpdl_core.decentral.layout import Layout
    bad = Layout.from_shapes([(3,)])
    for cls in (LoopExecutor, BatchedExecutor):
        with pytest.raises(ValueError):
            cls(mlp_model, N, bad, torch.zeros(N, 3), F.cross_entropy)


@pytest.mark.skipif(CUDA, reason="checks the error raised when CUDA is absent")
def test_cuda_without_cuda_raises():
    with pytest.raises(RuntimeError):
        resolve_device("cuda")
    with pytest.raises(RuntimeError):
        make_sim("mlp", device="cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not CUDA, reason="needs CUDA")
@pytest.mark.parametrize("gossip", [DS_RANDK, CHOCO_ID], ids=["ds-randomk0.9-eta0.5", "choco-identity"])
def test_batched_equals_loop_cuda(gossip):
    sims = _compare_executors("conv", gossip, "directed-ring", device="cuda")
    assert sims["loop"].x.is_cuda and sims["batched"].x.is_cuda
    assert sims["loop"].bytes_sent.is_cuda
    # and the CUDA run matches the CPU run, without compression (random-k draws come from the
    # device's own generator; top-k would depend on float order). cuDNN may run the convolution
    # in TF32, inputs rounded to 2^-11 relative; x moves by at most ~0.13 over the 5 steps, so the
    # devices' x differ by about 2^-11·0.13 = 6e-5 < 1e-4.
    if gossip is CHOCO_ID:
        cpu = _compare_executors("conv", gossip, "directed-ring", device="cpu")
        torch.testing.assert_close(sims["loop"].x.cpu(), cpu["loop"].x, rtol=1e-4, atol=1e-4)
