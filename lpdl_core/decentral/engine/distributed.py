r"""The distributed executor: one process per node, gossip as real point-to-point messages.

A `NodeProcess` is the simulator restricted to row i = rank of its stacked state: x_i, u_i, z_i,
the optimizer buffers and the algorithm's own rows (δ_i, x̂_i, ...) plus, where the algorithm
keeps them, replicas of its in-neighbours' values (CHOCO's x̂_j, Bagua's x̂_j: `init_node`). One
iteration is the simulator's (forward/backward at z_i on node i's batch, local step, gossip,
z_i = x_i / u_i); only the gossip round differs in where the numbers come from:

1. v_i = outgoing(...) with W's row i, then C(v_i) packed (`lpdl_core.decentral.wire`): the
   compressed payload (values and indices, or levels and scales, ...) and u_i if the algorithm
   sends it. The compressor's uniforms are the simulator's: the same generator (seed + 1) draws
   the whole (n, d) block every round and row i is used, so random-k / QSGD keep the same
   coordinates and roundings at every node.
2. The packed bytes go to each out-neighbour j (W_ji ≠ 0 at this round's t) and come from each
   in-neighbour (`p2p.exchange`); nothing else crosses the wire. With `MESSAGE.catch_up` a message
   on an idle edge carries every payload since its last active round, oldest first, which the
   receiver folds into its replica (`absorb`), as the simulator's catch-up does.
3. mix(...) with the received C(v_j), u_j and W's row i restricted to i and its in-neighbours: the
   same function the simulator runs on all n rows (the r = 1 receiver form of `algorithms.base`).

Global RNG (loop_rng=True, CPU). The loop executor draws every node's random numbers (8-bit
rounding, dropout, ...) from the one global generator, node after node, after building all n
models. mt19937 cannot jump ahead, so a node replays those draws: it builds the n - 1 models it
does not need, and at every step issues (unused) the random ops of the nodes before and after it,
of its own shapes (recorded once on a copy of its model through `noise`, default
`rng_replay.GLOBAL_DRAWS`, and checked at every step). GPU draws are not replayed: the node's own
forward/backward runs on the CPU loop executor. Costs (n - 1) times one node's draws;
loop_rng=False skips it (each process then draws its own numbers from the same seed).

Not one of `make_executor`'s: it replaces the Simulator in each of n processes, and runs its own
node's forward/backward on its spec's node_step (lpdl_core.specs.executors).

Bytes sent are counted from the tensors that left the process (for float32 state: the exact byte
metric, `compress.message_bytes`). The result equals the loop executor's row i up to float
summation order in Σ_j W_ij y_j (tests/test_distributed.py). z̄ and the consensus distance are
all-reduced for evaluation only. `state_dict` adds the wire's state (unsent history, each edge's
last active round), so a resumed rank continues the same messages (one checkpoint file per rank).
Runs use it through `lpdl train --executor distributed`; `torchrun --nproc-per-node 4 -m
lpdl_core.decentral.engine.selfcheck` checks a cluster's set-up (4 ranks against the loop).
"""
from __future__ import annotations

import copy
import time
from dataclasses import replace

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ...specs.executors import executor_spec
from .. import p2p, wire
from ..algorithms import GossipCfg, Round
from ..compress import REGISTRY, uniform_draws
from ..optim import OptimCfg
from ..topology import Topology
from .executors import LoopExecutor
from .rng_replay import GLOBAL_DRAWS
from .engine_cfg import EngineCfg
from .simulator import Simulator


NAME = "distributed"  # its registration: the per-node executor of lpdl_core.specs.executors
PHASES = ("compute", "compression", "communication")  # of a training step, timed per rank


class NodeProcess(Simulator):
    """Node `rank` (default: this process's rank) of `topology` in its own process; the process
    group must be initialized (`p2p.init`), one rank per node. Its attributes are the
    simulator's with one row: x, u, z (1, d), bytes_sent (1,), ...; train_step, forward_round and
    gossip_round take this node's batch (1, B, ...). timeout_s bounds each wait for a message (None:
    the group's); loop_rng, noise (replay(draws) and a record() context): the module docstring."""

    def __init__(self, make_model, *, topology: Topology, gossip: GossipCfg = GossipCfg(),
                 optim_cfg: OptimCfg = OptimCfg(), engine: EngineCfg = EngineCfg(),
                 loss_fn=F.cross_entropy, rank: int | None = None, timeout_s: float | None = None,
                 loop_rng: bool = True, noise=GLOBAL_DRAWS):
        if not dist.is_initialized():
            raise ValueError("the distributed executor runs in a process group of one process per node (start "
                             "it with `lpdl train --executor distributed`, torchrun or srun)")
        self.rank = dist.get_rank() if rank is None else rank
        if dist.get_world_size() != topology.n:
            raise ValueError(f"{topology.n} nodes need {topology.n} processes, got {dist.get_world_size()}")
        self.timeout = None if timeout_s is None else p2p.P2PCfg(timeout_s=timeout_s).timeout
        Ws = [topology.W(t) for t in range(topology.period)]
        i, n = self.rank, topology.n
        # senders: this node, then every in-neighbour of the schedule (the replicas' rows)
        self.senders = [i] + sorted({j for W in Ws for j in range(n) if j != i and W[i, j] != 0})
        self.receivers = sorted({j for W in Ws for j in range(n) if j != i and W[j, i] != 0})
        self._edges = [([j for j in self.receivers if W[j, i] != 0],
                        [b for b, j in enumerate(self.senders) if b and W[i, j] != 0]) for W in Ws]
        own = executor_spec(engine.executor).step_executor  # this node's forward/backward
        super().__init__(make_model, topology=topology, gossip=gossip, optim_cfg=optim_cfg,
                         engine=replace(engine, executor=own), loss_fn=loss_fn)
        self.rows = slice(self.rank, self.rank + 1)
        self.reset_clock()
        if loop_rng and not isinstance(self.executor, LoopExecutor):
            raise ValueError("loop_rng replays the loop executor's RNG stream: use the loop executor")
        if self.x.dtype != wire.WEIGHT_DTYPE:
            raise ValueError(f"the wire format carries float32 node state, got {self.x.dtype}")
        self.catch_up = self.algorithm.MESSAGE.catch_up(gossip)
        wire.codec_of(gossip.compressor)  # a compressor with no packed format: refused before any message
        self.size = wire.message_size(self.layout, gossip.compressor, dtype=self.x.dtype,
                                      push_sum_weight=self.algorithm.MESSAGE.push_sum_weight)
        self._history: dict[int, torch.Tensor] = {}     # own packed messages a receiver may miss
        self._last_out = dict.fromkeys(self.receivers, -1)  # last round each out-edge was active
        self._last_in = dict.fromkeys(self.senders[1:], -1)
        self.loop_rng, self.noise = loop_rng, noise
        self._noise: dict[tuple, list] = {}  # batch shape -> one node's draws in a forward/backward
        for _ in range(self.n - 1 if loop_rng else 0):
            make_model()  # the loop executor's other n - 1 models draw their initialisation

    def _rows(self) -> int:
        return 1

    # ---- across the nodes, by collectives of the whole group (evaluation and control only)
    def all_finite(self, t: torch.Tensor) -> bool:
        flag = torch.isfinite(t).all().to(torch.float32).reshape(1)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN)
        return bool(flag[0])

    def node_mean(self, t: torch.Tensor) -> float:
        return float(self.node_total(t.to(torch.float64).sum().reshape(1))[0]) / self.n

    def gather_rows(self, t: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(t) for _ in range(self.n)]
        dist.all_gather(parts, t.contiguous())
        return torch.cat(parts)

    def shard(self, size: int) -> slice:
        per = -(-size // self.n)
        return slice(min(self.rank * per, size), min((self.rank + 1) * per, size))

    def node_total(self, t: torch.Tensor) -> torch.Tensor:
        t = t.clone()
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def _group_means(self, rows: slice) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
        return self.average, self.average_buffers(), self.n  # collectives over all ranks

    def average_buffers(self) -> dict[str, torch.Tensor]:
        out = {}
        for k, b in self.executor.stacked_buffers().items():
            if b.is_floating_point():
                out[k] = self.node_total(b[0]) / self.n
            else:
                out[k] = b[0].clone()
                dist.broadcast(out[k], src=0)
        return out

    # ---- where a step's time goes
    def _tick(self, phase: str, t0: float) -> float:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        now = time.perf_counter()
        self.clock[phase] += now - t0
        return now

    def train_step(self, xb: torch.Tensor, yb: torch.Tensor, lr: float) -> torch.Tensor:
        t0, before = time.perf_counter(), {k: self.clock[k] for k in PHASES}
        losses = super().train_step(xb, yb, lr)
        self._tick("compute", t0)  # the whole step, less the compression and communication in it
        self.clock["compute"] -= sum(self.clock[k] - before[k] for k in PHASES if k != "compute")
        self.clock["steps"] += 1
        return losses

    def reset_clock(self) -> None:
        """Start timing afresh: seconds spent per phase and steps timed (see `step_split`)."""
        self.clock = dict.fromkeys(PHASES, 0.0) | {"steps": 0}

    def step_split(self) -> dict:
        """Mean seconds per training step of this rank, by phase: compute (forward/backward, local
        step, the algorithm's own arithmetic), compression (C(v) and packing, unpacking what came
        in) and communication (posting the messages and waiting for the in-neighbours'). On CUDA
        each phase ends with a synchronize."""
        k = max(self.clock["steps"], 1)
        return {"steps": self.clock["steps"], **{p: self.clock[p] / k for p in PHASES},
                "total": sum(self.clock[p] for p in PHASES) / k}

    def step_splits(self) -> list[dict]:
        """Every rank's `step_split`, rank order (a collective)."""
        every: list = [None] * self.n
        dist.all_gather_object(every, {"rank": self.rank, **self.step_split()})
        return every

    def state_dict(self) -> dict:
        """The simulator's state of this row, plus what the wire needs to continue: the own
        messages a receiver has not had yet, the last active round of each edge, the clock."""
        return {**super().state_dict(), "rank": self.rank, "history": dict(self._history),
                "last_out": dict(self._last_out), "last_in": dict(self._last_in), "clock": dict(self.clock)}

    def load_state_dict(self, sd: dict) -> None:
        if sd.get("rank") != self.rank:
            raise ValueError(f"checkpoint was written by rank {sd.get('rank')}, not {self.rank}")
        super().load_state_dict(sd)
        self._history = {int(t): b.clone() for t, b in sd["history"].items()}
        self._last_out = {int(j): int(t) for j, t in sd["last_out"].items()}
        self._last_in = {int(j): int(t) for j, t in sd["last_in"].items()}
        self.clock = {k: (int(v) if k == "steps" else float(v)) for k, v in sd["clock"].items()}

    @property
    def average(self) -> torch.Tensor:
        """z̄ = (1/n) Σ_i z_i, shape (d,), on every rank: one all-reduce (a collective of the whole
        group, so every rank must ask at the same point; evaluation only, never part of gossip)."""
        total = self.z[0].clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total / self.n

    def consensus_distance(self) -> float:
        """Ξ = sqrt((1/n) Σ_i ||z_i − z̄||²), the simulator's, from one more all-reduce of a scalar."""
        sq = ((self.z[0] - self.average) ** 2).sum().reshape(1).to(torch.float64)
        dist.all_reduce(sq, op=dist.ReduceOp.SUM)
        return float((sq[0] / self.n).sqrt())

    def _init_algorithm(self):
        return self.algorithm.init_node(self.x, senders=len(self.senders) - 1, topology=self.topology,
                                        cfg=self.gossip_cfg, layout=self.layout)

    def _loss_and_grad(self, xb: torch.Tensor, yb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # shared streams: every node draws what node 0 draws, from the same state, as each rank does
        # by itself; per node: replay the other nodes' share of the loop executor's stream
        if not self.loop_rng or self.noise is None or self.engine_cfg.rng_streams == "shared":
            return super()._loss_and_grad(xb, yb)
        shape = (tuple(xb.shape), tuple(yb.shape))  # an epoch's last batch may be smaller
        if shape not in self._noise:
            self._noise[shape] = self._noise_sizes(xb, yb)
        sizes = self._noise[shape]
        self.noise.replay(sizes * self.rank)  # nodes 0..i-1 draw first
        with self.noise.record() as drawn:
            out = super()._loss_and_grad(xb, yb)
        if drawn != sizes:
            raise RuntimeError("the random draws of a forward/backward changed between steps of one batch "
                               "shape; the loop executor's RNG stream cannot be replayed (use loop_rng=False)")
        self.noise.replay(sizes * (self.n - 1 - self.rank))
        return out

    def _noise_sizes(self, xb: torch.Tensor, yb: torch.Tensor) -> list:
        """One node's random draws in a forward/backward, on a copy of the model (RNG restored)."""
        with torch.random.fork_rng(devices=[]):
            module = copy.deepcopy(self.executor.reference_module()).train()
            with self.noise.record() as drawn:
                self.executor.loss_fn(module(xb[0]), yb[0]).backward()
        return drawn

    def _row(self, t: int) -> torch.Tensor:
        """W's row i over the senders at round t: (1, m)."""
        return self.W(t)[self.rank, self.senders][None]

    def _pack(self, v: torch.Tensor) -> torch.Tensor:
        comp = self.gossip_cfg.compressor
        draws = None
        if REGISTRY[comp.kind].random and not comp.is_identity:
            # the simulator's (n, d) draw of this round; row i is this node's
            draws = uniform_draws((self.n, self.layout.d), v, self.generator)[self.rank]
        weight = self.u[0] if self.algorithm.MESSAGE.push_sum_weight else None
        return wire.pack(v[0], self.layout, comp, draws=draws, weight=weight)

    def _unpack(self, buf: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        return wire.unpack(buf, self.layout, self.gossip_cfg.compressor, dtype=self.x.dtype,
                           push_sum_weight=self.algorithm.MESSAGE.push_sum_weight)

    def _round(self, x_tilde: torch.Tensor) -> tuple[Round, torch.Tensor]:
        t, cfg, algo = self.t, self.gossip_cfg, self.algorithm
        W = self._row(t)
        outs, ins = self._edges[t % self.topology.period]
        v = algo.outgoing(self.algo_state, x=self.x, x_tilde=x_tilde, W=W, cfg=cfg)
        t0 = time.perf_counter()
        buf = self._pack(v)
        c_own, _ = self._unpack(buf)  # what the receivers will decode
        t0 = self._tick("compression", t0)
        first = {j: (self._last_out[j] + 1 if self.catch_up else t) for j in outs}
        self._history[t] = buf
        sends = {j: torch.cat([self._history[s] for s in range(first[j], t + 1)]) for j in outs}
        recvs = {self.senders[b]: self.size * (t - self._last_in[self.senders[b]] if self.catch_up else 1)
                 for b in ins}
        got, nbytes = p2p.exchange(sends, recvs, timeout=self.timeout, device=self.x.device)
        t0 = self._tick("communication", t0)
        for j in outs:
            self._last_out[j] = t
        keep = min(self._last_out.values(), default=t) if self.catch_up else t
        self._history = {s: b for s, b in self._history.items() if s > keep}

        state = self.algo_state
        c = self.x.new_zeros((len(self.senders), self.layout.d))
        u = self.x.new_zeros(len(self.senders))
        c[0], u[0] = c_own, self.u[0]
        for b in ins:
            j = self.senders[b]
            *missed, last = got[j].view(-1, self.size)
            for m in missed:  # payloads of rounds this edge was idle, oldest first
                state = algo.absorb(state, b, self._unpack(m)[0])
            c[b], u_b = self._unpack(last)
            u[b], self._last_in[j] = (u[b] if u_b is None else u_b), t
        self._tick("compression", t0)
        u_in = u if algo.MESSAGE.push_sum_weight else self.u
        r = algo.mix(state, v=v, c=c, x=self.x, x_tilde=x_tilde, u=u_in, W=W, t=t, cfg=cfg)
        sent = torch.tensor([sum(b.numel() for b in sends.values()) / self.size], dtype=self.x.dtype)
        return r._replace(sent=sent), torch.tensor([float(nbytes)], dtype=torch.float64,
                                                   device=self.bytes_sent.device)
