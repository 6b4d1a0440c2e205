r"""Several runs ("cells") in one stacked state: a pack.

K cells that share the model, the algorithm, the optimizer and the node count n, but differ in
their graph, their message compression and η, or their seed, train as one simulator of K·n rows.
Cell k holds rows k·n … (k+1)·n − 1. The forward and backward pass, the optimizer step and the
8-bit layers run once over all K·n rows (the batched executor stacks them like nodes); the mixing
is block-diagonal,

.. math::
    W^{pack}(t) = \operatorname{diag}\big(W^{(1)}(t), \dots, W^{(K)}(t)\big),

applied block by block: each cell's gossip round is its own algorithm call on its rows, with its
own compressor, η and algorithm state, so no value crosses from one cell to another (a cell that
diverges cannot reach the others, not even as 0·NaN in a shared matrix product). Each cell starts
from the x_0 of its own seed, so a packed cell computes what its solo run computes; only the
summation order of the stacked kernels, and the 8-bit layers' stochastic-rounding draws (one stream
for the pack), differ (lpdl_core.training.pack, whose tests compare the two).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import Callable

import numpy as np
import torch
from torch import nn

from ...specs.executors import IN_PROCESS_EXECUTORS, executor_spec
from ..algorithms.base import GossipCfg, Round
from ..compress import message_bytes
from ..layout import node_parameters
from ..optim import OptimCfg
from ..topology import Topology
from .engine_cfg import EngineCfg
from .simulator import Simulator, restored


@dataclass(frozen=True, kw_only=True)
class PackMember:
    """One cell of a pack: its graph (n nodes), its gossip settings and the seed of its x_0."""

    topology: Topology
    gossip: GossipCfg
    seed: int


@dataclass(frozen=True)
class BlockTopology:
    """The pack's graph: the members' graphs side by side (block-diagonal W, no edge between blocks)."""

    members: tuple[Topology, ...]

    def __post_init__(self) -> None:
        if not self.members:
            raise ValueError("a pack needs at least one cell")

    @property
    def n(self) -> int:
        return sum(t.n for t in self.members)

    @property
    def name(self) -> str:
        return "pack(" + ", ".join(f"{t.name}/{t.n}" for t in self.members) + ")"

    @cached_property
    def period(self) -> int:
        return math.lcm(*(t.period for t in self.members))

    @property
    def time_varying(self) -> bool:
        return self.period > 1

    def W(self, t: int = 0) -> np.ndarray:
        out = np.zeros((self.n, self.n))
        start = 0
        for topo in self.members:
            out[start:start + topo.n, start:start + topo.n] = topo.W(t)
            start += topo.n
        return out


class PackedSimulator(Simulator):
    """A Simulator whose rows are K cells' nodes (the module docstring). Rows of cell k: rows[k]."""

    def __init__(self, make_model: Callable[[], nn.Module], *, members: list[PackMember],
                 optim_cfg: OptimCfg = OptimCfg(), engine: EngineCfg = EngineCfg(), param_transform=None):
        members = list(members)
        check_packable(members, engine)
        self.members = members
        n = members[0].topology.n
        self.rows_of = [slice(k * n, (k + 1) * n) for k in range(len(members))]
        super().__init__(make_model, topology=BlockTopology(tuple(m.topology for m in members)),
                         gossip=members[0].gossip, optim_cfg=optim_cfg, engine=engine,
                         param_transform=param_transform)
        self.member_bytes = [message_bytes(self.layout, m.gossip.compressor,
                                           push_sum_weight=self.algorithm.MESSAGE.push_sum_weight)
                             for m in members]
        for m, rows in zip(members, self.rows_of):  # each cell's x_0 from its own seed
            if m.seed != engine.seed:
                torch.manual_seed(m.seed)
                model = make_model()
                self.x[rows] = self.layout.flatten([p.detach() for _, p in node_parameters(model)]).to(self.device)
        self.z.copy_(self.x / self.u[:, None])
        # state that starts from x_0 (GUT's copies of every model) starts from each cell's own x_0
        self.algo_state = self._init_algorithm()

    def _init_algorithm(self):
        return tuple(self.algorithm.init(self.x[rows], topology=m.topology, cfg=m.gossip)
                     for m, rows in zip(self.members, self.rows_of))

    def _algorithm_round(self, state, *, x, x_tilde, u, W, t, generator) -> tuple[Round, torch.Tensor]:
        rounds, sent = [], []
        for m, rows, st, mb in zip(self.members, self.rows_of, state, self.member_bytes):
            r = self.algorithm.step(st, x=x[rows], x_tilde=x_tilde[rows], u=u[rows], W=W[rows, rows], t=t,
                                    cfg=m.gossip, layout=self.layout, generator=None)
            rounds.append(r)
            sent.append(r.sent.to(torch.float64) * mb)
        joined = Round(x=torch.cat([r.x for r in rounds]), u=torch.cat([r.u for r in rounds]),
                       state=tuple(r.state for r in rounds), sent=torch.cat([r.sent for r in rounds]))
        return joined, torch.cat(sent)

    def _algo_state_dict(self) -> dict:
        return {"members": [dict(s._asdict()) for s in self.algo_state]}

    def _load_algo_state(self, algo: dict, own: Callable):
        states = algo["members"]
        if len(states) != len(self.members):
            raise ValueError(f"checkpoint holds {len(states)} cells, this pack {len(self.members)}")
        return tuple(restored(s, d, own) for s, d in zip(self.algo_state, states))

    def _merge_groups(self) -> list[slice]:
        return list(self.rows_of)  # an all-reduce never mixes cells

    def cell_average(self, k: int) -> torch.Tensor:
        """z̄ of cell k: the mean of its rows of z, shape (d,)."""
        return self.z[self.rows_of[k]].mean(0)


def check_packable(members: list[PackMember], engine: EngineCfg) -> None:
    """One-line errors for members that cannot share one stacked state."""
    if not members:
        raise ValueError("a pack needs at least one cell")
    if not executor_spec(engine.executor).packable:
        raise ValueError(f"a pack runs in one process (executor {' or '.join(IN_PROCESS_EXECUTORS)}), "
                         f"got {engine.executor!r}")
    sizes = sorted({m.topology.n for m in members})
    if len(sizes) > 1:
        raise ValueError(f"the cells of a pack need the same number of nodes, got {sizes}")
    algos = sorted({m.gossip.algorithm for m in members})
    if len(algos) > 1:
        raise ValueError(f"the cells of a pack need the same algorithm, got {', '.join(algos)}")
    for m in members:
        if m.gossip.compressor.is_random:
            raise ValueError("a pack needs deterministic compressors (identity or topk), "
                             f"got {m.gossip.compressor.kind!r}")
    first = members[0].gossip
    for m in members[1:]:
        if (m.gossip.choco_form, m.gossip.choco_replicas) != (first.choco_form, first.choco_replicas):
            raise ValueError("the cells of a pack need the same CHOCO form and replicas")
