"""Tests for lpdl_core.decentral.algorithms (gossip rules) against docs/paper-vs-code.md, 'How the
official code trains' and its 'Invariants': push-sum weights, mass conservation, equivalences,
DS/CHOCO internals, Bagua-lp's formula, convergence on a non-IID least-squares problem, and
GossipCfg validation.

All invariant tests run in float64 on random stacked (n, d) node states.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from lpdl_core.decentral import algorithms, optim
from lpdl_core.decentral.algorithms import GossipCfg
from lpdl_core.decentral.compress import CompressorCfg, compress, kept_count
from lpdl_core.decentral.layout import Layout
from lpdl_core.decentral.optim import OptimCfg
from lpdl_core.decentral.spectral import is_column_stochastic
from lpdl_core.config import GRAPHS
from lpdl_core.decentral.topology import Topology

DT = torch.float64
LAYOUT = Layout.from_shapes([(3, 4), (5,), (2, 2, 2)])  # d = 25, numels 12 / 5 / 8
N = 8

REGULAR_STATIC = ("directed-ring", "ring", "torus", "grid-official", "exponential", "complete")
COMPRESSORS = {
    "identity": CompressorCfg(),
    "topk0.9": CompressorCfg(kind="topk", ratio=0.9),
    "topk0.99": CompressorCfg(kind="topk", ratio=0.99),
    "randomk0.9": CompressorCfg(kind="randomk", ratio=0.9),
    "minmax8": CompressorCfg(kind="minmax8"),
    "qsgd4": CompressorCfg(kind="qsgd", qsgd_level=4),
}
TOPK = CompressorCfg(kind="topk", ratio=0.9)


pytestmark = pytest.mark.usefixtures("one_thread")


def topo(name: str, n: int = N) -> Topology:
    return Topology(name=name, n=n, seed=0)


def W_at(tp: Topology, t: int) -> torch.Tensor:
    return torch.as_tensor(tp.W(t), dtype=DT)


def rand(shape, seed: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=DT)


def run(alg: str, tp: Topology, cfg: GossipCfg, T: int, *, seed: int = 0, x0=None, layout=LAYOUT,
        noise: float = 1.0, hook=None):
    """Drive one algorithm for T rounds with x̃_t = x_t + ξ_t (ξ a fixed random sequence).

    Returns the list of (x_tilde, Round) per step. `hook(t, x, x_tilde, u, W, round)` is called
    after every step.
    """
    mod = algorithms.get(alg)
    n, d = tp.n, layout.d
    x = rand((n, d), seed) if x0 is None else x0.clone()
    u = torch.ones(n, dtype=DT)
    state = mod.init(x, topology=tp, cfg=cfg)
    g = torch.Generator().manual_seed(seed + 1)
    xi = rand((T, n, d), seed + 2) * noise
    out = []
    for t in range(T):
        x_tilde = x + xi[t]
        W = W_at(tp, t)
        r = mod.step(state, x=x, x_tilde=x_tilde, u=u, W=W, t=t, cfg=cfg, layout=layout, generator=g)
        if hook is not None:
            hook(t, x, x_tilde, u, W, r)
        out.append((x_tilde, r))
        x, u, state = r.x, r.u, r.state
    return out


# --- 1. topologies, column stochasticity and push-sum weights ('Push-sum weight') ------------

GRAPH_CASES = [(g, 8) for g in GRAPHS] + [("torus", 16), ("grid-official", 16)]


@pytest.mark.parametrize("name,n", GRAPH_CASES)
def test_W_column_stochastic(name, n):
    tp = topo(name, n)
    for t in range(max(tp.period, 3)):
        W = tp.W(t)
        assert W.shape == (n, n)
        assert is_column_stochastic(W)
        np.testing.assert_allclose(W.sum(0), 1.0, rtol=0, atol=1e-15)


@pytest.mark.parametrize("alg", ["ds", "choco", "dpsgd"])
@pytest.mark.parametrize("name,n", [c for c in GRAPH_CASES if c[0] != "random-directed"])
def test_push_sum_weights_regular_graphs_exactly_one(alg, name, n):
    tp = topo(name, n)
    comp = CompressorCfg() if alg == "dpsgd" else TOPK
    for eta in (1.0, 0.5):
        cfg = GossipCfg(algorithm=alg, eta=eta, compressor=comp)
        for _, r in run(alg, tp, cfg, 20):
            assert torch.equal(r.u, torch.ones(n, dtype=DT))  # exactly 1, not approximately


@pytest.mark.parametrize("alg", ["ds", "choco", "dpsgd"])
@pytest.mark.parametrize("name", ["random-directed", "time-varying-exponential"])
def test_push_sum_weights_total_mass(alg, name):
    tp = topo(name)
    comp = CompressorCfg() if alg == "dpsgd" else TOPK
    cfg = GossipCfg(algorithm=alg, eta=1.0, compressor=comp)
    rounds = run(alg, tp, cfg, 20)
    for _, r in rounds:
        assert abs(float(r.u.sum()) - N) < 1e-12
        assert bool((r.u > 0).all())
    if name == "random-directed":
        # irregular: rows of W do not sum to 1, so u drifts away from 1
        assert float((rounds[-1][1].u - 1).abs().max()) > 0.05
    else:
        assert torch.equal(rounds[-1][1].u, torch.ones(N, dtype=DT))


def test_random_directed_is_irregular():
    W = topo("random-directed").W(0)
    assert len(set(np.round(W.sum(1), 12))) > 1  # rows do not all sum to 1
    assert len({len(o) for o in topo("random-directed").out_neighbours()}) > 1


# --- 2. mass conservation ('Invariants') -----------------------------------------------------

CONSERVE_GRAPHS = ("directed-ring", "random-directed", "time-varying-exponential")
CONSERVE_CASES = (
    [("dpsgd", {}, "identity")]
    + [("ds", {}, c) for c in COMPRESSORS]
    + [("choco", {"choco_form": "code"}, c) for c in COMPRESSORS]
    + [("choco", {"choco_form": "code", "choco_replicas": "official-aggregate"}, c)
       for c in ("identity", "topk0.9", "qsgd4")]
)


def _assert_conserved(rounds):
    for x_tilde, r in rounds:
        lhs, rhs = r.x.sum(0), x_tilde.sum(0)
        scale = max(1.0, float(x_tilde.abs().sum(0).max()))
        assert float((lhs - rhs).abs().max()) <= 1e-10 * scale


@pytest.mark.parametrize("graph", CONSERVE_GRAPHS)
@pytest.mark.parametrize("alg,opts,comp", CONSERVE_CASES,
                         ids=[f"{a}-{o.get('choco_replicas', '')}-{c}" for a, o, c in CONSERVE_CASES])
def test_mass_conservation(alg, opts, comp, graph):
    tp = topo(graph)
    for k, eta in enumerate((0.01, 0.5, 1.0)):
        cfg = GossipCfg(algorithm=alg, eta=eta, compressor=COMPRESSORS[comp], **opts)
        _assert_conserved(run(alg, tp, cfg, 12, seed=10 * k))


@pytest.mark.parametrize("graph", ["directed-ring", "ring", "torus"])
def test_choco_paper_form_conserves_mass_on_regular_graphs(graph):
    for eta in (0.01, 0.5, 1.0):
        cfg = GossipCfg(algorithm="choco", eta=eta, compressor=TOPK, choco_form="paper")
        _assert_conserved(run("choco", topo(graph), cfg, 12))


def test_choco_paper_form_does_not_conserve_mass_on_irregular_graph():
    """Paper form Σ_j (W_ij − I_ij)(x̂_j − x̂_i) = code form + (1 − Σ_j W_ij) x̂_i. On random-directed
    the rows of W do not sum to 1, so Σ_i x_i changes by η Σ_i (1 − rowsum_i) x̂_i ≠ 0 while the
    code form's Σ_i Σ_j (W_ij − I_ij) x̂_j is 0 by column stochasticity (docs/paper-vs-code.md,
    'Where the code departs from Algorithms 4 and 5')."""
    tp = topo("random-directed")
    cfg = GossipCfg(algorithm="choco", eta=0.5, compressor=TOPK, choco_form="paper")
    rounds = run("choco", tp, cfg, 5)
    rowsum = torch.as_tensor(tp.W(0).sum(1), dtype=DT)
    for x_tilde, r in rounds:
        drift = r.x.sum(0) - x_tilde.sum(0)
        expected = 0.5 * ((1.0 - rowsum)[:, None] * r.state.xhat).sum(0)
        torch.testing.assert_close(drift, expected, rtol=1e-9, atol=1e-12)
        assert float(drift.abs().max()) > 1e-3


# --- Bagua-lp: its formula (mass is not conserved by design) --------------------------------

@pytest.mark.parametrize("graph", ["ring", "torus", "complete"])
@pytest.mark.parametrize("comp", ["minmax8", "identity", "topk0.9"])
def test_bagua_lp_equals_its_formula(graph, comp):
    tp = topo(graph)
    cfg = GossipCfg(algorithm="bagua-lp", eta=1.0, compressor=COMPRESSORS[comp])

    def hook(t, x, x_tilde, u, W, r):
        x_half = x_tilde + (W @ x - x)
        expected = x + compress(x_half - x, LAYOUT, cfg.compressor)
        torch.testing.assert_close(r.x, expected, rtol=0, atol=1e-12)
        assert torch.equal(r.u, u)  # no push-sum
        assert torch.equal(r.sent, torch.as_tensor(
            [len(o) for o in tp.out_neighbours(t)], dtype=DT))

    run("bagua-lp", tp, cfg, 6, hook=hook)


def test_bagua_lp_identity_is_dpsgd_with_gradient_outside_mixing():
    """Without compression Bagua's step is x_{t+1} = W x_t − lr d_t (x̃ = x − lr d)."""
    tp = topo("ring")
    cfg = GossipCfg(algorithm="bagua-lp")

    def hook(t, x, x_tilde, u, W, r):
        torch.testing.assert_close(r.x, W @ x + (x_tilde - x), rtol=0, atol=1e-12)

    run("bagua-lp", tp, cfg, 5, hook=hook)


# --- 3. equivalences ('Invariants') ----------------------------------------------------------

def _trajectory(alg, tp, cfg, T=15):
    rs = run(alg, tp, cfg, T, seed=3)
    return torch.stack([r.x for _, r in rs]), torch.stack([r.u for _, r in rs])


def _choco_variants(graph):
    tp = topo(graph)
    row_stochastic = np.allclose(tp.W(0).sum(1), 1.0)
    forms = ("paper", "code") if row_stochastic else ("code",)
    reps = ("per-neighbour", "official-aggregate") if not tp.time_varying else ("per-neighbour",)
    return [(f, r) for f in forms for r in reps]


@pytest.mark.parametrize("graph", ["directed-ring", "ring", "random-directed",
                                   "time-varying-exponential"])
def test_ds_choco_dpsgd_equivalent_without_compression(graph):
    tp = topo(graph)
    xs, us = _trajectory("dpsgd", tp, GossipCfg(algorithm="dpsgd"))
    cases = [("ds", {})] + [("choco", {"choco_form": f, "choco_replicas": r})
                            for f, r in _choco_variants(graph)]
    for alg, opts in cases:
        x2, u2 = _trajectory(alg, tp, GossipCfg(algorithm=alg, eta=1.0, **opts))
        torch.testing.assert_close(x2, xs, rtol=0, atol=1e-12, msg=f"{alg} {opts}")
        torch.testing.assert_close(u2, us, rtol=0, atol=1e-12, msg=f"{alg} {opts}")
    # and DS/CHOCO/dpsgd really are x_{t+1} = W x̃_t here
    rs = run("dpsgd", tp, GossipCfg(algorithm="dpsgd"), 4, seed=3)
    for t, (x_tilde, r) in enumerate(rs):
        torch.testing.assert_close(r.x, W_at(tp, t) @ x_tilde, rtol=0, atol=1e-12)


def test_choco_paper_form_differs_from_dpsgd_on_irregular_graph():
    """Documented difference (docs/paper-vs-code.md, 'Where the code departs from Algorithms 4
    and 5'): only the code form is SGP there."""
    tp = topo("random-directed")
    xs, _ = _trajectory("dpsgd", tp, GossipCfg(algorithm="dpsgd"))
    xp, _ = _trajectory("choco", tp, GossipCfg(algorithm="choco", choco_form="paper"))
    assert float((xp - xs).abs().max()) > 1e-3


@pytest.mark.parametrize("graph", ["directed-ring", "random-directed", "time-varying-exponential"])
@pytest.mark.parametrize("alg,opts,comp", [
    ("dpsgd", {}, "identity"),
    ("ds", {}, "topk0.9"), ("ds", {}, "qsgd4"),
    ("choco", {"choco_form": "paper"}, "topk0.9"), ("choco", {"choco_form": "code"}, "randomk0.9"),
    ("choco", {"choco_replicas": "official-aggregate"}, "minmax8"),
])
def test_eta_zero_never_mixes(alg, opts, comp, graph):
    cfg = GossipCfg(algorithm=alg, eta=0.0, compressor=COMPRESSORS[comp], **opts)
    for x_tilde, r in run(alg, topo(graph), cfg, 8):
        assert torch.equal(r.x, x_tilde)
        assert torch.equal(r.u, torch.ones(N, dtype=DT))


@pytest.mark.parametrize("graph", ["ring", "torus"])
def test_eta_zero_never_mixes_bagua(graph):
    cfg = GossipCfg(algorithm="bagua-lp", eta=0.0)
    for x_tilde, r in run("bagua-lp", topo(graph), cfg, 8):
        # x + (x̃ − x) rounds differently from x̃, hence the tolerance
        torch.testing.assert_close(r.x, x_tilde, rtol=0, atol=1e-12)
        assert torch.equal(r.u, torch.ones(N, dtype=DT))


# --- 4. DS internals ('Deep-Squeeze (`gossip_ds`)', 'Invariants') ----------------------------

@pytest.mark.parametrize("graph", ["directed-ring", "random-directed"])
@pytest.mark.parametrize("ratio", [0.5, 0.9, 0.99])
def test_ds_error_feedback(ratio, graph):
    tp = topo(graph)
    cfg = GossipCfg(algorithm="ds", eta=0.5, compressor=CompressorCfg(kind="topk", ratio=ratio))
    mod = algorithms.get("ds")
    x = rand((N, LAYOUT.d), 0)
    u = torch.ones(N, dtype=DT)
    state = mod.init(x, topology=tp, cfg=cfg)
    assert torch.equal(state.delta, torch.zeros_like(x))
    for t in range(10):
        x_tilde = x + rand((N, LAYOUT.d), 100 + t)
        v = x_tilde + state.delta
        c = compress(v, LAYOUT, cfg.compressor)
        W = W_at(tp, t)
        r = mod.step(state, x=x, x_tilde=x_tilde, u=u, W=W, t=t, cfg=cfg, layout=LAYOUT)
        delta = r.state.delta
        assert torch.equal(delta, v - c)
        # self term uses the compressed C(v_i) (official gossip_ds)
        torch.testing.assert_close(r.x, x_tilde + 0.5 * (W @ c - c), rtol=0, atol=1e-12)
        for seg in LAYOUT.segments():
            cs, ds_, vs = c[:, seg.start:seg.stop], delta[:, seg.start:seg.stop], v[:, seg.start:seg.stop]
            k = max(1, int(seg.numel * (1 - ratio)))
            assert k == kept_count(seg.numel, ratio)
            assert ((cs != 0).sum(1) == k).all()          # exactly k non-zeros per tensor per node
            kept = cs != 0
            assert bool((ds_[kept] == 0).all())            # δ zero exactly at kept coordinates
            assert torch.equal(ds_[~kept], vs[~kept])      # and equal to v elsewhere
            # the kept coordinates are the k largest |v|
            thresh = vs.abs().topk(k, dim=1).values[:, -1:]
            assert bool((vs.abs()[kept].view(N, k) >= thresh).all())
        x, u, state = r.x, r.u, r.state


def test_ds_identity_keeps_delta_zero():
    cfg = GossipCfg(algorithm="ds", eta=0.3)
    for _, r in run("ds", topo("random-directed"), cfg, 6):
        assert torch.equal(r.state.delta, torch.zeros_like(r.x))


# --- 5. CHOCO internals ('CHOCO-SGD (`gossip_choco`)', 'Invariants') -------------------------

@pytest.mark.parametrize("replicas", ["per-neighbour", "official-aggregate"])
@pytest.mark.parametrize("graph", ["directed-ring", "random-directed", "time-varying-exponential"])
def test_choco_xhat_is_sum_of_sent_q(graph, replicas):
    tp = topo(graph)
    cfg = GossipCfg(algorithm="choco", eta=0.3, compressor=TOPK, choco_replicas=replicas)
    acc = torch.zeros(N, LAYOUT.d, dtype=DT)
    prev_xhat = torch.zeros_like(acc)

    def hook(t, x, x_tilde, u, W, r):
        nonlocal acc, prev_xhat
        q = compress(x_tilde - prev_xhat, LAYOUT, TOPK)
        acc = acc + q
        assert torch.equal(r.state.xhat, acc)
        prev_xhat = r.state.xhat

    run("choco", tp, cfg, 12, hook=hook)


@pytest.mark.parametrize("graph", ["directed-ring", "random-directed", "time-varying-exponential"])
def test_choco_xhat_tracks_x_tilde_without_compression(graph):
    cfg = GossipCfg(algorithm="choco", eta=1.0)
    for x_tilde, r in run("choco", topo(graph), cfg, 6):
        torch.testing.assert_close(r.state.xhat, x_tilde, rtol=0, atol=1e-12)


def _W_off(W):
    return W - torch.diag(torch.diagonal(W))


@pytest.mark.parametrize("name,n", [("directed-ring", 8), ("random-directed", 8),
                                    ("grid-official", 8), ("torus", 16)])
def test_choco_official_aggregate_is_weighted_sum_on_static_graph(name, n):
    tp = topo(name, n)
    cfg = GossipCfg(algorithm="choco", eta=0.2, compressor=TOPK, choco_replicas="official-aggregate",
                    choco_form="code")

    def hook(t, x, x_tilde, u, W, r):
        torch.testing.assert_close(r.state.aggregate, _W_off(W) @ r.state.xhat, rtol=0, atol=1e-12)

    run("choco", tp, cfg, 15, hook=hook)


@pytest.mark.parametrize("graph", ["directed-ring", "ring", "torus"])
def test_choco_code_form_equals_paper_form_on_regular_graphs(graph):
    tp = topo(graph)
    trajs = []
    for form in ("paper", "code"):
        cfg = GossipCfg(algorithm="choco", eta=0.01, compressor=TOPK, choco_form=form)
        trajs.append(torch.stack([r.x for _, r in run("choco", tp, cfg, 150, noise=0.05)]))
    torch.testing.assert_close(trajs[0], trajs[1], rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("form", ["paper", "code"])
@pytest.mark.parametrize("name,n", [("directed-ring", 8), ("random-directed", 8),
                                    ("grid-official", 8), ("exponential", 16)])
def test_choco_official_aggregate_equals_per_neighbour_on_static_graphs(name, n, form):
    tp = topo(name, n)
    trajs = []
    for replicas in ("per-neighbour", "official-aggregate"):
        cfg = GossipCfg(algorithm="choco", eta=0.1, compressor=TOPK, choco_form=form,
                        choco_replicas=replicas)
        trajs.append(torch.stack([r.x for _, r in run("choco", tp, cfg, 40, noise=0.1)]))
    torch.testing.assert_close(trajs[0], trajs[1], rtol=1e-10, atol=1e-10)


def test_choco_time_varying_per_neighbour_replicas_vs_official_aggregate():
    """Per-neighbour replicas stay exact on time-varying-exponential; the official single
    aggregate S_i (it assumes fixed in-neighbours and weights: docs/paper-vs-code.md, 'Graphs and
    mixing weights') does not."""
    tp = topo("time-varying-exponential")
    assert tp.time_varying and tp.period == 3
    cfg = GossipCfg(algorithm="choco", eta=0.5, compressor=TOPK, choco_form="code")

    def hook(t, x, x_tilde, u, W, r):
        st = r.state
        w_e = W[st.dst, st.src]
        active = w_e != 0
        assert int(active.sum()) == N  # one out-edge per node per round
        assert torch.equal(st.replicas[active], st.xhat[st.src[active]])
        assert bool((st.last_sync[active] == t).all())
        S = torch.zeros_like(st.xhat).index_add_(0, st.dst, w_e[:, None] * st.replicas)
        torch.testing.assert_close(S, _W_off(W) @ st.xhat, rtol=0, atol=1e-12)
        torch.testing.assert_close(r.x, x_tilde + 0.5 * (W @ st.xhat - st.xhat), rtol=0, atol=1e-12)

    per = run("choco", tp, cfg, 9, hook=hook)

    agg_cfg = GossipCfg(algorithm="choco", eta=0.5, compressor=TOPK, choco_form="code",
                        choco_replicas="official-aggregate")
    gaps = []

    def agg_hook(t, x, x_tilde, u, W, r):
        gaps.append(float((r.state.aggregate - _W_off(W) @ r.state.xhat).abs().max()))

    agg = run("choco", tp, agg_cfg, 9, hook=agg_hook)
    assert gaps[0] < 1e-12          # first round: the aggregate has seen only this W
    assert min(gaps[1:]) > 1e-2     # then it mixes stale weights / in-neighbours
    assert float((agg[-1][1].x - per[-1][1].x).abs().max()) > 1e-2


def test_choco_time_varying_official_aggregate_differs_from_sgp_without_compression():
    tp = topo("time-varying-exponential")
    xs, _ = _trajectory("dpsgd", tp, GossipCfg(algorithm="dpsgd"))
    xa, _ = _trajectory("choco", tp, GossipCfg(algorithm="choco", choco_form="code",
                                               choco_replicas="official-aggregate"))
    assert float((xa - xs).abs().max()) > 1e-2


@pytest.mark.parametrize("alg", ["dpsgd", "ds", "choco"])
@pytest.mark.parametrize("name,n", [("directed-ring", 8), ("ring", 8), ("torus", 16),
                                    ("complete", 8), ("random-directed", 8), ("exponential", 8)])
def test_sent_is_out_degree_on_static_graphs(alg, name, n):
    tp = topo(name, n)
    comp = CompressorCfg() if alg == "dpsgd" else TOPK
    expected = torch.as_tensor([len(o) for o in tp.out_neighbours()], dtype=DT)
    for _, r in run(alg, tp, GossipCfg(algorithm=alg, eta=0.5, compressor=comp), 3):
        assert torch.equal(r.sent, expected)
    if name == "directed-ring":
        assert torch.equal(expected, torch.ones(n, dtype=DT))


def test_sent_grid_official_n8_counts_distinct_receivers():
    """For n=8 the official GridGraph sends the i±4 message twice (parallel edge, weight 2/5);
    `sent` counts the distinct out-neighbours (3), i.e. one merged message carrying weight 2/5."""
    tp = topo("grid-official", 8)
    for _, r in run("ds", tp, GossipCfg(algorithm="ds", compressor=TOPK), 2):
        assert torch.equal(r.sent, torch.full((8,), 3.0, dtype=DT))


def test_sent_time_varying_choco_replays_backlog():
    """Per-neighbour CHOCO on a time-varying graph replays the q's a receiver missed: one node
    sends t+1 messages in round t < period, then `period` per round."""
    tp = topo("time-varying-exponential")
    cfg = GossipCfg(algorithm="choco", compressor=TOPK, eta=0.5)
    for t, (_, r) in enumerate(run("choco", tp, cfg, 8)):
        assert torch.equal(r.sent, torch.full((N,), float(min(t + 1, tp.period)), dtype=DT))
    # DS / dpsgd send one message per active out-edge
    for _, r in run("ds", tp, GossipCfg(algorithm="ds", compressor=TOPK), 4):
        assert torch.equal(r.sent, torch.ones(N, dtype=DT))


# --- 6. convergence on a non-IID least-squares problem --------------------------------------

LS_N, LS_D, LS_M = 8, 10, 20
LS_LAYOUT = Layout.from_shapes([(2, 3), (4,)])


@pytest.fixture(scope="module")
def lsq():
    g = torch.Generator().manual_seed(0)
    A = torch.randn(LS_N, LS_M, LS_D, generator=g, dtype=DT) / math.sqrt(LS_M)
    b = torch.randn(LS_N, LS_M, generator=g, dtype=DT) + torch.arange(LS_N, dtype=DT)[:, None]
    H = torch.einsum("nmi,nmj->ij", A, A)
    x_star = torch.linalg.solve(H, torch.einsum("nmi,nm->i", A, b))
    # node optima differ a lot from the global one (non-IID)
    local = torch.linalg.solve(torch.einsum("nmi,nmj->nij", A, A), torch.einsum("nmi,nm->ni", A, b))
    assert float((local - x_star).norm(dim=1).min() / x_star.norm()) > 0.1
    return A, b, x_star


def _solve(lsq, alg, graph, comp=CompressorCfg(), eta=1.0, *, T=3000, lr0=0.3, decay=0.998,
           debias=True, avg_last=0, **opts):
    A, b, x_star = lsq
    tp = topo(graph, LS_N)
    cfg = GossipCfg(algorithm=alg, eta=eta, compressor=comp, **opts)
    mod = algorithms.get(alg)
    x = torch.zeros(LS_N, LS_D, dtype=DT)
    u = torch.ones(LS_N, dtype=DT)
    state = mod.init(x, topology=tp, cfg=cfg)
    ocfg = OptimCfg(momentum="none", weight_decay=0.0)
    ostate = optim.init(x)
    gen = torch.Generator().manual_seed(1)
    z_avg = torch.zeros_like(x)
    for t in range(T):
        lr = lr0 * decay ** t
        z = x / u[:, None] if debias else x
        grad = torch.einsum("nmi,nm->ni", A, torch.einsum("nmi,ni->nm", A, z) - b)
        x_tilde, ostate = optim.local_step(x, grad, ostate, lr, ocfg)
        r = mod.step(state, x=x, x_tilde=x_tilde, u=u, W=W_at(tp, t), t=t, cfg=cfg,
                     layout=LS_LAYOUT, generator=gen)
        x, u, state = r.x, r.u, r.state
        if t >= T - avg_last:
            z_avg += x / u[:, None]
    z = x / u[:, None]
    zbar = z.mean(0)
    scale = float(x_star.norm())
    cons = lambda zz: float(((zz - zz.mean(0)) ** 2).sum(1).mean().sqrt()) / scale  # noqa: E731
    res = {"err": float((zbar - x_star).norm()) / scale, "cons": cons(z), "x": x, "u": u}
    if avg_last:
        res["cons_avg"] = cons(z_avg / avg_last)
    return res


TOPK05 = CompressorCfg(kind="topk", ratio=0.5)
CONVERGE_CASES = {
    "dpsgd": ("dpsgd", "directed-ring", CompressorCfg(), 1.0),
    "ds": ("ds", "directed-ring", CompressorCfg(), 1.0),
    "choco": ("choco", "directed-ring", CompressorCfg(), 1.0),
    "choco-topk0.5": ("choco", "directed-ring", TOPK05, 0.5),
    "bagua-lp-minmax8": ("bagua-lp", "ring", CompressorCfg(kind="minmax8"), 1.0),
    "dpsgd-random-directed": ("dpsgd", "random-directed", CompressorCfg(), 1.0),
    "ds-random-directed": ("ds", "random-directed", CompressorCfg(), 1.0),
}


@pytest.mark.parametrize("case", list(CONVERGE_CASES))
def test_converges_to_global_optimum(lsq, case):
    alg, graph, comp, eta = CONVERGE_CASES[case]
    res = _solve(lsq, alg, graph, comp, eta)
    assert res["err"] < 1e-2, res["err"]
    assert res["cons"] < 1e-2, res["cons"]


def test_ds_topk_converges_on_average(lsq):
    """Deep-Squeeze with top-k: the averaged model reaches x*, but consensus is reached only
    on time-average. Consensus (x_i = c) is not a fixed point of Alg. 4 with a sparsifier
    (δ_{t+1} = δ_t + x_t − C(x_t + δ_t) keeps pushing the dropped mass), so the instantaneous
    consensus distance stays O(η) while its time average vanishes."""
    res = _solve(lsq, "ds", "directed-ring", TOPK05, 0.5, avg_last=100)
    assert res["err"] < 1e-2, res["err"]
    assert res["cons"] < 0.5, res["cons"]
    assert res["cons_avg"] < min(2e-2, 0.1 * res["cons"]), (res["cons_avg"], res["cons"])
    small_eta = _solve(lsq, "ds", "directed-ring", TOPK05, 0.1, T=600, decay=0.99)
    assert small_eta["cons"] < 0.5 * res["cons"]  # O(η): smaller η, smaller instantaneous spread


def test_push_sum_debiasing_matters_on_random_directed(lsq):
    ok = _solve(lsq, "dpsgd", "random-directed")
    x_star = lsq[2]
    # u is far from 1, so the raw numerators x_i are NOT the solution; z_i = x_i / u_i is
    assert float(ok["u"].min()) < 0.7 and float(ok["u"].max()) > 1.3
    raw_err = float(((ok["x"] - x_star).norm(dim=1) / x_star.norm()).max())
    assert raw_err > 0.2
    assert ok["err"] < 1e-2
    # evaluating gradients at x instead of z converges to a wrong point
    biased = _solve(lsq, "dpsgd", "random-directed", debias=False)
    assert biased["err"] > 0.05


# --- 7. GossipCfg / init validation ---------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    {"algorithm": "sgp"},
    {"algorithm": "DS"},
    {"eta": -0.1},
    {"eta": 1.5},
    {"eta": float("nan")},
    {"algorithm": "dpsgd", "compressor": CompressorCfg(kind="topk", ratio=0.9)},
    {"algorithm": "dpsgd", "compressor": CompressorCfg(kind="minmax8")},
    {"algorithm": "dpsgd", "compressor": CompressorCfg(kind="qsgd", qsgd_level=4)},
    {"algorithm": "choco", "choco_form": "official"},
    {"algorithm": "choco", "choco_replicas": "aggregate"},
])
def test_gossip_cfg_rejects(kwargs):
    with pytest.raises(ValueError):
        GossipCfg(**kwargs)


def test_gossip_cfg_accepts_identity_like_dpsgd():
    GossipCfg(algorithm="dpsgd", compressor=CompressorCfg(kind="topk", ratio=0.0))
    GossipCfg(algorithm="dpsgd", compressor=CompressorCfg(kind="qsgd", qsgd_level=32))
    GossipCfg(algorithm="ds", eta=0.0)
    GossipCfg(algorithm="choco", eta=1.0)


def test_get_unknown_algorithm():
    with pytest.raises(ValueError):
        algorithms.get("nope")
    for name in algorithms.ALGORITHMS:
        assert algorithms.get(name) is algorithms.REGISTRY[name]


@pytest.mark.parametrize("graph", ["random-directed", "time-varying-exponential"])
def test_bagua_init_rejects_unsupported_topology(graph):
    cfg = GossipCfg(algorithm="bagua-lp", compressor=CompressorCfg(kind="minmax8"))
    with pytest.raises(ValueError):
        algorithms.get("bagua-lp").init(torch.zeros(N, LAYOUT.d, dtype=DT), topology=topo(graph), cfg=cfg)


def test_bagua_init_rejects_directed_ring():
    cfg = GossipCfg(algorithm="bagua-lp", compressor=CompressorCfg(kind="minmax8"))
    with pytest.raises(ValueError):
        algorithms.get("bagua-lp").init(torch.zeros(N, LAYOUT.d, dtype=DT),
                                        topology=topo("directed-ring"), cfg=cfg)


@pytest.mark.parametrize("name,n", [("ring", 8), ("torus", 16), ("complete", 8), ("grid-official", 8)])
def test_bagua_init_accepts_symmetric_doubly_stochastic(name, n):
    cfg = GossipCfg(algorithm="bagua-lp", compressor=CompressorCfg(kind="minmax8"))
    algorithms.get("bagua-lp").init(torch.zeros(n, LAYOUT.d, dtype=DT), topology=topo(name, n), cfg=cfg)
