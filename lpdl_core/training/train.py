"""One decentralized training run, top-down: partition the data, build the simulator, train for
some epochs with per-epoch evaluation, then the official protocol's optional gossip-only rounds.
Returns plain data; the caller decides what to print or write."""
from __future__ import annotations

import itertools
import math
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Literal

import numpy as np
import torch
from torch import nn

from ..data.augment import augment_batch
from ..data.base import DataSplit
from ..data.sampler import NodeSampler
from ..decentral.algorithms.base import GossipCfg
from ..decentral.engine import EngineCfg, Simulator, evaluate
from ..decentral.optim import OptimCfg
from ..decentral.partition import histograms, skew_partition
from ..decentral.topology import Topology
from .schedule import ScheduleCfg, lr_at, lr_at_step


@dataclass(frozen=True, kw_only=True)
class RunCfg:
    """The training protocol of one run.

    batch_size is per node (the official code uses int(256 / n)). final_gossip_rounds are
    gossip-only rounds after training (official: 50 on CIFAR, 36 on Imagenette; 0 = off);
    final_rounds: "gossip-only" mixes the models and nothing else; "train-forward" first runs a
    train-mode forward and backward on each node's next batch (no optimizer step), as the official
    code's final rounds do, which updates activation ranges and normalization statistics.
    data_on: "device" keeps the whole dataset on the training device (fastest); "host" keeps it in
    (pinned) host memory and copies each node-stacked batch over, for datasets too big for the
    device. Augmentation runs on the training device either way.
    curve_eval_samples: evaluate the per-epoch curve on the first k test samples only (None: all);
    the final evaluation always uses the whole test set.
    """

    epochs: int
    batch_size: int
    lr: float
    schedule: ScheduleCfg = field(default_factory=lambda: ScheduleCfg(kind="constant"))
    skew: float = 0.0
    partition_seed: int = 1234
    final_gossip_rounds: int = 0
    final_rounds: Literal["gossip-only", "train-forward"] = "gossip-only"
    data_on: Literal["device", "host"] = "device"
    curve_eval_samples: int | None = None

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1:
            raise ValueError("run.epochs and run.batch_size must be >= 1")
        if not self.lr > 0:
            raise ValueError(f"run.lr must be > 0, got {self.lr}")
        if not 0.0 <= self.skew <= 1.0:
            raise ValueError(f"run.skew must be in [0, 1], got {self.skew}")
        if self.final_gossip_rounds < 0:
            raise ValueError("run.final_gossip_rounds must be >= 0")
        if self.curve_eval_samples is not None and self.curve_eval_samples < 1:
            raise ValueError("run.curve_eval_samples must be >= 1 or None")
        if self.final_rounds not in ("gossip-only", "train-forward"):
            raise ValueError(f"run.final_rounds must be 'gossip-only' or 'train-forward', got {self.final_rounds!r}")
        if self.data_on not in ("device", "host"):
            raise ValueError(f"run.data_on must be 'device' or 'host', got {self.data_on!r}")


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


def _save_checkpoint(path: Path, state: dict) -> None:
    """Atomic: a kill -9 mid-write leaves the previous checkpoint intact."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        torch.save(state, tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _resume(path: Path, fingerprint: str, sim: Simulator, aug_gen: torch.Generator,
            epochs: int) -> tuple[tuple[list, int, float] | None, str]:
    """Load a checkpoint of this run into sim and the RNGs: ((curve, next epoch, elapsed), "")
    or (None, why it cannot be used). Any failure counts: a truncated, random or edited file."""
    try:
        ck = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001  (zip, pickle, EOF, unicode, ... errors alike)
        return None, f"unreadable ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"
    if not isinstance(ck, dict) or "fingerprint" not in ck:
        return None, "not an lpdl checkpoint"
    if ck["fingerprint"] != fingerprint:
        return None, "written for other settings of this run"
    try:
        epoch = int(ck["epoch"])
        curve = list(ck["curve"])
        if not 0 <= epoch < epochs or len(curve) != epoch + 1:
            return None, f"inconsistent (epoch {epoch}, {len(curve)} curve rows)"
        sim.load_state_dict(ck["sim"])
        torch.set_rng_state(ck["torch_rng"])
        if sim.device.type == "cuda" and ck.get("cuda_rng") is not None:
            torch.cuda.set_rng_state(ck["cuda_rng"], sim.device)
        aug_gen.set_state(ck["aug_gen"])
        return (curve, epoch + 1, float(ck["elapsed"])), ""
    except Exception as e:  # noqa: BLE001
        return None, f"inconsistent ({type(e).__name__}: {str(e).splitlines()[0][:120] if str(e) else ''})"


def _set_aside(path: Path, tag: str) -> Path:
    """Rename path to <name>.<tag>-<UTC time> beside it (kept, never deleted)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    aside = path.with_name(f"{path.name}.{tag}-{stamp}")
    n = 1
    while aside.exists():
        aside, n = path.with_name(f"{path.name}.{tag}-{stamp}.{n}"), n + 1
    os.replace(path, aside)
    return aside


def train(make_model: Callable[[], nn.Module], split: DataSplit, *, topology: Topology,
          gossip: GossipCfg, optim_cfg: OptimCfg, engine: EngineCfg, run: RunCfg,
          progress: Callable[[dict], None] | None = None,
          checkpoint: str | os.PathLike | None = None) -> RunResult:
    """Train n nodes on `split`. The whole dataset moves to the training device once (images as
    uint8); each step augments and normalizes the node-stacked batch there.

    checkpoint: a file written after every epoch (atomically) with all state, every RNG
    included; if it exists when train() starts, training resumes after its epoch, so on CPU a
    resumed run ends with exactly the metrics of an uninterrupted one. A checkpoint that cannot
    be used (truncated, random bytes, other settings) is renamed aside, never deleted, with a
    "checkpoint-set-aside" progress event, and the run starts from scratch.
    """
    t0 = time.perf_counter()
    labels = split.y_train.numpy()
    parts = skew_partition(labels, topology.n, run.skew, seed=run.partition_seed)
    hist = histograms(parts, labels, num_classes=split.num_classes)
    def fresh() -> tuple[Simulator, torch.Generator]:
        s = Simulator(make_model, topology=topology, gossip=gossip, optim_cfg=optim_cfg, engine=engine)
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

    sampler = NodeSampler(parts, run.batch_size, seed=run.partition_seed)
    to_train = lambda xb: augment_batch(xb, split, train=True, generator=aug_gen)  # noqa: E731
    to_test = lambda xb: augment_batch(xb.to(dev), split, train=False)  # noqa: E731
    curve: list[dict] = []
    status, diverged_at = "ok", None
    start_epoch, elapsed_before = 0, 0.0
    # What the checkpoint must match: the same run of the same cell (frozen dataclass reprs are stable).
    fingerprint = repr((split.name, len(split.x_train), topology, gossip, optim_cfg, run, sim.layout.d))
    ckpt = Path(checkpoint) if checkpoint is not None else None
    if ckpt is not None and ckpt.exists():
        resumed, why = _resume(ckpt, fingerprint, sim, aug_gen, run.epochs)
        if resumed is None:  # unusable: keep it for inspection, start this run from scratch
            aside = _set_aside(ckpt, "corrupt" if why.startswith("unreadable") else "unusable")
            sim, aug_gen = fresh()
            if progress is not None:
                progress({"event": "checkpoint-set-aside", "path": str(ckpt), "moved_to": str(aside),
                          "reason": why})
        else:
            curve, start_epoch, elapsed_before = resumed
            if progress is not None:
                progress({"event": "resumed", "epoch": start_epoch, "epochs": run.epochs})
    for epoch in range(start_epoch, run.epochs):
        per_step, total = run.schedule.per_step, run.epochs * sampler.iters_per_epoch
        lr = lr_at(epoch, run.lr, run.schedule) if not per_step else None
        loss_sum = torch.zeros(topology.n, device=dev)
        for it, idx in enumerate(sampler.epoch(epoch)):
            if per_step:
                lr = lr_at_step(epoch * sampler.iters_per_epoch + it, total, run.lr, run.schedule)
            xb, yb = batch(idx)
            losses = sim.train_step(to_train(xb), yb, lr)
            loss_sum += losses
            if not torch.isfinite(losses).all():
                status, diverged_at = "diverged", {"epoch": epoch, "iteration": it}
                break
            if progress is not None:
                progress({"event": "step", "epoch": epoch, "iteration": it,
                          "iters_per_epoch": sampler.iters_per_epoch})
        if status == "diverged":
            break
        k = run.curve_eval_samples or len(x_te)
        ev = evaluate(sim, x_te[:k], y_te[:k].to(dev), transform=to_test)
        row = {"epoch": epoch, "lr": lr, "train_loss": float(loss_sum.mean()) / sampler.iters_per_epoch,
               "mean_acc": ev.mean_acc, "avg_model_acc": ev.avg_model_acc,
               "consensus_distance": ev.consensus_distance, "test_loss": ev.mean_loss,
               "bytes_per_node": float(sim.bytes_sent.mean())}
        curve.append(row)
        if ckpt is not None:
            _save_checkpoint(ckpt, {
                "fingerprint": fingerprint, "epoch": epoch, "curve": curve, "sim": sim.state_dict(),
                "torch_rng": torch.get_rng_state(), "aug_gen": aug_gen.get_state(),
                "cuda_rng": torch.cuda.get_rng_state(dev) if dev.type == "cuda" else None,
                "elapsed": elapsed_before + time.perf_counter() - t0})
        if progress is not None:
            progress({"event": "epoch", **row, "epochs": run.epochs})
    # the final rounds' batches continue the sampler's stream past the last epoch
    final_batches = itertools.chain.from_iterable(sampler.epoch(e) for e in itertools.count(run.epochs))
    for _ in range(run.final_gossip_rounds if status == "ok" else 0):
        if run.final_rounds == "train-forward":
            xb, yb = batch(next(final_batches))
            sim.forward_round(to_train(xb), yb)
        else:
            sim.gossip_round()
    final = evaluate(sim, x_te, y_te.to(dev), transform=to_test).as_dict()
    if not math.isfinite(final["mean_loss"]) and status == "ok":
        status, diverged_at = "diverged", {"epoch": run.epochs - 1, "iteration": None}
    return RunResult(status=status, epochs_done=len(curve), curve=curve, final=final,
                     bytes_per_node=float(sim.bytes_sent.mean()), partition=hist,
                     wall_time_s=elapsed_before + time.perf_counter() - t0, executor=sim.executor.name,
                     device=str(dev), diverged_at=diverged_at)
