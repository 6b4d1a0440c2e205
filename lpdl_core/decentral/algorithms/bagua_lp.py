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
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch

from ..compress import compress
from .base import GossipCfg, Message, Round, out_degree, residual

MESSAGE = Message(push_sum_weight=False)  # node j sends c_j only (no push-sum: u stays 1)


class State(NamedTuple):
    pass


def init(x: torch.Tensor, *, topology, cfg: GossipCfg) -> State:
    if topology is not None:
        if topology.time_varying:
            raise ValueError("bagua-lp needs fixed peers; the topology "
                             f"{topology.name!r} is time-varying")
        W = topology.W(0)
        if not (np.allclose(W, W.T) and np.allclose(W.sum(0), 1)):
            raise ValueError(f"bagua-lp needs a symmetric doubly stochastic W (undirected peers); "
                             f"{topology.name!r} with n={topology.n} is not (use 'ring' or 'torus')")
    return State()


def step(state: State, *, x: torch.Tensor, x_tilde: torch.Tensor, u: torch.Tensor,
         W: torch.Tensor, t: int, cfg: GossipCfg, layout, generator=None) -> Round:
    x_half = x_tilde + cfg.eta * residual(W, x)
    c = compress(x_half - x, layout, cfg.compressor, generator)
    return Round(x=x + c, u=u, state=state, sent=out_degree(W))
