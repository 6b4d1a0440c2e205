r"""Deep-Squeeze in its Sparse-Push form: error-compensated compressed gossip with push-sum
(paper Alg. 4; Tang et al. 2019 and Aketi et al. 2021). Matches `gossip_ds` of the official code
(docs/paper-vs-code.md, 'Deep-Squeeze (`gossip_ds`)'), including the self term using the
*compressed* C(v_i).

.. math::
    v_t^{(i)} &= \tilde x_t^{(i)} + \delta_t^{(i)} \\
    \delta_{t+1}^{(i)} &= v_t^{(i)} - C[v_t^{(i)}] \\
    x_{t+1}^{(i)} &= \tilde x_t^{(i)} + \eta \sum_{j} (W_{ij} - I_{ij})\, C[v_t^{(j)}] \\
    u_{t+1}^{(i)} &= u_t^{(i)} + \eta \sum_{j} (W_{ij} - I_{ij})\, u_t^{(j)}

Σ_i x_i is conserved for any column-stochastic W (columns of W − I sum to 0). Without
compression δ ≡ 0 and the step is D-PSGD/SGP.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from ..compress import compress
from .base import GossipCfg, Message, Round, out_degree, push_sum_weights, residual

MESSAGE = Message(push_sum_weight=True)  # node j sends C[v_j] and u_j


class State(NamedTuple):
    delta: torch.Tensor  # (r, d) error-feedback buffer δ, zeros at start


def init(x: torch.Tensor, *, topology=None, cfg: GossipCfg | None = None) -> State:
    return State(delta=torch.zeros_like(x))


def init_node(x: torch.Tensor, *, senders: int, topology=None, cfg: GossipCfg | None = None,
              layout=None) -> State:
    """One node's state (x: its own row): δ only, no replicas (messages are whole C[v_j])."""
    return init(x, topology=topology, cfg=cfg)


def outgoing(state: State, *, x: torch.Tensor, x_tilde: torch.Tensor, W: torch.Tensor,
             cfg: GossipCfg) -> torch.Tensor:
    """v_i = x̃_i + δ_i, sent as C[v_i]."""
    return x_tilde + state.delta


def mix(state: State, *, v: torch.Tensor, c: torch.Tensor, x: torch.Tensor, x_tilde: torch.Tensor,
        u: torch.Tensor, W: torch.Tensor, t: int, cfg: GossipCfg) -> Round:
    """x_{t+1} = x̃ + η (W − I) C[v], δ = v − C[v] (c: every sender's C[v_j], own rows first)."""
    x_next = x_tilde + cfg.eta * residual(W, c)
    return Round(x=x_next, u=push_sum_weights(u, W, cfg.eta), state=State(delta=v - c[:v.shape[0]]),
                 sent=out_degree(W))


def step(state: State, *, x: torch.Tensor, x_tilde: torch.Tensor, u: torch.Tensor,
         W: torch.Tensor, t: int, cfg: GossipCfg, layout, generator=None) -> Round:
    v = outgoing(state, x=x, x_tilde=x_tilde, W=W, cfg=cfg)
    return mix(state, v=v, c=compress(v, layout, cfg.compressor, generator), x=x, x_tilde=x_tilde,
               u=u, W=W, t=t, cfg=cfg)
