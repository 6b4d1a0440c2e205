r"""Bagua's LowPrecisionDecentralized SGD (DCD-PSGD difference compression, Tang et al. 2018):
peers keep replicas of each other's models and exchange 8-bit min-max quantized *differences* of
successive models (docs/paper-vs-code.md, "8-bit messages (Bagua's min-max quantizer)"; Bagua's page
https://tutorials.baguasys.com/algorithms/low-precision-decentralized).

.. math::
    x_{t+1/2}^{(i)} &= \sum_j W_{ij}\, \hat x_t^{(j)} - lr\, d_t^{(i)}
        = \tilde x_t^{(i)} + \eta \sum_j (W_{ij} - I_{ij})\, \hat x_t^{(j)} \\
    c_t^{(i)} &= Q[x_{t+1/2}^{(i)} - x_t^{(i)}], \qquad x_{t+1}^{(i)} = x_t^{(i)} + c_t^{(i)},
    \qquad \hat x_{t+1}^{(j)} = \hat x_t^{(j)} + c_t^{(j)}

with x̂_i = x_i for the node itself (η = 1 in Bagua). Replicas start equal to the models (all nodes
start from the same x_0) and receive every c_j, so x̂_j = x_j at all times: the simulator reads x_j
directly. Bagua requires fixed peers and a symmetric doubly stochastic W (its ring uses 1/3); it has
no push-sum, so u stays 1. Q is the configured compressor (minmax8 = Bagua's MinMaxUInt8, but per
tensor rather than per flattened bucket). Σ_i x_i is not conserved (each node applies its own
quantization error).

One node (`init_node`, a distributed rank) cannot read x_j: it keeps x̂ for itself and each
in-neighbour in `State.xhat` (all x_0 at start), updated by every c_j it receives.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from ..compress import compress
from .base import (GossipCfg, Message, Round, absorb_replica, out_degree, refuse_frozen,
                   require_fixed_doubly_stochastic, residual)


def _always(cfg: GossipCfg) -> bool:
    return True


MESSAGE = Message(push_sum_weight=False, catch_up=_always)  # node j sends c_j only (u stays 1)


class State(NamedTuple):
    xhat: Optional[torch.Tensor] = None  # (m, d) x̂ of every sender (own rows first); None: read x


def init(x: torch.Tensor, *, topology, cfg: GossipCfg) -> State:
    require_fixed_doubly_stochastic("bagua-lp", topology, symmetric=True, why="undirected peers",
                                    hint=" (use 'ring' or 'torus')")
    return State()


def init_node(x: torch.Tensor, *, senders: int, topology, cfg: GossipCfg, layout=None) -> State:
    """One node's state (x: its own row x_0): x̂ of itself and of `senders` in-neighbours, all
    x_0 (every node starts from the same x_0). The forward pass moves frozen tensors of x
    (layout.frozen) outside gossip, which no replica sees: refused."""
    init(x, topology=topology, cfg=cfg)
    refuse_frozen("bagua-lp", layout, "keeps replicas of its peers' models")
    return State(xhat=torch.cat([x] + [x] * senders))


absorb = absorb_replica  # a missed message: x̂_j += its payload


def outgoing(state: State, *, x: torch.Tensor, x_tilde: torch.Tensor, W: torch.Tensor,
             cfg: GossipCfg) -> torch.Tensor:
    """v_i = x_{t+1/2} − x_i = x̃_i + η Σ_j (W_ij − I_ij) x̂_j − x_i, sent as c_i = Q[v_i]."""
    x_half = x_tilde + cfg.eta * residual(W, x if state.xhat is None else state.xhat)
    return x_half - x


def mix(state: State, *, v: torch.Tensor, c: torch.Tensor, x: torch.Tensor, x_tilde: torch.Tensor,
        u: torch.Tensor, W: torch.Tensor, t: int, cfg: GossipCfg) -> Round:
    """x_{t+1} = x + c and x̂_j += c_j for every sender j (c: every sender's c_j, own rows first)."""
    xhat = None if state.xhat is None else state.xhat + c
    return Round(x=x + c[:x.shape[0]], u=u, state=State(xhat=xhat), sent=out_degree(W))


def step(state: State, *, x: torch.Tensor, x_tilde: torch.Tensor, u: torch.Tensor,
         W: torch.Tensor, t: int, cfg: GossipCfg, layout, generator=None) -> Round:
    v = outgoing(state, x=x, x_tilde=x_tilde, W=W, cfg=cfg)
    return mix(state, v=v, c=compress(v, layout, cfg.compressor, generator), x=x, x_tilde=x_tilde,
               u=u, W=W, t=t, cfg=cfg)
