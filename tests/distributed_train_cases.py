"""What a rank runs in tests/test_distributed_train.py (importable by the spawned processes): one
whole training run (lpdl_core.training.train) on a subset of the digits stand-in, as node `rank`."""
from __future__ import annotations

import dataclasses
import pickle
from pathlib import Path

import torch
from kill_helpers import Killed, kill_after_epoch
from torch import nn

from lpdl_core.data.registry import load_dataset
from lpdl_core.decentral.algorithms.base import GossipCfg
from lpdl_core.decentral.compress import CompressorCfg
from lpdl_core.decentral.engine import EngineCfg
from lpdl_core.decentral.optim import OptimCfg
from lpdl_core.decentral.topology import Topology
from lpdl_core.quant.layers import make_conv, make_linear
from lpdl_core.quant.quantizer import QuantCfg
from lpdl_core.training.run_cfg import RunCfg
from lpdl_core.training.train import train

N = 4


def cnn_fp32() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.Tanh(), nn.Conv2d(8, 16, 3, stride=2, padding=1),
                         nn.Tanh(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def cnn_int8() -> nn.Module:
    q = QuantCfg()
    return nn.Sequential(make_conv(3, 8, 3, stride=2, padding=1, bias=True, qcfg=q), nn.Tanh(),
                         nn.AdaptiveAvgPool2d(2), nn.Flatten(), make_linear(32, 10, qcfg=q))


def cnn_int8_dropout() -> nn.Module:
    """8-bit with dropout before the classifier (as the VGG-11 stand-in has): two kinds of draws,
    rounding noise and dropout masks, from the one global generator."""
    q = QuantCfg()
    return nn.Sequential(make_conv(3, 8, 3, stride=2, padding=1, bias=True, qcfg=q), nn.Tanh(),
                         nn.AdaptiveAvgPool2d(2), nn.Flatten(), nn.Dropout(0.5), make_linear(32, 10, qcfg=q))


MODELS = {"fp32": cnn_fp32, "int8": cnn_int8, "int8-dropout": cnn_int8_dropout}
RUNS = {
    # CHOCO with top-k on the time-varying graph (catch-up), final gossip rounds; 8-bit: DS on the
    # directed ring with the replayed noise stream and the official protocol (train-forward final
    # rounds, at most L − 1 of them, the trailing forward, the epoch test before its last gossip,
    # test batch 64)
    "choco-tv-fp32": dict(model="fp32", graph="time-varying-exponential",
                          gossip=GossipCfg(algorithm="choco", eta=0.5,
                                           compressor=CompressorCfg(kind="topk", ratio=0.9)),
                          run=RunCfg(epochs=3, batch_size=16, lr=0.05, skew=0.8, final_gossip_rounds=3)),
    "ds-dring-int8": dict(model="int8", graph="directed-ring",
                          gossip=GossipCfg(algorithm="ds", eta=0.5, compressor=CompressorCfg(kind="topk", ratio=0.5)),
                          run=RunCfg(epochs=3, batch_size=16, lr=0.05, skew=0.4, final_gossip_rounds=2,
                                     final_rounds="train-forward", final_round_limit="epoch-batches",
                                     final_trailing_forward=True, epoch_test="before-last-gossip",
                                     test_batch=64)),
    # dropout masks and 8-bit noise replayed from the loop executor's one stream
    "choco-dring-int8-dropout": dict(model="int8-dropout", graph="directed-ring",
                                     gossip=GossipCfg(algorithm="choco", eta=0.5,
                                                      compressor=CompressorCfg(kind="topk", ratio=0.9)),
                                     run=RunCfg(epochs=3, batch_size=16, lr=0.05, skew=0.6, final_gossip_rounds=2)),
    # one exact average (an all-reduce: collectives across the ranks) in place of the final rounds
    "ds-allreduce-fp32": dict(model="fp32", graph="directed-ring", gossip=GossipCfg(algorithm="ds", eta=1.0),
                              run=RunCfg(epochs=2, batch_size=16, lr=0.05, skew=0.8, final_gossip_rounds=3,
                                         final_rounds="allreduce")),
}


def split():
    s = load_dataset("digits")
    return dataclasses.replace(s, x_train=s.x_train[:192], y_train=s.y_train[:192], x_test=s.x_test[:96],
                               y_test=s.y_test[:96])


def run(name: str, executor: str, checkpoint=None, progress=None, identity=None):
    spec = RUNS[name]
    return train(MODELS[spec["model"]], split(), topology=Topology(name=spec["graph"], n=N), gossip=spec["gossip"],
                 optim_cfg=OptimCfg(), engine=EngineCfg(executor=executor, device="cpu"), run=spec["run"],
                 checkpoint=checkpoint, progress=progress, identity=identity)


def rank_runs(names: list[str], out_dir: str, kill_epoch: int | None = None, checkpoint: bool = False,
              identity: dict | None = None) -> None:
    """Rank side: each run distributed; rank r pickles its RunResult (and the events it saw) to
    out_dir/<name>-<r>.pkl. kill_epoch: every rank stops after that epoch (the checkpoint stays).
    identity: what the caller names the run (train's `identity`, part of what a checkpoint must match)."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank = dist.get_rank()
    kill = kill_after_epoch(kill_epoch) if kill_epoch is not None else (lambda ev: None)
    for name in names:
        events: list = []

        def progress(ev, events=events):
            events.append(ev)
            kill(ev)

        ck = Path(out_dir) / name / "checkpoint.pt" if checkpoint else None
        try:
            res = run(name, "distributed", checkpoint=ck, progress=progress, identity=identity)
        except Killed:
            res = None
        (Path(out_dir) / f"{name}-{rank}.pkl").write_bytes(pickle.dumps((res, events)))
