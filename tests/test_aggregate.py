"""Table aggregation: reproduced vs paper, seeds mean/std, diverged and missing cells, each run
read from its own folder."""
import json

import pytest

from lpdl_core.aggregate import aggregate_table, collect_runs, run_dir
from lpdl_core.cells import load_cells
from lpdl_core.config import Fidelity
from lpdl_core.runstore import run_identity


def _metrics(cell, acc, status="ok", seed=1):
    return {"status": status, "final": {"mean_acc": acc, "avg_model_acc": acc + 1, "consensus_distance": 0.1},
            "bytes_per_node": 2e6, "wall_time_s": 3.0, "diverged_at": {"epoch": 2} if status != "ok" else None,
            "config": {"cell_id": cell.cell_id, "seed": seed, "mapping": ["dataset cifar10 -> digits"]},
            "identity": run_identity(cell, profile="mini", seed=seed, fidelity=Fidelity())}


def test_aggregate_rows(tmp_path):
    cells = load_cells(tables=["table3"])[:3]
    a, b, c = cells
    for cell, m in [(a, _metrics(a, 90.0)), (a, _metrics(a, 92.0, seed=2)), (b, _metrics(b, 0.0, "diverged"))]:
        d = run_dir(tmp_path, cell.cell_id, m["config"]["seed"])
        d.mkdir(parents=True)
        (d / "metrics.json").write_text(json.dumps(m))
    runs = collect_runs(cells, tmp_path, profile="mini", seeds=[1, 2], fidelity=Fidelity().as_dict())
    assert collect_runs(cells, tmp_path, profile="mini") == runs  # every seed present, any fidelity
    rows = aggregate_table(cells, runs, "mini")
    ra, rb, rc = rows
    assert ra["status"] == "ok" and ra["seeds"] == 2
    assert ra["reproduced"] == pytest.approx(91.0) and ra["reproduced_std"] == pytest.approx(2 ** 0.5)
    assert ra["delta"] == pytest.approx(91.0 - cells[0].paper_acc) and ra["paper"] == cells[0].paper_acc
    assert ra["avg_model"] == pytest.approx(92.0) and ra["mb_per_node"] == pytest.approx(2.0)
    assert ra["mapping"] == "dataset cifar10 -> digits" and ra["profile"] == "mini"
    assert rb["status"] == "diverged" and rb["reproduced"] is None and rb["delta"] is None
    assert json.loads(rb["diverged_at"]) == [{"epoch": 2}]
    assert rc["status"] == "missing" and rc["reproduced"] is None and rc["paper"] == cells[2].paper_acc


def test_aggregate_marks_cells_that_did_not_learn_and_shared_runs():
    """The table CSVs carry what the report shows: chance (100 / the classes the run trained on),
    whether the cell learned (more than LEARNED_MARGIN points above chance) and the cell whose run
    it shares."""
    a, b, c, d = load_cells(tables=["table3"])[:4]
    ma = dict(_metrics(a, 15.1), num_classes=10)           # 5.1 points above chance: learned
    mb = dict(_metrics(b, 14.9), num_classes=10)           # 4.9 points above: did not learn
    mc = _metrics(c, 50.0)                                 # classes not recorded: cannot judge
    md = dict(_metrics(d, 97.0), num_classes=4)
    md["config"] = dict(md["config"], same_run_as=a.cell_id)
    rows = aggregate_table([a, b, c, d], {a.cell_id: [ma], b.cell_id: [mb], c.cell_id: [mc], d.cell_id: [md]}, "mini")
    assert [(r["chance"], r["learned"]) for r in rows] == [(10.0, True), (10.0, False), (None, None), (25.0, True)]
    assert [r["same_run_as"] for r in rows] == ["", "", "", a.cell_id]
