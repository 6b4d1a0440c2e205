"""The epoch loop, once, for a solo run (`train`) and a pack of runs (`train_pack`).

Each epoch e of a run with I iterations per epoch:

    for i in 0..I-1:   lr = lr_at(e) (or lr_at_step(e·I + i) for a per-step schedule)
                       losses = sim.train_step(augmented batch i, lr)     (gossip included)
                       stop early when nothing is left training (a diverged solo run, or every
                       cell of a pack diverged)
    then: evaluate (after the last gossip, or before it: run.epoch_test), append the epoch's
          curve entry, save the checkpoint (all state and every random stream), report it.

What differs between a solo run and a pack is behind `Trainee`: where the batches come from and how
they are augmented, what counts as diverged, and the curve entry of an epoch (one row, or one per
cell). The final rounds and the final evaluation are the callers'.
"""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol

import torch

from ..quant import arithmetic, fused
from .run_cfg import RunCfg
from .schedule import lr_at, lr_at_step


class Trainee(Protocol):
    """A solo run or a pack, as the loop drives it."""

    iters: int                   # iterations per epoch

    @property
    def stopped(self) -> bool:   # nothing is left training (diverged)
        ...

    def batches(self, epoch: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The epoch's augmented training batches (x, y), node-stacked."""
        ...

    def check(self, losses: torch.Tensor, epoch: int, iteration: int) -> None:
        """Record any divergence these losses show."""
        ...

    def epoch_end(self, epoch: int, lr: float | None, loss_sum: torch.Tensor) -> tuple[object, dict]:
        """(the epoch's curve entry, its progress event), evaluated where the test reads the models."""
        ...


@dataclass
class Progress:
    """Where a run's loop stands: the curve so far, the epoch to start at, and time spent."""

    curve: list = field(default_factory=list)
    start_epoch: int = 0
    elapsed_before: float = 0.0
    t0: float = field(default_factory=time.perf_counter)

    def elapsed(self) -> float:
        return self.elapsed_before + time.perf_counter() - self.t0


def curve_row(epoch: int, lr: float | None, train_loss: float, ev, bytes_per_node: float) -> dict:
    """One epoch's row of a run's curve (curve.csv), from its evaluation `ev` (engine.Evaluation)."""
    return {"epoch": epoch, "lr": lr, "train_loss": train_loss, "mean_acc": ev.mean_acc,
            "avg_model_acc": ev.avg_model_acc, "consensus_distance": ev.consensus_distance,
            "test_loss": ev.mean_loss, "bytes_per_node": bytes_per_node}


def epoch_view(sim, run: RunCfg):
    """Where the epoch's test reads the models: after the last gossip, or before it."""
    return sim.premix_view() if run.epoch_test == "before-last-gossip" else contextlib.nullcontext()


def run_epochs(sim, run: RunCfg, trainee: Trainee, state: Progress, *, fused_quant: bool, checkpoint=None,
               fingerprint=None, aug=None, progress: Callable[[dict], None] | None = None) -> None:
    """Train from state.start_epoch to run.epochs (or until the trainee stops), appending to
    state.curve; after each epoch, save `checkpoint` (a Checkpoints, or None) with `fingerprint`
    and the augmentation streams `aug` (anything with get_state())."""
    dev, iters = sim.device, trainee.iters
    per_step, total = run.schedule.per_step, run.epochs * iters
    arithmetic.reset(dev)  # the run's record of its 8-bit layers' arithmetic starts here
    for epoch in range(state.start_epoch, run.epochs):
        if trainee.stopped:
            break
        lr = None if per_step else lr_at(epoch, run.lr, run.schedule)
        loss_sum = torch.zeros(sim.x.shape[0], device=dev)
        for it, (xb, yb) in enumerate(trainee.batches(epoch)):
            if per_step:
                lr = lr_at_step(epoch * iters + it, total, run.lr, run.schedule)
            sim.keep_premix = run.tests_before_gossip(it, iters)
            with fused.enabled(fused_quant):
                losses = sim.train_step(xb, yb, lr)
            sim.keep_premix = False
            loss_sum += losses
            trainee.check(losses, epoch, it)
            if trainee.stopped:
                break
            if progress is not None:
                progress({"event": "step", "epoch": epoch, "iteration": it, "iters_per_epoch": iters})
        if trainee.stopped:
            break
        with epoch_view(sim, run):
            entry, event = trainee.epoch_end(epoch, lr, loss_sum)
        state.curve.append(entry)
        if checkpoint is not None:
            checkpoint.save({
                "fingerprint": fingerprint, "epoch": epoch, "curve": state.curve, "sim": sim.state_dict(),
                "torch_rng": torch.get_rng_state(), "aug_gen": aug.get_state(),
                "cuda_rng": torch.cuda.get_rng_state(dev) if dev.type == "cuda" else None,
                "elapsed": state.elapsed()})
        if progress is not None:
            progress({"event": "epoch", **event, "epochs": run.epochs})
