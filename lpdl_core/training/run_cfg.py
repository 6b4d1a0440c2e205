"""One run's training protocol (`RunCfg`): epochs, batch, learning rate and schedule, the data
partition and sampler, the final rounds, and the official trainer's protocol as named options.
What it drives: lpdl_core.training.train."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from ..config import DEFAULT_SEED, FIDELITY_CHOICES
from ..data.sampler import NodeSampler
from ..decentral.partition import epoch_samples, node_partition
from .schedule import ScheduleCfg


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
    final_rounds: str = "gossip-only"       # FIDELITY_CHOICES["final_rounds"]
    data_on: Literal["device", "host"] = "device"
    curve_eval_samples: int | None = None
    epoch_test: str = "after-gossip"        # FIDELITY_CHOICES["epoch_test"]
    final_round_limit: str = "cell"         # FIDELITY_CHOICES["final_round_limit"]
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
