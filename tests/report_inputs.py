"""What the report tests feed the report: synthetic run folders as the train rule writes them, then
the files the DAG derives from them (runs.csv, curves.csv, tables/*.csv by the aggregate step,
partitions.csv, cost.json), or a ReportData built directly from frames."""
from __future__ import annotations

import csv
import functools
import json
from dataclasses import replace
from pathlib import Path

from lpdl_core.config import TABLES, Fidelity
from lpdl_core.pipeline.aggregation.aggregate import summarize, write_aggregate
from lpdl_core.pipeline.cells.tables import PAPER_DIR, load_cells
from lpdl_core.pipeline.aggregation.paper_partitions import partition_figures_frame
from lpdl_core.pipeline.run.runstore import run_identity
from lpdl_core.pipeline.aggregation.tidy import read_runs
from lpdl_core.report.data import load_report_data
from lpdl_core.report.model import ReportData

PAPER = PAPER_DIR
CELLS = {c.cell_id: c for c in load_cells(PAPER)}
FIDELITY = Fidelity().as_dict()


def write_run(root: Path, cell_id: str, seed: int, acc: float | None, *, epochs: int = 3, classes: int | None = 10,
              fidelity: dict | None = None, sha: str = "abc123def4567890", same_run_as: str = "",
              wall: float = 60.0, mapping: list[str] | None = None,
              before_final: dict | None = None) -> Path:
    """One run folder as the pipeline writes it; acc None = diverged at epoch 1. before_final: the
    evaluation before the final rounds (mean_acc, avg_model_acc, ...), recorded when given."""
    c = CELLS[cell_id]
    d = root / "runs" / cell_id / f"seed{seed}"
    d.mkdir(parents=True)
    status = "ok" if acc is not None else "diverged"
    node_acc = [acc + k - 1 for k in range(3)] if acc is not None else [None] * 3  # NaN is written as null
    fid = fidelity or FIDELITY
    metrics = {
        "status": status, "diverged_at": None if acc is not None else 1, "epochs_done": epochs,
        "identity": run_identity(c, profile=root.name, seed=seed, fidelity=fid),
        "final": {"mean_acc": acc, "avg_model_acc": (acc or 0) + 0.5,
                  "consensus_distance": 0.01, "mean_loss": 1.0, "node_acc": node_acc},
        **({"before_final": before_final} if before_final is not None else {}),
        "bytes_per_node": 2.5e6, "wall_time_s": wall, "executor": "loop", "device": "cpu",
        **({"num_classes": classes} if classes else {}),
        "config": {"cell_id": cell_id, "cell": {"table": c.table, "norm": c.norm}, "fidelity": fid,
                   "mapping": mapping or ["dataset cifar10 -> digits stand-in (16 px)", "epochs 200 -> 3"],
                   **({"same_run_as": same_run_as} if same_run_as else {})},
        "provenance": {"git_sha": sha, "git_dirty": False, "python": "3.11.7", "torch": "2.14.1",
                       "device_name": "x86_64"},
    }
    (d / "metrics.json").write_text(json.dumps(metrics))
    with (d / "curve.csv").open("w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["epoch", "lr", "train_loss", "mean_acc", "avg_model_acc", "consensus_distance",
                    "test_loss", "bytes_per_node"])
        for e in range(epochs):
            w.writerow([e, 0.1, 2.0 - e * 0.1, 10 + e, 11 + e, 0.1 / (e + 1), 2.0, 1e5 * (e + 1)])
    (d / "partition.csv").write_text("node,c0,c1,total\n0,5,5,10\n")
    return d


@functools.cache
def cost_json() -> str:
    """cost.json as the cost rule writes it on a machine without a GPU (computed once)."""
    from lpdl_core.training.cost import figure3_cost

    return json.dumps(figure3_cost(device="cpu"))


def finish(root: Path, tables=TABLES, *, cost: bool = True, partitions: bool = True) -> Path:
    """Write what the DAG derives from root/runs: the aggregate step's files, cost.json and
    partitions.csv (each optional)."""
    write_aggregate(root, load_cells(PAPER), profile=root.name, tables=tables)
    if cost:
        (root / "cost.json").write_text(cost_json())
    if partitions:
        partition_figures_frame().to_csv(root / "partitions.csv", index=False)
    return root


def report_data(root: Path, tables=TABLES) -> ReportData:
    """finish(root) and read it back as the report does."""
    return load_report_data(finish(root, tables), PAPER, tables=tables)


def empty_data(tables=TABLES, profile: str = "mini") -> ReportData:
    """A ReportData with every paper cell missing (no runs at all)."""
    cells = tuple(load_cells(PAPER, tables=tables))
    runs, curves = read_runs([], "/nonexistent", profile=profile)
    return ReportData(profile=profile, cells=cells, runs=runs, curves=curves, summary=summarize(runs, cells, profile))


def as_paper(data: ReportData, offset=lambda r: 0.0, *, epochs: int = 6) -> ReportData:
    """Every cell 'reproduced' exactly at the paper's value (+ offset(row)) by one finished run of
    seed 1 (of `epochs` epochs, as a mini run records them); cells the paper gives no number for
    stay missing."""
    import pandas as pd

    from lpdl_core.pipeline.aggregation.tidy import CELL_COLUMNS

    s = data.summary.copy()
    has = s["paper"].notna()
    s["status"] = has.map({True: "ok", False: "missing"})
    s["reproduced"] = s["paper"] + s.apply(lambda r: offset(r.to_dict()), axis=1)
    s.loc[~has, "reproduced"] = None
    runs = pd.DataFrame([{"cell_id": r["cell_id"], **{k: getattr(CELLS[r["cell_id"]], k) for k in CELL_COLUMNS},
                          "seed": 1, "status": "ok", "mean_acc": r["reproduced"], "num_classes": 10,
                          "epochs_done": epochs}
                         for r in s[has].to_dict("records")])
    return replace(data, summary=s, runs=runs)
