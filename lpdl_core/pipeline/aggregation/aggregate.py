"""The aggregate step (torch-free): the runs of a results folder -> tidy frames -> the per-table CSVs.

    results/{profile}/runs.csv                   one row per (cell, seed)          (tidy.read_runs)
    results/{profile}/curves.csv                 one row per (cell, seed, epoch)
    results/{profile}/tables/{table}.csv         one row per paper cell: groupby over seeds
    results/{profile}/tables/{table}-paper.csv   the same, pivoted to the paper's shape

A table row: reproduced = mean over the cell's finished (status ok) seeds of the mean per-node
test accuracy (the official metric), its standard deviation (two or more seeds), the averaged
model's accuracy, the paper's value and delta = reproduced - paper. A cell without runs is
'missing' and never filled; a cell whose seeds all diverged is 'diverged', some of them
'partly-diverged' (the mean is then over the others); a cell with a run that cannot be read
(lpdl_core.pipeline.aggregation.tidy) is 'damaged' or 'partly-damaged' alike, with the reason in `problem`.
chance = 100 / the classes of the data the
runs trained on; learned = reproduced > chance + LEARNED_MARGIN; same_run_as names the cell whose
mini run this cell's is (computed once). Accuracies are rounded to 2 decimals, MB to 3,
seconds to 1, the consensus distance to 4 significant digits.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Iterable

import pandas as pd

from ...config import LEARNED_MARGIN
from ..cells.cell import Cell, columns
from ..cells.shapes import SHAPES
from .tidy import CURVES_FILE, RUNS_FILE, read_runs, write_frame

# a table row's cell columns (Cell's "table" columns, the id after the block); an extension grid's table
# also has the columns a grid may vary that the paper's tables leave out (its "grid-table" columns)
AXES = (*columns("table")[:2], "cell_id", *columns("table")[2:])
GRID_AXES = (*AXES, *columns("grid-table"))
SUMMARY = ("profile", "seeds", "runs", "status", "reproduced", "reproduced_std", "avg_model", "avg_model_std",
           "paper", "delta", "consensus_distance", "mb_per_node", "wall_time_s", "diverged_at", "chance",
           "learned", "same_run_as", "mapping", "problem")
DECIMALS = {"reproduced": 2, "reproduced_std": 2, "avg_model": 2, "avg_model_std": 2, "paper": 2, "delta": 2,
            "chance": 2, "mb_per_node": 3, "wall_time_s": 1}


def _status(g: pd.DataFrame) -> str:
    """ok: every run finished; diverged / damaged: none did (damaged when one of them cannot be
    read); partly-diverged / partly-damaged: some did (the numbers are theirs)."""
    ok, damaged = int((g["status"] == "ok").sum()), bool((g["status"] == "damaged").any())
    if ok == len(g):
        return "ok"
    return ("damaged" if damaged else "diverged") if ok == 0 else ("partly-damaged" if damaged else "partly-diverged")


def _cell_summary(g: pd.DataFrame) -> pd.Series:
    ok = g[g["status"] == "ok"]
    diverged = sorted(int(e) for e in g["diverged_epoch"].dropna())
    same = sorted({s for s in g["same_run_as"].fillna("") if s})
    return pd.Series({
        "seeds": len(ok), "runs": len(g), "status": _status(g),
        "reproduced": ok["mean_acc"].mean(), "reproduced_std": ok["mean_acc"].std(ddof=1),
        "avg_model": ok["avg_model_acc"].mean(), "avg_model_std": ok["avg_model_acc"].std(ddof=1),
        "consensus_distance": ok["consensus_distance"].mean(), "mb_per_node": ok["mb_per_node"].mean(),
        "wall_time_s": g["wall_time_s"].sum(min_count=1),
        "diverged_at": json.dumps(diverged) if diverged else "",
        "chance": g["chance"].dropna().iloc[0] if g["chance"].notna().any() else None,
        "same_run_as": ";".join(same), "mapping": g["mapping"].iloc[0],
        "problem": " | ".join(p for p in g["problem"].fillna("") if p),
    })


def _axis_value(cell: Cell, column: str):
    """A table row's value of one of its cell's columns: milestones as in a cell CSV (30;60)."""
    if column == "cell_id":
        return cell.cell_id
    value = getattr(cell, column)
    return ";".join(str(m) for m in value) if column == "milestones" else value


def summarize(runs: pd.DataFrame, cells: Iterable[Cell], profile: str, *, grid: bool = False) -> pd.DataFrame:
    """One row per cell (paper order), every cell present: missing ones with status 'missing'.
    grid: the cells are an extension grid's (its table has GRID_AXES)."""
    cells, axes = list(cells), GRID_AXES if grid else AXES
    base = pd.DataFrame([{**{k: _axis_value(c, k) for k in axes},
                          "paper": c.paper_acc} for c in cells], columns=[*axes, "paper"])
    if len(runs):
        per = runs.groupby("cell_id", sort=False)[list(runs.columns)].apply(_cell_summary).reset_index()
    else:
        per = pd.DataFrame(columns=["cell_id", *(k for k in SUMMARY if k not in ("profile", "paper", "delta",
                                                                              "learned"))])
    out = base.merge(per, on="cell_id", how="left")
    out["profile"] = profile
    out["seeds"] = out["seeds"].fillna(0).astype(int)
    out["runs"] = out["runs"].fillna(0).astype(int)
    out["status"] = out["status"].fillna("missing")
    out["reproduced_std"] = out["reproduced_std"].where(out["seeds"] > 1)
    out["avg_model_std"] = out["avg_model_std"].where(out["seeds"] > 1)
    out["delta"] = out["reproduced"] - out["paper"]
    learned = out["reproduced"] > out["chance"] + LEARNED_MARGIN
    out["learned"] = learned.astype("boolean").where(out["reproduced"].notna() & out["chance"].notna())
    for col in ("diverged_at", "same_run_as", "mapping", "problem"):
        out[col] = out[col].astype(object).fillna("")
    out = out[[*axes, *SUMMARY]].round(DECIMALS)
    out["consensus_distance"] = out["consensus_distance"].map(lambda x: float(f"{x:.4g}"), na_action="ignore")
    return out


def paper_pivot(summary: pd.DataFrame, cells: Iterable[Cell], table: str) -> pd.DataFrame:
    """One table in the paper's shape: rows = its row axes, columns = (variant, reproduced | std |
    paper | status), e.g. ('LP-CHOCO (8-bit)', 'reproduced')."""
    shape = SHAPES[table]
    by_id = summary.set_index("cell_id")
    rows = []
    for c in cells:
        if c.table != table:
            continue
        s = by_id.loc[c.cell_id]
        labels = dict(zip(shape.row_axes, shape.row_of(c)))
        for field in ("reproduced", "reproduced_std", "paper", "status"):
            rows.append({**labels, "column": shape.column_of(c), "field": field.removeprefix("reproduced_") or field,
                         "value": s[field]})
    long = pd.DataFrame(rows)
    wide = long.pivot_table(index=list(shape.row_axes), columns=["column", "field"], values="value",
                            aggfunc="first", sort=False, dropna=False)
    order = list(dict.fromkeys(shape.column_of(c) for c in cells if c.table == table))
    return wide.reindex(columns=pd.MultiIndex.from_product([order, ["reproduced", "std", "paper", "status"]]))


def write_aggregate(results_dir: str | Path, cells: Iterable[Cell], *, profile: str, tables: Iterable[str],
                    seeds=None, fidelity=None, warn=None, paper_shape: bool = True) -> dict[str, Path]:
    """Read every run of `cells` once and write runs.csv, curves.csv and each table's two CSVs
    (paper_shape False: the tidy one only, for an extension grid, which has no paper layout).
    A damaged run is a marked row (status damaged, its reason in `problem`), reported to `warn`
    in one line: it never stops the other cells' tables."""
    results_dir = Path(results_dir)
    cells = [c for c in cells if c.table in set(tables)]
    runs, curves = read_runs(cells, results_dir, profile=profile, seeds=seeds, fidelity=fidelity, warn=warn)
    written = {"runs": write_frame(runs, results_dir / RUNS_FILE),
               "curves": write_frame(curves, results_dir / CURVES_FILE)}
    summary = summarize(runs, cells, profile, grid=not paper_shape)
    for table in dict.fromkeys(c.table for c in cells):
        rows = summary[summary["table"] == table]
        written[table] = write_frame(rows, results_dir / "tables" / f"{table}.csv")
        if not paper_shape:
            continue
        written[f"{table}-paper"] = write_frame(paper_pivot(rows, cells, table),
                                                results_dir / "tables" / f"{table}-paper.csv", index=True)
    return written
