"""Run artifacts on disk: every write is atomic (temp file in the same folder, then os.replace), so
a killed job never leaves a half-written metrics file that a rerun would trust."""
from __future__ import annotations

import csv
import io
import os
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from ...atomic import write_atomic, write_json
from ...provenance import provenance


# the columns of a run's curve.csv (one row per epoch; lpdl_core.training.train writes the rows)
CURVE_COLUMNS = ("epoch", "lr", "train_loss", "mean_acc", "avg_model_acc", "consensus_distance", "test_loss",
                 "bytes_per_node")


def write_rows(path, rows: Iterable[Mapping], columns: Iterable[str] = ()) -> Path:
    """CSV with `columns`, then the other keys (in first-seen order), as header: a file with no
    rows still has its header."""
    rows = list(rows)
    keys: list[str] = list(columns)
    for r in rows:
        keys += [k for k in r if k not in keys]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=keys, lineterminator="\n")
    w.writeheader()
    w.writerows(rows)
    return write_atomic(path, buf.getvalue())


def partition_rows(hist: np.ndarray, class_names: tuple[str, ...] = ()) -> list[dict]:
    """Per-node class histogram as CSV rows: node, one column per class, total."""
    names = list(class_names) if len(class_names) == hist.shape[1] else [f"c{c}" for c in range(hist.shape[1])]
    return [{"node": i, **{n: int(v) for n, v in zip(names, row)}, "total": int(row.sum())}
            for i, row in enumerate(hist)]


def save_run(result, out_dir: str | os.PathLike, *, config: Mapping, class_names: tuple[str, ...] = (),
             identity: Mapping | None = None) -> Path:
    """Write a finished run: curve.csv (per epoch), partition.csv (per-node class histogram) and,
    last, metrics.json (its presence marks the run complete). identity: what the run is
    (`runstore.run_identity`), checked by every reader."""
    out = Path(out_dir)
    write_rows(out / "curve.csv", result.curve, CURVE_COLUMNS)  # a run diverged in epoch 1: header only
    write_rows(out / "partition.csv", partition_rows(result.partition, class_names))
    metrics = {"status": result.status, "epochs_done": result.epochs_done, "diverged_at": result.diverged_at,
               "final": result.final, "bytes_per_node": result.bytes_per_node,
               "wall_time_s": result.wall_time_s, "executor": result.executor, "device": result.device,
               "config": dict(config), "provenance": provenance()}
    if getattr(result, "before_final", None) is not None:  # the models before the final rounds merged them
        metrics["before_final"] = result.before_final
    if getattr(result, "step_split", None):  # distributed: each rank's seconds per step by phase
        metrics["step_split"] = list(result.step_split)
    if getattr(result, "int8_arithmetic", ""):  # what its 8-bit layers took (lpdl_core.quant.arithmetic)
        metrics["int8_arithmetic"] = result.int8_arithmetic
    if class_names:
        metrics["num_classes"] = len(class_names)  # chance = 100 / num_classes ("did not learn")
    if identity is not None:
        metrics["identity"] = dict(identity)
    return write_json(out / "metrics.json", metrics)
