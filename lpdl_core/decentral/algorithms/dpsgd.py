r"""D-PSGD / Stochastic Gradient Push with push-sum de-biasing (Lian et al. 2017; Assran et al.
2019), in the residual form the official code uses.

.. math::
    x_{t+1}^{(i)} = \tilde x_t^{(i)} + \eta \sum_j (W_{ij} - I_{ij})\,\tilde x_t^{(j)},\qquad
    u_{t+1}^{(i)} = u_t^{(i)} + \eta \sum_j (W_{ij} - I_{ij})\,u_t^{(j)},\qquad
    z_{t+1}^{(i)} = x_{t+1}^{(i)} / u_{t+1}^{(i)}

With η = 1 this is x_{t+1} = W x̃_t, the SGP step. W only needs to be column-stochastic.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from .base import GossipCfg, Message, Round, out_degree, push_sum_weights, residual

MESSAGE = Message(push_sum_weight=True)  # node j sends x̃_j and u_j


class State(NamedTuple):
    pass


def init(x: torch.Tensor, *, topology=None, cfg: GossipCfg | None = None) -> State:
    return State()


def init_node(x: torch.Tensor, *, senders: int, topology=None, cfg: GossipCfg | None = None,
              layout=None) -> State:
    """One node's state: none (messages are whole models x̃_j)."""
    return State()


def outgoing(state: State, *, x: torch.Tensor, x_tilde: torch.Tensor, W: torch.Tensor,
             cfg: GossipCfg) -> torch.Tensor:
    """v_i = x̃_i, sent whole (the compressor is the identity)."""
    return x_tilde


def mix(state: State, *, v: torch.Tensor, c: torch.Tensor, x: torch.Tensor, x_tilde: torch.Tensor,
        u: torch.Tensor, W: torch.Tensor, t: int, cfg: GossipCfg) -> Round:
    """x_{t+1} = x̃ + η (W − I) x̃ (c: every sender's x̃_j, own rows first)."""
    x_next = x_tilde + cfg.eta * residual(W, c)
    return Round(x=x_next, u=push_sum_weights(u, W, cfg.eta), state=state, sent=out_degree(W))


def step(state: State, *, x: torch.Tensor, x_tilde: torch.Tensor, u: torch.Tensor,
         W: torch.Tensor, t: int, cfg: GossipCfg, layout=None, generator=None) -> Round:
    v = outgoing(state, x=x, x_tilde=x_tilde, W=W, cfg=cfg)
    # C is the identity (GossipCfg checks), so every sender's C(v_j) is v_j itself.
    return mix(state, v=v, c=v, x=x, x_tilde=x_tilde, u=u, W=W, t=t, cfg=cfg)
