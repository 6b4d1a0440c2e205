"""What the report reads: only the files the DAG gives it (no run folder, no model, no torch).

    results/{profile}/runs.csv            one row per (cell, seed)     (the aggregate rule)
    results/{profile}/curves.csv          one row per (cell, seed, epoch)
    results/{profile}/tables/{table}.csv  one row per paper cell (groupby over seeds)
    results/{profile}/cost.json           Figure 3's numbers             (the cost rule)
    results/{profile}/partitions.csv      Figures 2, 5-7's partitions    (the partitions rule)
    {paper_dir}/{table}.csv               the paper's cells
    {compare_dir}/runs.csv, tables/*.csv  the other fidelity mode's results (optional: the
                                          report's "Paper text vs official code" section)

A missing runs.csv, curves.csv or table CSV (of either folder) is one line naming the file; a
missing cost.json or partitions.csv leaves its figure out with a warning in the report's header.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import pandas as pd

from ..errors import CorruptFile
from ..pipeline.cells.tables import load_cells
from ..pipeline.aggregation.tidy import CURVES_FILE, RUNS_FILE, read_frame
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


def load_report_data(results_dir: str | Path, paper_dir: str | Path | None = None, tables=None,
                     profile: str | None = None, compare_dir: str | Path | None = None) -> ReportData:
    """results_dir: results/{profile}, holding what the aggregate, cost and partitions rules wrote.
    tables: which paper artifacts (default: every one in paper_dir).
    compare_dir: another results folder of the same profile in the other fidelity mode (its
    runs.csv and the same tables/*.csv): its cells beside these (ReportData.modes)."""
    results_dir = Path(results_dir)
    profile = profile or results_dir.name.removesuffix("-official")  # results/{profile}[-official]
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
    compared = _compare(Path(compare_dir), names, known, runs, summary, notes) if compare_dir is not None else {}
    return ReportData(profile=profile, cells=cells, runs=runs, curves=curves, summary=summary, cost=cost,
                      partitions=partitions, notes=tuple(notes), **compared)


def load_grids_data(grid_dirs: Iterable[str | Path]) -> ReportData:
    """The report's data when it holds extension grids alone (config `tables: []`): every grid's
    runs.csv and tables/<grid>.csv (one row per cell), for the header's provenance and warnings.
    No paper cells, curves, cost or partitions."""
    dirs = [Path(d) for d in grid_dirs]
    if not dirs:
        raise CorruptFile("a report without paper tables needs at least one extension grid's results")
    runs = pd.concat([read_frame(d / RUNS_FILE, f"runs table of grid {d.name}") for d in dirs], ignore_index=True)
    summary = pd.concat([read_frame(d / "tables" / f"{_grid_name(d)}.csv", f"table of grid {d.name}")
                         for d in dirs], ignore_index=True)
    profiles = sorted({str(p) for p in summary["profile"].dropna()}) if "profile" in summary else []
    if len(profiles) > 1:
        raise CorruptFile(f"the grids' results are of several profiles ({', '.join(profiles)}): one report per profile")
    profile = profiles[0] if profiles else dirs[0].name.split("-")[0]
    return ReportData(profile=profile, cells=(), runs=runs, curves=pd.DataFrame(), summary=summary)


def _grid_name(results: Path) -> str:
    """A grid's name, as its grid.json (the aggregate step's) records it."""
    from .grids import GRID_FILE, load_spec

    return load_spec(results / GRID_FILE).name


def _compare(compare_dir: Path, names: list[str], known: set[str], runs: pd.DataFrame,
             summary: pd.DataFrame, notes: list[str]) -> dict:
    """ReportData's modes, mode_names and mode_options: this folder's cells beside compare_dir's
    (its runs.csv gives its fidelity mode, its tables/*.csv its cells)."""
    from .modes import MODE_LABELS, column_modes, compare_modes, differing_options, runs_mode

    other_runs = read_frame(compare_dir / RUNS_FILE, "runs table of the compared fidelity mode")
    other_runs = other_runs[other_runs["cell_id"].isin(known)] if "cell_id" in other_runs else other_runs
    other = pd.concat([read_frame(compare_dir / "tables" / f"{t}.csv", f"{t} table of the compared fidelity mode")
                       for t in names], ignore_index=True) if names else pd.DataFrame()
    this_mode, other_mode = runs_mode(runs), runs_mode(other_runs)
    swapped, modes = column_modes(this_mode, other_mode)
    if sorted(modes) != ["official", "paper"]:
        notes.append(f"Fidelity modes compared: this folder's runs are {MODE_LABELS[this_mode].lower()}, "
                     f"{compare_dir}'s {MODE_LABELS[other_mode].lower()}: not the paper text beside the "
                     f"official code.")
    left, right = (other_runs, runs) if swapped else (runs, other_runs)
    return {"modes": compare_modes(summary, other, this_mode, other_mode), "mode_names": modes,
            "mode_options": differing_options(left, right)}


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
