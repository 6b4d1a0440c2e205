"""Tests for lpdl_core.decentral.optim: the local SGD step against torch.optim.SGD, QGM against
docs/paper-vs-code.md, 'Quasi-Global Momentum', and OptimCfg validation."""
from __future__ import annotations

import pytest
import torch

from lpdl_core.decentral import optim
from lpdl_core.decentral.optim import OptimCfg, OptimState, local_step, qgm_correct

D = 17
LRS = [0.1, 0.1, 0.05, 0.2, 0.01] * 4  # 20 steps, changing lr


def _grads(T, n, dtype, seed=0):
    return torch.randn(T, n, D, generator=torch.Generator().manual_seed(seed), dtype=dtype)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
@pytest.mark.parametrize("momentum", ["nesterov", "heavy-ball", "none"])
@pytest.mark.parametrize("wd", [1e-4, 0.0])
def test_local_step_matches_torch_sgd(momentum, dtype, tol, wd):
    x0 = torch.randn(1, D, generator=torch.Generator().manual_seed(1), dtype=dtype)
    grads = _grads(len(LRS), 1, dtype)
    p = torch.nn.Parameter(x0[0].clone())
    beta = 0.9 if momentum != "none" else 0.0
    opt = torch.optim.SGD([p], lr=LRS[0], momentum=beta, nesterov=momentum == "nesterov",
                          weight_decay=wd)
    cfg = OptimCfg(momentum=momentum, beta=0.9, weight_decay=wd)
    x, state = x0.clone(), optim.init(x0)
    assert torch.equal(state.buf, torch.zeros_like(x0))
    for lr, g in zip(LRS, grads):
        for group in opt.param_groups:
            group["lr"] = lr
        p.grad = g[0].clone()
        opt.step()
        x, state = local_step(x, g, state, lr, cfg)
        torch.testing.assert_close(x[0], p.detach(), rtol=0, atol=tol)
        if momentum != "none":
            torch.testing.assert_close(state.buf[0], opt.state[p]["momentum_buffer"], rtol=0, atol=tol)
    assert x.dtype == dtype


def test_local_step_rows_are_independent():
    """Stacked rows behave like n separate optimizers."""
    cfg = OptimCfg()
    x = torch.randn(4, D, dtype=torch.float64)
    grads = _grads(5, 4, torch.float64, seed=3)
    xs, st = x.clone(), optim.init(x)
    for g in grads:
        xs, st = local_step(xs, g, st, 0.1, cfg)
    for i in range(4):
        xi, sti = x[i:i + 1].clone(), optim.init(x[i:i + 1])
        for g in grads:
            xi, sti = local_step(xi, g[i:i + 1], sti, 0.1, cfg)
        torch.testing.assert_close(xs[i:i + 1], xi, rtol=0, atol=1e-14)


def test_local_step_is_pure():
    cfg = OptimCfg()
    x = torch.randn(3, D)
    g = torch.randn(3, D)
    st = OptimState(buf=torch.randn(3, D))
    x_c, g_c, b_c = x.clone(), g.clone(), st.buf.clone()
    local_step(x, g, st, 0.1, cfg)
    assert torch.equal(x, x_c) and torch.equal(g, g_c) and torch.equal(st.buf, b_c)


# --- QGM (docs/paper-vs-code.md, 'Quasi-Global Momentum') ------------------------------------

@pytest.mark.parametrize("wd", [1e-4, 0.0, 0.05])
def test_qgm_local_direction_and_momentum_recursion(wd):
    beta = 0.9
    cfg = OptimCfg(momentum="qgm", beta=beta, weight_decay=wd)
    n = 5
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(n, D, generator=gen, dtype=torch.float64)
    st = optim.init(x)
    u = torch.ones(n, dtype=torch.float64)
    for lr in [0.1, 0.05, 0.2, 0.1, 0.01, 0.3]:
        g = torch.randn(n, D, generator=gen, dtype=torch.float64)
        m_prev = st.buf.clone()
        x_tilde, st_mid = local_step(x, g, st, lr, cfg)
        # local direction d = g' + β(β m̂ + g'), g' = g + wd·x
        gw = g + wd * x
        d = gw + beta * (beta * m_prev + gw)
        torch.testing.assert_close(x_tilde, x - lr * d, rtol=0, atol=1e-13)
        # gossip displacement (any): x_{t+1} = x̃ + Δ
        x_next = x_tilde + 0.3 * torch.randn(n, D, generator=gen, dtype=torch.float64)
        st = qgm_correct(st_mid, x_next, x_tilde, u, lr, cfg)
        # m̂_t = β m̂_{t−1} + (1−β)(x_t − x_{t+1}) / lr
        expected = beta * m_prev + (1 - beta) * (x - x_next) / lr
        torch.testing.assert_close(st.buf, expected, rtol=1e-10, atol=1e-10)
        x = x_next


def test_qgm_correction_uses_push_sum_weight():
    """Official apply step: m̂ ← m̂ + (β − 1)/(lr·u)·(x_{t+1} − x̃_t), per node u."""
    cfg = OptimCfg(momentum="qgm", beta=0.8)
    n = 4
    gen = torch.Generator().manual_seed(0)
    buf = torch.randn(n, D, generator=gen, dtype=torch.float64)
    x_tilde = torch.randn(n, D, generator=gen, dtype=torch.float64)
    x_next = torch.randn(n, D, generator=gen, dtype=torch.float64)
    u = torch.tensor([1.0, 0.5, 2.0, 1.3], dtype=torch.float64)
    out = qgm_correct(OptimState(buf=buf), x_next, x_tilde, u, 0.1, cfg)
    expected = buf + ((0.8 - 1.0) / (0.1 * u))[:, None] * (x_next - x_tilde)
    torch.testing.assert_close(out.buf, expected, rtol=0, atol=1e-12)


def test_qgm_no_gossip_is_plain_nesterov_like_direction():
    """With no displacement (x_{t+1} = x̃_t) m̂_t = β m̂_{t−1} + (1−β) d_t."""
    cfg = OptimCfg(momentum="qgm", beta=0.9, weight_decay=0.0)
    x = torch.randn(2, D, dtype=torch.float64)
    st = OptimState(buf=torch.randn(2, D, dtype=torch.float64))
    g = torch.randn(2, D, dtype=torch.float64)
    x_tilde, st1 = local_step(x, g, st, 0.1, cfg)
    st2 = qgm_correct(st1, x_tilde, x_tilde, torch.ones(2, dtype=torch.float64), 0.1, cfg)
    d = (x - x_tilde) / 0.1
    torch.testing.assert_close(st2.buf, 0.9 * st.buf + 0.1 * d, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("momentum", ["nesterov", "heavy-ball", "none"])
def test_qgm_correct_noop_for_other_momenta(momentum):
    cfg = OptimCfg(momentum=momentum)
    st = OptimState(buf=torch.randn(3, D))
    out = qgm_correct(st, torch.randn(3, D), torch.randn(3, D), torch.ones(3), 0.1, cfg)
    assert out is st


def test_qgm_correct_noop_at_zero_lr():
    cfg = OptimCfg(momentum="qgm")
    st = OptimState(buf=torch.randn(3, D))
    assert qgm_correct(st, torch.randn(3, D), torch.randn(3, D), torch.ones(3), 0.0, cfg) is st


# --- validation -----------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs", [
    {"momentum": "adamw"},
    {"momentum": "Nesterov"},
    {"beta": 1.0},
    {"beta": -0.1},
    {"beta": 1.5},
    {"weight_decay": -1e-4},
    {"momentum": "adam", "beta2": 1.0},
    {"eps": 0.0},
])
def test_optim_cfg_rejects(kwargs):
    with pytest.raises(ValueError):
        OptimCfg(**kwargs)


def test_optim_cfg_defaults_and_keyword_only():
    cfg = OptimCfg()
    assert (cfg.momentum, cfg.beta, cfg.weight_decay) == ("nesterov", 0.9, 1e-4)
    OptimCfg(momentum="qgm", beta=0.0, weight_decay=0.0)
    with pytest.raises(TypeError):
        OptimCfg("nesterov")  # kw_only


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.float64, 1e-12)])
def test_adam_matches_torch_optim_adam(dtype, tol):
    """The paper's NLP optimizer: Adam(lr, betas=(0.9, 0.9), weight_decay=1e-4) (L2, not AdamW)."""
    from lpdl_core.decentral.optim import OptimCfg, init, local_step

    torch.manual_seed(3)
    x0 = torch.randn(1, 17, dtype=dtype)
    cfg = OptimCfg(momentum="adam", beta=0.9, beta2=0.9, weight_decay=1e-4)
    p = torch.nn.Parameter(x0[0].clone())
    ref = torch.optim.Adam([p], lr=3e-3, betas=(0.9, 0.9), weight_decay=1e-4)
    x, st = x0.clone(), init(x0, cfg)
    for k in range(25):
        g = torch.randn(17, dtype=dtype)
        lr = 3e-3 * (0.5 if k > 12 else 1.0)
        for group in ref.param_groups:
            group["lr"] = lr
        p.grad = g.clone()
        ref.step()
        x, st = local_step(x, g[None], st, lr, cfg)
    assert st.step == 25
    torch.testing.assert_close(x[0], p.detach(), atol=tol, rtol=tol)
