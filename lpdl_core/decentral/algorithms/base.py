"""What every gossip algorithm shares: its config, what its messages carry, the result of one
round, and the two mixing primitives (W - I) X and the push-sum weight update (paper Alg. 4/5,
line 9).

Every algorithm module defines the same functions: `init` (the simulator's state for all n nodes),
`init_node` (the state of one node that holds its own row and replicas of its in-neighbours'),
`outgoing` (the message v_i before compression), `mix` (the round, given every sender's C(v_j))
and `step` = mix after outgoing and `compress`. The simulator calls `step` on all n nodes at once.

Receivers and senders. `mix` and `outgoing` take W as an (r, m) block: rows the r nodes being
updated, columns the m nodes whose messages they read, the receivers being the first r senders.
The simulator passes all nodes (r = m = n, W square). A distributed rank passes its own row and
its in-neighbours (r = 1; lpdl_core.decentral.engine.distributed). The senders' C(v_j), their
push-sum weights u_j (when the message carries them) and replicas kept in the algorithm's state
have m rows; every other node-stacked input (x, x̃, own buffers) has r.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

from ...config import ALGORITHMS, FIDELITY_CHOICES
from ...specs.algorithms import SPECS as ALGORITHM_SPECS
from ..compress import CompressorCfg


@dataclass(frozen=True, kw_only=True)
class GossipCfg:
    """Consensus step of every node.

    algorithm: "dpsgd" (D-PSGD/SGP with push-sum), "ds" (Deep-Squeeze as Sparse-Push, Alg. 4),
        "choco" (CHOCO-SGD as Quant-SGP, Alg. 5), "bagua-lp" (Bagua's low-precision
        decentralized SGD: 8-bit min-max quantized model differences), "adagossip" (CHOCO's
        compressed gossip with a per-coordinate adaptive consensus step, Aketi et al. 2024),
        "gut" (Global Update Tracking, Aketi et al. 2023: uncompressed, η = 1; QG-GUTm with
        gut_momentum > 0 and the optimizer's momentum "none").
    eta: the averaging rate η (the supplement calls it γ): 1 without compression, 0.01 at 99%.
    compressor: C(·), applied layer-wise to what each node sends.
    choco_form: "paper" uses Σ_j (W_ij − I_ij)(x̂_j − x̂_i) as Alg. 5 writes it; "code" uses the
        official code's Σ_j (W_ij − I_ij) x̂_j. Equal whenever the rows of W sum to 1.
    choco_replicas: "per-neighbour" keeps node i's copy of every in-neighbour's x̂_j (correct on
        time-varying graphs); "official-aggregate" keeps the official code's single pre-weighted
        sum S_i = Σ_{j∈in(i)} w x̂_j (valid for static graphs only).
    adagossip_beta: AdaGossip's decay β of the consensus term's second moment (official 0.999).
    adagossip_eps: AdaGossip's ε added to the moment's square root (official 1e-8).
    gut_scaling: GUT's scaling μ of the tracking correction (official --scaling, default 0.9;
        0 gives D-PSGD).
    gut_momentum: the official GUT optimizer's heavy-ball momentum β on the tracked update
        (official --momentum, default 0; QG-GUTm: 0.9).
    """

    algorithm: str = "ds"                 # one of lpdl_core.config.ALGORITHMS
    eta: float = 1.0
    compressor: CompressorCfg = field(default_factory=CompressorCfg)
    choco_form: str = "paper"             # FIDELITY_CHOICES["choco_form"]
    choco_replicas: str = "per-neighbour"  # FIDELITY_CHOICES["choco_replicas"]
    adagossip_beta: float = 0.999
    adagossip_eps: float = 1e-8
    gut_scaling: float = 0.9
    gut_momentum: float = 0.0

    def __post_init__(self) -> None:
        if self.algorithm not in ALGORITHMS:
            raise ValueError(f"gossip.algorithm must be one of {ALGORITHMS}, got {self.algorithm!r}")
        if not 0.0 <= self.eta <= 1.0:
            raise ValueError(f"gossip.eta must be in [0, 1], got {self.eta}")
        if ALGORITHM_SPECS[self.algorithm].uncompressed and not self.compressor.is_identity:
            raise ValueError(f"gossip.algorithm {self.algorithm!r} sends uncompressed messages, so it takes "
                             "compressor identity (lpdl_core.specs.algorithms); use 'ds' or 'choco' for a "
                             "compressed exchange")
        if not 0.0 <= self.adagossip_beta < 1.0:
            raise ValueError(f"gossip.adagossip_beta must be in [0, 1), got {self.adagossip_beta}")
        if not 0.0 < self.adagossip_eps < float("inf"):
            raise ValueError(f"gossip.adagossip_eps must be positive and finite, got {self.adagossip_eps}")
        if not 0.0 <= self.gut_scaling < float("inf"):
            raise ValueError(f"gossip.gut_scaling must be >= 0 and finite, got {self.gut_scaling}")
        if not 0.0 <= self.gut_momentum < 1.0:
            raise ValueError(f"gossip.gut_momentum must be in [0, 1), got {self.gut_momentum}")
        if self.algorithm == "gut" and self.eta != 1.0:
            raise ValueError("gossip.algorithm 'gut' tracks its updates at the official averaging rate "
                             f"(eta must be 1, got eta {self.eta})")
        for name in ("choco_form", "choco_replicas"):  # the fidelity options' values, declared once
            if getattr(self, name) not in FIDELITY_CHOICES[name]:
                raise ValueError(f"gossip.{name} must be one of {', '.join(FIDELITY_CHOICES[name])}, "
                                 f"got {getattr(self, name)!r}")


def _never(cfg: GossipCfg) -> bool:
    return False


@dataclass(frozen=True, kw_only=True)
class Message:
    """What one gossip message carries besides the compressed payload C(·) (declared by each
    algorithm module as `MESSAGE`; the simulator sizes messages from it).

    push_sum_weight: the sender's push-sum weight u_j rides along (4 bytes, float32), as in the
        push-sum algorithms' u_{t+1} = u_t + η Σ_j (W_ij − I_ij) u_j. False when u stays 1.
    catch_up: cfg -> True when receivers keep a replica of each sender that every payload updates
        (x̂_j += C(v_j), applied by the module's `absorb`): an edge idle for some rounds then
        replays, on its next active round, every payload its receiver missed, oldest first (each
        counted as one message).
    """

    push_sum_weight: bool
    catch_up: Callable[[GossipCfg], bool] = _never

    def __post_init__(self) -> None:
        if not isinstance(self.push_sum_weight, bool):
            raise ValueError(f"Message.push_sum_weight must be a bool, got {self.push_sum_weight!r}")
        if not callable(self.catch_up):
            raise ValueError(f"Message.catch_up must be callable, got {self.catch_up!r}")


class Round(NamedTuple):
    """Outcome of one gossip round for the r receivers (all n nodes in the simulator)."""

    x: torch.Tensor  # (r, d) x_{t+1}, push-sum numerators after the consensus step
    u: torch.Tensor  # (r,)   u_{t+1}, push-sum weights
    state: Any       # the algorithm's own state (error buffers, x̂, replicas, ...)
    sent: torch.Tensor  # (n,) messages each node sent this round (bytes = sent * message bytes)


def residual(W: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """(W − I) y for stacked sender values y of shape (m, ...) and W of shape (r, m), the r
    receivers being the first r senders: row i is Σ_j (W_ij − I_ij) y_j."""
    flat = y.reshape(y.shape[0], -1)
    r = W.shape[0]
    return (W @ flat - flat[:r]).reshape(r, *y.shape[1:])


def push_sum_weights(u: torch.Tensor, W: torch.Tensor, eta: float) -> torch.Tensor:
    """u_{t+1} = u_t + η Σ_j (W_ij − I_ij) u_j (Alg. 4/5 line 9). u ≡ 1 on regular graphs."""
    return u[:W.shape[0]] + eta * residual(W, u)


def off_diagonal(W: torch.Tensor) -> torch.Tensor:
    """W with the receivers' self weights W_ii zeroed: the in-edge weights only."""
    return W.clone().fill_diagonal_(0.0)


def out_degree(W: torch.Tensor) -> torch.Tensor:
    """Messages each node sends this round: non-zero off-diagonal entries of its column."""
    nz = (W != 0).to(W.dtype)
    return nz.sum(0) - torch.diagonal(nz)


def absorb_replica(state, row: int, c: torch.Tensor):
    """A missed message of sender `row` folded into this node's replica of it: x̂_row += c (the
    catch-up of algorithms whose receivers keep replicas, CHOCO and Bagua; `state` has `xhat`)."""
    xhat = state.xhat.clone()
    xhat[row] += c
    return state._replace(xhat=xhat)


def require_fixed_doubly_stochastic(name: str, topology, *, symmetric: bool = False, why: str,
                                    hint: str = "") -> None:
    """For algorithms without push-sum that keep replicas of fixed peers (bagua-lp, gut): refuse a
    time-varying graph, and a W that is not doubly stochastic (and symmetric, if asked), in one
    line. topology None: nothing to check (a distributed rank's own row)."""
    if topology is None:
        return
    if topology.time_varying:
        raise ValueError(f"{name} needs fixed peers; the topology {topology.name!r} is time-varying")
    W = topology.W(0)
    if not (np.allclose(W.sum(0), 1) and np.allclose(W.sum(1), 1) and (not symmetric or np.allclose(W, W.T))):
        kind = "symmetric doubly stochastic" if symmetric else "doubly stochastic"
        raise ValueError(f"{name} needs a {kind} W ({why}); {topology.name!r} with n={topology.n} is not{hint}")


def refuse_frozen(name: str, layout, keeps: str) -> None:
    """Replicas (or model copies) of x cannot follow the tensors the forward pass updates outside
    gossip (layout.frozen, e.g. 8-bit activation ranges kept as parameters): one line."""
    if layout is not None and layout.frozen:
        raise ValueError(f"{name} {keeps}, which cannot follow frozen tensors that the forward pass "
                         f"updates ({sorted(layout.frozen)})")
