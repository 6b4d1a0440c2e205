"""Run artifacts on disk: every write is atomic (temp file in the same folder, then os.replace), so
a killed job never leaves a half-written metrics file that a rerun would trust."""
from __future__ import annotations

import csv
import functools
import hashlib
import io
import json
import math
import os
from pathlib import Path
from typing import Iterable, Mapping

import numpy as np

from ..atomic import write_bytes
from ..config import PACKAGE_DIR


def write_atomic(path: str | os.PathLike, text: str) -> Path:
    """`text` (UTF-8) as the content of `path`, atomically and only over a regular file
    (lpdl_core.atomic): NotRegularFile or WriteFailed in one line naming the path otherwise."""
    return write_bytes(path, text.encode("utf-8"))


def finite(obj):
    """obj with every non-finite float (NaN, inf) replaced by None, so the JSON is standard."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {k: finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite(v) for v in obj]
    return obj


def write_json(path, obj) -> Path:
    """Standard JSON (strict parsers accept it): non-finite floats become null."""
    plain = json.loads(json.dumps(obj, default=_jsonable))  # numpy / dataclasses -> plain types
    return write_atomic(path, json.dumps(finite(plain), indent=2, sort_keys=True, allow_nan=False) + "\n")


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


def _jsonable(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if hasattr(o, "__dataclass_fields__"):
        from dataclasses import asdict
        return asdict(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def git(*args: str) -> str | None:
    """A git command's output in the library's own checkout (None outside one). Torch-free."""
    import subprocess

    try:
        return subprocess.run(["git", *args], capture_output=True, text=True, timeout=10,
                              cwd=PACKAGE_DIR, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


@functools.cache
def code_sha256() -> str:
    """sha256 over the library's Python sources (paths and contents), git or not: kept copies of
    finished runs are restored only for the same library code."""
    h = hashlib.sha256()
    for p in sorted(PACKAGE_DIR.rglob("*.py")):
        h.update(p.relative_to(PACKAGE_DIR).as_posix().encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()


def provenance() -> dict:
    """Git SHA (and dirty flag), versions and devices, stored with every run."""
    import platform

    import torch


    status = git("status", "--porcelain", "--untracked-files=no")
    return {"git_sha": git("rev-parse", "HEAD"), "git_dirty": bool(status) if status is not None else None,
            "code_sha256": code_sha256(),
            "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": torch.backends.cudnn.version(),
            "device_name": (torch.cuda.get_device_name() if torch.cuda.is_available()
                            else platform.processor() or platform.machine())}


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
    if class_names:
        metrics["num_classes"] = len(class_names)  # chance = 100 / num_classes ("did not learn")
    if identity is not None:
        metrics["identity"] = dict(identity)
    return write_json(out / "metrics.json", metrics)
