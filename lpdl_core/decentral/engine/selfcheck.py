"""A self-check of the distributed executor on a cluster or a laptop: every rank trains a tiny
model on seeded random batches as one node of the graph (`NodeProcess`), and with --check also
runs the loop simulator of all n nodes and compares its own row and its bytes sent.

    torchrun --nproc-per-node 4 -m lpdl_core.decentral.engine.selfcheck --check
    srun -n 4 python -m lpdl_core.decentral.engine.selfcheck --check   (MASTER_ADDR / MASTER_PORT exported)

Exit status 0 when every rank matches (|x - x_loop| <= 1e-5 and the same bytes), else 1.
"""
from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist

from ...config import COMPRESSORS, DEFAULT_SEED, GRAPHS
from .. import p2p
from ..algorithms import ALGORITHMS, GossipCfg
from ..compress import CompressorCfg
from ..topology import Topology
from .distributed import NodeProcess
from .engine_cfg import EngineCfg
from .simulator import Simulator


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
    ap = argparse.ArgumentParser(prog="python -m lpdl_core.decentral.engine.selfcheck")
    ap.add_argument("--algorithm", choices=ALGORITHMS, default=GossipCfg().algorithm)
    ap.add_argument("--graph", choices=GRAPHS, default=GRAPHS[0])
    ap.add_argument("--compressor", choices=COMPRESSORS, default=CompressorCfg().kind)
    ap.add_argument("--ratio", type=float, default=0.0, help="fraction dropped (topk/randomk)")
    ap.add_argument("--eta", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--lr", type=float, default=0.1)
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--timeout", type=float, default=p2p.P2PCfg().timeout_s,
                    help="seconds for rendezvous and each wait")
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
    # One write(2) per line: ranks share the launcher's stdout, and print() under
    # PYTHONUNBUFFERED writes the text and its newline separately, so lines interleave.
    os.write(sys.stdout.fileno(), (line + ("" if ok else "  MISMATCH") + "\n").encode())
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
