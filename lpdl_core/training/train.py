"""One decentralized training run, top-down: partition the data, build the simulator, train for
some epochs with per-epoch evaluation, then the official protocol's optional gossip-only rounds.
Returns plain data; the caller decides what to print or write."""
from __future__ import annotations

import itertools
import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np
import torch
from torch import nn

from ..data.augment import augment_batch
from ..specs.executors import executor_spec
from ..data.base import DataSplit
from ..decentral.algorithms.base import GossipCfg
from ..decentral.engine import EngineCfg, NodeProcess, Simulator, evaluate
from ..decentral.optim import OptimCfg
from ..decentral.partition import histograms
from ..decentral.topology import Topology
from ..quant import arithmetic, fused
from ..quant.params import ParamQuant
from .checkpoint import Checkpoints, fingerprint
from .loop import Progress, curve_row, run_epochs
from .run_cfg import RunCfg


def shared_streams(engine: EngineCfg) -> dict:
    """The checkpoint fingerprint's part for shared random streams (none for per-node streams, so
    the fingerprints of per-node runs read as before the option existed)."""
    return {"rng_streams": "shared"} if engine.rng_streams == "shared" else {}


def run_final_rounds(sim, run: RunCfg, iters_per_epoch: int, next_batch: Callable[[], tuple]) -> None:
    """The final rounds of a run that trained to the end: gossip-only, or (official) a train-mode
    forward on next_batch() before each gossip, then possibly one trailing forward."""
    rounds = run.final_round_count(iters_per_epoch)
    if rounds and run.final_rounds == "allreduce":  # one exact average in place of the rounds
        sim.allreduce_round()
        return
    for _ in range(rounds):
        if run.final_rounds == "train-forward":
            sim.forward_round(*next_batch())
        else:
            sim.gossip_round()
    if rounds and run.final_trailing_forward:
        sim.forward_only(*next_batch())


@dataclass
class RunResult:
    status: str                    # "ok" or "diverged"
    epochs_done: int
    curve: list[dict]              # one row per epoch: epoch, lr, train_loss, eval metrics
    final: dict                    # Evaluation.as_dict() after the final gossip rounds
    bytes_per_node: float          # mean over nodes of bytes sent (training + final rounds)
    partition: np.ndarray          # (n, C) class histogram of the node partitions
    wall_time_s: float
    executor: str
    device: str
    diverged_at: dict | None = None
    step_split: list[dict] | None = None  # distributed: each rank's seconds per step by phase
    # Evaluation.as_dict() after training, before the final rounds (None: no final rounds). Its
    # avg_model_acc is what one exact average (an all-reduce) of the trained models would score.
    before_final: dict | None = None
    # the arithmetic its 8-bit layers took (lpdl_core.quant.arithmetic.taken; '' in an FP run)
    int8_arithmetic: str = ""


class Solo:
    """One run as the epoch loop drives it (lpdl_core.training.loop.Trainee): its sampler's
    batches, augmented; diverged when a loss is not finite on any node (every rank agrees)."""

    def __init__(self, sim, run: RunCfg, sampler, batch, to_train, evaluate_now):
        self.sim, self.run, self.sampler, self.batch, self.to_train = sim, run, sampler, batch, to_train
        self.evaluate_now, self.iters, self.diverged_at = evaluate_now, sampler.iters_per_epoch, None

    @property
    def stopped(self) -> bool:
        return self.diverged_at is not None

    def batches(self, epoch: int):
        for idx in self.sampler.epoch(epoch):
            xb, yb = self.batch(idx[self.sim.rows])
            yield self.to_train(xb), yb

    def check(self, losses, epoch: int, iteration: int) -> None:
        if not self.sim.all_finite(losses):
            self.diverged_at = {"epoch": epoch, "iteration": iteration}

    def epoch_end(self, epoch: int, lr, loss_sum) -> tuple[dict, dict]:
        ev, sim = self.evaluate_now(), self.sim
        row = curve_row(epoch, lr, sim.node_mean(loss_sum) / self.iters, ev, sim.node_mean(sim.bytes_sent))
        return row, row


def train(make_model: Callable[[], nn.Module], split: DataSplit, *, topology: Topology,
          gossip: GossipCfg, optim_cfg: OptimCfg, engine: EngineCfg, run: RunCfg,
          progress: Callable[[dict], None] | None = None,
          checkpoint: str | os.PathLike | None = None, identity: Mapping | None = None) -> RunResult:
    """Train n nodes on `split`. The whole dataset moves to the training device once (images as
    uint8); each step augments and normalizes the node-stacked batch there.

    With a one-process-per-node engine.executor (distributed) this process is one rank of a
    torch.distributed group of n (lpdl_core.decentral.p2p.init) and trains node `rank` only
    (`NodeProcess`). Every rank loads its own row of each node-stacked batch and augments it with
    the random draws of the whole batch (augment_batch's `part`), as one process would, so the run
    equals the loop executor's;
    metrics come from collectives, and every rank returns the same result but its own wall time.

    checkpoint: a file written after every epoch (atomically) with all state, every RNG
    included (one per rank for a distributed run: lpdl_core.training.checkpoint); if it exists
    when train() starts, training resumes after its epoch, so on CPU a resumed run ends with
    exactly the metrics of an uninterrupted one. A checkpoint that cannot be used (truncated,
    random bytes, other settings) is renamed aside, never deleted, with a "checkpoint-set-aside"
    progress event, and the run starts from scratch.

    identity: what the caller names this run's result (a paper cell's run identity: cell, seed,
    profile, defining columns, fidelity). A checkpoint is resumed only when its identity and the
    resolved plan (data, graph, gossip, optimizer, protocol, the model's tensors and
    architecture) are this run's (lpdl_core.training.checkpoint.fingerprint).
    """
    t0 = time.perf_counter()
    labels = split.y_train.numpy()
    parts = run.partition(labels, topology.n)
    hist = histograms(parts, labels, num_classes=split.num_classes)
    def fresh() -> tuple[Simulator, torch.Generator]:
        kw = dict(topology=topology, gossip=gossip, optim_cfg=optim_cfg, engine=engine)
        if executor_spec(engine.executor).per_node_process:  # each rank replays the others' global draws
            s = NodeProcess(make_model, **kw)
        else:  # the 8-bit layers' weight quantizers run once for all nodes where that saves work
            s = Simulator(make_model, param_transform=ParamQuant, **kw)
        return s, torch.Generator(device=s.device).manual_seed(run.partition_seed + 2)

    sim, aug_gen = fresh()
    dev = sim.device
    store = dev if run.data_on == "device" else torch.device("cpu")
    pin = run.data_on == "host" and dev.type == "cuda"
    x_tr, y_tr = split.x_train.to(store), split.y_train.to(store)
    x_te, y_te = split.x_test.to(store), split.y_test.to(store)
    if pin:
        x_tr, y_tr = x_tr.pin_memory(), y_tr.pin_memory()

    def batch(idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        idx = idx.to(store)
        xb, yb = x_tr[idx], y_tr[idx]
        if pin:
            xb, yb = xb.pin_memory(), yb.pin_memory()
        return xb.to(dev, non_blocking=True), yb.to(dev, non_blocking=True)

    shared = engine.rng_streams == "shared"
    sampler = run.sampler(parts, shared=shared)
    # a NodeProcess trains its own row: the augmentation draws the whole batch's randomness, applies its row's
    # (shared streams: every node, this one too, draws what one node draws)
    part = None if sim.rows == slice(None) or shared else (sim.rows.start, topology.n)
    to_train = lambda xb: augment_batch(xb, split, train=True, generator=aug_gen, part=part,  # noqa: E731
                                        shared=shared)
    to_test = lambda xb: augment_batch(xb.to(dev), split, train=False)  # noqa: E731
    # What the checkpoint must match: this run's identity and its whole resolved plan.
    fp = fingerprint(identity=identity, data=f"{split.name} ({len(split.x_train)} training samples)",
                     topology=topology, gossip=gossip, optim=optim_cfg, run=run, layout=sim.layout,
                     architecture=sim.architecture, **shared_streams(engine))
    state = Progress(t0=t0)
    ckpt = Checkpoints(checkpoint, sim) if checkpoint is not None else None
    if ckpt is not None:
        resumed = ckpt.resume(fp, run.epochs, sim, aug_gen, progress)
        if resumed is None:  # nothing usable: this run starts from scratch
            if ckpt.dirty:  # half-restored
                sim, aug_gen = fresh()
        else:
            state.curve, state.start_epoch, state.elapsed_before = resumed
            if progress is not None:
                progress({"event": "resumed", "epoch": state.start_epoch, "epochs": run.epochs})
    k = run.curve_eval_samples or len(x_te)
    solo = Solo(sim, run, sampler, batch, to_train,
                lambda: evaluate(sim, x_te[:k], y_te[:k].to(dev), batch_size=run.test_batch, transform=to_test))
    run_epochs(sim, run, solo, state, fused_quant=engine.fused_quant, checkpoint=ckpt, fingerprint=fp, aug=aug_gen,
               progress=progress)
    curve, (status, diverged_at) = state.curve, (("diverged", solo.diverged_at) if solo.stopped else ("ok", None))
    phase_split = sim.step_splits()  # the training steps' (before the final rounds)
    # the final rounds' batches continue the sampler's stream past the last epoch
    final_batches = itertools.chain.from_iterable(sampler.epoch(e) for e in itertools.count(run.epochs))

    def next_batch():
        xb, yb = batch(next(final_batches)[sim.rows])
        return to_train(xb), yb

    before_final = None
    if status == "ok" and run.final_round_count(sampler.iters_per_epoch):
        before_final = evaluate(sim, x_te, y_te.to(dev), batch_size=run.test_batch, transform=to_test).as_dict()
        with fused.enabled(engine.fused_quant):
            run_final_rounds(sim, run, sampler.iters_per_epoch, next_batch)
    final = evaluate(sim, x_te, y_te.to(dev), batch_size=run.test_batch, transform=to_test).as_dict()
    if not math.isfinite(final["mean_loss"]) and status == "ok":
        status, diverged_at = "diverged", {"epoch": run.epochs - 1, "iteration": None}
    return RunResult(status=status, epochs_done=len(curve), curve=curve, final=final,
                     bytes_per_node=sim.node_mean(sim.bytes_sent), partition=hist, wall_time_s=state.elapsed(),
                     executor=engine.executor, device=str(dev), diverged_at=diverged_at, step_split=phase_split,
                     before_final=before_final, int8_arithmetic=arithmetic.taken())
