"""The data of the paper's partition figures (Figures 2, 5, 6, 7): per-node class counts of the
official skew partition of each paper dataset's training set, for the node counts and skews the
paper's captions show (plus the IID panel for reference). Torch-free (numpy and pandas): the
`partitions` rule writes it to results/{profile}/partitions.csv (`lpdl partition-figures`), and
the report draws it.

It is computed on the real datasets' class sizes (lpdl_core.decentral.partition.KNOWN_CLASS_SIZES), not on
the runs, so it shows the paper's partitions in every profile.
"""
from __future__ import annotations

import pandas as pd

from ...config import DEFAULT_SEED
from ...decentral.partition import KNOWN_CLASS_SIZES, histograms, labels_from_class_sizes, skew_partition

PARTITION_SEED = DEFAULT_SEED  # the official --seed
# (name, paper figure, dataset, ((nodes, skew), ...)): node counts as the paper's captions
# (Fig. 5: 4 and 8 nodes; Figs. 6-7: 4-node ring), plus the IID (skew 0) panel for reference.
PARTITION_FIGURES = (
    ("fig2-partition-cifar10", "Figure 2", "cifar10", ((8, 0.0), (8, 0.4), (8, 0.8), (8, 0.9))),
    ("fig5-partition-imagenette", "Figure 5", "imagenette", ((4, 0.0), (4, 0.6), (8, 0.0), (8, 0.6))),
    ("fig6-partition-agnews", "Figure 6", "agnews", ((4, 0.0), (4, 0.5), (4, 0.9))),
    ("fig7-partition-sentlen", "Figure 7", "sentlen", ((4, 0.0), (4, 0.5), (4, 0.9))),
)
SENTLEN_TRAIN, SENTLEN_CLASSES = 100_000, 6  # paper Sec. 4.2: 100,000 train samples, 6 bins
COLUMNS = ("figure", "paper_figure", "dataset", "nodes", "skew", "node", "class", "count",
           "dataset_samples", "sizes_assumed", "seed")


def class_sizes(dataset: str) -> tuple[tuple[int, ...], bool]:
    """(train class sizes, assumed?). Sentlen has no official sizes: 6 equal classes (up to 1)
    summing to 100,000, assumed."""
    if dataset in KNOWN_CLASS_SIZES:
        return KNOWN_CLASS_SIZES[dataset], False
    if dataset == "sentlen":
        q, r = divmod(SENTLEN_TRAIN, SENTLEN_CLASSES)
        return tuple(q + (i < r) for i in range(SENTLEN_CLASSES)), True
    raise ValueError(f"no class sizes for {dataset!r}")


def partition_figures_frame(seed: int = PARTITION_SEED) -> pd.DataFrame:
    """One row per (figure, panel (nodes, skew), node, class): the count of that class's training
    samples on that node."""
    rows = []
    for name, paper_fig, dataset, panels in PARTITION_FIGURES:
        sizes, assumed = class_sizes(dataset)
        labels = labels_from_class_sizes(sizes)
        for nodes, skew in panels:
            h = histograms(skew_partition(labels, nodes, float(skew), seed=seed), labels)
            rows += [{"figure": name, "paper_figure": paper_fig, "dataset": dataset, "nodes": nodes,
                      "skew": float(skew), "node": i, "class": k, "count": int(h[i, k]),
                      "dataset_samples": int(sum(sizes)), "sizes_assumed": assumed, "seed": seed}
                     for i in range(nodes) for k in range(h.shape[1])]
    return pd.DataFrame(rows, columns=list(COLUMNS))
