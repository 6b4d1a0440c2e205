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
2. The packed bytes go to each out-neighbour j (W_ji ≠ 0 at this round's t, so time-varying
   schedules change the peers) and come from each in-neighbour (`p2p.exchange`); nothing else
   crosses the wire. With `MESSAGE.catch_up` a message on an edge that was idle carries every
   payload since its last active round, oldest first; the receiver folds the older ones into its
   replica (`absorb`), as the simulator's catch-up does.
3. mix(...) with the received C(v_j), u_j and W's row i restricted to i and its in-neighbours: the
   same function the simulator runs on all n rows (the r = 1 receiver form of `algorithms.base`).

Global RNG (loop_rng=True, CPU). The loop executor draws every node's 8-bit stochastic-rounding
noise from the one global generator, node after node: node i's forward/backward starts after
nodes 0..i-1 drew theirs, and all n models were built (n + 1 initialisations) before the first
step. mt19937 cannot jump ahead, so a node replays those draws: it builds the n - 1 models it does
not need, and at every step draws (without using) the noise of the i nodes before it and of the
n - 1 - i after it, of the same sizes as its own (same model and batch shape; recorded once on a
copy of its model through `noise`, and checked at every step). `noise` is the stream's owner,
given from above (`lpdl_core.quant.quantizer.NOISE` for 8-bit models; None: nothing to replay but
the initialisations), so this layer never imports the quantizer. Other global draws
(dropout, GPU noise, vmap's) are not replayed, so it needs the loop executor for the node's own
forward/backward. Costs (n - 1) times the noise draws of one node; loop_rng=False skips it (each
process then draws its own noise from the same seed).

Not an `engine.executor` name: `loop` and `batched` run the n nodes' forward/backward inside one
Simulator (make_executor builds them there); this executor replaces the Simulator in each of n
processes, so it is entered through `NodeProcess` (and `main` under torchrun or srun).

Bytes sent are counted from the tensors that left the process; for float32 state they equal the
simulator's exact byte metric (`compress.message_bytes`). The result equals the loop executor's
row i up to float summation order in Σ_j W_ij y_j (one dot product of the row instead of the
(n, n) matmul): tests/test_distributed.py measures it. The averaged model z̄ and the consensus
distance, for evaluation only, are all-reduced across the ranks. Checkpoints and the training
pipeline do not know this executor yet.

Run (4 ranks, a self-check against the loop simulator on a tiny model):
    torchrun --nproc-per-node 4 -m lpdl_core.decentral.engine.distributed --check
or under SLURM: srun -n 4 python -m lpdl_core.decentral.engine.distributed --check (with
MASTER_ADDR / MASTER_PORT exported).
"""
from __future__ import annotations

import argparse
import copy
import sys

import torch
import torch.distributed as dist
import torch.nn.functional as F

from .. import p2p, wire
from ..algorithms import ALGORITHMS, GossipCfg, Round
from ..compress import COMPRESSORS, REGISTRY, CompressorCfg, uniform_draws
from ..optim import OptimCfg
from ..topology import GRAPHS, Topology
from .executors import LoopExecutor
from .simulator import EngineCfg, Simulator


class NodeProcess(Simulator):
    """Node `rank` (default: this process's rank) of `topology` in its own process; the process
    group must be initialized (`p2p.init`), one rank per node. Its attributes are the
    simulator's with one row: x, u, z (1, d), bytes_sent (1,), ... train_step, forward_round and
    gossip_round take this node's batch (1, B, ...). timeout_s bounds each wait for a message
    (None: the process group's timeout); loop_rng, noise (an object with replay(sizes) and a
    record() context yielding the list of draw sizes): see the module docstring."""

    def __init__(self, make_model, *, topology: Topology, gossip: GossipCfg = GossipCfg(),
                 optim_cfg: OptimCfg = OptimCfg(), engine: EngineCfg = EngineCfg(),
                 loss_fn=F.cross_entropy, rank: int | None = None, timeout_s: float | None = None,
                 loop_rng: bool = True, noise=None):
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
        super().__init__(make_model, topology=topology, gossip=gossip, optim_cfg=optim_cfg,
                         engine=engine, loss_fn=loss_fn)
        if loop_rng and not isinstance(self.executor, LoopExecutor):
            raise ValueError("loop_rng replays the loop executor's RNG stream: use the loop executor")
        if self.x.dtype != wire.WEIGHT_DTYPE:
            raise ValueError(f"the wire format carries float32 node state, got {self.x.dtype}")
        self.catch_up = self.algorithm.MESSAGE.catch_up(gossip)
        self.size = wire.message_size(self.layout, gossip.compressor, dtype=self.x.dtype,
                                      push_sum_weight=self.algorithm.MESSAGE.push_sum_weight)
        self._history: dict[int, torch.Tensor] = {}     # own packed messages a receiver may miss
        self._last_out = dict.fromkeys(self.receivers, -1)  # last round each out-edge was active
        self._last_in = dict.fromkeys(self.senders[1:], -1)
        self.loop_rng, self.noise, self._noise = loop_rng, noise, None  # lane counts of one node's draws
        for _ in range(self.n - 1 if loop_rng else 0):
            make_model()  # the loop executor's other n - 1 models draw their initialisation

    def _rows(self) -> int:
        return 1

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
        if not self.loop_rng or self.noise is None:
            return super()._loss_and_grad(xb, yb)
        if self._noise is None:
            self._noise = self._noise_sizes(xb, yb)
        self.noise.replay(self._noise * self.rank)  # nodes 0..i-1 draw first
        with self.noise.record() as drawn:
            out = super()._loss_and_grad(xb, yb)
        if drawn != self._noise:
            raise RuntimeError("the noise draws of a forward/backward changed between steps; the "
                               "loop executor's RNG stream cannot be replayed (use loop_rng=False)")
        self.noise.replay(self._noise * (self.n - 1 - self.rank))
        return out

    def _noise_sizes(self, xb: torch.Tensor, yb: torch.Tensor) -> list[int]:
        """One node's noise draws in a forward/backward, on a copy of the model (RNG restored)."""
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
        buf = self._pack(v)
        c_own, _ = self._unpack(buf)  # what the receivers will decode
        first = {j: (self._last_out[j] + 1 if self.catch_up else t) for j in outs}
        self._history[t] = buf
        sends = {j: torch.cat([self._history[s] for s in range(first[j], t + 1)]) for j in outs}
        recvs = {self.senders[b]: self.size * (t - self._last_in[self.senders[b]] if self.catch_up else 1)
                 for b in ins}
        got, nbytes = p2p.exchange(sends, recvs, timeout=self.timeout, device=self.x.device)
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
            if u_b is not None:
                u[b] = u_b
            self._last_in[j] = t
        u_in = u if algo.MESSAGE.push_sum_weight else self.u
        r = algo.mix(state, v=v, c=c, x=self.x, x_tilde=x_tilde, u=u_in, W=W, t=t, cfg=cfg)
        sent = torch.tensor([sum(b.numel() for b in sends.values()) / self.size], dtype=self.x.dtype)
        return r._replace(sent=sent), torch.tensor([float(nbytes)], dtype=torch.float64,
                                                   device=self.bytes_sent.device)


# ----------------------------------------------------------------------------- torchrun self-check
def _tiny_model() -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(64, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 10))


def _batches(steps: int, n: int, batch: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(n, batch, 1, 8, 8, generator=g), torch.randint(0, 10, (n, batch), generator=g))
            for _ in range(steps)]


def main(argv: list[str] | None = None) -> int:
    """Train the tiny model for --steps on seeded random batches, one node per process; with
    --check, also run the loop simulator in every process and compare this node's row."""
    ap = argparse.ArgumentParser(prog="python -m lpdl_core.decentral.engine.distributed")
    ap.add_argument("--algorithm", choices=ALGORITHMS, default=GossipCfg().algorithm)
    ap.add_argument("--graph", choices=GRAPHS, default=GRAPHS[0])
    ap.add_argument("--compressor", choices=COMPRESSORS, default=CompressorCfg().kind)
    ap.add_argument("--ratio", type=float, default=0.0, help="fraction dropped (topk/randomk)")
    ap.add_argument("--eta", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--timeout", type=float, default=60.0, help="seconds for rendezvous and each wait")
    ap.add_argument("--check", action="store_true", help="compare with the loop simulator")
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    rank, world = p2p.init(p2p.P2PCfg(timeout_s=a.timeout))
    topo = Topology(name=a.graph, n=world)
    gossip = GossipCfg(algorithm=a.algorithm, eta=a.eta,
                       compressor=CompressorCfg(kind=a.compressor, ratio=a.ratio))
    engine = EngineCfg(device="cpu", seed=a.seed)
    node = NodeProcess(_tiny_model, topology=topo, gossip=gossip, engine=engine)
    batches = _batches(a.steps, world, 8, a.seed)
    for xb, yb in batches:
        node.train_step(xb[rank:rank + 1], yb[rank:rank + 1], a.lr)
    line = f"rank {rank}: {a.steps} steps, {int(node.bytes_sent[0])} bytes sent"
    ok = True
    if a.check:
        sim = Simulator(_tiny_model, topology=topo, gossip=gossip, engine=engine)
        for xb, yb in batches:
            sim.train_step(xb, yb, a.lr)
        diff = float((node.x[0] - sim.x[rank]).abs().max())
        ok = diff <= 1e-5 and float(sim.bytes_sent[rank]) == float(node.bytes_sent[0])
        line += f" (simulator {int(sim.bytes_sent[rank])}), max |x - x_loop| = {diff:.2e}"
    print(line + ("" if ok else "  MISMATCH"), flush=True)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
