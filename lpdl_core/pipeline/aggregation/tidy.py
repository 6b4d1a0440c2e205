"""Every run of a results folder as tidy pandas frames (torch-free).

    runs.csv    one row per (cell, seed): the cell's axes, the run's status and final metrics, what
                it ran on (mapping), its fidelity options and its provenance
    curves.csv  one row per (cell, seed, epoch): the per-epoch curve

Each run is read from its own folder, results/{profile}/runs/{cell}/seed{seed}/, and its identity
checked (runstore). A run whose metrics.json is corrupt or holds another run's result is one row
with status "damaged", no numbers and the one-line reason in `problem` (never a row under the
wrong name, and never a failed aggregate: the other cells are unaffected). A damaged curve.csv
leaves the run's checked final numbers and is noted in `problem`; a run that diverged in its
first epoch has an empty curve. A cell without a finished run has no row: missing stays missing.
"""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict
from pathlib import Path
from typing import Callable, Iterable

import pandas as pd

from ...config import FIDELITY_BEFORE, FIDELITY_CHOICES, fidelity_mode, recorded_fidelity
from ...errors import CorruptFile, RunMismatch
from ..cells.cell import Cell, columns
from ..run.results import CURVE_COLUMNS
from ..run.runstore import ANY_DATA, identity_of, read_run_metrics, run_identity, run_key
from .targets import num_classes

CELL_COLUMNS = columns("runs")
PROVENANCE = ("git_sha", "git_dirty", "python", "torch", "device_name")
RUN_COLUMNS = ("cell_id", *CELL_COLUMNS, "paper", "profile", "data", "seed", "status", "diverged_epoch", "epochs_done",
               "mean_acc", "avg_model_acc", "consensus_distance", "test_loss", "node_acc_min", "node_acc_max",
               "before_final_mean_acc", "before_final_avg_model_acc", "before_final_consensus_distance",
               "mb_per_node", "wall_time_s", "num_classes", "chance", "same_run_as", "packed_with", "ran_on", "mapping",
               "fidelity_mode", *(f"fidelity_{k}" for k in FIDELITY_CHOICES), "executor", "int8_arithmetic", "device",
               *PROVENANCE, "problem", "run_key", "metrics_sha256")
RUNS_FILE, CURVES_FILE = "runs.csv", "curves.csv"
REAL_DATA = "real"   # runs.csv's `data` for a run on the real data (else the identity's, e.g. "rehearsal")


def run_dir(results_dir: str | Path, cell_id: str, seed: int) -> Path:
    """results/{profile}/runs/{cell}/seed{seed}: where one run lives."""
    return Path(results_dir) / "runs" / cell_id / f"seed{seed}"


def seeds_present(results_dir: str | Path, cell_id: str) -> list[int]:
    """Seeds with a finished run (a metrics.json) of a cell, ascending."""
    d = Path(results_dir) / "runs" / cell_id
    found = [p.parent.name.removeprefix("seed") for p in d.glob("seed*/metrics.json")] if d.is_dir() else []
    return sorted(int(s) for s in found if s.isdigit())


def _finite(v) -> float | None:
    """v as a finite float, else None (also for a value that is not a number at all)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v) if math.isfinite(v) else None


def _diverged_epoch(m: dict) -> int | None:
    d = m.get("diverged_at")
    if d is None or m.get("status") != "diverged":
        return None
    return int(d["epoch"] if isinstance(d, dict) else d)


def run_row(cell: Cell, seed: int, profile: str, m: dict, classes: int | None = None) -> dict:
    """One runs.csv row from a checked metrics.json (classes: of the data it trained on, when known)."""
    final, cfg, prov = m.get("final", {}), m.get("config", {}), m.get("provenance", {})
    before = m.get("before_final") if isinstance(m.get("before_final"), dict) else {}
    node = [a for a in (final.get("node_acc") or ()) if a is not None]
    classes = classes or m.get("num_classes")
    fid = recorded_fidelity(cfg.get("fidelity", {}))
    return {
        "cell_id": cell.cell_id, **{k: getattr(cell, k) for k in CELL_COLUMNS},
        "paper": cell.paper_acc, "profile": profile, "seed": seed, "status": m.get("status", "ok"),
        # the data it trained on: "real", or "rehearsal" (lpdl rehearsal-data: synthetic, never an accuracy)
        "data": identity_of(m).get("data") or REAL_DATA,
        "diverged_epoch": _diverged_epoch(m), "epochs_done": m.get("epochs_done"),
        "mean_acc": _finite(final.get("mean_acc")), "avg_model_acc": _finite(final.get("avg_model_acc")),
        "consensus_distance": _finite(final.get("consensus_distance")),
        "test_loss": _finite(final.get("mean_loss")),
        "node_acc_min": min(node) if node else None, "node_acc_max": max(node) if node else None,
        # the trained models before the final rounds merged them (runs with final rounds only)
        **{f"before_final_{k}": _finite(before.get(k)) for k in ("mean_acc", "avg_model_acc", "consensus_distance")},
        "mb_per_node": _finite(m["bytes_per_node"] / 1e6) if m.get("bytes_per_node") is not None else None,
        "wall_time_s": m.get("wall_time_s"), "num_classes": classes,
        "chance": 100.0 / classes if classes else None,
        "same_run_as": cfg.get("same_run_as") or "",
        # the other cells of its pack (lpdl_core.pipeline.run.runpack): its wall time is the pack's
        "packed_with": ";".join(sorted(cfg.get("packed_with") or [])), "ran_on": cfg.get("dataset", ""),
        "mapping": "; ".join(cfg.get("mapping", [])),
        "fidelity_mode": fidelity_mode(fid),
        **{f"fidelity_{k}": v for k, v in fid.items()},
        "executor": m.get("executor", cfg.get("executor")), "device": m.get("device"),
        # the arithmetic its 8-bit layers took ('' in an FP run; a run from before it was recorded: fake)
        "int8_arithmetic": m.get("int8_arithmetic",
                                 FIDELITY_BEFORE["int8_arithmetic"] if cell.precision != "fp32" else ""),
        **{k: prov.get(k) for k in PROVENANCE},
    }


def file_sha256(path: Path) -> str:
    """The bytes of a run file, hashed: which result a runs.csv row was read from."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def damaged_row(cell: Cell, seed: int, profile: str, why: str, sha: str | None = None) -> dict:
    """The row of a run whose metrics.json cannot be used: its cell, no numbers, the reason."""
    return {"cell_id": cell.cell_id, **{k: getattr(cell, k) for k in CELL_COLUMNS}, "paper": cell.paper_acc,
            "profile": profile, "seed": seed, "status": "damaged", "problem": why, "metrics_sha256": sha}


def _curve(path: Path, cell_id: str, seed: int, m: dict) -> tuple[pd.DataFrame | None, str]:
    """(the run's per-epoch curve, "") or (None, why it cannot be read). A run that diverged before
    its first epoch ended has no curve rows (an empty file, or a header only)."""
    none_expected = m.get("status") == "diverged" and not m.get("epochs_done")
    if not path.is_file():
        return None, f"{path}: missing (the per-epoch curve)"
    try:
        df = pd.read_csv(path)
    except pd.errors.EmptyDataError:
        return (None, "") if none_expected else (None, f"{path}: empty, but the run finished epochs")
    except (pd.errors.ParserError, UnicodeDecodeError) as e:
        return None, f"{path}: not a curve CSV ({type(e).__name__})"
    missing = [c for c in ("epoch", "mean_acc") if c not in df.columns]
    if missing:
        return None, f"{path}: not a curve CSV (no {', '.join(missing)} column)"
    df.insert(0, "seed", seed)
    df.insert(0, "cell_id", cell_id)
    return df, ""


def read_runs(cells: Iterable[Cell], results_dir: str | Path, *, profile: str, seeds=None,
              fidelity=None, warn: Callable[[str], None] | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(runs, curves) of every finished run of `cells` under results_dir.

    seeds: the seeds to read (a missing run stays missing); None = every seed present.
    fidelity: the fidelity options every run must have (None: any). A corrupt metrics.json, or one
    of another cell, seed, profile or setting, is a "damaged" row; `warn` gets each problem's line.
    """
    rows, curves = [], []
    warn = warn or (lambda line: None)
    for c in cells:
        for seed in (seeds_present(results_dir, c.cell_id) if seeds is None else seeds):
            d = run_dir(results_dir, c.cell_id, seed)
            path = d / "metrics.json"
            if not path.exists():
                continue
            want = {**run_identity(c, profile=profile, seed=seed, fidelity=fidelity or {}), "data": ANY_DATA}
            if fidelity is None:
                del want["fidelity"]
            try:
                sha = file_sha256(path)
                m = read_run_metrics(path, want)
            except (CorruptFile, RunMismatch, OSError) as e:
                why = str(e) if isinstance(e, (CorruptFile, RunMismatch)) else f"{path}: unreadable ({e.strerror})"
                warn(why)
                rows.append(damaged_row(c, seed, profile, why, sha=None if isinstance(e, OSError) else sha))
                continue
            row = run_row(c, seed, profile, m, num_classes(m, d))
            curve, problem = _curve(d / "curve.csv", c.cell_id, seed, m)
            if problem:
                warn(problem)
            rows.append({**row, "problem": problem, "run_key": run_key(identity_of(m)),
                         "metrics_sha256": sha})
            if curve is not None:
                curves.append(curve)
    runs = _texts(pd.DataFrame(rows, columns=list(RUN_COLUMNS)))
    curve_df = (pd.concat(curves, ignore_index=True) if curves
                else pd.DataFrame(columns=["cell_id", "seed", *CURVE_COLUMNS]))
    return runs, curve_df


def write_frame(df: pd.DataFrame, path: str | Path, **kw) -> Path:
    """A frame as CSV, written atomically (a kill mid-write leaves the previous file)."""
    from ...atomic import write_atomic

    return write_atomic(path, df.to_csv(index=kw.pop("index", False), lineterminator="\n", **kw))


TEXT_COLUMNS = ("data", "same_run_as", "packed_with", "mapping", "diverged_at", "ran_on", "git_sha", "problem",
                "run_key", "metrics_sha256")


def _texts(df: pd.DataFrame) -> pd.DataFrame:
    """df with its free-text columns as strings, "" where empty (a damaged run's row has none)."""
    for c in TEXT_COLUMNS:
        if c in df:
            col = df[c]
            df[c] = (col if pd.api.types.is_string_dtype(col) else col.astype(object)).fillna("")
    return df


def read_frame(path: str | Path, what: str) -> pd.DataFrame:
    """A CSV the aggregate step wrote; one line naming the file when it is missing or unreadable.
    Free-text columns come back as strings ("" when empty), never as NaN floats."""
    path = Path(path)
    if not path.is_file():
        raise CorruptFile(f"{path}: missing ({what}; the aggregate step writes it)")
    try:
        head = pd.read_csv(path, nrows=0).columns
        return _texts(pd.read_csv(path, dtype={c: str for c in TEXT_COLUMNS if c in head}))
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as e:
        raise CorruptFile(f"{path}: not a readable {what} ({type(e).__name__})") from None


def cells_frame(cells: Iterable[Cell]) -> pd.DataFrame:
    """The paper cells as a frame (one row per cell, every column; milestones as JSON)."""
    rows = [{**asdict(c), "cell_id": c.cell_id, "milestones": json.dumps(list(c.milestones))} for c in cells]
    return pd.DataFrame(rows)
