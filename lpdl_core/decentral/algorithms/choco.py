r"""CHOCO-SGD in its Quant-SGP form: compressed model-difference gossip with public copies x̂
and push-sum (paper Alg. 5; Koloskova et al. 2019, Taheri et al. 2020).

.. math::
    q_t^{(i)} &= C[\tilde x_t^{(i)} - \hat x_t^{(i)}], \qquad
    \hat x_{t+1}^{(j)} = \hat x_t^{(j)} + q_t^{(j)} \quad (\text{at } i \text{ for } j \in N_i^{in} \cup \{i\}) \\
    x_{t+1}^{(i)} &= \tilde x_t^{(i)} + \eta \sum_j (W_{ij} - I_{ij})(\hat x_{t+1}^{(j)} - \hat x_{t+1}^{(i)})
        \quad(\text{paper form}) \\
    u_{t+1}^{(i)} &= u_t^{(i)} + \eta \sum_j (W_{ij} - I_{ij})\, u_t^{(j)}

The official code writes the consensus term as Σ_j (W_ij − I_ij) x̂_j ("code" form). The two
differ by (1 − Σ_j W_ij) x̂_i, zero whenever W's rows sum to 1 (every regular uniform graph);
only the code form conserves Σ_i x_i on irregular directed graphs.

Replicas. Node i keeps a copy of x̂_j for each in-neighbour j. On a static graph every in-edge
delivers every q_j, so each copy equals x̂_j at all times and the simulator reads x̂_j directly
(no E extra model copies). On a time-varying graph copies are stored per edge (j → i); when an
edge is active the sender replays the q_j the receiver missed (counted as that many messages), so
the copy is exact again and the update uses the current W_ij. The official code instead keeps one
pre-weighted aggregate S_i = Σ_{j∈in(i)} w q_j (option choco_replicas="official-aggregate"),
which is wrong once the in-neighbours or weights change. With η = 1 and no compression,
x̂_i = x̃_i after every step and CHOCO is exactly D-PSGD/SGP.

One node (`init_node`, a distributed rank) keeps x̂ for itself and one copy per in-neighbour in
the rows of `State.xhat`, updated by every q_j it receives; on a time-varying graph the missed
q_j are replayed (`MESSAGE.catch_up`) and folded in by `absorb` before the round's own q_j.
"""
from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from ..compress import compress
from .base import GossipCfg, Message, Round, absorb_replica, off_diagonal, out_degree, push_sum_weights


def _per_neighbour(cfg: GossipCfg) -> bool:
    return cfg.choco_replicas == "per-neighbour"  # the official aggregate never replays


MESSAGE = Message(push_sum_weight=True, catch_up=_per_neighbour)  # node j sends q_j and u_j


class State(NamedTuple):
    xhat: torch.Tensor                 # (m, d) x̂ of every sender (own rows first); zeros at start
    replicas: Optional[torch.Tensor]   # (E, d) copy of x̂_src at dst, time-varying graphs only
    src: Optional[torch.Tensor]        # (E,) long, sender of each edge
    dst: Optional[torch.Tensor]        # (E,) long, receiver of each edge
    last_sync: Optional[torch.Tensor]  # (E,) long, last round the edge was active (-1: never)
    aggregate: Optional[torch.Tensor]  # (r, d) official S_i, "official-aggregate" only


def init(x: torch.Tensor, *, topology, cfg: GossipCfg) -> State:
    xhat = torch.zeros_like(x)
    if cfg.choco_replicas == "official-aggregate":
        return State(xhat, None, None, None, None, torch.zeros_like(x))
    if topology is None or not topology.time_varying:
        return State(xhat, None, None, None, None, None)
    edges = topology.edges()
    src = torch.tensor([j for j, _ in edges], dtype=torch.long, device=x.device)
    dst = torch.tensor([i for _, i in edges], dtype=torch.long, device=x.device)
    replicas = x.new_zeros((len(edges), x.shape[1]))
    last_sync = torch.full((len(edges),), -1, dtype=torch.long, device=x.device)
    return State(xhat, replicas, src, dst, last_sync, None)


def init_node(x: torch.Tensor, *, senders: int, topology=None, cfg: GossipCfg,
              layout=None) -> State:
    """One node's state (x: its own row): x̂ for itself and a copy for each of `senders`
    in-neighbours, all zeros as every x̂ starts; the official aggregate S_i when asked for."""
    xhat = x.new_zeros((x.shape[0] + senders, x.shape[1]))
    aggregate = torch.zeros_like(x) if cfg.choco_replicas == "official-aggregate" else None
    return State(xhat, None, None, None, None, aggregate)


absorb = absorb_replica  # a missed message: x̂_j += its payload


def outgoing(state: State, *, x: torch.Tensor, x_tilde: torch.Tensor, W: torch.Tensor,
             cfg: GossipCfg) -> torch.Tensor:
    """v_i = x̃_i − x̂_i, sent as q_i = C[v_i]."""
    return x_tilde - state.xhat[:x_tilde.shape[0]]


def consensus(state: State, *, c: torch.Tensor, W: torch.Tensor, t: int, cfg: GossipCfg,
              r: int) -> tuple[torch.Tensor, State, torch.Tensor]:
    """x̂_j += q_j for every sender j (c: every sender's q_j), then the r receivers' consensus
    term Σ_j (W_ij − I_ij)(x̂_j − x̂_i) (or the code form): (term, new state, messages sent).
    Shared with AdaGossip, which scales the same term per coordinate."""
    xhat = state.xhat + c
    W_off = off_diagonal(W)  # in-edge weights only
    sent = out_degree(W)
    replicas, last_sync, aggregate = state.replicas, state.last_sync, state.aggregate

    if aggregate is not None:
        # Official: S_i += Σ_in w q_j with this round's weights, never re-weighted.
        aggregate = aggregate + W_off @ c
        S = aggregate
    elif replicas is None:
        S = W_off @ xhat  # every copy of x̂_j equals x̂_j (static graph, or caught up)
    else:
        w_e = W[state.dst, state.src]
        active = w_e != 0
        # Catch-up: the receiver applies every q_j it missed, so its copy equals x̂_j again.
        replicas = torch.where(active[:, None], xhat[state.src], replicas)
        backlog = (t - last_sync).clamp(min=1).to(xhat.dtype) * active.to(xhat.dtype)
        sent = torch.zeros_like(sent).index_add_(0, state.src, backlog)
        last_sync = torch.where(active, t, last_sync)  # t: an int, or a compiled step's long tensor
        S = torch.zeros_like(xhat).index_add_(0, state.dst, w_e[:, None] * replicas)

    own = xhat[:r]
    if cfg.choco_form == "paper":
        term = S - W_off.sum(1, keepdim=True) * own
    else:
        term = S + (torch.diagonal(W) - 1.0)[:, None] * own
    return term, State(xhat, replicas, state.src, state.dst, last_sync, aggregate), sent


def mix(state: State, *, v: torch.Tensor, c: torch.Tensor, x: torch.Tensor, x_tilde: torch.Tensor,
        u: torch.Tensor, W: torch.Tensor, t: int, cfg: GossipCfg) -> Round:
    """x̂_j += q_j for every sender j, then the consensus step (c: every sender's q_j)."""
    term, new_state, sent = consensus(state, c=c, W=W, t=t, cfg=cfg, r=x_tilde.shape[0])
    x_next = x_tilde + cfg.eta * term
    return Round(x=x_next, u=push_sum_weights(u, W, cfg.eta), state=new_state, sent=sent)


def step(state: State, *, x: torch.Tensor, x_tilde: torch.Tensor, u: torch.Tensor,
         W: torch.Tensor, t: int, cfg: GossipCfg, layout, generator=None) -> Round:
    v = outgoing(state, x=x, x_tilde=x_tilde, W=W, cfg=cfg)
    return mix(state, v=v, c=compress(v, layout, cfg.compressor, generator), x=x, x_tilde=x_tilde,
               u=u, W=W, t=t, cfg=cfg)
