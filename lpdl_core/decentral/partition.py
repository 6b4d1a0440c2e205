"""Heterogeneous (non-IID) data partitions across n nodes: the paper's skew split (Sec. 4,
"skew" s in [0, 1], Fig. 2), reimplemented from the official `skew_sort` + `DataPartitioner`
(docs/paper-vs-code.md, 'The partition algorithm'), plus a Dirichlet(alpha) split for comparison.
"""
from __future__ import annotations

import json
import math
import os
import random
from typing import Sequence

import numpy as np

from ..config import DATASET_SPECS, DEFAULT_SEED

# Train-split class sizes, in label order, of the datasets whose spec gives them (as the official
# code hard-codes them, CIFAR-100 fixed: the official dict has only 10 entries; Imagenette:
# imagenette2 train, sorted-wnid folder order): lpdl_core.specs.datasets.
KNOWN_CLASS_SIZES: dict[str, tuple[int, ...]] = {n: s.class_sizes for n, s in DATASET_SPECS.items()
                                                 if s.class_sizes is not None}


def labels_from_class_sizes(class_sizes: Sequence[int]) -> np.ndarray:
    """Build a class-sorted label vector `[0]*size_0 + [1]*size_1 + ...`.

    Args:
        class_sizes: number of samples of each class, in label order.
    Returns:
        int64 array of length `sum(class_sizes)`.
    """
    sizes = [int(s) for s in class_sizes]
    if any(s < 0 for s in sizes):
        raise ValueError(f"class sizes must be non-negative, got {sizes}")
    return np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)


def _check_labels(labels: np.ndarray) -> np.ndarray:
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0:
        raise ValueError("labels must be a non-empty 1-D array")
    if not np.issubdtype(labels.dtype, np.integer):
        raise ValueError(f"labels must be integers, got dtype {labels.dtype}")
    if labels.min() < 0:
        raise ValueError("labels must be non-negative")
    return labels.astype(np.int64, copy=False)


def _check_n(n: int, num_samples: int) -> int:
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if n > num_samples:
        raise ValueError(f"n={n} nodes but only {num_samples} samples")
    return int(n)


def skew_partition(labels: np.ndarray, n: int, skew: float, seed: int = DEFAULT_SEED) -> list[np.ndarray]:
    """Split sample indices over n nodes with the official skew scheme.

    A fraction `skew` of every class goes, in class order, to a "sorted" pool that nodes take
    contiguously (1-2 dominant classes per node); the rest is shuffled with `random.Random(seed)`
    and dealt out evenly. s=0 is IID, s=1 fully class-sorted. Per-node class histograms equal the
    official ones for the same seed. Deviation: the official code sorts labels with numpy's
    unstable quicksort; we sort stably, so WHICH sample of a class lands on a node may differ,
    but the label sequence of both pools (hence every histogram) is identical, because the
    shuffle permutes positions and depends only on the pool length and the seed.

    Float truncation is reproduced exactly, so some samples may be left unused (CIFAR-10, n=8,
    s=0.8: int(6250*(1-0.8)) = 1249 -> 8 unused), and the last node may be short when the sorted
    pool runs out (Imagenette s=0.6, n=4: 2366 x3 + 2362).

    Args:
        labels: 1-D integer class labels, any order.
        n: number of nodes (>= 1).
        skew: s in [0, 1].
        seed: seed of the Python `random.Random` that shuffles the random pool.
    Returns:
        n int64 arrays of indices into `labels`, disjoint; within a node the sorted-pool indices
        come first, then the random-pool ones (official order; loaders shuffle anyway).
    """
    labels = _check_labels(labels)
    n = _check_n(n, labels.size)
    if isinstance(skew, bool) or not isinstance(skew, (int, float, np.integer, np.floating)):
        raise ValueError(f"skew must be a number in [0, 1], got {skew!r}")
    skew = float(skew)
    if not (0.0 <= skew <= 1.0):  # also rejects NaN
        raise ValueError(f"skew must be in [0, 1], got {skew}")

    # Official: class blocks cut from argsort by hard-coded class sizes; we derive the sizes from
    # the labels, which is the same thing when the hard-coded sizes are right.
    order = np.argsort(labels, kind="stable")
    class_size = np.bincount(labels).tolist()

    sorted_pool: list[np.ndarray] = []
    random_pool: list[np.ndarray] = []
    start = 0
    for size_c in class_size:
        block = order[start:start + size_c]
        start += size_c
        cut = int(skew * size_c)  # official operand order: skew*class_size[i]
        sorted_pool.append(block[:cut])
        random_pool.append(block[cut:])
    sorted_idx = np.concatenate(sorted_pool)
    rand_list = np.concatenate(random_pool).tolist()
    # Python's Random.shuffle (not numpy) on a list of the same length gives the same
    # permutation as the official code for the same seed.
    random.Random(seed).shuffle(rand_list)
    rand_idx = np.asarray(rand_list, dtype=np.int64)

    # Official DataPartitioner: frac = 1.0/size, part lengths int(frac*N*skew) and
    # int(frac*N*(1-skew)), evaluated left to right in Python floats. This reading reproduces all
    # listed sizes (6250/6249, 3125/3124, 2366/2362, 1183/1179). List slicing past the end of a
    # pool just yields fewer items, which is why the last Imagenette node comes up short.
    frac = 1.0 / n
    data_len = labels.size
    parts: list[np.ndarray] = []
    s_pos = r_pos = 0
    for _ in range(n):
        if skew == 1.0:
            take_s, take_r = int(frac * data_len), 0
        elif skew == 0.0:
            take_s, take_r = 0, int(frac * data_len)
        else:
            take_s = int(frac * data_len * skew)
            take_r = int(frac * data_len * (1 - skew))
        part = np.concatenate([sorted_idx[s_pos:s_pos + take_s], rand_idx[r_pos:r_pos + take_r]])
        s_pos += take_s
        r_pos += take_r
        parts.append(part.astype(np.int64, copy=False))
    return parts


def dirichlet_partition(labels: np.ndarray, n: int, alpha: float, seed: int = DEFAULT_SEED,
                        min_size: int = 1, max_tries: int = 1000) -> list[np.ndarray]:
    """Standard per-class Dirichlet split (not in the paper; a common non-IID baseline).

    For every class, node shares p ~ Dir(alpha * 1_n) split that class's shuffled indices at the
    cumulative proportions. Whole draws are repeated until every node has >= min_size samples.

    Args:
        labels: 1-D integer class labels.
        n: number of nodes (>= 1).
        alpha: concentration (> 0); small alpha = highly skewed.
        seed: seed of `np.random.default_rng`.
        min_size: minimum samples per node (>= 0).
        max_tries: bound on redraws before giving up with ValueError.
    Returns:
        n sorted int64 index arrays, disjoint, covering all samples.
    """
    labels = _check_labels(labels)
    n = _check_n(n, labels.size)
    alpha = float(alpha)
    if not (alpha > 0.0 and math.isfinite(alpha)):
        raise ValueError(f"alpha must be a finite number > 0, got {alpha}")
    if min_size < 0 or min_size * n > labels.size:
        raise ValueError(f"min_size={min_size} impossible for {labels.size} samples over {n} nodes")
    rng = np.random.default_rng(seed)
    classes = [np.flatnonzero(labels == c) for c in range(int(labels.max()) + 1)]
    for _ in range(max_tries):
        buckets: list[list[np.ndarray]] = [[] for _ in range(n)]
        for idx in classes:
            if idx.size == 0:
                continue
            idx = rng.permutation(idx)
            p = rng.dirichlet(np.full(n, alpha))
            cuts = (np.cumsum(p)[:-1] * idx.size).astype(np.int64)
            for node, chunk in enumerate(np.split(idx, cuts)):
                buckets[node].append(chunk)
        parts = [np.sort(np.concatenate(b)).astype(np.int64) if b else np.empty(0, np.int64)
                 for b in buckets]
        if min(p.size for p in parts) >= min_size:
            return parts
    raise ValueError(f"no Dirichlet(alpha={alpha}) draw gave every node >= {min_size} samples "
                     f"in {max_tries} tries; raise alpha or lower min_size")


# How a Dirichlet split's epoch length is chosen (`epoch_samples`), as Dirichlet runs' identities
# name it (lpdl_core.pipeline.run.runstore): their runs under the earlier rule (the largest shard) are
# other runs, recomputed.
DIRICHLET_EPOCH = "mean shard"


def epoch_samples(parts: Sequence[np.ndarray], dirichlet_alpha: float | None = None) -> int:
    """L, the samples every node takes per epoch (lpdl_core.data.sampler), by partition kind:

    * the paper's skew split: its largest shard, L = max_i |P_i| (the official drop_last=False
      loader of the largest node; the shards are equal up to the last node's remainder);
    * a Dirichlet split: its mean shard, L = floor(sum_i |P_i| / n). Its shards differ by design
      (at alpha 0.01 from 1 to over 400 digits samples on 8 nodes), so the largest would give each
      alpha, and each draw, its own training length (2.4x the skew split's at alpha 0.01): with
      the mean, every partition of a dataset trains the same steps on the same number of samples.
    """
    sizes = [len(p) for p in parts]
    return max(sizes) if dirichlet_alpha is None else sum(sizes) // len(sizes)


def epoch_iterations(length: int, batch: int) -> int:
    """T = ceil(L / B), the iterations every node takes per epoch of L samples at batch B
    (lpdl_core.data.sampler; the last batch holds the rest)."""
    return math.ceil(length / batch)


def node_partition(labels: np.ndarray, n: int, *, skew: float = 0.0, dirichlet_alpha: float | None = None,
                   seed: int = DEFAULT_SEED) -> list[np.ndarray]:
    """The partition a run trains on: the paper's skew partition, or a Dirichlet(α) split when
    `dirichlet_alpha` is given (then skew must be 0: one partition, one parameter)."""
    if dirichlet_alpha is None:
        return skew_partition(labels, n, skew, seed=seed)
    if skew:
        raise ValueError(f"a Dirichlet partition takes no skew, got skew {skew}")
    return dirichlet_partition(labels, n, dirichlet_alpha, seed=seed)


def histograms(parts: Sequence[np.ndarray], labels: np.ndarray,
               num_classes: int | None = None) -> np.ndarray:
    """Per-node class counts.

    Args:
        parts: per-node index arrays into `labels`.
        labels: 1-D integer labels.
        num_classes: number of columns; default max label + 1.
    Returns:
        (n, C) int64 array of counts.
    """
    labels = _check_labels(labels)
    c = int(labels.max()) + 1 if num_classes is None else int(num_classes)
    if c < int(labels.max()) + 1:
        raise ValueError(f"num_classes={c} smaller than max label + 1")
    out = np.zeros((len(parts), c), dtype=np.int64)
    for i, p in enumerate(parts):
        out[i] = np.bincount(labels[np.asarray(p, dtype=np.int64)], minlength=c)
    return out


def partition_table(hist: np.ndarray, unused: int | None = None) -> str:
    """Aligned text table: node, per-class counts, total, max-class share.

    Args:
        hist: (n, C) counts from `histograms`.
        unused: samples assigned to no node; printed as a last row if given.
    Returns:
        The table as one string (no trailing newline).
    """
    hist = np.asarray(hist, dtype=np.int64)
    if hist.ndim != 2:
        raise ValueError("hist must be 2-D (nodes, classes)")

    def share(row: np.ndarray) -> str:
        tot = int(row.sum())
        return f"{row.max() / tot:.3f}" if tot > 0 and row.size else "-"

    header = ["node"] + [f"c{j}" for j in range(hist.shape[1])] + ["total", "max_share"]
    rows = [[str(i)] + [str(int(v)) for v in r] + [str(int(r.sum())), share(r)]
            for i, r in enumerate(hist)]
    col = hist.sum(axis=0)
    rows.append(["sum"] + [str(int(v)) for v in col] + [str(int(col.sum())), share(col)])
    if unused is not None:
        rows.append(["unused"] + [""] * hist.shape[1] + [str(int(unused)), ""])
    widths = [max(len(r[k]) for r in [header] + rows) for k in range(len(header))]
    return "\n".join("  ".join(cell.rjust(w) for cell, w in zip(r, widths))
                     for r in [header] + rows)


def write_histograms(hist: np.ndarray, path: str | os.PathLike, fmt: str = "csv") -> None:
    """Write per-node histograms atomically (temp file in the same directory + os.replace).

    CSV: header `node,c0,...,c{C-1},total`, one row per node. JSON: {"nodes": n, "classes": C,
    "counts": [[...]], "totals": [...]} with per-node totals (same as the CSV total column).

    Args:
        hist: (n, C) counts.
        path: destination file.
        fmt: "csv" or "json".
    """
    hist = np.asarray(hist, dtype=np.int64)
    if hist.ndim != 2:
        raise ValueError("hist must be 2-D (nodes, classes)")
    if fmt not in ("csv", "json"):
        raise ValueError(f"fmt must be 'csv' or 'json', got {fmt!r}")
    totals = hist.sum(axis=1)
    if fmt == "csv":
        lines = [",".join(["node"] + [f"c{j}" for j in range(hist.shape[1])] + ["total"])]
        lines += [",".join(str(int(v)) for v in [i, *r, totals[i]]) for i, r in enumerate(hist)]
        text = "\n".join(lines) + "\n"
    else:
        text = json.dumps({"nodes": int(hist.shape[0]), "classes": int(hist.shape[1]),
                           "counts": hist.tolist(), "totals": totals.tolist()}, indent=1) + "\n"
    # lpdl's one atomic writer: readers never see a half-written file, only a regular file is
    # replaced, and a failed write is one line naming the path
    from ..atomic import write_bytes

    write_bytes(path, text.encode("utf-8"))
