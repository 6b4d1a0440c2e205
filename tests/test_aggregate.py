"""The aggregate step (pandas): every run read once into runs.csv / curves.csv (one row per cell
and seed / per epoch), then per table a summary (groupby over seeds) and the paper-shaped pivot.
Missing runs stay missing, diverged runs are marked, values are rounded and typed."""
import json

import pandas as pd
import pytest

from lpdl_core.config import Fidelity
from lpdl_core.pipeline.aggregation.aggregate import paper_pivot, summarize, write_aggregate
from lpdl_core.pipeline.cells.tables import load_cells
from lpdl_core.pipeline.run.runstore import run_identity
from lpdl_core.pipeline.aggregation.tidy import RUN_COLUMNS, read_runs, run_dir

T3 = load_cells(tables=["table3"])


def _metrics(cell, acc, status="ok", seed=1, classes=None, same=None, sha="ab" * 20):
    return {"status": status, "final": {"mean_acc": acc, "avg_model_acc": acc + 1, "consensus_distance": 0.123456,
                                        "node_acc": [acc - 1, acc + 1]},
            "bytes_per_node": 2e6, "wall_time_s": 3.0,
            "diverged_at": {"epoch": 2, "iteration": 5} if status != "ok" else None,
            "num_classes": classes,
            "config": {"cell_id": cell.cell_id, "seed": seed, "mapping": ["dataset cifar10 -> digits"],
                       **({"same_run_as": same} if same else {})},
            "identity": run_identity(cell, profile="mini", seed=seed, fidelity=Fidelity()),
            "provenance": {"git_sha": sha, "git_dirty": False, "python": "3.11", "torch": "2.14", "device_name": "x"}}


def _write(root, cell, m, seed=1, curve_rows=2):
    d = run_dir(root, cell.cell_id, seed)
    d.mkdir(parents=True)
    (d / "metrics.json").write_text(json.dumps(m))
    (d / "curve.csv").write_text("epoch,lr,train_loss,mean_acc,avg_model_acc,consensus_distance,"
                                 "test_loss,bytes_per_node\n"
                                 + "".join(f"{e},0.1,1.0,{50 + e},{51 + e},0.1,1.0,100\n" for e in range(curve_rows)))


@pytest.fixture
def results(tmp_path):
    root = tmp_path / "results" / "mini"
    a, b, c, d = T3[:4]
    _write(root, a, _metrics(a, 90.0, classes=10))
    _write(root, a, _metrics(a, 92.0, seed=2, classes=10), seed=2)
    _write(root, b, _metrics(b, 0.0, "diverged", classes=10))
    _write(root, c, _metrics(c, 14.9, classes=10))                   # 4.9 points above chance: did not learn
    _write(root, d, _metrics(d, 15.1, classes=10, same=a.cell_id))   # 5.1 above: learned
    return root


def test_runs_frame_has_one_row_per_cell_and_seed(results):
    runs, curves = read_runs(T3, results, profile="mini")
    assert tuple(runs.columns) == RUN_COLUMNS and len(runs) == 5
    assert sorted(runs.loc[runs["cell_id"] == T3[0].cell_id, "seed"]) == [1, 2]
    row = runs[runs["cell_id"] == T3[1].cell_id].iloc[0]
    assert row["status"] == "diverged" and row["diverged_epoch"] == 2
    assert runs["mb_per_node"].eq(2.0).all() and runs["chance"].eq(10.0).all()
    assert (runs["node_acc_max"] - runs["node_acc_min"]).to_numpy() == pytest.approx([2.0] * 5)
    assert len(curves) == 10 and set(curves.columns) >= {"cell_id", "seed", "epoch", "mean_acc"}
    assert read_runs(T3, results, profile="mini", seeds=[2])[0]["cell_id"].tolist() == [T3[0].cell_id]


def test_summary_groups_seeds_marks_missing_and_diverged(results):
    runs, _ = read_runs(T3, results, profile="mini")
    s = summarize(runs, T3, "mini").set_index("cell_id")
    a, b, c, d, e = (s.loc[x.cell_id] for x in T3[:5])
    assert len(s) == len(T3) and a["status"] == "ok" and a["seeds"] == 2
    assert a["reproduced"] == 91.0 and a["reproduced_std"] == pytest.approx(round(2 ** 0.5, 2))
    assert a["delta"] == pytest.approx(round(91.0 - T3[0].paper_acc, 2)) and a["avg_model"] == 92.0
    assert b["status"] == "diverged" and pd.isna(b["reproduced"]) and b["diverged_at"] == "[2]"
    assert e["status"] == "missing" and e["seeds"] == 0 and e["paper"] == T3[4].paper_acc
    assert pd.isna(a["reproduced_std"]) is False and pd.isna(d["reproduced_std"])      # one seed: no std
    assert (c["learned"], d["learned"]) == (False, True) and d["same_run_as"] == T3[0].cell_id
    assert a["consensus_distance"] == 0.1235                                           # 4 significant digits


def test_written_csvs_read_back_typed_and_rounded(results):
    written = write_aggregate(results, load_cells(), profile="mini", tables=["table3"])
    assert set(written) == {"runs", "curves", "table3", "table3-paper"}
    t = pd.read_csv(written["table3"])
    assert len(t) == 16 and t["nodes"].dtype == "int64" and t["seeds"].dtype == "int64"
    assert t["learned"].dropna().isin([True, False]).all()
    text = written["table3"].read_text()
    assert "91.0," in text and "90.99999" not in text
    paper = pd.read_csv(written["table3-paper"], header=[0, 1], index_col=[0, 1])
    assert paper.index.names == ["Compression (%)", "Skew"]
    assert paper.loc[(0, 0.0), ("CHOCO with QGM", "reproduced")] == 91.0
    assert paper.loc[(0, 0.0), ("CHOCO with QGM", "paper")] == T3[0].paper_acc


def test_paper_pivot_is_the_papers_shape():
    empty = summarize(read_runs([], "/nonexistent", profile="mini")[0], T3, "mini")
    wide = paper_pivot(empty, T3, "table3")
    assert wide.shape == (8, 8) and list(wide.columns.get_level_values(0).unique()) == [
        "CHOCO with QGM", "LP-CHOCO with QGM"]
    assert (wide.xs("status", axis=1, level=1) == "missing").all().all()


def test_a_mislabelled_run_is_a_damaged_row_naming_the_file(results):
    """Another cell's result in a run folder gives no number under this cell's name: one damaged
    row with the reason, and the problem reported once."""
    a, other = T3[0], T3[5]
    d = run_dir(results, other.cell_id, 1)
    d.mkdir(parents=True)
    (d / "metrics.json").write_text(json.dumps(_metrics(a, 50.0)))   # a's result in other's folder
    lines = []
    runs, _ = read_runs(T3, results, profile="mini", warn=lines.append)
    row = runs[(runs["cell_id"] == other.cell_id) & (runs["seed"] == 1)].iloc[0]
    assert row["status"] == "damaged" and pd.isna(row["mean_acc"]) and str(d / "metrics.json") in row["problem"]
    assert len(lines) == 1 and f"holds the result of cell {a.cell_id}" in lines[0]
    summary = summarize(runs, T3, "mini").set_index("cell_id")
    assert summary.loc[other.cell_id, "status"] == "damaged" and pd.isna(summary.loc[other.cell_id, "reproduced"])
