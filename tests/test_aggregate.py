"""Table aggregation: reproduced vs paper, seeds mean/std, diverged and missing cells."""
import json

import pytest

from lpdl_core.aggregate import aggregate_table, load_runs
from lpdl_core.cells import load_cells


def _metrics(cell_id, acc, status="ok", seed=1):
    return {"status": status, "final": {"mean_acc": acc, "avg_model_acc": acc + 1, "consensus_distance": 0.1},
            "bytes_per_node": 2e6, "wall_time_s": 3.0, "diverged_at": {"epoch": 2} if status != "ok" else None,
            "config": {"cell_id": cell_id, "seed": seed, "mapping": ["dataset cifar10 -> digits"]}}


def test_aggregate_rows(tmp_path):
    cells = load_cells(tables=["table3"])[:3]
    a, b, c = (x.cell_id for x in cells)
    paths = []
    for i, m in enumerate([_metrics(a, 90.0), _metrics(a, 92.0, seed=2), _metrics(b, 0.0, "diverged")]):
        p = tmp_path / f"{i}.json"
        p.write_text(json.dumps(m))
        paths.append(p)
    rows = aggregate_table(cells, load_runs(paths + [tmp_path / "absent.json"]), "mini")
    ra, rb, rc = rows
    assert ra["status"] == "ok" and ra["seeds"] == 2
    assert ra["reproduced"] == pytest.approx(91.0) and ra["reproduced_std"] == pytest.approx(2 ** 0.5)
    assert ra["delta"] == pytest.approx(91.0 - cells[0].paper_acc) and ra["paper"] == cells[0].paper_acc
    assert ra["avg_model"] == pytest.approx(92.0) and ra["mb_per_node"] == pytest.approx(2.0)
    assert ra["mapping"] == "dataset cifar10 -> digits" and ra["profile"] == "mini"
    assert rb["status"] == "diverged" and rb["reproduced"] is None and rb["delta"] is None
    assert json.loads(rb["diverged_at"]) == [{"epoch": 2}]
    assert rc["status"] == "missing" and rc["reproduced"] is None and rc["paper"] == cells[2].paper_acc
