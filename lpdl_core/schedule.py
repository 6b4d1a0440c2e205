"""Learning-rate schedules of the official code (official-code.md section 4): a constant 0.1x
warm-up epoch, then MultiStepLR stepped once per epoch."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

SCHEDULES = ("resnet", "vgg", "multistep", "constant")


@dataclass(frozen=True, kw_only=True)
class ScheduleCfg:
    """kind: "resnet" (x0.1 at epochs 100 and 150), "vgg" (x0.5 every 30 epochs), "multistep"
    (x`gamma` at `milestones`), "constant". warmup_epochs run at warmup_factor x lr."""

    kind: Literal["resnet", "vgg", "multistep", "constant"] = "resnet"
    milestones: tuple[int, ...] = ()
    gamma: float = 0.1
    warmup_epochs: int = 1
    warmup_factor: float = 0.1

    def __post_init__(self) -> None:
        if self.kind not in SCHEDULES:
            raise ValueError(f"schedule.kind must be one of {SCHEDULES}, got {self.kind!r}")
        if self.warmup_epochs < 0 or not 0 < self.warmup_factor <= 1:
            raise ValueError("schedule.warmup_epochs must be >= 0 and warmup_factor in (0, 1]")
        if list(self.milestones) != sorted(self.milestones):
            raise ValueError(f"schedule.milestones must be increasing, got {self.milestones}")


def lr_at(epoch: int, base_lr: float, cfg: ScheduleCfg) -> float:
    """Learning rate used throughout `epoch` (0-based).

    ResNet, 200 epochs: 0.01 at epoch 0, 0.1 for 1-99, 0.01 for 100-149, 0.001 for 150-199.
    VGG: 0.01 at 0, then 0.1 x 0.5^floor(epoch/30), ending at 0.0015625.
    """
    if epoch < cfg.warmup_epochs:
        return base_lr * cfg.warmup_factor
    if cfg.kind == "constant":
        return base_lr
    if cfg.kind == "vgg":
        return base_lr * 0.5 ** (epoch // 30)
    milestones, gamma = ((100, 150), 0.1) if cfg.kind == "resnet" else (cfg.milestones, cfg.gamma)
    return base_lr * gamma ** sum(epoch >= m for m in milestones)
