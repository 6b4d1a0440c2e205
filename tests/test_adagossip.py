"""AdaGossip (lpdl_core.decentral.algorithms.adagossip) against the public code's update, its
invariants and limits, and the executors (loop, batched, distributed) against each other.

The reference is a transcription, in torch, of what aparna-aketi/AdaG_SGD does in a round
(docs/paper-vs-code.md, 'AdaGossip (`adagossip`)'), run on the same inputs as lpdl's `step`.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from lpdl_core.decentral import algorithms
from lpdl_core.decentral.algorithms import GossipCfg
from lpdl_core.decentral.compress import CompressorCfg, compress, message_bytes
from lpdl_core.decentral.engine import EngineCfg, Simulator
from lpdl_core.decentral.layout import Layout
from lpdl_core.decentral.topology import Topology

sys.path.insert(0, str(Path(__file__).parent))  # the spawned ranks import distributed_cases
from distributed_cases import N as DIST_N  # noqa: E402
from distributed_cases import Case, launch_cases  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

LAYOUT = Layout.from_shapes([(3, 4), (5,), (2, 2, 2)])  # d = 25, numels 12 / 5 / 8
N = 8
ADA = algorithms.get("adagossip")
TOPK = CompressorCfg.top_k(0.9)
COMPRESSORS = {"identity": CompressorCfg(), "topk0.9": TOPK}
# The official β is a float32 tensor (torch.ones(1) * 0.999) read back with float(): the β its
# arithmetic sees is float32(0.999). The reference test hands lpdl that same β.
BETA32 = float(torch.tensor(0.999, dtype=torch.float32))
TV = "time-varying-exponential"


def topo(name: str, n: int = N) -> Topology:
    return Topology(name=name, n=n, seed=0)


def rand(shape, seed: int, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)


def run(tp: Topology, cfg: GossipCfg, T: int, *, alg: str = "adagossip", seed: int = 0,
        scale: float = 1.0, noise: float = 1.0, dtype=torch.float64):
    """Drive an algorithm T rounds with x̃_t = x_t + ξ_t: [(x_tilde, W, Round)] per round."""
    mod = algorithms.get(alg)
    x = rand((tp.n, LAYOUT.d), seed, dtype) * scale
    u = torch.ones(tp.n, dtype=dtype)
    state = mod.init(x, topology=tp, cfg=cfg)
    xi = rand((T, tp.n, LAYOUT.d), seed + 2, dtype) * noise
    g = torch.Generator().manual_seed(seed + 1)
    out = []
    for t in range(T):
        x_tilde = x + xi[t]
        W = torch.as_tensor(tp.W(t), dtype=dtype)
        r = mod.step(state, x=x, x_tilde=x_tilde, u=u, W=W, t=t, cfg=cfg, layout=LAYOUT, generator=g)
        out.append((x_tilde, W, r))
        x, u, state = r.x, r.u, r.state
    return out


# --- 1. the public code's update on identical inputs ------------------------------------------

class Official:
    """AdaG_SGD's round for n nodes of a static graph with uniform weight w, one flattened parameter
    vector per node, transcribed from aparna-aketi/AdaG_SGD:

    - gossip_choco/distributed.py, GossipDataParallel.transfer_params (L286-299): send buffer
      x − x̂_i, t += 1;
    - _gossip_into_receive_buffer (L314-341): q_i = C(buffer), x̂_i += q_i, then SGD_DS.mix
      (gossip_choco/gossiper.py L153-198, mix_out_msg_ L106-114): each out-edge gets w·q_i, the
      receive buffer is the sum of the in-edges' w·q_j;
    - update_hats (distributed.py L218-222): S_i += Σ w q_j; r = S_i + (w − 1) x̂_i;
    - _query_gossip_queue with ada_gamma (L247-259): v = β v + (1 − β) r², buf = sqrt(v / (1 − β^t))
      + 1e-8, exp = min(γ / buf, 1), p += exp ⊙ r.

    C(·) is lpdl's layer-wise compressor (tested against the official one in test_compress.py):
    this checks the gossip, not the compressor."""

    def __init__(self, W: np.ndarray, d: int, *, gamma: float, beta: float, layout, comp):
        n = W.shape[0]
        self.w = torch.ones(1) * float(W[0, 0])  # UniformMixing's weight, a float32 tensor
        assert np.allclose(W[W != 0], W[0, 0])  # uniform weights only (the official mixing)
        self.in_peers = [[j for j in range(n) if j != i and W[i, j] != 0] for i in range(n)]
        self.averaging_rate = torch.ones(1) * gamma
        self.beta = torch.ones(1) * beta
        self.self_xhat = [torch.zeros(d) for _ in range(n)]
        self.neighbor_copy = [torch.zeros(d) for _ in range(n)]
        self.avg_err_sq = [torch.zeros(d) for _ in range(n)]
        self.t = 0
        self.layout, self.comp = layout, comp

    def round(self, params: torch.Tensor) -> torch.Tensor:
        n = params.shape[0]
        bufs = []
        for i in range(n):  # transfer_params
            b = params[i].clone()
            b.add_(self.self_xhat[i], alpha=-1)
            bufs.append(b)
        self.t += 1
        q = compress(torch.stack(bufs), self.layout, self.comp)  # C(V_t), row by row
        for i in range(n):
            self.self_xhat[i].add_(q[i])
        out_msg = [q[i] * self.w.type(q.dtype) for i in range(n)]  # out_msg *= weight
        in_msg = []
        for i in range(n):
            buf = torch.zeros_like(bufs[i])
            for j in self.in_peers[i]:
                buf.add_(out_msg[j])
            in_msg.append(buf)
        new = []
        for i in range(n):
            self.neighbor_copy[i].add_(in_msg[i])  # update_hats
            r = self.neighbor_copy[i].clone()
            r.add_(self.self_xhat[i], alpha=float(self.w) - 1.0)
            v = self.avg_err_sq[i]  # _query_gossip_queue, ada_gamma
            v.mul_(self.beta).addcmul_(r, r, value=1.0 - float(self.beta))
            buf = ((v.clone().div_(1.0 - (float(self.beta) ** self.t))).sqrt()).add_(1e-8)
            exp = torch.ones_like(buf) * self.averaging_rate
            exp.div_(buf)
            exp = torch.clamp(exp, max=1.0)
            r.mul_(exp.type(r.dtype))
            p = params[i].clone()
            p.add_(r)
            new.append(p)
        return torch.stack(new)


FIDELITIES = {"code-aggregate": dict(choco_form="code", choco_replicas="official-aggregate"),
              "paper-per-neighbour": dict(choco_form="paper", choco_replicas="per-neighbour")}


@pytest.mark.parametrize("eta", [0.1, 1.0])
@pytest.mark.parametrize("fidelity", list(FIDELITIES))
@pytest.mark.parametrize("comp", list(COMPRESSORS))
@pytest.mark.parametrize("graph", ["directed-ring", "ring"])
def test_step_equals_the_public_code(graph, comp, fidelity, eta):
    """lpdl's `step` and the transcribed official round, float32, 8 nodes, 8 rounds, each fed its
    own x_{t+1} back (x̃_t = x_t + ξ_t).

    Tolerance. Directed ring (w = 1/2, one in-neighbour): every operation is the official one on
    the same operands (w·q and (w − 1)·x̂ are exact, the in-neighbour sum adds one term to zeros, so
    the aggregate, per-neighbour replicas and both forms give the same bits), hence bitwise equal.
    Ring (w = 1/3, two in-neighbours): the sum order and a possibly fused a + αb in the official
    add_(alpha=w − 1) round differently, a few ulps of the O(1) consensus term per round; γ ⊙ e
    moves by at most about that much (γ ≤ 1, and min(η/(|e|+ε), 1)·e is 1-Lipschitz in e), so
    8 rounds stay below 1e-5 absolute on O(1) values. A wrong rule (no bias correction, no clamp,
    another β, the moment of something else) changes x by O(η)."""
    tp = topo(graph)
    cfg = GossipCfg(algorithm="adagossip", eta=eta, compressor=COMPRESSORS[comp], adagossip_beta=BETA32,
                    **FIDELITIES[fidelity])
    W = torch.as_tensor(tp.W(0), dtype=torch.float32)
    ref = Official(tp.W(0), LAYOUT.d, gamma=eta, beta=BETA32, layout=LAYOUT, comp=cfg.compressor)
    x = rand((N, LAYOUT.d), 0)
    x_ref = x.clone()
    u = torch.ones(N)
    state = ADA.init(x, topology=tp, cfg=cfg)
    clamped = []
    for t in range(8):
        xi = rand((N, LAYOUT.d), 100 + t) * 0.5
        r = ADA.step(state, x=x, x_tilde=x + xi, u=u, W=W, t=t, cfg=cfg, layout=LAYOUT)
        x_ref = ref.round(x_ref + xi)
        if graph == "directed-ring":
            assert torch.equal(r.x, x_ref), (t, float((r.x - x_ref).abs().max()))
            assert torch.equal(r.state.moment, torch.stack(ref.avg_err_sq))
            assert torch.equal(r.state.xhat, torch.stack(ref.self_xhat))
        else:
            torch.testing.assert_close(r.x, x_ref, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(r.state.moment, torch.stack(ref.avg_err_sq), rtol=1e-5, atol=1e-6)
        assert torch.equal(r.u, u)
        assert int(r.state.rounds) == ref.t == t + 1
        m_hat = r.state.moment.double() / (1 - BETA32 ** (t + 1))
        clamped.append(float((eta / (m_hat.sqrt() + 1e-8) >= 1).double().mean()))
        x, state = r.x, r.state
    if eta < 1:  # the adaptive step is active (some γ < 1) and the clamp too (γ = 1 elsewhere)
        assert 0 < np.mean(clamped) < 1, clamped


# --- 2. invariants and limits -----------------------------------------------------------------

def test_message_and_defaults():
    """No push-sum weight on the wire (u stays 1); CHOCO's catch-up; the official β and ε; the
    existing GossipCfg fields keep their defaults."""
    assert ADA.MESSAGE.push_sum_weight is False
    for replicas, replays in (("per-neighbour", True), ("official-aggregate", False)):
        assert ADA.MESSAGE.catch_up(GossipCfg(algorithm="adagossip", choco_replicas=replicas)) is replays
    cfg = GossipCfg()
    assert (cfg.adagossip_beta, cfg.adagossip_eps) == (0.999, 1e-8)
    assert (cfg.algorithm, cfg.eta, cfg.compressor, cfg.choco_form, cfg.choco_replicas) == (
        "ds", 1.0, CompressorCfg(), "paper", "per-neighbour")


@pytest.mark.parametrize("kwargs", [dict(adagossip_beta=1.0), dict(adagossip_beta=-0.1),
                                    dict(adagossip_beta=math.nan), dict(adagossip_eps=0.0),
                                    dict(adagossip_eps=-1e-8), dict(adagossip_eps=math.inf),
                                    dict(adagossip_eps=math.nan)])
def test_gossip_cfg_rejects_bad_hyper_parameters(kwargs):
    with pytest.raises(ValueError, match="adagossip_"):
        GossipCfg(algorithm="adagossip", **kwargs)
    GossipCfg(algorithm="adagossip", adagossip_beta=0.0, adagossip_eps=1e-3)  # the edges that are fine


OFFICIAL = {"choco_form": "code", "choco_replicas": "official-aggregate"}  # static graphs only


@pytest.mark.parametrize("graph,opts", [("directed-ring", {}), ("random-directed", {}), (TV, {}),
                                        ("directed-ring", OFFICIAL), ("random-directed", OFFICIAL)])
def test_eta_zero_never_mixes(graph, opts):
    cfg = GossipCfg(algorithm="adagossip", eta=0.0, compressor=TOPK, **opts)
    for x_tilde, _, r in run(topo(graph), cfg, 8):
        assert torch.equal(r.x, x_tilde)
        assert torch.equal(r.u, torch.ones(N, dtype=r.u.dtype))


@pytest.mark.parametrize("graph", ["directed-ring", "random-directed", "time-varying-exponential"])
def test_u_stays_one_and_sent_is_chocos(graph):
    """No push-sum even where the rows of W do not sum to 1; the messages counted are CHOCO's
    (one per active out-edge, plus the replayed backlog on a time-varying graph)."""
    tp = topo(graph)
    ada = run(tp, GossipCfg(algorithm="adagossip", eta=0.5, compressor=TOPK), 8)
    choco = run(tp, GossipCfg(algorithm="choco", eta=0.5, compressor=TOPK), 8, alg="choco")
    for (_, _, r), (_, _, rc) in zip(ada, choco):
        assert torch.equal(r.u, torch.ones(N, dtype=r.u.dtype))
        assert torch.equal(r.sent, rc.sent)


@pytest.mark.parametrize("graph", ["directed-ring", "ring", "random-directed", "time-varying-exponential"])
@pytest.mark.parametrize("form", ["paper", "code"])
def test_equals_its_formula_in_float64(graph, form):
    """x_{t+1} = x̃ + γ ⊙ e with e CHOCO's consensus term on the x̂ the state holds, m the EMA of e²
    and γ = min(η / (sqrt(m / (1 − β^{t+1})) + ε), 1), on static, irregular and time-varying graphs
    (per-neighbour replicas: every copy of x̂_j is caught up, so e reads x̂ directly)."""
    cfg = GossipCfg(algorithm="adagossip", eta=0.2, compressor=TOPK, choco_form=form, adagossip_beta=0.9)
    m = torch.zeros(N, LAYOUT.d, dtype=torch.float64)
    for t, (x_tilde, W, r) in enumerate(run(topo(graph), cfg, 10, noise=0.3)):
        xhat = r.state.xhat
        W_off = W - torch.diag(torch.diagonal(W))
        e = (W_off @ xhat - W_off.sum(1, keepdim=True) * xhat if form == "paper"
             else W @ xhat - xhat)
        m = 0.9 * m + 0.1 * e * e
        gamma = (0.2 / ((m / (1 - 0.9 ** (t + 1))).sqrt() + 1e-8)).clamp(max=1.0)
        torch.testing.assert_close(r.state.moment, m, rtol=1e-12, atol=1e-15)
        torch.testing.assert_close(r.x, x_tilde + gamma * e, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("graph", ["directed-ring", "ring", "torus", "time-varying-exponential"])
@pytest.mark.parametrize("comp", list(COMPRESSORS))
def test_clamped_step_is_choco_at_eta_one(graph, comp):
    """With η = 1 and every bias-corrected moment below (1 − ε)² (small consensus terms: the
    corrected moment is a convex combination of past e², so |e| < 0.9 throughout suffices), γ ≡ 1
    and AdaGossip is CHOCO at η = 1 bit for bit; without compression that is D-PSGD/SGP."""
    tp = topo(graph, 16 if graph == "torus" else N)
    kw = dict(eta=1.0, compressor=COMPRESSORS[comp])
    ada = run(tp, GossipCfg(algorithm="adagossip", **kw), 12, scale=0.05, noise=0.05)
    choco = run(tp, GossipCfg(algorithm="choco", **kw), 12, alg="choco", scale=0.05, noise=0.05)
    for t, ((_, _, r), (_, _, rc)) in enumerate(zip(ada, choco)):
        assert float((r.state.moment / (1 - 0.999 ** (t + 1))).max()) < 0.81
        assert torch.equal(r.x, rc.x)
    if comp == "identity":
        sgp = run(tp, GossipCfg(algorithm="dpsgd"), 12, alg="dpsgd", scale=0.05, noise=0.05)
        for (_, _, r), (_, _, rs) in zip(ada, sgp):
            torch.testing.assert_close(r.x, rs.x, rtol=0, atol=1e-12)


def test_adaptive_step_differs_from_choco_when_not_clamped():
    """The adaptive step does act: at η = 0.1 on O(1) differences it is not CHOCO at η = 0.1."""
    tp = topo("directed-ring")
    ada = run(tp, GossipCfg(algorithm="adagossip", eta=0.1, compressor=TOPK), 5)
    choco = run(tp, GossipCfg(algorithm="choco", eta=0.1, compressor=TOPK), 5, alg="choco")
    assert float((ada[-1][2].x - choco[-1][2].x).abs().max()) > 1e-2


@pytest.mark.parametrize("graph", ["directed-ring", "ring", "time-varying-exponential"])
def test_uncompressed_gossip_stays_in_the_hull_and_reaches_consensus(graph):
    """Without compression x̂ = x̃, and on a row-stochastic W each node's update is, coordinate by
    coordinate, a convex combination (1 − γ(1 − W_ii)) x_i + γ Σ_{j≠i} W_ij x_j with γ ∈ (0, 1]:
    gossip alone (x̃ = x) never leaves the nodes' range and drives them together. The average is
    not kept (γ differs per node)."""
    tp = topo(graph)
    cfg = GossipCfg(algorithm="adagossip", eta=0.1)
    rounds = run(tp, cfg, 200, noise=0.0)
    for x_tilde, _, r in rounds:
        assert bool((r.x.max(0).values <= x_tilde.max(0).values + 1e-12).all())
        assert bool((r.x.min(0).values >= x_tilde.min(0).values - 1e-12).all())
    spread = lambda y: float((y - y.mean(0)).norm())  # noqa: E731
    assert spread(rounds[-1][2].x) < 1e-6 * spread(rounds[0][0])


def test_node_state_and_absorb():
    """A rank's state: x̂ for itself and each in-neighbour, its own moment row, the round count;
    a missed payload folds into the sender's replica."""
    x = rand((1, LAYOUT.d), 0, torch.float64)
    st = ADA.init_node(x, senders=2, cfg=GossipCfg(algorithm="adagossip"))
    assert st.xhat.shape == (3, LAYOUT.d) and st.moment.shape == (1, LAYOUT.d)
    assert float(st.rounds) == 0 and st.rounds.dtype == torch.float64
    c = rand((LAYOUT.d,), 1, torch.float64)
    st2 = ADA.absorb(st, 2, c)
    assert torch.equal(st2.xhat[2], c) and torch.equal(st2.xhat[:2], st.xhat[:2])
    assert st2.moment is st.moment


# --- 3. executors -----------------------------------------------------------------------------

def _mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 10))


def _conv() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.Tanh(), nn.Flatten(), nn.Linear(256, 10))


# random-k keeps the coordinates the seeded draws pick, the same in both executors (top-k could
# swap two near-equal entries at the cut on a summation-order difference)
RANDK = CompressorCfg(kind="randomk", ratio=0.9)


@pytest.mark.parametrize("model", ["mlp", "conv"])
@pytest.mark.parametrize("graph,gossip", [
    ("directed-ring", GossipCfg(algorithm="adagossip", eta=0.1, compressor=RANDK)),
    ("ring", GossipCfg(algorithm="adagossip", eta=1.0)),
    ("time-varying-exponential", GossipCfg(algorithm="adagossip", eta=0.1, compressor=RANDK)),
], ids=["dring-randomk", "ring-identity", "tv-randomk"])
def test_batched_equals_loop(model, graph, gossip):
    """As tests/test_engine.py's executor comparison: float order differs between the executors,
    nothing else (rtol/atol 1e-5 over 5 steps of lr 0.1; a math difference is O(lr·g) ~ 1e-2)."""
    make = {"mlp": _mlp, "conv": _conv}[model]
    sims = {ex: Simulator(make, topology=Topology(name=graph, n=4), gossip=gossip,
                          engine=EngineCfg(executor=ex, device="cpu", seed=1234)) for ex in ("loop", "batched")}
    assert torch.equal(sims["loop"].x, sims["batched"].x)
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        xb, yb = torch.randn(4, 6, 1, 8, 8, generator=g), torch.randint(0, 10, (4, 6), generator=g)
        torch.testing.assert_close(sims["loop"].train_step(xb, yb, lr=0.1), sims["batched"].train_step(xb, yb, lr=0.1),
                                   rtol=1e-5, atol=1e-5)
    for attr in ("x", "z", "u"):
        torch.testing.assert_close(getattr(sims["loop"], attr), getattr(sims["batched"], attr), rtol=1e-5, atol=1e-5)
    for a, b in zip(sims["loop"].algo_state, sims["batched"].algo_state):
        if isinstance(a, torch.Tensor):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert float(sims["loop"].algo_state.rounds) == 5
    assert float((sims["loop"].x - sims["loop"].x[0]).abs().max()) > 0
    # no push-sum weight in the byte count
    assert sims["loop"].message_bytes == message_bytes(sims["loop"].layout, gossip.compressor, push_sum_weight=False)


def test_checkpoint_resumes_bit_exactly():
    """state_dict/load_state_dict carry the moment and the round count (a float64 scalar)."""
    gossip = GossipCfg(algorithm="adagossip", eta=0.1, compressor=RANDK)
    mk = lambda: Simulator(_mlp, topology=Topology(name="directed-ring", n=4), gossip=gossip,  # noqa: E731
                           engine=EngineCfg(executor="batched", device="cpu", seed=1234))
    a, b = mk(), mk()
    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(4, 6, 1, 8, 8, generator=g), torch.randint(0, 10, (4, 6), generator=g)) for _ in range(4)]
    for xb, yb in data[:2]:
        a.train_step(xb, yb, lr=0.1)
    b.load_state_dict(a.state_dict())
    for xb, yb in data[2:]:
        a.train_step(xb, yb, lr=0.1)
        b.train_step(xb, yb, lr=0.1)
    assert torch.equal(a.x, b.x) and torch.equal(a.algo_state.moment, b.algo_state.moment)
    assert float(b.algo_state.rounds) == 4


DIST_CASES = [
    Case("adagossip", 0.01, "fp32", "directed-ring"),                  # top-k 99 %
    Case("adagossip", 0.01, "int8", TV),                               # 8-bit model, catch-up replays
    Case("adagossip", 1.0, "fp32", "ring"),                            # identity, two in-neighbours
    Case("adagossip", 0.1, "int8", "directed-ring", choco_replicas="official-aggregate",
         compressor=CompressorCfg(kind="randomk", ratio=0.5)),
]


@pytest.fixture(scope="module")
def dist_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("adagossip-dist")
    return out, launch_cases(DIST_CASES, out)


@pytest.mark.slow
@pytest.mark.parametrize("case", DIST_CASES, ids=lambda c: c.name)
def test_distributed_equals_loop(case, dist_run):
    """4 gloo ranks against the loop simulator, with tests/test_distributed.py's tolerance (RTOL
    1e-5 / ATOL 1e-6: the rank's one-row weighted sum against the (n, n) matmul, a few ulps per
    round; a plumbing error moves x by an update, ~1e-2). Bytes: exactly the simulator's."""
    sim, _ = case.simulate()
    for r in range(DIST_N):
        got = torch.load(dist_run[0] / f"{case.name}-{r}.pt")
        assert got["bytes"] == float(sim.bytes_sent[r]) > 0, (case.name, r)
        assert float(got["u"]) == 1.0 == float(sim.u[r])
        torch.testing.assert_close(got["x"], sim.x[r], rtol=1e-5, atol=1e-6,
                                   msg=lambda m, r=r: f"{case.name} rank {r}: {m}")
    assert float((sim.x - sim.x[0]).abs().max()) > 1e-4


def test_adagossip_trains_a_tiny_model():
    """A few loop steps on a learnable signal lower the loss (the rule plugs into training)."""
    sim = Simulator(_mlp, topology=Topology(name="directed-ring", n=4),
                    gossip=GossipCfg(algorithm="adagossip", eta=0.1, compressor=TOPK),
                    engine=EngineCfg(executor="batched", device="cpu", seed=0))
    g = torch.Generator().manual_seed(0)
    proto = torch.randn(10, 1, 8, 8, generator=g)
    losses = []
    for _ in range(40):
        yb = torch.randint(0, 10, (4, 16), generator=g)
        xb = proto[yb] + 0.3 * torch.randn(4, 16, 1, 8, 8, generator=g)
        losses.append(float(sim.train_step(xb, yb, lr=0.2).mean()))
    assert np.mean(losses[-5:]) < 0.5 * np.mean(losses[:5])
    assert all(math.isfinite(v) for v in losses)
