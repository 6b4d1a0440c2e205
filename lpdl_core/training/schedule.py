"""Learning-rate schedules. The official code's (a constant 0.1x warm-up epoch, then MultiStepLR
stepped once per epoch) and the mini profile's "cosine", stepped every iteration: with a few
hundred steps in all, a per-epoch schedule is too coarse.

    cosine:  lr(t) = base * (t + 1) / T_w                                  for t < T_w
             lr(t) = base * (1 + cos(pi * (t - T_w) / (T - T_w))) / 2      otherwise
    with T the run's total steps and T_w = round(warmup_fraction * T)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import SCHEDULES


@dataclass(frozen=True, kw_only=True)
class ScheduleCfg:
    """kind: "resnet" (x0.1 at epochs 100 and 150), "vgg" (x0.5 every 30 epochs), "multistep"
    (x`gamma` at `milestones`), "constant", "cosine" (per step, see the module docstring).
    warmup_epochs run at warmup_factor x lr (per-epoch kinds); "cosine" warms up linearly over
    warmup_fraction of all steps instead."""

    kind: str = "resnet"      # one of lpdl_core.config.SCHEDULES
    milestones: tuple[int, ...] = ()
    gamma: float = 0.1
    warmup_epochs: int = 1
    warmup_factor: float = 0.1
    warmup_fraction: float = 0.0

    @property
    def per_step(self) -> bool:
        return self.kind == "cosine"

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"schedule.kind must be one of {SCHEDULES}, got {self.kind!r}")
        if self.warmup_epochs < 0 or not 0 < self.warmup_factor <= 1:
            raise ValueError("schedule.warmup_epochs must be >= 0 and warmup_factor in (0, 1]")
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise ValueError(f"schedule.warmup_fraction must be in [0, 1), got {self.warmup_fraction}")
        if list(self.milestones) != sorted(self.milestones):
            raise ValueError(f"schedule.milestones must be increasing, got {self.milestones}")


def lr_at(epoch: int, base_lr: float, cfg: ScheduleCfg) -> float:
    """Learning rate used throughout `epoch` (0-based).

    ResNet, 200 epochs: 0.01 at epoch 0, 0.1 for 1-99, 0.01 for 100-149, 0.001 for 150-199.
    VGG: 0.01 at 0, then 0.1 x 0.5^floor(epoch/30), ending at 0.0015625.
    """
    if cfg.per_step:
        raise ValueError(f"schedule {cfg.kind!r} is stepped per iteration: use lr_at_step")
    if epoch < cfg.warmup_epochs:
        return base_lr * cfg.warmup_factor
    if cfg.kind == "constant":
        return base_lr
    if cfg.kind == "vgg":
        return base_lr * 0.5 ** (epoch // 30)
    milestones, gamma = ((100, 150), 0.1) if cfg.kind == "resnet" else (cfg.milestones, cfg.gamma)
    return base_lr * gamma ** sum(epoch >= m for m in milestones)


def lr_at_step(step: int, total_steps: int, base_lr: float, cfg: ScheduleCfg) -> float:
    """Learning rate of iteration `step` (0-based) of `total_steps` for per-step kinds."""
    if not cfg.per_step:
        raise ValueError(f"schedule {cfg.kind!r} is stepped per epoch: use lr_at")
    if not 0 <= step < total_steps:
        raise ValueError(f"step must be in [0, {total_steps}), got {step}")
    warm = round(cfg.warmup_fraction * total_steps)
    if step < warm:
        return base_lr * (step + 1) / warm
    return base_lr * 0.5 * (1.0 + math.cos(math.pi * (step - warm) / (total_steps - warm)))
