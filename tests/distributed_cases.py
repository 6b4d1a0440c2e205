"""Cases for tests/test_distributed.py, importable by the spawned rank processes: tiny models,
seeded batches, and what a rank runs (one NodeProcess per case, its row saved to a file)."""
from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from lpdl_core.decentral.algorithms import GossipCfg
from lpdl_core.decentral.compress import CompressorCfg
from lpdl_core.decentral.engine import EngineCfg, Simulator
from lpdl_core.decentral.optim import OptimCfg
from lpdl_core.decentral.topology import Topology
from lpdl_core.quant.layers import make_conv, make_linear
from lpdl_core.quant.quantizer import QuantCfg

N, B = 4, 6
# The paper's 8-bit training: nearest-rounded weights and activations, stochastically rounded layer
# gradients (noise from the global generator, which the ranks replay as the loop executor draws it).
INT8 = QuantCfg()


def mlp_fp32() -> nn.Module:
    return nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 10))


def cnn_int8() -> nn.Module:
    """8-bit conv + linear (QConv2d/QLinear: quantized weights, activations, layer gradients)."""
    return nn.Sequential(make_conv(1, 4, 3, padding=1, bias=True, qcfg=INT8), nn.Tanh(), nn.Flatten(),
                         make_linear(256, 10, qcfg=INT8))


def cnn_int8_frozen() -> nn.Module:
    """cnn_int8 with the official code's activation ranges as gossiped, frozen parameters."""
    q = QuantCfg(measure_as_parameters=True)
    return nn.Sequential(make_conv(1, 4, 3, padding=1, bias=True, qcfg=q), nn.Tanh(), nn.Flatten(),
                         make_linear(256, 10, qcfg=q))


MODELS = {"fp32": mlp_fp32, "int8": cnn_int8, "int8-frozen": cnn_int8_frozen}
# The paper's messages: η = 1 without compression, η = 0.01 with top-k at 99% (Bagua: 8-bit min-max).
COMPRESSION = {1.0: CompressorCfg(), 0.01: CompressorCfg(kind="topk", ratio=0.99)}


@dataclass(frozen=True)
class Case:
    algorithm: str
    eta: float
    precision: str
    graph: str
    steps: int = 4
    lr: float = 0.1
    compressor: CompressorCfg | None = None  # None: COMPRESSION[eta] (identity for dpsgd)
    momentum: str = "nesterov"
    choco_replicas: str = "per-neighbour"
    loop_rng: bool = True  # the ranks replay the loop executor's global RNG stream
    rng_streams: str = "per-node"  # "shared": every node draws the same (the official ranks)
    identical_batches: bool = False  # every node gets the same batch
    gossip_opts: tuple = ()  # further GossipCfg fields, (name, value) pairs (e.g. GUT's gut_momentum)

    @property
    def name(self) -> str:
        comp = self.gossip.compressor
        return (f"{self.algorithm}-eta{self.eta:g}-{self.precision}-{self.graph}-{comp.kind}{comp.ratio:g}"
                f"-{self.momentum}-{self.choco_replicas}" + ("" if self.loop_rng else "-own-rng")
                + ("" if self.rng_streams == "per-node" else f"-{self.rng_streams}")
                + ("-same-batches" if self.identical_batches else "")
                + "".join(f"-{k}{v:g}" for k, v in self.gossip_opts))

    @property
    def gossip(self) -> GossipCfg:
        comp = self.compressor
        if comp is None:
            comp = CompressorCfg() if self.algorithm == "dpsgd" else COMPRESSION[self.eta]
        return GossipCfg(algorithm=self.algorithm, eta=self.eta, compressor=comp,
                         choco_replicas=self.choco_replicas, **dict(self.gossip_opts))

    def kwargs(self) -> dict:
        return dict(topology=Topology(name=self.graph, n=N), gossip=self.gossip,
                    optim_cfg=OptimCfg(momentum=self.momentum),
                    engine=EngineCfg(executor="loop", device="cpu", rng_streams=self.rng_streams))

    def batches(self):
        g = torch.Generator().manual_seed(len(self.name))
        k = 1 if self.identical_batches else N
        return [(torch.randn(k, B, 1, 8, 8, generator=g).expand(N, -1, -1, -1, -1).clone(),
                 torch.randint(0, 10, (k, B), generator=g).expand(N, -1).clone()) for _ in range(self.steps)]

    def simulate(self) -> tuple[Simulator, float]:
        """The loop simulator after the case's steps, and the largest |x_{t+1} - x_t| on the way."""
        sim, move = Simulator(MODELS[self.precision], **self.kwargs()), 0.0
        for xb, yb in self.batches():
            x = sim.x.clone()
            sim.train_step(xb, yb, self.lr)
            move = max(move, float((sim.x - x).abs().max()))
        return sim, move


def run_cases(cases: list[Case], out_dir: str) -> None:
    """Rank side: every case from scratch; saves x, u, bytes sent and seconds per case."""
    from lpdl_core.decentral.engine.distributed import NodeProcess

    torch.set_num_threads(1)
    for case in cases:
        t0 = time.perf_counter()
        node = NodeProcess(MODELS[case.precision], loop_rng=case.loop_rng, **case.kwargs())
        r = node.rank
        for xb, yb in case.batches():
            node.train_step(xb[r:r + 1], yb[r:r + 1], case.lr)
        seconds = time.perf_counter() - t0
        torch.save({"x": node.x[0], "u": node.u[0], "bytes": float(node.bytes_sent[0]),
                    "average": node.average, "consensus": node.consensus_distance(), "seconds": seconds},
                   Path(out_dir) / f"{case.name}-{r}.pt")


def die_at(case: Case, victim: int, step: int, out_dir: str, hang: bool = False) -> None:
    """Rank side: before step `step`, `victim` exits abruptly (os._exit, no goodbye) or, with
    hang, stops answering (its connections stay open) until every other rank gave up; the others
    record when they gave up."""
    from lpdl_core.decentral.engine.distributed import NodeProcess

    torch.set_num_threads(1)
    node = NodeProcess(MODELS[case.precision], **case.kwargs())
    r = node.rank
    try:
        for t, (xb, yb) in enumerate(case.batches()):
            if r == victim and t == step:
                (Path(out_dir) / "died").write_text(str(time.time()))
                while hang and len(list(Path(out_dir).glob("gave-up-*"))) < N - 1:
                    time.sleep(0.1)
                os._exit(3)
            node.train_step(xb[r:r + 1], yb[r:r + 1], case.lr)
    finally:
        (Path(out_dir) / f"gave-up-{r}").write_text(str(time.time()))


def launch_cases(cases: list[Case], out_dir) -> float:
    """Run `cases` on N gloo ranks (run_cases) into out_dir; the wall seconds it took."""
    from lpdl_core.decentral import p2p

    t0 = time.perf_counter()
    codes = p2p.launch(run_cases, cases, str(out_dir), world_size=N, cfg=p2p.P2PCfg(timeout_s=60))
    assert codes == [0] * N, codes
    return time.perf_counter() - t0
