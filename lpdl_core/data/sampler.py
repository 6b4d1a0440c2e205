"""Per-node minibatches: each node iterates its own partition with its own shuffling.

Rule for the iteration count: every node takes T = ceil(L / B) iterations per epoch, with batch
sizes b_t = min(B, L − t·B), where L is the partition's epoch length
(lpdl_core.decentral.partition.epoch_samples): its largest shard for the paper's skew split (the
official drop_last=False behaviour of the largest node), its mean shard for a Dirichlet split.
Each epoch a node draws a fresh shuffle of its own partition, repeated as needed and cut at L: a
node with a smaller partition sees all of its samples (some twice), one with a larger partition
(Dirichlet only) a fresh random L of them. Batch shapes agree across nodes (needed for stacked
batches) and nobody waits (the official blocking gossip needs equal counts). With equal partition
sizes every sample is seen exactly once per epoch.
"""
from __future__ import annotations

import math
from typing import Iterator, Sequence

import numpy as np
import torch

from ..config import DEFAULT_SEED
from ..decentral.partition import epoch_iterations


class NodeSampler:
    """shared=False: each node shuffles its partition with its own stream, seeded (seed, node,
    epoch). shared=True (the official ranks, seeded alike): every node draws the same local
    permutations, seeded (seed, epoch), so nodes with identical shards see identical batches."""

    def __init__(self, parts: Sequence[np.ndarray], batch_size: int, seed: int = DEFAULT_SEED, shared: bool = False,
                 epoch_len: int | None = None):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        if not parts or any(len(p) == 0 for p in parts):
            raise ValueError("every node needs a non-empty partition")
        self.parts = [np.asarray(p, dtype=np.int64) for p in parts]
        self.batch_size, self.seed, self.shared = batch_size, seed, shared
        # L: given (partition.epoch_samples), else the largest partition
        self.epoch_len = max(len(p) for p in self.parts) if epoch_len is None else int(epoch_len)
        if self.epoch_len < 1:
            raise ValueError(f"epoch_len must be >= 1, got {epoch_len}")

    @property
    def n(self) -> int:
        return len(self.parts)

    @property
    def iters_per_epoch(self) -> int:
        return epoch_iterations(self.epoch_len, self.batch_size)

    def _stream(self, node: int, epoch: int) -> np.ndarray:
        # Seeded by (seed, node, epoch), or (seed, epoch) when shared: any epoch can be regenerated
        # exactly on resume.
        rng = np.random.default_rng([self.seed, epoch] if self.shared else [self.seed, node, epoch])
        part = self.parts[node]
        reps = math.ceil(self.epoch_len / len(part))
        return np.concatenate([part[rng.permutation(len(part))] for _ in range(reps)])[:self.epoch_len]

    def epoch(self, epoch: int) -> Iterator[torch.Tensor]:
        """Yield (n, b_t) index tensors for one epoch."""
        streams = np.stack([self._stream(i, epoch) for i in range(self.n)])
        for s in range(0, self.epoch_len, self.batch_size):
            yield torch.from_numpy(streams[:, s:s + self.batch_size])
