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


def step(state: State, *, x: torch.Tensor, x_tilde: torch.Tensor, u: torch.Tensor,
         W: torch.Tensor, t: int, cfg: GossipCfg, layout=None, generator=None) -> Round:
    x_next = x_tilde + cfg.eta * residual(W, x_tilde)
    return Round(x=x_next, u=push_sum_weights(u, W, cfg.eta), state=state, sent=out_degree(W))
