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
