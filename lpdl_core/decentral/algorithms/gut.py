r"""Global Update Tracking (GUT) and, with `gut_momentum` β > 0, QG-GUTm (Aketi, Hashemi, Roy,
NeurIPS 2023), as the official code computes them (docs/paper-vs-code.md, 'Global Update Tracking').

Node i keeps its model P_i (the official code's parameters) and replicas of its in-neighbours' P_j;
lpdl's x_i is the mixed model Σ_j W_ij P_j at which the official code takes the gradient (it adds
the gossip term before the forward pass and removes it after the backward pass). With the local
step x̃_t = x_t − lr·g_t (optimizer momentum "none", no weight decay: the official optimizer's
momentum acts on the tracked update and lives here, in `gut_momentum`), one round is, in units of
lr (D = lr·d, Y = lr·y, B = lr·buf of the official code, at a constant learning rate):

.. math::
    D_t^{(i)} &= (x_t^{(i)} - \tilde x_t^{(i)}) - \sum_j (W_{ij} - I_{ij})\, P_t^{(j)} \\
    Y_t^{(i)} &= D_t^{(i)} - \mu\, A_t^{(i)} - \mu\, D_{t-1}^{(i)},\qquad
    B_t^{(i)} = \beta B_{t-1}^{(i)} + Y_t^{(i)},\qquad P_{t+1}^{(i)} = P_t^{(i)} - B_t^{(i)} \\
    A_{t+1}^{(i)} &= \sum_j W_{ij} (P_{t+1}^{(j)} - P_t^{(j)}) + (1 + \beta) \sum_j (W_{ij} - I_{ij})\, P_t^{(j)} \\
    x_{t+1}^{(i)} &= P_{t+1}^{(i)} + \sum_j (W_{ij} - I_{ij})\, P_{t+1}^{(j)}

with P_0 = x_0 (every node starts from the same x_0), D_{−1} = A_0 = B_{−1} = 0, μ = `gut_scaling`.
Node j sends P_{t+1}^{(j)} − P_t^{(j)} = −B_t^{(j)} uncompressed; u stays 1 (no push-sum).

On a doubly stochastic W (required, with fixed peers) the columns of W − I sum to 0, so
Σ_i P_t and Σ_i x_t follow one recurrence whatever the graph; with β = 0, Σ_i Y_t = Σ_i D_t (the
tracking property) and Σ_i x_{t+1} = Σ_i x̃_t, as D-PSGD. With μ = β = 0, P_{t+1} = x̃_t and the
round is D-PSGD at η = 1 (x_{t+1} = W x̃_t); with μ = 0, β > 0 it is the official QG-DSGDm.

One node (`init_node`, a distributed rank) keeps P for itself and each in-neighbour in the rows
of `State.phat` (all x_0 at start), updated by every message it receives.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .base import GossipCfg, Message, Round, out_degree, refuse_frozen, require_fixed_doubly_stochastic, residual

MESSAGE = Message(push_sum_weight=False)  # node j sends P_{t+1} − P_t only (u stays 1)


class State(NamedTuple):
    phat: torch.Tensor   # (m, d) P of every sender (own rows first), x_0 at start
    delta: torch.Tensor  # (r, d) D_{t−1}, the last local-plus-consensus update, zeros at start
    acc: torch.Tensor    # (r, d) A_t, the neighbourhood's last updates, shifted; zeros at start
    buf: torch.Tensor    # (r, d) B_{t−1}, momentum of the tracked update (β = 0: unused), zeros


def _check(topology, layout) -> None:
    require_fixed_doubly_stochastic("gut", topology, why="it has no push-sum")
    refuse_frozen("gut", layout, "keeps each node's model P apart from x")


def init(x: torch.Tensor, *, topology, cfg: GossipCfg) -> State:
    _check(topology, None)
    zeros = torch.zeros_like(x)
    return State(phat=x.clone(), delta=zeros, acc=zeros.clone(), buf=zeros.clone())


def init_node(x: torch.Tensor, *, senders: int, topology, cfg: GossipCfg, layout=None) -> State:
    """One node's state (x: its own row x_0): P of itself and of `senders` in-neighbours, all x_0."""
    _check(topology, layout)
    zeros = torch.zeros_like(x)
    return State(phat=torch.cat([x] + [x] * senders), delta=zeros, acc=zeros.clone(), buf=zeros.clone())


def _update(state: State, x: torch.Tensor, x_tilde: torch.Tensor, W: torch.Tensor
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """(D_t, (W − I) P_t): the local step plus the consensus step, and the consensus step."""
    consensus = residual(W, state.phat)
    return (x - x_tilde) - consensus, consensus


def outgoing(state: State, *, x: torch.Tensor, x_tilde: torch.Tensor, W: torch.Tensor,
             cfg: GossipCfg) -> torch.Tensor:
    """v_i = P_{t+1} − P_t = −B_t, with B_t = β B_{t−1} + D_t − μ A_t − μ D_{t−1}."""
    delta, _ = _update(state, x, x_tilde, W)
    mu = cfg.gut_scaling
    y = delta - mu * state.acc - mu * state.delta
    return -(cfg.gut_momentum * state.buf + y)


def mix(state: State, *, v: torch.Tensor, c: torch.Tensor, x: torch.Tensor, x_tilde: torch.Tensor,
        u: torch.Tensor, W: torch.Tensor, t: int, cfg: GossipCfg) -> Round:
    """P_j += c_j for every sender j, x_{t+1} = Σ_j W_ij P_j, and the next round's D, A, B
    (c: every sender's P_{t+1} − P_t, own rows first)."""
    r = x.shape[0]
    delta, consensus = _update(state, x, x_tilde, W)
    phat = state.phat + c
    acc = W @ c + (1.0 + cfg.gut_momentum) * consensus
    x_next = phat[:r] + residual(W, phat)
    return Round(x=x_next, u=u, state=State(phat=phat, delta=delta, acc=acc, buf=-v),
                 sent=out_degree(W))


def step(state: State, *, x: torch.Tensor, x_tilde: torch.Tensor, u: torch.Tensor,
         W: torch.Tensor, t: int, cfg: GossipCfg, layout=None, generator=None) -> Round:
    if layout is not None and layout.frozen:
        _check(None, layout)
    v = outgoing(state, x=x, x_tilde=x_tilde, W=W, cfg=cfg)
    # C is the identity (GossipCfg checks), so every sender's message is v_j itself.
    return mix(state, v=v, c=v, x=x, x_tilde=x_tilde, u=u, W=W, t=t, cfg=cfg)
