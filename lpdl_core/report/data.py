"""What the report reads: only the files the DAG gives it (no run folder, no model, no torch).

    results/{profile}/runs.csv            one row per (cell, seed)     (the aggregate rule)
    results/{profile}/curves.csv          one row per (cell, seed, epoch)
    results/{profile}/tables/{table}.csv  one row per paper cell (groupby over seeds)
    results/{profile}/cost.json           Figure 3's numbers             (the cost rule)
    results/{profile}/partitions.csv      Figures 2, 5-7's partitions    (the partitions rule)
    {paper_dir}/{table}.csv               the paper's cells

A missing runs.csv, curves.csv or table CSV is one line naming the file; a missing cost.json or
partitions.csv leaves its figure out with a warning in the report's header.
"""
from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from ..errors import CorruptFile
from ..pipeline.cells import load_cells
from ..pipeline.tidy import CURVES_FILE, RUNS_FILE, read_frame
from .model import ReportData

COST_FILE, PARTITIONS_FILE = "cost.json", "partitions.csv"


def _optional_json(path: Path, notes: list[str], what: str) -> dict | None:
    if not path.is_file():
        notes.append(f"{what} not drawn: {path} is missing (the DAG writes it; by hand: lpdl cost --out {path})")
        return None
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CorruptFile(f"{path}: not readable JSON ({type(e).__name__})") from None


def _optional_frame(path: Path, notes: list[str], what: str) -> pd.DataFrame | None:
    if not path.is_file():
        notes.append(f"{what} not drawn: {path} is missing (the DAG writes it; by hand: "
                     f"lpdl partition-figures --out {path})")
        return None
    return read_frame(path, what)


def load_report_data(results_dir: str | Path, paper_dir: str | Path = "workflow/paper", tables=None,
                     profile: str | None = None) -> ReportData:
    """results_dir: results/{profile}, holding what the aggregate, cost and partitions rules wrote.
    tables: which paper artifacts (default: every one in paper_dir)."""
    results_dir = Path(results_dir)
    profile = profile or results_dir.name
    cells = tuple(load_cells(paper_dir, tables=tables))
    names = list(dict.fromkeys(c.table for c in cells))
    notes: list[str] = []
    runs = read_frame(results_dir / RUNS_FILE, "runs table")
    curves = read_frame(results_dir / CURVES_FILE, "curves table")
    summary = pd.concat([read_frame(results_dir / "tables" / f"{t}.csv", f"{t} table") for t in names],
                        ignore_index=True) if names else pd.DataFrame()
    known = {c.cell_id for c in cells}
    runs = runs[runs["cell_id"].isin(known)].reset_index(drop=True)
    curves = curves[curves["cell_id"].isin(known)].reset_index(drop=True)
    cost = _optional_json(results_dir / COST_FILE, notes, "Figure 3")
    partitions = _optional_frame(results_dir / PARTITIONS_FILE, notes, "Figures 2, 5-7")
    return ReportData(profile=profile, cells=cells, runs=runs, curves=curves, summary=summary, cost=cost,
                      partitions=partitions, notes=tuple(notes))


def rows_of(data: ReportData, table: str) -> list[dict]:
    """A table's summary rows as dicts (NaN as None), in paper order."""
    part = data.summary[data.summary["table"] == table]
    return [{k: (None if _isna(v) else v) for k, v in r.items()} for r in part.to_dict("records")]


def _isna(v) -> bool:
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def not_learned_cells(data: ReportData) -> list[str]:
    """Cells whose reproduced mean is within LEARNED_MARGIN points of chance (cells whose chance
    is unknown are not among them)."""
    s = data.summary
    return s.loc[s["learned"].astype("boolean").eq(False).fillna(False), "cell_id"].tolist() if len(s) else []


def per_seed_acc(data: ReportData) -> dict[tuple[str, int], float]:
    """(cell_id, seed) -> final mean node accuracy of every finished (status ok) run."""
    ok = data.runs[(data.runs["status"] == "ok") & data.runs["mean_acc"].notna()]
    return {(c, int(s)): float(a) for c, s, a in zip(ok["cell_id"], ok["seed"], ok["mean_acc"])}


def cell_classes(data: ReportData) -> dict[str, int]:
    """cell_id -> classes of the data its runs trained on (cells without the record are absent)."""
    r = data.runs[data.runs["num_classes"].notna()]
    return {c: int(k) for c, k in zip(r["cell_id"], r["num_classes"])}
