"""One decentralized training run, top-down: partition the data, build the simulator, train for
some epochs with per-epoch evaluation, then the official protocol's optional gossip-only rounds.
Returns plain data; the caller decides what to print or write."""
from __future__ import annotations

import contextlib
import itertools
import math
import os
import time
from dataclasses import dataclass, field
from typing import Callable, Literal, Mapping

import numpy as np
import torch
from torch import nn

from ..config import DEFAULT_SEED, FIDELITY_CHOICES
from ..data.augment import augment_batch
from ..data.base import DataSplit
from ..data.sampler import NodeSampler
from ..decentral.algorithms.base import GossipCfg
from ..decentral.engine import EngineCfg, NodeProcess, Simulator, evaluate
from ..decentral.optim import OptimCfg
from ..decentral.partition import epoch_samples, histograms, node_partition
from ..decentral.topology import Topology
from ..quant import fused
from ..quant.params import ParamQuant
from .checkpoint import Checkpoints, fingerprint
from .schedule import ScheduleCfg, lr_at, lr_at_step


@dataclass(frozen=True, kw_only=True)
class RunCfg:
    """The training protocol of one run.

    batch_size is per node (the official code uses int(256 / n)). final_gossip_rounds are
    gossip-only rounds after training (official: 50 on CIFAR, 36 on Imagenette; 0 = off);
    final_rounds: "gossip-only" mixes the models and nothing else; "train-forward" first runs a
    train-mode forward and backward on each node's next batch (no optimizer step), as the official
    code's final rounds do, which updates activation ranges and normalization statistics;
    "allreduce" replaces the rounds by one exact average of the models and their buffers
    (Simulator.allreduce_round), the merge the gossip rounds approximate.
    data_on: "device" keeps the whole dataset on the training device (fastest); "host" keeps it in
    (pinned) host memory and copies each node-stacked batch over, for datasets too big for the
    device. Augmentation runs on the training device either way.
    curve_eval_samples: evaluate the per-epoch curve on the first k test samples only (None: all);
    the final evaluation always uses the whole test set.

    The official trainer's protocol, as named options (lpdl_core.config.Fidelity; defaults: the
    paper's text, or lpdl's choice where the text is silent):
    epoch_test: "after-gossip" tests each epoch's models after the epoch's last gossip round;
        "before-last-gossip" before it (official: that transfer is applied at the next forward, and
        eval() turns gossip off), so per-epoch curves see each node's model one gossip earlier.
        Training is the same either way.
    final_round_limit: "cell" runs final_gossip_rounds; "epoch-batches" at most L − 1 of them,
        L the batches per epoch (official: the final rounds loop over one epoch's batches).
    final_trailing_forward: after the final rounds, one more train-mode forward and backward
        whose gossip is never applied (official: the loop's last transfer is never applied), so
        activation ranges and BN statistics end one local update past the last gossip
        ("train-forward" final rounds only).
    test_batch: samples per evaluation batch (official 64). 8-bit Range EvoNorm quantizes its
        per-sample scales over the batch, so 8-bit accuracy depends on it.
    """

    epochs: int
    batch_size: int
    lr: float
    schedule: ScheduleCfg = field(default_factory=lambda: ScheduleCfg(kind="constant"))
    skew: float = 0.0
    dirichlet_alpha: float | None = None  # a Dirichlet(α) partition instead of the skew one
    partition_seed: int = DEFAULT_SEED
    final_gossip_rounds: int = 0
    final_rounds: Literal["gossip-only", "train-forward", "allreduce"] = "gossip-only"
    data_on: Literal["device", "host"] = "device"
    curve_eval_samples: int | None = None
    epoch_test: Literal["after-gossip", "before-last-gossip"] = "after-gossip"
    final_round_limit: Literal["cell", "epoch-batches"] = "cell"
    final_trailing_forward: bool = False
    test_batch: int = 1024

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1:
            raise ValueError("run.epochs and run.batch_size must be >= 1")
        if not self.lr > 0:
            raise ValueError(f"run.lr must be > 0, got {self.lr}")
        if not 0.0 <= self.skew <= 1.0:
            raise ValueError(f"run.skew must be in [0, 1], got {self.skew}")
        if self.dirichlet_alpha is not None and (not math.isfinite(self.dirichlet_alpha)
                                                 or self.dirichlet_alpha <= 0 or self.skew):
            raise ValueError(f"run.dirichlet_alpha must be a finite number > 0, with skew 0, got "
                             f"{self.dirichlet_alpha} (skew {self.skew})")
        if self.final_gossip_rounds < 0:
            raise ValueError("run.final_gossip_rounds must be >= 0")
        if self.curve_eval_samples is not None and self.curve_eval_samples < 1:
            raise ValueError("run.curve_eval_samples must be >= 1 or None")
        if self.data_on not in ("device", "host"):
            raise ValueError(f"run.data_on must be 'device' or 'host', got {self.data_on!r}")
        for name in ("final_rounds", "epoch_test", "final_round_limit"):  # the fidelity values, declared once
            allowed = FIDELITY_CHOICES[name]
            if getattr(self, name) not in allowed:
                raise ValueError(f"run.{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if self.final_trailing_forward and self.final_rounds != "train-forward":
            raise ValueError("run.final_trailing_forward needs final_rounds 'train-forward' (a trailing "
                             "forward follows forward rounds)")
        if isinstance(self.test_batch, bool) or not isinstance(self.test_batch, int) or self.test_batch < 1:
            raise ValueError(f"run.test_batch must be a positive integer, got {self.test_batch!r}")

    def final_round_count(self, iters_per_epoch: int) -> int:
        """The final gossip rounds applied: final_gossip_rounds, at most L − 1 with "epoch-batches"."""
        if self.final_round_limit == "epoch-batches":
            return min(self.final_gossip_rounds, max(iters_per_epoch - 1, 0))
        return self.final_gossip_rounds

    def partition(self, labels: np.ndarray, n: int) -> list[np.ndarray]:
        """The run's n node shards of the training labels: its skew or Dirichlet split, seeded
        by its partition seed (lpdl_core.decentral.partition.node_partition)."""
        return node_partition(labels, n, skew=self.skew, dirichlet_alpha=self.dirichlet_alpha,
                              seed=self.partition_seed)

    def sampler(self, parts, *, shared: bool = False) -> NodeSampler:
        """The run's minibatches over its shards: its batch, its partition seed, and the epoch
        length L its partition kind gives (lpdl_core.decentral.partition.epoch_samples)."""
        return NodeSampler(parts, self.batch_size, seed=self.partition_seed, shared=shared,
                           epoch_len=epoch_samples(parts, self.dirichlet_alpha))

    def tests_before_gossip(self, it: int, iters_per_epoch: int) -> bool:
        """Whether step `it` of an epoch is the one whose pre-gossip models the epoch tests."""
        return self.epoch_test == "before-last-gossip" and it == iters_per_epoch - 1


def shared_streams(engine: EngineCfg) -> dict:
    """The checkpoint fingerprint's part for shared random streams (none for per-node streams, so
    the fingerprints of per-node runs read as before the option existed)."""
    return {"rng_streams": "shared"} if engine.rng_streams == "shared" else {}


def epoch_view(sim, run: RunCfg):
    """Where the epoch's test reads the models: after the last gossip, or before it."""
    return sim.premix_view() if run.epoch_test == "before-last-gossip" else contextlib.nullcontext()


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


def train(make_model: Callable[[], nn.Module], split: DataSplit, *, topology: Topology,
          gossip: GossipCfg, optim_cfg: OptimCfg, engine: EngineCfg, run: RunCfg,
          progress: Callable[[dict], None] | None = None,
          checkpoint: str | os.PathLike | None = None, identity: Mapping | None = None) -> RunResult:
    """Train n nodes on `split`. The whole dataset moves to the training device once (images as
    uint8); each step augments and normalizes the node-stacked batch there.

    engine.executor "distributed": this process is one rank of a torch.distributed group of n
    (lpdl_core.decentral.p2p.init) and trains node `rank` only (`NodeProcess`). Every rank loads
    its own row of each node-stacked batch and augments it with the random draws of the whole
    batch (augment_batch's `part`), as one process would, so the run equals the loop executor's;
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
        if engine.executor == "distributed":
            from ..quant.quantizer import NOISE  # the 8-bit noise stream each rank replays
            s = NodeProcess(make_model, noise=NOISE, **kw)
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
    curve: list[dict] = []
    status, diverged_at = "ok", None
    start_epoch, elapsed_before = 0, 0.0
    # What the checkpoint must match: this run's identity and its whole resolved plan.
    fp = fingerprint(identity=identity, data=f"{split.name} ({len(split.x_train)} training samples)",
                     topology=topology, gossip=gossip, optim=optim_cfg, run=run, layout=sim.layout,
                     architecture=sim.architecture, **shared_streams(engine))
    ckpt = Checkpoints(checkpoint, sim) if checkpoint is not None else None
    if ckpt is not None:
        resumed = ckpt.resume(fp, run.epochs, sim, aug_gen, progress)
        if resumed is None:  # nothing usable: this run starts from scratch
            if ckpt.dirty:  # half-restored
                sim, aug_gen = fresh()
        else:
            curve, start_epoch, elapsed_before = resumed
            if progress is not None:
                progress({"event": "resumed", "epoch": start_epoch, "epochs": run.epochs})
    for epoch in range(start_epoch, run.epochs):
        per_step, total = run.schedule.per_step, run.epochs * sampler.iters_per_epoch
        lr = lr_at(epoch, run.lr, run.schedule) if not per_step else None
        loss_sum = torch.zeros(sim.x.shape[0], device=dev)
        for it, idx in enumerate(sampler.epoch(epoch)):
            if per_step:
                lr = lr_at_step(epoch * sampler.iters_per_epoch + it, total, run.lr, run.schedule)
            xb, yb = batch(idx[sim.rows])
            sim.keep_premix = run.tests_before_gossip(it, sampler.iters_per_epoch)
            with fused.enabled(engine.fused_quant):
                losses = sim.train_step(to_train(xb), yb, lr)
            sim.keep_premix = False
            loss_sum += losses
            if not sim.all_finite(losses):
                status, diverged_at = "diverged", {"epoch": epoch, "iteration": it}
                break
            if progress is not None:
                progress({"event": "step", "epoch": epoch, "iteration": it,
                          "iters_per_epoch": sampler.iters_per_epoch})
        if status == "diverged":
            break
        k = run.curve_eval_samples or len(x_te)
        with epoch_view(sim, run):
            ev = evaluate(sim, x_te[:k], y_te[:k].to(dev), batch_size=run.test_batch, transform=to_test)
        row = {"epoch": epoch, "lr": lr, "train_loss": sim.node_mean(loss_sum) / sampler.iters_per_epoch,
               "mean_acc": ev.mean_acc, "avg_model_acc": ev.avg_model_acc,
               "consensus_distance": ev.consensus_distance, "test_loss": ev.mean_loss,
               "bytes_per_node": sim.node_mean(sim.bytes_sent)}
        curve.append(row)
        if ckpt is not None:
            ckpt.save({
                "fingerprint": fp, "epoch": epoch, "curve": curve, "sim": sim.state_dict(),
                "torch_rng": torch.get_rng_state(), "aug_gen": aug_gen.get_state(),
                "cuda_rng": torch.cuda.get_rng_state(dev) if dev.type == "cuda" else None,
                "elapsed": elapsed_before + time.perf_counter() - t0})
        if progress is not None:
            progress({"event": "epoch", **row, "epochs": run.epochs})
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
                     bytes_per_node=sim.node_mean(sim.bytes_sent), partition=hist,
                     wall_time_s=elapsed_before + time.perf_counter() - t0, executor=engine.executor,
                     device=str(dev), diverged_at=diverged_at, step_split=phase_split, before_final=before_final)
