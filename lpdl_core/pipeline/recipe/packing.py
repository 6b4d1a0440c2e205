"""Which cells can train as one stacked state (a pack), as the planner sees them before any data is
loaded (torch-free): cells of one `pack_key` and one batch plan. The run's own check on the
resolved plans: lpdl_core.training.pack.pack_conflict.
"""
from __future__ import annotations

import functools

from ..cells.cell import columns


# the cell columns that the cells of a pack share, Cell's "pack" columns (lpdl_core.training.pack.pack_conflict
# checks the resolved plans); they may differ in seed, skew, partition, graph, compression and eta
PACK_COLUMNS = columns("pack")


def pack_key(cell) -> tuple:
    return tuple(getattr(cell, c) for c in PACK_COLUMNS)


@functools.lru_cache(maxsize=None)
def _batches(dataset: str, nodes: int, skew: float, alpha: float | None, seed: int, batch: int) -> tuple:
    from ...decentral.partition import (KNOWN_CLASS_SIZES, epoch_iterations, epoch_samples,
                                       labels_from_class_sizes, node_partition)

    if dataset not in KNOWN_CLASS_SIZES:
        return ("skew", skew) if alpha is None else ("dirichlet", alpha)
    parts = node_partition(labels_from_class_sizes(KNOWN_CLASS_SIZES[dataset]), nodes, skew=skew,
                           dirichlet_alpha=alpha, seed=seed)
    length = epoch_samples(parts, alpha)  # L, as the run's sampler takes it (data.sampler)
    return (epoch_iterations(length, batch), length)


def batch_plan(cell) -> tuple:
    """The paper-profile batches of a cell: (iterations per epoch, samples per node per epoch) of its
    partition where its dataset's class sizes are known (lpdl_core.decentral.partition), else its
    skew. Cells stack only with equal batches (lpdl_core.training.pack.batch_plan, on the loaded data)."""
    return _batches(cell.dataset, cell.nodes, cell.skew, cell.dirichlet_alpha, cell.seed, cell.batch_per_node)


def pack_stacks(cells, pack_size: int) -> list[list]:
    """The stacks a paper-profile job of `cells` trains, as the planner counts them: cells of one
    pack_key and one batch plan, pack_size at a time, in the given order (as
    lpdl_core.pipeline.run.runpack forms them)."""
    if pack_size < 1:
        raise ValueError(f"pack_size must be >= 1, got {pack_size}")
    groups: dict[tuple, list] = {}
    for c in cells:
        groups.setdefault((pack_key(c), batch_plan(c)), []).append(c)
    return [g[i:i + pack_size] for g in groups.values() for i in range(0, len(g), pack_size)]
