"""SLURM runtime requests of paper jobs from measured step times (lpdl_core.pipeline.workflow.runtime)."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from lpdl_core.errors import ConfigError
from lpdl_core.pipeline.cells.tables import load_cells
from lpdl_core.pipeline.workflow.runtime import StepTimes, job_runtime

ROOT = Path(__file__).resolve().parents[1]
TABLE = yaml.safe_load((ROOT / "config/step-times.yaml").read_text())


@pytest.fixture(scope="module")
def times():
    return StepTimes.from_mapping(TABLE)


@pytest.fixture(scope="module")
def cells():
    return {c.cell_id: c for c in load_cells()}


def _cell(cells, table, model, nodes, precision):
    return next(c for c in cells.values()
                if (c.table, c.model, c.nodes, c.precision) == (table, model, nodes, precision))


def test_a_table2_resnet20_cell_is_its_steps_times_the_measured_step(times, cells):
    c = _cell(cells, "table2", "resnet20", 8, "int8")
    assert times.steps(c) == c.epochs * math.ceil(50000 / (8 * c.batch_per_node)) == 200 * 196
    t = TABLE["measured"]["resnet20"]["int8"]["loop"]
    assert times.cell_seconds(c, "loop") == pytest.approx(200 * 196 * t * (1 + TABLE["eval_share"]), rel=1e-12)
    req = job_runtime([c], times, executor="loop", margin=1.5, startup=10, max_minutes=10_000)
    assert req.minutes == math.ceil(10 + 1.5 * times.cell_seconds(c, "loop") / 60) and req.attempts_needed == 1


def test_the_request_is_capped_and_says_how_many_attempts_it_needs(times, cells):
    c = _cell(cells, "table2", "resnet20", 16, "int8")
    free = job_runtime([c], times, executor="loop", max_minutes=100_000)
    cap = int(free.estimate_minutes // 3)
    req = job_runtime([c], times, executor="loop", max_minutes=cap)
    assert req.minutes == cap and req.attempts_needed == math.ceil(free.estimate_minutes / cap) == 4


def test_batched_and_more_nodes_scale_the_measured_step(times, cells):
    c8 = _cell(cells, "table2", "resnet20", 8, "fp32")
    c16 = _cell(cells, "table2", "resnet20", 16, "fp32")
    m = TABLE["measured"]["resnet20"]["fp32"]
    assert times.step_seconds(c8, "batched") == pytest.approx(m["batched"])
    assert times.step_seconds(c16, "loop") == pytest.approx(2 * m["loop"])


def test_distributed_takes_one_nodes_loop_step_unless_measured(times, cells):
    """One node per process and GPU: the loop executor's time of one node, whatever n is."""
    m = TABLE["measured"]["resnet20"]["fp32"]
    for n in (8, 16):
        c = _cell(cells, "table2", "resnet20", n, "fp32")
        assert times.step_seconds(c, "distributed") == pytest.approx(m["loop"] / 8)
    own = StepTimes.from_mapping({**TABLE, "measured": {"resnet20": {"fp32": {"loop": 1.0, "distributed": 0.8}}}})
    assert own.step_seconds(_cell(cells, "table2", "resnet20", 8, "fp32"), "distributed") == pytest.approx(0.8)


def test_an_unmeasured_model_is_scaled_up_by_its_macs(times, cells):
    c = _cell(cells, "table2", "resnet54", 8, "int8")
    ratio = TABLE["macs_per_sample"]["resnet54"] / TABLE["macs_per_sample"]["resnet20"]
    assert ratio > 1
    ref = TABLE["measured"]["resnet20"]["int8"]["loop"]
    assert times.step_seconds(c, "loop") == pytest.approx(ref * ratio * c.batch_per_node / 32)
    # measured, it uses its own number
    own = StepTimes.from_mapping({**TABLE, "measured": {**TABLE["measured"],
                                                        "resnet54": {"int8": {"loop": 0.9}}}})
    assert own.step_seconds(c, "loop") == pytest.approx(0.9)


def test_vgg11_on_imagenette_uses_its_224px_macs(times, cells):
    c = next(c for c in cells.values() if c.model == "vgg11" and c.dataset == "imagenette")
    ref = TABLE["measured"]["resnet20"][c.precision]["loop"]
    macs = TABLE["macs_per_sample"]["vgg11@imagenette"] * c.batch_per_node
    expected = ref * c.nodes / 8 * max(1.0, macs / (TABLE["macs_per_sample"]["resnet20"] * 32))
    assert times.step_seconds(c, "loop") == pytest.approx(expected)


@pytest.mark.parametrize("bad, why", [
    ({"measured": {"resnet20": {"int8": {"loop": -1}}}}, "positive"),
    ({"measured": {"vgg11": {"fp32": {"loop": 1}}}}, "reference model"),
    ({"measured": {"resnet20": {"fp16": {"loop": 1}}}}, "precision"),
    ({"typo": 1}, "unknown keys"),
])
def test_a_bad_step_table_is_one_config_error(bad, why):
    with pytest.raises(ConfigError, match=why):
        StepTimes.from_mapping({**TABLE, **bad})


def test_a_margin_below_one_is_refused(times, cells):
    with pytest.raises(ConfigError, match="margin"):
        job_runtime(list(cells.values())[:1], times, executor="loop", margin=0.5)


def test_a_missing_executor_measurement_is_named(cells):
    t = StepTimes.from_mapping({**TABLE, "measured": {"resnet20": {"fp32": {"loop": 0.1}, "int8": {"loop": 0.2}}}})
    with pytest.raises(ConfigError, match="batched"):
        t.step_seconds(_cell(cells, "table2", "resnet20", 8, "fp32"), "batched")


@pytest.mark.parametrize("key, model, dataset", [
    ("resnet20", "resnet20", "cifar10"), ("resnet54", "resnet54", "cifar10"), ("vgg11", "vgg11", "cifar10"),
    ("mobilenetv2", "mobilenetv2", "cifar10"), ("resnet18", "resnet18", "imagenette"),
    ("vgg11@imagenette", "vgg11", "imagenette")])
def test_the_tables_macs_are_the_real_models(key, model, dataset):
    from lpdl_core.training.cost import count_model

    assert TABLE["macs_per_sample"][key] == count_model(model, dataset, batch=1)["forward_macs_per_image"]


def test_the_slurm_dry_run_asks_each_job_its_estimate(times, cells):
    """Every paper train job's runtime in the dry run is job_runtime's, under the cap, the same on
    every attempt (the rule's runtime does not take the attempt)."""
    env = {**os.environ, "LPDL_SLURM_ACCOUNT": "", "LPDL_SLURM_PARTITION": "",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    p = subprocess.run([str(Path(sys.executable).parent / "snakemake"), "--profile", "slurm", "-n",
                        "--configfile", "config/paper.yaml", "--config", "tables=[table2]", "cells_per_job=cell"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout + p.stderr
    c = _cell(cells, "table2", "resnet20", 8, "int8")
    want = job_runtime([c], times, executor="batched+compiled", max_minutes=2880).minutes  # paper.yaml's
    rule = "train_" + c.cell_id.replace("-", "_").replace(".", "_")
    block = out[out.index(f"rule {rule}:"):]
    assert f"runtime={want}," in block[:block.index("\n\n")]
    # the rule's resources are the planner's, computed once per job: no attempt goes in
    import inspect

    from lpdl_core.pipeline.workflow.resources import Planner
    assert "**JOB_RESOURCES[_job.name]" in (ROOT / "workflow/rules/train.smk").read_text()
    assert "attempt" not in inspect.signature(Planner.resources).parameters


# ---- the bill before the run (lpdl_core.pipeline.workflow.bill, `lpdl plan`)

def test_the_bill_prices_each_job_as_its_slurm_request(times, cells):
    """A paper job's expected GPU-hours are its start-up plus its cells' estimated time; what SLURM
    holds is its request (with the margin) times its attempts; copies (seeds x results folders)
    multiply both; a distributed job holds one GPU per node."""
    from lpdl_core.pipeline.workflow.bill import price
    from lpdl_core.pipeline.workflow.runtime import STARTUP_MINUTES

    c = _cell(cells, "table2", "resnet20", 16, "int8")
    cap = 600
    bill = price([c], times, executor="loop", margin=1.5, max_minutes=cap, copies=3)
    (job,) = bill.jobs
    req = job_runtime([c], times, executor="loop", margin=1.5, max_minutes=cap)
    assert req.attempts_needed > 1  # the case where asked != one request
    assert job.expected_h == pytest.approx((STARTUP_MINUTES + times.cell_seconds(c, "loop") / 60) / 60)
    assert job.asked_h == pytest.approx(req.attempts_needed * cap / 60) and job.gpus == 1
    assert bill.total() == {"jobs": 3, "cells": 3, "expected_gpu_h": pytest.approx(3 * job.expected_h),
                            "asked_gpu_h": pytest.approx(3 * job.asked_h)}
    dist = price([c], times, executor="distributed", margin=1.5, max_minutes=cap).jobs[0]
    assert dist.gpus == 16


def test_the_bill_says_which_step_times_are_measured_and_how_the_rest_are_scaled(times, cells):
    from lpdl_core.pipeline.workflow.bill import price

    picked = [_cell(cells, "table2", "resnet20", 8, "fp32"), _cell(cells, "table2", "resnet20", 16, "fp32"),
              next(c for c in cells.values() if c.model == "resnet54")]
    bases = price(picked, times, executor="loop").bases
    assert bases["resnet20@cifar10 fp32 loop n=8 b=32"] == "measured"
    assert bases["resnet20@cifar10 fp32 loop n=16 b=16"] == "x 16/8 nodes"
    (k54,) = [k for k in bases if k.startswith("resnet54")]
    assert "scaled from resnet20 by MACs" in bases[k54]


def test_lpdl_plan_prints_the_paper_grids_bill_per_table_and_in_total(tmp_path, capsys, monkeypatch):
    from lpdl_core.cli import main

    monkeypatch.chdir(ROOT)
    out = tmp_path / "bill.json"
    assert main(["plan", "--configfile", "config/paper.yaml", "--config", "seeds=[1,2]", "cells_per_job=cell",
                 "--out", str(out)]) == 0
    text = capsys.readouterr().out
    bill = json.loads(out.read_text())
    assert set(bill["tables"]) == {"table1", "table2", "table3", "table4", "table5", "fig1"}
    assert bill["copies"] == 2 and bill["total"]["jobs"] == 2 * 226
    assert bill["total"]["asked_gpu_h"] == pytest.approx(sum(t["asked_gpu_h"] for t in bill["tables"].values()))
    assert bill["total"]["asked_gpu_h"] >= bill["total"]["expected_gpu_h"] > 0
    assert f"{bill['total']['asked_gpu_h']:,.1f}" in text and "measured" in text and "scaled from" in text
    assert main(["plan"]) == 0 and "asks for no GPU" in capsys.readouterr().out


def test_retries_warning_is_quiet_when_the_retries_suffice():
    from lpdl_core.pipeline.workflow.runtime import retries_warning
    assert retries_warning([1, 1, 1], retries=0, max_minutes=60) is None          # every job fits
    assert retries_warning([1, 3, 2], retries=2, max_minutes=60) is None          # 3 attempts = 2 retries
    assert retries_warning([1, 3, 2], retries=5, max_minutes=60) is None
    assert retries_warning([], retries=0, max_minutes=60) is None


def test_retries_warning_names_what_is_needed():
    from lpdl_core.pipeline.workflow.runtime import retries_warning
    line = retries_warning([1, 3, 2, 4], retries=1, max_minutes=480)
    assert line == ("lpdl: 3 train jobs are estimated longer than max_runtime=480 min and need up to 4 "
                    "attempts (each resumes from its checkpoint): run with --retries 3 or more (this run "
                    "allows 1), or raise max_runtime")
    assert "--retries 1 or more, or raise" in retries_warning([2], retries=None, max_minutes=60)


def test_lpdl_plan_prices_an_extension_grid_apart(tmp_path, capsys, monkeypatch):
    """`--config extensions=[heterogeneity]`: the paper's bill unchanged, the grid's own bill (its
    140 cells, one results folder) printed after it and under "grids" in the JSON."""
    from lpdl_core.cli import main

    monkeypatch.chdir(ROOT)
    base, ext = tmp_path / "base.json", tmp_path / "ext.json"
    assert main(["plan", "--configfile", "config/paper.yaml", "--out", str(base)]) == 0
    assert main(["plan", "--configfile", "config/paper.yaml", "--config", "extensions=[heterogeneity]",
                 "--out", str(ext)]) == 0
    text = capsys.readouterr().out
    b, e = json.loads(base.read_text()), json.loads(ext.read_text())
    assert {k: v for k, v in e.items() if k != "grids"} == b
    g = e["grids"]["heterogeneity"]
    assert set(g["tables"]) == {"heterogeneity"} and g["total"]["cells"] == 140
    assert g["total"]["asked_gpu_h"] >= g["total"]["expected_gpu_h"] > 0
    assert "extension grid heterogeneity: 140 cells" in text
