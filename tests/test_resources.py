"""What a training job asks its scheduler for (lpdl_core.pipeline.workflow.resources): the numbers the
workflow's train rules hand to Snakemake, checked on the paper's own cells."""
from __future__ import annotations

from pathlib import Path

import pytest

from lpdl_core.errors import ConfigError
from lpdl_core.pipeline.cells.tables import load_cells
from lpdl_core.pipeline.workflow.jobs import plan_jobs
from lpdl_core.pipeline.workflow.resources import (EXTRA_PROCESS_MB, MINI_CELL_MINUTES, PAPER_MEM_MB, Planner,
                                          job_nodes, job_priority)
from lpdl_core.pipeline.workflow.runtime import StepTimes, job_runtime

ROOT = Path(__file__).resolve().parent.parent
CELLS = load_cells()
BY_ID = {c.cell_id: c for c in CELLS}
TIMES = StepTimes.load(ROOT / "config/step-times.yaml")


def _job(profile, table="table2", per="block", model="resnet20"):
    for j in plan_jobs(CELLS, profile, per):
        cells = [BY_ID[c] for c in j.cells]
        if cells[0].table == table and cells[0].model == model:
            return j, cells
    raise AssertionError("no such job")


def test_mini_jobs_are_small_cpu_jobs():
    _, cells = _job("mini")
    r = Planner(profile="mini").resources(cells)
    assert r == {"mem_mb": 3000, "runtime": 10 + MINI_CELL_MINUTES * len(cells), "gpu": 0}


def test_paper_runtime_is_the_step_time_model_and_memory_is_by_model():
    _, cells = _job("paper", per="pack")
    p = Planner(profile="paper", step_times=TIMES, step_kind="batched+compiled", pack_size=4)
    r = p.resources(cells)
    expect = job_runtime(cells, TIMES, executor="batched+compiled", pack_size=4)
    assert r["runtime"] == expect.minutes and r["mem_mb"] == PAPER_MEM_MB["resnet20"] and r["gpu"] == 1
    assert "gres" not in r and "tasks" not in r


def test_gres_sites_get_gres_and_no_gpu_count():
    _, cells = _job("paper", per="pack")
    r = Planner(profile="paper", step_times=TIMES, gpu_request="gres").resources(cells)
    assert r["gpu"] == 0 and r["gres"] == "gpu:1"


def test_a_distributed_job_is_one_task_per_node_with_a_gpu_each():
    _, cells = _job("paper", table="table3", per="cell", model="resnet20")
    n = cells[0].nodes
    r = Planner(profile="paper", step_times=TIMES, distributed=True).resources(cells)
    assert (r["mpi"], r["tasks"], r["tasks_per_gpu"], r["gpu"]) == ("srun", n, 1, n)
    assert r["mem_mb"] == PAPER_MEM_MB["resnet20"] + EXTRA_PROCESS_MB["paper"] * (n - 1)
    mini = Planner(profile="mini", distributed=True).resources(cells)
    assert mini["tasks"] == n and "tasks_per_gpu" not in mini and mini["gpu"] == 0


def test_a_job_of_mixed_node_counts_is_refused_in_one_line():
    a = next(c for c in CELLS if c.nodes == 8)
    b = next(c for c in CELLS if c.nodes == 16)
    with pytest.raises(ConfigError, match=r"job j mixes cells of \[8, 16\] nodes"):
        job_nodes([a, b], "j")


def test_bad_planner_settings_are_config_errors():
    with pytest.raises(ConfigError, match="gpu_request 'gpu' is not one of gpus, gres"):
        Planner(profile="mini", gpu_request="gpu")
    with pytest.raises(ConfigError, match="need step times"):
        Planner(profile="paper")


def test_priority_starts_big_8bit_jobs_first():
    small = [c for c in CELLS if c.nodes == 1 and c.precision == "fp32"][:1]
    big = [c for c in CELLS if c.nodes == 16 and c.precision == "int8"][:4]
    assert job_priority(big) > job_priority(small) >= 1
    fp = [c for c in CELLS if c.nodes == 16 and c.precision == "fp32"][:4]
    assert job_priority(big) > job_priority(fp)


def test_attempts_follow_max_runtime():
    p = Planner(profile="paper", step_times=TIMES, step_kind="batched+compiled", pack_size=4, max_minutes=480)
    jobs = plan_jobs(CELLS, "paper", "pack")
    attempts = p.attempts(jobs, BY_ID)
    assert max(attempts) > 1 and min(attempts) == 1
    assert Planner(profile="mini").attempts(jobs, BY_ID) == [1] * len(jobs)


def test_step_times_file_errors_are_one_line(tmp_path):
    with pytest.raises(ConfigError, match="step_times: .*nope.yaml: cannot read"):
        StepTimes.load(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("[1, 2\n")
    with pytest.raises(ConfigError, match="bad.yaml: "):
        StepTimes.load(bad)
    bad.write_text("- 1\n")
    with pytest.raises(ConfigError, match="not a mapping"):
        StepTimes.load(bad)
