"""`lpdl targets` (the mini profile's learning targets) and `lpdl timing` (where a run's time
went), on synthetic run folders in the real layout."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lpdl_core.errors import LpdlError
from lpdl_core.pipeline.cells.tables import cells_by_id, load_cells
from lpdl_core.pipeline.workflow.jobs import plan_jobs
from lpdl_core.pipeline.aggregation.targets import check_targets, not_learned
from lpdl_core.pipeline.aggregation.timing import pipeline_timing

CELLS = cells_by_id(load_cells())


def _run(results, cell, acc, seed=1, classes=10, wall=1.0, sha="ab" * 20, **config):
    d = results / "runs" / cell / f"seed{seed}"
    d.mkdir(parents=True)
    m = {"status": "ok", "final": {"mean_acc": acc}, "num_classes": classes, "wall_time_s": wall,
         "config": {"cell_id": cell, **config}, "provenance": {"git_sha": sha}}
    (d / "metrics.json").write_text(json.dumps(m))


def test_targets_name_each_miss_with_its_value(tmp_path):
    pick = ["t1-resnet20-single-c0-s0-none-fp32", "t1-resnet20-single-c0-s0-none-int8",
            "t2-resnet20-dring8-c0-s0-ds-fp32", "t2-resnet20-dring8-c0-s0-ds-int8",
            "t5-agnews-distilbert-dring4-c0-s0-ds-fp32", "t2-resnet20-dring8-c99-s0.9-ds-fp32"]
    cells = [CELLS[c] for c in pick]
    for c, acc in zip(pick, [95.0, 92.9, 97.0, 94.5, 49.0, 12.0]):
        _run(tmp_path, c, acc, classes=4 if "agnews" in c else 10)
    checks = {(ch.target, ch.subject): ch for ch in check_targets(tmp_path, cells, [1])}
    assert checks["single-node image >= 93", pick[0]].ok
    assert (not checks["single-node image >= 93", pick[1]].ok
            and checks["single-node image >= 93", pick[1]].value == 92.9)
    assert checks["8-node >= 90", pick[2]].ok and checks["8-node >= 90", pick[3]].ok
    gap = checks["8-node |FP - LP| <= 2", f"{pick[2]} vs {pick[3]}"]
    assert not gap.ok and abs(gap.value - 2.5) < 1e-9
    assert not checks["text >= 2x chance", pick[4]].ok       # chance 25 %: needs 50
    assert not_learned(tmp_path, cells, [1]) == [(pick[5], 1, 12.0)]  # within 5 points of 10 %
    r = subprocess.run([sys.executable, "-m", "lpdl_core", "targets", str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 1 and "NOT MET t1-resnet20-single-c0-s0-none-int8: 92.90" in r.stdout


def test_timing_splits_job_wall_into_training_and_the_rest(tmp_path):
    cells = [CELLS["t2-resnet20-dring8-c0-s0-ds-fp32"], CELLS["t2-resnet20-dring8-c0-s0-choco-fp32"]]
    jobs = plan_jobs(cells, "mini")
    assert len(jobs) == 1 and jobs[0].shares
    _run(tmp_path, cells[0].cell_id, 97.0, seed=1234, wall=10.0)
    _run(tmp_path, cells[1].cell_id, 97.0, seed=1234, wall=10.0, same_run_as=cells[0].cell_id)
    bench = tmp_path / "benchmarks" / "train" / jobs[0].name
    bench.mkdir(parents=True)
    (bench / "seed1234.tsv").write_text("s\th:m:s\tmax_rss\n13.5\t0:00:13\t500\n")
    t = pipeline_timing(tmp_path, jobs, cells)
    assert (t["jobs"], t["runs_computed"], t["runs_shared"]) == (1, 1, 1)
    assert t["job_wall_s"] == 13.5 and t["train_s"] == 10.0 and t["outside_train_s"] == 3.5
    assert t["train_s_by_model"] == {"resnet20 fp32": 10.0}
    # what was measured, where: the commit of the computed runs and the machine reading the results
    assert t["git_sha_of_runs"] == {"ab" * 6: 1}
    assert pipeline_timing(tmp_path, jobs, cells, seeds=[1234])["jobs"] == 1
    with pytest.raises(LpdlError, match="no training benchmarks for seed"):
        pipeline_timing(tmp_path, jobs, cells, seeds=[7])
    assert t["machine"]["cores"] >= 1 and t["machine"]["cpu"] and t["computed_utc"].endswith("Z")


def test_timing_counts_a_pack_once_and_times_a_grid_folder(tmp_path, monkeypatch):
    """A grid's results folder (results/mini-<grid>) is timed with the grid's cells and the grouping
    its benchmarks carry (here cells_per_job pack, not the mini default); a pack's cells record the
    pack's wall time, which they share, so the summed training time is the pack's once."""
    from lpdl_core.pipeline.cells.grids import load_grid

    cells = load_grid("claims").cells
    jobs = plan_jobs(cells, "mini", "pack")
    job = next(j for j in jobs if len(j.cells) >= 2 and not j.shares)
    a, b = job.cells[:2]
    results = tmp_path / "results" / "mini-claims"
    _run(results, a, 90.0, seed=2, wall=30.0, packed_with=[b])
    _run(results, b, 80.0, seed=2, wall=30.0, packed_with=[a])
    bench = results / "benchmarks" / "train" / job.name
    bench.mkdir(parents=True)
    (bench / "seed2.tsv").write_text("s\th:m:s\tmax_rss\n34.0\t0:00:34\t500\n")
    t = pipeline_timing(results, jobs, cells)
    assert (t["jobs"], t["runs_computed"], t["train_s"], t["outside_train_s"]) == (1, 2, 30.0, 4.0)
    assert sorted(r["train_s"] for r in t["slowest_runs"]) == [15.0, 15.0]
    # the command finds the grid from the folder's name and the grouping from the benchmarks
    (tmp_path / "config").symlink_to(Path(__file__).resolve().parents[1] / "config")
    monkeypatch.chdir(tmp_path)
    r = subprocess.run([sys.executable, "-m", "lpdl_core", "timing", "results/mini-claims"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["train_s"] == 30.0
