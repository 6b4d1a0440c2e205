r"""AdaGossip: CHOCO-SGD's compressed gossip with an adaptive, per-coordinate consensus step size
(Aketi, Hashemi and Roy 2024, "AdaGossip: Adaptive Consensus Step-size for Decentralized Deep
Learning with Communication Compression"; official code `aparna-aketi/AdaG_SGD`,
`gossip_choco/distributed.py`, `_query_gossip_queue` with `ada_gamma`).

.. math::
    q_t^{(i)} &= C[\tilde x_t^{(i)} - \hat x_t^{(i)}], \qquad
    \hat x_{t+1}^{(j)} = \hat x_t^{(j)} + q_t^{(j)} \quad (\text{at } i \text{ for } j \in N_i^{in} \cup \{i\}) \\
    e_t^{(i)} &= \sum_j (W_{ij} - I_{ij})(\hat x_{t+1}^{(j)} - \hat x_{t+1}^{(i)})
        \quad(\text{CHOCO's consensus term, paper form}) \\
    m_t^{(i)} &= \beta\, m_{t-1}^{(i)} + (1 - \beta)\, e_t^{(i)} \odot e_t^{(i)}, \qquad m_{-1}^{(i)} = 0 \\
    \gamma_t^{(i)} &= \min\Big(\frac{\eta}{\sqrt{m_t^{(i)} / (1 - \beta^{t+1})} + \epsilon},\ 1\Big)
        \quad(\text{elementwise}) \\
    x_{t+1}^{(i)} &= \tilde x_t^{(i)} + \gamma_t^{(i)} \odot e_t^{(i)}, \qquad u_{t+1}^{(i)} = u_t^{(i)} = 1

η is the base consensus step (the official `--gamma`), β = `adagossip_beta` (0.999) and
ε = `adagossip_eps` (1e-8), the official defaults; t + 1 counts the rounds mixed so far (the
official `t`, 1 at the first round). Everything up to e_t is CHOCO's (`choco.consensus`): the
"paper"/"code" forms (`choco_form`), the per-neighbour replicas with catch-up on time-varying
graphs or the official single aggregate (`choco_replicas`) carry over unchanged. The official code
runs the code form Σ_j (W_ij − I_ij) x̂_j with the aggregate; both forms agree on regular graphs.

No push-sum: the step differs per node and per coordinate, so one scalar weight u_i cannot track
the mass, and the official code (uniform weights on regular graphs, where u ≡ 1 anyway) sends
none. u stays 1, so nothing de-biases an irregular W (random-directed): there the paper form, whose
fixed points are agreements, still brings the nodes together, the code form does not. Σ_i x_i is
not conserved on any graph (each node takes its own step) unless every γ is 1.

Limits. η = 0 never mixes (γ ≡ 0). With η = 1, while every bias-corrected m stays at or below
(1 − ε)² (small consensus terms), γ clamps to 1 and the round is exactly CHOCO's at η = 1; without
compression that is D-PSGD/SGP.

One node (`init_node`, a distributed rank) keeps CHOCO's x̂ rows for itself and its in-neighbours,
plus its own m row and the round count.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from ..compress import compress
from . import choco
from .base import GossipCfg, Message, Round, absorb_replica

MESSAGE = Message(push_sum_weight=False, catch_up=choco.MESSAGE.catch_up)  # node j sends q_j only


class State(NamedTuple):
    xhat: torch.Tensor                 # CHOCO's state, field for field (choco.State)
    replicas: Optional[torch.Tensor]
    src: Optional[torch.Tensor]
    dst: Optional[torch.Tensor]
    last_sync: Optional[torch.Tensor]
    aggregate: Optional[torch.Tensor]
    moment: torch.Tensor               # (r, d) m: moving average of e ⊙ e, zeros at start
    rounds: torch.Tensor               # () float64, rounds mixed so far (β's exponent), 0 at start


def _with_moment(cs: choco.State, x: torch.Tensor) -> State:
    return State(*cs, moment=torch.zeros_like(x), rounds=torch.zeros((), dtype=torch.float64, device=x.device))


def init(x: torch.Tensor, *, topology, cfg: GossipCfg) -> State:
    return _with_moment(choco.init(x, topology=topology, cfg=cfg), x)


def init_node(x: torch.Tensor, *, senders: int, topology=None, cfg: GossipCfg, layout=None) -> State:
    """One node's state (x: its own row): CHOCO's x̂ for itself and each of `senders`
    in-neighbours, its m row and the round count."""
    return _with_moment(choco.init_node(x, senders=senders, topology=topology, cfg=cfg), x)


absorb = absorb_replica  # a missed message: x̂_j += its payload
outgoing = choco.outgoing  # v_i = x̃_i − x̂_i, sent as q_i = C[v_i]


def mix(state: State, *, v: torch.Tensor, c: torch.Tensor, x: torch.Tensor, x_tilde: torch.Tensor,
        u: torch.Tensor, W: torch.Tensor, t: int, cfg: GossipCfg) -> Round:
    """x̂_j += q_j, CHOCO's consensus term e, then x̃ + γ ⊙ e with γ from e's second moment."""
    e, cs, sent = choco.consensus(choco.State(*state[:6]), c=c, W=W, t=t, cfg=cfg, r=x_tilde.shape[0])
    beta = cfg.adagossip_beta
    moment = torch.addcmul(state.moment * beta, e, e, value=1.0 - beta)
    rounds = state.rounds + 1
    denom = (moment / (1.0 - beta ** rounds)).sqrt() + cfg.adagossip_eps
    # η / denom as a division (a Python scalar over a tensor would multiply by its reciprocal)
    gamma = torch.clamp(torch.full_like(denom, cfg.eta) / denom, max=1.0)
    return Round(x=x_tilde + e * gamma, u=u, state=State(*cs, moment=moment, rounds=rounds), sent=sent)


def step(state: State, *, x: torch.Tensor, x_tilde: torch.Tensor, u: torch.Tensor,
         W: torch.Tensor, t: int, cfg: GossipCfg, layout, generator=None) -> Round:
    v = outgoing(state, x=x, x_tilde=x_tilde, W=W, cfg=cfg)
    return mix(state, v=v, c=compress(v, layout, cfg.compressor, generator), x=x, x_tilde=x_tilde,
               u=u, W=W, t=t, cfg=cfg)
