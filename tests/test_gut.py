"""Tests for Global Update Tracking (lpdl_core.decentral.algorithms.gut; docs/paper-vs-code.md,
'Global Update Tracking'): the official code's update transcribed and compared on identical inputs,
the invariants on doubly stochastic graphs, the reductions (μ = β = 0: D-PSGD), validation, the
one-node (distributed) form, batched == loop, and the distributed executor against the loop one.
"""
from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from lpdl_core.decentral import algorithms, optim
from lpdl_core.decentral.algorithms import GossipCfg, gut
from lpdl_core.decentral.compress import CompressorCfg
from lpdl_core.decentral.engine import EngineCfg, Simulator
from lpdl_core.decentral.layout import Layout
from lpdl_core.decentral.optim import OptimCfg
from lpdl_core.decentral.topology import Topology

sys.path.insert(0, str(Path(__file__).parent))  # the spawned ranks import distributed_cases
from distributed_cases import Case, launch_cases
from distributed_cases import N as DIST_N

pytestmark = pytest.mark.usefixtures("one_thread")

N, D = 8, 40
LAYOUT = Layout.from_shapes([(4, 5), (20,)])  # d = 40
PLAIN = OptimCfg(momentum="none", weight_decay=0.0)  # the official optimizer has no weight decay
GUT = GossipCfg(algorithm="gut", gut_scaling=0.9)                       # test.sh's GUT runs
QG_GUTM = GossipCfg(algorithm="gut", gut_scaling=0.06, gut_momentum=0.9)  # test.sh's QG-GUTm (ring)
QG_DSGDM = GossipCfg(algorithm="gut", gut_scaling=0.0, gut_momentum=0.9)  # test.sh's QG-DSGDm
DSGD = GossipCfg(algorithm="gut", gut_scaling=0.0)                      # test.sh's DSGD


def _quadratic(n: int, d: int, dtype, seed: int = 0):
    """Heterogeneous local losses f_i(z) = ½ Σ h_i (z − c_i)², far-apart optima c_i (non-IID):
    the gradient h_i ⊙ (z − c_i) depends on where it is taken, so both codes must agree on it."""
    g = torch.Generator().manual_seed(seed)
    h = 0.5 + torch.rand(n, d, generator=g, dtype=dtype)
    c = 3.0 * torch.randn(n, d, generator=g, dtype=dtype)
    return lambda z: h * (z - c)


def official(P0: torch.Tensor, W: torch.Tensor, grad, lrs, mu: float, beta: float):
    """The official GUT / QG-GUTm, transcribed from github.com/aparna-aketi/global_update_tracking
    (trainer.py train(), L284-306) with every node a row: GossipDataParallel.transfer_params
    (gossip/distributed.py L170-222), gossip_averaging (L225-230, gamma = 1), forward/backward at
    the mixed model, remove_gossip (L232-236), GUT.__call__ and modify_gradients (models/gut.py
    L30-57), then torch.optim.SGD(lr, momentum=beta).step(). Uniform mixing: node i's self weight
    W_ii, its received sum Σ_{j∈in(i)} W_ij y_j. Returns the points the gradients were taken at
    (one per iteration) and the final parameters."""
    w = torch.diagonal(W)[:, None]
    W_in = W - torch.diag(torch.diagonal(W))
    P = nn.Parameter(P0.clone())
    self_xhat, neighbor_copy = P0.clone(), (1.0 - w) * P0
    prev_delta, tracker_lr = torch.zeros_like(P0), lrs[0]
    opt = torch.optim.SGD([P], lr=lrs[0], momentum=beta)
    points = []
    for lr in lrs:
        opt.param_groups[0]["lr"] = lr
        b = 1.0 + beta
        with torch.no_grad():
            yi = P - self_xhat
            yj = W_in @ yi
            acc = yj + w * yi
            acc = acc + b * neighbor_copy
            acc = acc + ((w - 1.0) * b) * self_xhat
            self_xhat = self_xhat + yi
            neighbor_copy = neighbor_copy + yj
            gu = neighbor_copy + (w - 1.0) * self_xhat
            P.add_(gu)                       # gossip_averaging
            points.append(P.detach().clone())
            g = grad(P.detach())             # the backward at the mixed model
            P.sub_(gu)                       # remove_gossip
            d = g - gu / tracker_lr          # GUT.__call__ (lr: the tracker's, last call's)
            y = d - (mu / tracker_lr) * acc - mu * prev_delta
            prev_delta, tracker_lr = d, lr
        P.grad = y                           # modify_gradients
        opt.step()
    return points, P.detach()


def lpdl(x0: torch.Tensor, topology: Topology, grad, lrs, cfg: GossipCfg, dtype):
    """lpdl's iteration: gradient at x, optim.local_step (momentum none), then gut.step."""
    W = torch.as_tensor(topology.W(0), dtype=dtype)
    x, u = x0.clone(), torch.ones(x0.shape[0], dtype=dtype)
    state, ost = gut.init(x, topology=topology, cfg=cfg), optim.init(x)
    points = []
    for t, lr in enumerate(lrs):
        points.append(x)
        x_tilde, ost = optim.local_step(x, grad(x), ost, lr, PLAIN)
        r = gut.step(state, x=x, x_tilde=x_tilde, u=u, W=W, t=t, cfg=cfg, layout=LAYOUT)
        x, u, state = r.x, r.u, r.state
        assert torch.equal(u, torch.ones_like(u))
    return points, state


# --- 1. against the official code on identical inputs ------------------------------------------
# Tolerance. The two compute the same numbers in another association: the official code works in
# gradient units (d = g − gu/lr, multiplied back by lr in the optimizer, and P + gu − gu around the
# backward), lpdl in units of lr; nothing else differs, so they agree to rounding. Measured over
# these 12 steps on values up to ~26: at most 1.2e-14 in float64 and 9.5e-6 in float32 (2^-24
# relative per operation). 1e-11 (float64) and 1e-4 (float32) leave ~1000x and ~10x margin; a
# wrong term (a missing μ·D_{t−1}, b without β, W instead of W − I) moves the points by
# O(lr·μ·g) ~ 1e-2 (checked by mutating gut.py: every such case fails).
CASES = {"gut": GUT, "qg-gutm": QG_GUTM, "qg-dsgdm": QG_DSGDM, "dsgd": DSGD,
         "gut-mu0.5-beta0.5": GossipCfg(algorithm="gut", gut_scaling=0.5, gut_momentum=0.5)}


@pytest.mark.parametrize("graph", ["ring", "directed-ring"])
@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_matches_official_code(graph, name, dtype):
    cfg, tp = CASES[name], Topology(name=graph, n=N)
    W = torch.as_tensor(tp.W(0), dtype=dtype)
    grad = _quadratic(N, D, dtype)
    x0 = torch.randn(D, generator=torch.Generator().manual_seed(3), dtype=dtype).expand(N, D).clone()
    lrs = [0.1] * 12
    ref_points, ref_P = official(x0, W, grad, lrs, cfg.gut_scaling, cfg.gut_momentum)
    points, state = lpdl(x0, tp, grad, lrs, cfg, dtype)
    tol = 1e-11 if dtype == torch.float64 else 1e-4
    for t, (got, ref) in enumerate(zip(points, ref_points)):
        torch.testing.assert_close(got, ref, rtol=tol, atol=tol, msg=lambda m, t=t: f"step {t}: {m}")
    torch.testing.assert_close(state.phat, ref_P, rtol=tol, atol=tol)  # the models P themselves
    assert float((points[-1] - points[-1][0]).abs().max()) > 0.1  # the nodes are apart (non-IID)


def test_official_tracker_lags_the_learning_rate_at_a_milestone():
    """The documented difference: at an lr drop the official tracker divides by the previous
    step's lr once (models/gut.py L34-44: self.lr is updated after use) and keeps d, buf in
    gradient units; lpdl's update units assume a constant lr. Same before the drop, apart after."""
    tp, dtype = Topology(name="ring", n=N), torch.float64
    W, grad = torch.as_tensor(tp.W(0), dtype=dtype), _quadratic(N, D, dtype)
    x0 = torch.zeros(N, D, dtype=dtype)
    lrs = [0.1] * 5 + [0.01] * 5
    ref_points, _ = official(x0, W, grad, lrs, QG_GUTM.gut_scaling, QG_GUTM.gut_momentum)
    points, _ = lpdl(x0, tp, grad, lrs, QG_GUTM, dtype)
    for t in range(6):  # the point of step 5 comes from step 4's update, the last at lr 0.1
        torch.testing.assert_close(points[t], ref_points[t], rtol=1e-11, atol=1e-11)
    assert float((points[6] - ref_points[6]).abs().max()) > 1e-3


# --- 2. invariants and reductions (float64, x̃ = x + ξ with a fixed random ξ) ------------------
DT = torch.float64


def _drive(cfg: GossipCfg, graph: str, T: int = 10, seed: int = 0):
    """T rounds with x̃_t = x_t + ξ_t from x_0 equal on all nodes; returns [(x_t, x̃_t, Round)]."""
    tp = Topology(name=graph, n=N)
    W = torch.as_tensor(tp.W(0), dtype=DT)
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(D, generator=g, dtype=DT).expand(N, D).clone()
    xi = 0.1 * torch.randn(T, N, D, generator=g, dtype=DT)
    u = torch.ones(N, dtype=DT)
    mod = algorithms.get(cfg.algorithm)
    state, out = mod.init(x, topology=tp, cfg=cfg), []
    for t in range(T):
        x_tilde = x + xi[t]
        r = mod.step(state, x=x, x_tilde=x_tilde, u=u, W=W, t=t, cfg=cfg, layout=LAYOUT)
        out.append((x, x_tilde, r))
        x, u, state = r.x, r.u, r.state
    return out


@pytest.mark.parametrize("graph", ["ring", "directed-ring", "exponential", "complete"])
def test_without_momentum_tracking_conserves_mass(graph):
    """β = 0: Σ_i Y_t = Σ_i D_t (the tracking property), hence Σ_i x_{t+1} = Σ_i x̃_t as D-PSGD,
    for any μ, on every doubly stochastic W."""
    for _x, x_tilde, r in _drive(GUT, graph):
        torch.testing.assert_close(r.x.sum(0), x_tilde.sum(0), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(r.state.phat.sum(0), x_tilde.sum(0), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cfg", [GUT, QG_GUTM], ids=["gut", "qg-gutm"])
def test_node_sum_does_not_depend_on_the_graph(cfg):
    """The columns of W − I sum to 0, so Σ_i x_t follows one recurrence in the local steps alone
    (with momentum too): the same on four graphs, while the nodes themselves differ."""
    runs = {g: _drive(cfg, g) for g in ("ring", "directed-ring", "exponential", "complete")}
    ref = runs["ring"]
    for run in runs.values():
        for (_, _, r), (_, _, r0) in zip(run, ref):
            torch.testing.assert_close(r.x.sum(0), r0.x.sum(0), rtol=1e-12, atol=1e-12)
    assert float((runs["ring"][-1][2].x - runs["complete"][-1][2].x).abs().max()) > 1e-3


@pytest.mark.parametrize("graph", ["ring", "directed-ring", "exponential"])
def test_zero_scaling_and_momentum_is_dpsgd(graph):
    """μ = β = 0: P_{t+1} = x̃_t and x_{t+1} = W x̃_t, D-PSGD at η = 1 (rounding apart)."""
    for (_, _, r), (_, _, r0) in zip(_drive(DSGD, graph), _drive(GossipCfg(algorithm="dpsgd"), graph)):
        torch.testing.assert_close(r.x, r0.x, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(r.u, r0.u, rtol=0, atol=0)
    assert gut.MESSAGE.push_sum_weight is False


def test_tracking_changes_the_trajectory():
    """μ > 0 moves the nodes off D-PSGD's path (the correction is not a no-op)."""
    (_, _, a), (_, _, b) = _drive(GUT, "ring")[-1], _drive(DSGD, "ring")[-1]
    assert float((a.x - b.x).abs().max()) > 1e-3


# --- validation ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,match", [
    ({"eta": 0.5}, "eta must be 1"),
    ({"compressor": CompressorCfg(kind="topk", ratio=0.9)}, "compressor identity"),
    ({"gut_scaling": -0.1}, "gut_scaling"),
    ({"gut_scaling": float("inf")}, "gut_scaling"),
    ({"gut_momentum": 1.0}, "gut_momentum"),
    ({"gut_momentum": -0.1}, "gut_momentum"),
])
def test_config_rejects(kwargs, match):
    with pytest.raises(ValueError, match=match):
        GossipCfg(algorithm="gut", **kwargs)


def test_defaults_are_the_official_ones_and_leave_others_alone():
    cfg = GossipCfg(algorithm="gut")
    assert (cfg.gut_scaling, cfg.gut_momentum) == (0.9, 0.0)  # trainer.py --scaling, --momentum
    assert GossipCfg() == GossipCfg(algorithm="ds")  # the paper's configs are unchanged
    GossipCfg(algorithm="ds", eta=0.01, compressor=CompressorCfg(kind="topk", ratio=0.99))


@pytest.mark.parametrize("graph,match", [("time-varying-exponential", "fixed peers"),
                                         ("random-directed", "doubly stochastic")])
def test_refuses_graphs_without_fixed_doubly_stochastic_weights(graph, match):
    x = torch.zeros(N, D, dtype=DT)
    for build in (lambda tp: gut.init(x, topology=tp, cfg=GUT),
                  lambda tp: gut.init_node(x[:1], senders=1, topology=tp, cfg=GUT)):
        with pytest.raises(ValueError, match=match):
            build(Topology(name=graph, n=N, seed=0))


def test_refuses_frozen_tensors():
    """Tensors the forward pass updates (the official LPDL code's activation ranges) would be lost:
    x is rebuilt from the models P each round."""
    frozen = dataclasses.replace(LAYOUT, frozen=frozenset({LAYOUT.names[1]}))
    with pytest.raises(ValueError, match="frozen"):
        gut.init_node(torch.zeros(1, D), senders=1, topology=None, cfg=GUT, layout=frozen)
    x = torch.zeros(N, D)
    with pytest.raises(ValueError, match="frozen"):
        gut.step(gut.init(x, topology=None, cfg=GUT), x=x, x_tilde=x, u=torch.ones(N), W=torch.eye(N),
                 t=0, cfg=GUT, layout=frozen)


# --- one node with replicas (the distributed executor's form) == the stacked step --------------
@pytest.mark.parametrize("graph", ["ring", "directed-ring", "exponential"])
def test_node_form_equals_stacked_step(graph):
    """Each node runs init_node / outgoing / mix on its row of W over itself and its in-neighbours,
    fed its senders' messages, as engine/distributed.py does: the stacked step's rows, exactly
    up to the order of the sums Σ_j W_ij (·)_j (one row's dot product against the matmul)."""
    tp, cfg = Topology(name=graph, n=N), QG_GUTM
    W = torch.as_tensor(tp.W(0), dtype=DT)
    ins = tp.in_neighbours(0)
    senders = [[i] + sorted(j for j in ins[i] if j != i) for i in range(N)]
    g = torch.Generator().manual_seed(5)
    x = torch.randn(D, generator=g, dtype=DT).expand(N, D).clone()
    u = torch.ones(N, dtype=DT)
    state = gut.init(x, topology=tp, cfg=cfg)
    nodes = [gut.init_node(x[i:i + 1], senders=len(s) - 1, topology=tp, cfg=cfg) for i, s in enumerate(senders)]
    xs = [x[i:i + 1] for i in range(N)]
    for t in range(8):
        xi = 0.1 * torch.randn(N, D, generator=g, dtype=DT)
        r = gut.step(state, x=x, x_tilde=x + xi, u=u, W=W, t=t, cfg=cfg, layout=LAYOUT)
        rows = [W[i, s][None] for i, s in enumerate(senders)]
        vs = [gut.outgoing(nodes[i], x=xs[i], x_tilde=xs[i] + xi[i], W=rows[i], cfg=cfg) for i in range(N)]
        new = []
        for i, s in enumerate(senders):
            c = torch.cat([vs[j] for j in s])
            new.append(gut.mix(nodes[i], v=vs[i], c=c, x=xs[i], x_tilde=xs[i] + xi[i], u=u[i:i + 1],
                               W=rows[i], t=t, cfg=cfg))
        nodes, xs = [n.state for n in new], [n.x for n in new]
        torch.testing.assert_close(torch.cat(xs), r.x, rtol=1e-12, atol=1e-12)
        x, state = r.x, r.state


# --- 3. batched == loop ---------------------------------------------------------------------------
def _mlp() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 10))


def _conv() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.Tanh(), nn.Flatten(), nn.Linear(256, 10))


@pytest.mark.parametrize("model", [_mlp, _conv], ids=["mlp", "conv"])
@pytest.mark.parametrize("cfg", [GUT, QG_GUTM], ids=["gut", "qg-gutm"])
def test_batched_equals_loop(model, cfg):
    """As tests/test_engine.py's comparison: the executors differ in float summation order only
    (~1e-7 relative per op on these smooth nets, through 5 steps of lr 0.1): rtol/atol 1e-5; a
    difference in math moves x by the order of lr·g ~ 1e-2."""
    n, B = 4, 6
    sims = {ex: Simulator(model, topology=Topology(name="ring", n=n), gossip=cfg, optim_cfg=PLAIN,
                          engine=EngineCfg(executor=ex, device="cpu", seed=1234)) for ex in ("loop", "batched")}
    assert torch.equal(sims["loop"].x, sims["batched"].x)
    g = torch.Generator().manual_seed(0)
    for _ in range(5):
        xb = torch.randn(n, B, 1, 8, 8, generator=g)
        yb = 2 * torch.arange(n)[:, None] + torch.randint(0, 2, (n, B), generator=g)  # non-IID labels
        for sim in sims.values():
            sim.train_step(xb, yb, lr=0.1)
    for attr in ("x", "z", "u", "bytes_sent"):
        torch.testing.assert_close(getattr(sims["loop"], attr), getattr(sims["batched"], attr),
                                   rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(sims["loop"].algo_state.phat, sims["batched"].algo_state.phat,
                               rtol=1e-5, atol=1e-5)
    loop = sims["loop"]
    assert float((loop.x - loop.x[0]).abs().max()) > 1e-3  # something happened
    # every node sent 2 uncompressed messages per round (ring), no push-sum weight
    assert torch.equal(loop.bytes_sent, torch.full((n,), 5 * 2 * 4.0 * loop.layout.d, dtype=torch.float64))


def test_simulator_checkpoint_roundtrip():
    """The state (P replicas, D, A, B) is plain tensors: a resumed simulator continues bit for bit."""
    def mk():
        return Simulator(_mlp, topology=Topology(name="ring", n=4), gossip=QG_GUTM, optim_cfg=PLAIN,
                         engine=EngineCfg(executor="loop", device="cpu", seed=1))

    g = torch.Generator().manual_seed(0)
    data = [(torch.randn(4, 6, 1, 8, 8, generator=g), torch.randint(0, 10, (4, 6), generator=g)) for _ in range(4)]
    a, b = mk(), mk()
    for xb, yb in data[:2]:
        a.train_step(xb, yb, 0.1)
    b.load_state_dict(a.state_dict())
    for xb, yb in data[2:]:
        a.train_step(xb, yb, 0.1)
        b.train_step(xb, yb, 0.1)
    assert torch.equal(a.x, b.x)


# --- the distributed executor (4 gloo ranks) == the loop executor, FP and 8-bit -----------------
# Same tolerance and reasoning as tests/test_distributed.py (RTOL 1e-5, ATOL 1e-6: the ring's
# Σ_j W_ij (·)_j is a 3-term dot product at a rank and a matmul row in the simulator).
DIST = [Case("gut", 1.0, "fp32", "ring", momentum="none", gossip_opts=(("gut_momentum", 0.9), ("gut_scaling", 0.06))),
        Case("gut", 1.0, "int8", "ring", momentum="none", gossip_opts=(("gut_scaling", 0.9),)),
        Case("gut", 1.0, "fp32", "directed-ring", momentum="nesterov")]


@pytest.fixture(scope="module")
def dist_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gut")
    return out, launch_cases(DIST, out)


@pytest.mark.slow  # ~50 s on a busy 2-core machine (3 cases, 4 spawned ranks, 8-bit replays)
@pytest.mark.parametrize("case", DIST, ids=lambda c: c.name)
def test_distributed_equals_loop(case, dist_run):
    out, _ = dist_run
    sim, _ = case.simulate()
    for r in range(DIST_N):
        got = torch.load(out / f"{case.name}-{r}.pt")
        assert got["bytes"] == float(sim.bytes_sent[r]) > 0, (case.name, r)
        assert float(got["u"]) == 1.0
        torch.testing.assert_close(got["x"], sim.x[r], rtol=1e-5, atol=1e-6,
                                   msg=lambda m, r=r: f"{case.name} rank {r}: {m}")
    assert float((sim.x - sim.x[0]).abs().max()) > 1e-4


def test_a_cells_momentum_column_picks_guts_official_settings():
    """momentum nesterov -> GUT (μ 0.9, β 0), qgm -> QG-GUTm (β 0.9, μ 0.06: the official README's
    QG-GUTm run; μ 0.9 with β 0.9 diverged in the heterogeneity grid), both on plain SGD."""
    from lpdl_core.pipeline.cells.grids import load_grid
    from lpdl_core.pipeline.run.runcell import plan_cell

    from dataclasses import replace

    cell = next(c for c in load_grid("heterogeneity").cells if c.algorithm == "gut" and c.momentum == "qgm")
    qg, gut = plan_cell(cell), plan_cell(replace(cell, momentum="nesterov"))
    assert (qg.gossip.gut_scaling, qg.gossip.gut_momentum, qg.optim.momentum) == (0.06, 0.9, "none")
    assert (gut.gossip.gut_scaling, gut.gossip.gut_momentum, gut.optim.momentum) == (0.9, 0.0, "none")


def test_the_settings_a_gut_cell_selects_are_part_of_its_runs_identity(monkeypatch):
    """A run of other μ/β settings (as the earlier μ 0.9 QG-GUTm) is another run, recomputed;
    cells of other algorithms carry no such part (the paper's identities are unchanged)."""
    from lpdl_core.config import Fidelity
    from lpdl_core.errors import RunMismatch
    from lpdl_core.pipeline.recipe import own_momentum
    from lpdl_core.pipeline.cells.tables import load_cells
    from lpdl_core.pipeline.cells.grids import load_grid
    from lpdl_core.pipeline.run.runstore import check_identity, run_identity

    cell = next(c for c in load_grid("heterogeneity").cells if c.algorithm == "gut")
    ident = run_identity(cell, profile="mini", seed=1, fidelity=Fidelity())
    assert ident["own_momentum"]["gossip"] == {"gut_momentum": 0.9, "gut_scaling": 0.06}
    assert all("own_momentum" not in run_identity(c, profile="paper", seed=1, fidelity=Fidelity())
               for c in load_cells())
    earlier = {**own_momentum.OWN_MOMENTUM["gut"],
               "gossip": {**own_momentum.OWN_MOMENTUM["gut"]["gossip"],
                          "qgm": {"gut_momentum": 0.9, "gut_scaling": 0.9}}}
    monkeypatch.setitem(own_momentum.OWN_MOMENTUM, "gut", earlier)
    with pytest.raises(RunMismatch, match="own_momentum.gossip"):
        check_identity("m.json", {"identity": ident}, run_identity(cell, profile="mini", seed=1, fidelity=Fidelity()))
