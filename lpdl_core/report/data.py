"""Read one results folder (results/{profile}/) into a ReportData.

Layout: runs/{cell_id}/seed{seed}/{metrics.json, curve.csv, partition.csv}. Only cells of the
requested paper tables are read; a cell with no metrics.json is missing (never filled). The table
rows come from the same `aggregate_table` that writes results/{profile}/tables/*.csv.
"""
from __future__ import annotations

import csv
from pathlib import Path

from ..aggregate import aggregate_table, run_dir, seeds_present
from ..cells import load_cells
from ..runstore import read_metrics, read_run_metrics, run_identity
from .model import ReportData, Run


def _num(text: str):
    try:
        v = float(text)
    except ValueError:
        return text
    return int(v) if v.is_integer() and "." not in text and "e" not in text.lower() else v


def _read_csv(path: Path) -> tuple[dict, ...]:
    if not path.exists():
        return ()
    with path.open(newline="") as f:
        return tuple({k: _num(v) for k, v in row.items()} for row in csv.DictReader(f))


def read_run(run_dir: Path, want: dict | None = None) -> Run:
    """One run folder -> Run. want: the identity the run must have (runstore.run_identity;
    'fidelity' may be left out); a corrupt or mislabelled metrics.json is one line naming it."""
    path = run_dir / "metrics.json"
    metrics = read_metrics(path) if want is None else read_run_metrics(path, want)
    seed = int(run_dir.name.removeprefix("seed")) if run_dir.name.startswith("seed") else \
        int(metrics.get("config", {}).get("seed", 0))
    return Run(cell_id=metrics["config"]["cell_id"], seed=seed, metrics=metrics,
               curve=_read_csv(run_dir / "curve.csv"), partition=_read_csv(run_dir / "partition.csv"))


def load_report_data(results_dir: str | Path, paper_dir: str | Path = "workflow/paper",
                     tables=None, profile: str | None = None, seeds=None, fidelity=None) -> ReportData:
    """results_dir: results/{profile} (holding runs/). tables: which paper artifacts (default all
    present in paper_dir). seeds: only these seeds (default every seed found). fidelity: the
    fidelity options every run must have (default: any; the header lists them)."""
    results_dir = Path(results_dir)
    profile = profile or results_dir.name
    cells = tuple(load_cells(paper_dir, tables=tables))
    runs: dict[str, tuple[Run, ...]] = {}
    for c in cells:
        found = []
        for seed in seeds_present(results_dir, c.cell_id):
            if seeds is not None and seed not in seeds:
                continue
            want = run_identity(c, profile=profile, seed=seed, fidelity=fidelity or {})
            if fidelity is None:
                del want["fidelity"]
            found.append(read_run(run_dir(results_dir, c.cell_id, seed), want))
        if found:
            runs[c.cell_id] = tuple(found)
    rows: dict[str, list[dict]] = {}
    for table in dict.fromkeys(c.table for c in cells):
        tcells = [c for c in cells if c.table == table]
        rows[table] = aggregate_table(tcells, {k: [r.metrics for r in v] for k, v in runs.items()},
                                      profile)
    return ReportData(profile=profile, cells=cells, runs=runs, rows=rows)


def classes_of(run: Run) -> int | None:
    """Classes of the data a run trained on: metrics["num_classes"], else its partition.csv's
    class columns (runs made before num_classes was recorded)."""
    if run.metrics.get("num_classes"):
        return int(run.metrics["num_classes"])
    if run.partition:
        return len([k for k in run.partition[0] if k not in ("node", "total")]) or None
    return None


def cell_classes(data: ReportData, cell_id: str) -> int | None:
    """Classes of the data a cell's runs trained on (None without runs or without the record)."""
    return next((k for run in data.runs.get(cell_id, ()) if (k := classes_of(run))), None)


def chance_of(data: ReportData, cell_id: str) -> float | None:
    """Chance accuracy in percent, 100 / classes, for a cell's runs (None when unknown): taken from
    the runs themselves, never from the table, since a stand-in may have other classes."""
    k = cell_classes(data, cell_id)
    return 100.0 / k if k else None


def not_learned_cells(data: ReportData) -> list[str]:
    """Cells whose reproduced mean is within LEARNED_MARGIN points of chance (cells whose chance
    is unknown, having no run, are not among them)."""
    from .model import LEARNED_MARGIN

    out = []
    for rows in data.rows.values():
        for r in rows:
            ch = chance_of(data, r["cell_id"])
            if r["reproduced"] is not None and ch is not None and r["reproduced"] <= ch + LEARNED_MARGIN:
                out.append(r["cell_id"])
    return out


def per_seed_acc(data: ReportData) -> dict[tuple[str, int], float]:
    """(cell_id, seed) -> final mean node accuracy of every finished (status ok) run."""
    return {(cid, r.seed): float(r.metrics["final"]["mean_acc"]) for cid, runs in data.runs.items()
            for r in runs if r.status == "ok"}
