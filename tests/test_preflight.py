"""`lpdl preflight`: the plan's job shapes, their verdicts, and a step-times file that gives back
exactly what was measured. The end-to-end run (child processes, real loader on rehearsal data,
the real simulator) is slow; the rest is torch-free."""


import pytest
import yaml

from lpdl_core.pipeline.cells.tables import load_cells
from lpdl_core.pipeline.workflow.preflight import SLURM_RETRIES, Shape, measured_times, shapes, verdict
from lpdl_core.pipeline.workflow.runtime import StepTimes, step_kind
from lpdl_core.pipeline.workflow.wfconfig import load
from repo_copy import ROOT

PAPER = load(ROOT, [str(ROOT / "config/paper.yaml")])


def _m(**kw) -> dict:
    base = {"step_s": 0.5, "loader_samples_per_s": 10_000.0, "step_samples_per_s": 512.0, "peak_rss_mb": 3000.0,
            "device": "cpu"}
    return {**base, **kw}


def test_every_job_of_the_paper_plan_has_one_shape_and_shapes_are_few():
    """Each pack of each planned job maps to exactly one shape; the paper profile's 226 cells
    come down to a few dozen shapes (so a preflight is minutes, not hours)."""
    cells = load_cells(tables=PAPER["tables"])
    found = shapes(PAPER, cells)
    assert sum(len(cs) for jobs in found.values() for cs in jobs) >= len(cells)
    assert {s.model for s in found} == {c.model for c in cells}
    assert all(s.executor == PAPER["executor"] and s.compile == PAPER["compile"] for s in found)
    assert all(1 <= s.pack <= PAPER["pack_size"] for s in found) and len(found) <= 60
    one = shapes({**PAPER, "cells_per_job": "cell"}, cells)
    assert all(s.pack == 1 for s in one)


def test_verdicts_name_each_reason_and_fit_otherwise():
    assert verdict(_m(), mem_request_mb=24_000, attempts_needed=1) == []
    why = verdict(_m(peak_rss_mb=30_000, loader_samples_per_s=100.0), mem_request_mb=24_000,
                  attempts_needed=SLURM_RETRIES + 2)
    assert len(why) == 3 and why[0].startswith("host memory 30,000 MB above the SLURM request")
    assert "attempts" in why[1] and why[2].startswith("data loader 100 samples/s, slower")
    gpu = _m(device_peak_mb=75_000, device_total_mb=81_000)
    assert verdict(gpu, mem_request_mb=24_000, attempts_needed=1) == ["device memory 75,000 MB above 72,900 MB"]
    assert verdict(_m(), mem_request_mb=24_000, attempts_needed=1, mem_cap_mb=1)[0].startswith(
        "host memory 3,000 MB above the cap of 1 MB")


def test_the_written_step_times_give_back_each_measured_step():
    """The invariant the bill rests on: for the shape's own cell, the runtime model reads back the
    measured seconds (normalised to ref_nodes on write, scaled by nodes on read)."""
    base = StepTimes.load(ROOT / "config/step-times.yaml")
    cells = load_cells(tables=["table2"])
    c8 = next(c for c in cells if c.model == "resnet20" and c.nodes == 8)
    c16 = next(c for c in cells if c.model == "resnet20" and c.nodes == 16 and c.precision == c8.precision)
    s8, s16 = (Shape(model="resnet20", dataset="cifar10", precision=c8.precision, executor="batched", nodes=c.nodes,
                     pack=1, compile=True) for c in (c8, c16))
    mapping = measured_times(base, {s8: _m(step_s=0.010), s16: _m(step_s=0.030)}, provenance="test")
    times = StepTimes.from_mapping(yaml.safe_load(yaml.safe_dump(mapping)))
    kind = step_kind("batched", True)
    # one column holds both shapes: the larger per node, so the 16-node shape reads back exactly
    assert times.step_seconds(c16, kind) == pytest.approx(0.030)
    assert times.step_seconds(c8, kind) == pytest.approx(0.015)  # at least its own 0.010
    assert mapping["provenance"]["resnet20"] == "test" and "scaled from resnet20" in mapping["provenance"]["others"]
    assert mapping["measured"] == {"resnet20": {c8.precision: {kind: 0.015}}}  # no other device's numbers
    with pytest.raises(ValueError, match="no shape was measured"):
        measured_times(base, {s8: {"error": "x"}}, provenance="test")


@pytest.mark.slow
def test_lpdl_preflight_measures_a_scaled_down_plan_and_plan_reads_its_file(tmp_path, capsys):
    """On rehearsal data, one Table 3 cell of the paper profile: the real loader, the simulator,
    child processes. A tiny memory cap makes the shape not fit, in one line, exit 1; the file it
    writes is a step-times file `lpdl plan` prices from."""
    from lpdl_core.cli import main
    from repo_copy import small_paper_dir

    small_paper_dir(tmp_path / "cells", n=1, table="table3")
    assert main(["-q", "rehearsal-data", "--out", str(tmp_path / "data"), "--scale", "0.005",
                 "--dataset", "cifar10"]) == 0
    capsys.readouterr()
    out = tmp_path / "st.yaml"
    argv = ["preflight", "--directory", str(ROOT), "--configfile", str(ROOT / "config/paper.yaml"), "--config",
            f"paper_dir={tmp_path / 'cells'}", "tables=[table3]", f"data_root={tmp_path / 'data'}", "compile=false",
            "--steps", "1", "--out", str(out), "--mem-cap-mb", "1"]
    assert main(argv) == 1
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].startswith("resnet20/cifar10 fp32 batched n=8: will not fit: host memory")
    assert "above the cap of 1 MB" in lines[0] and lines[-1].startswith("lpdl preflight: 0 of 1 shapes fit")
    written = yaml.safe_load(out.read_text())
    shape = written["preflight"]["resnet20/cifar10 fp32 batched n=8"]
    assert shape["rehearsal"] is True and shape["step_s"] > 0 and shape["peak_rss_mb"] > 100
    assert written["measured"]["resnet20"]["fp32"]["batched"] == pytest.approx(shape["step_s"], rel=1e-5)
    assert main(["plan", "--directory", str(ROOT), "--configfile", str(ROOT / "config/paper.yaml"), "--config",
                 f"paper_dir={tmp_path / 'cells'}", "tables=[table3]", "compile=false", f"step_times={out}"]) == 0
    assert "measured" in capsys.readouterr().out


def test_a_measured_host_peak_raises_the_slurm_memory_request_never_lowers_it():
    """The file's host_mb (each model's peak RSS in the preflight) sets the job's mem_mb to at
    least HOST_MARGIN x that; below PAPER_MEM_MB the request stays as it was."""
    from dataclasses import replace

    from lpdl_core.pipeline.workflow.resources import HOST_MARGIN, PAPER_MEM_MB, Planner

    base = StepTimes.load(ROOT / "config/step-times.yaml")
    cell = next(c for c in load_cells(tables=["table2"]) if c.model == "resnet20")
    high = Planner(profile="paper", step_times=replace(base, host_mb={"resnet20": 30_000.0}))
    low = Planner(profile="paper", step_times=replace(base, host_mb={"resnet20": 100.0}))
    assert high.resources([cell])["mem_mb"] == 30_000 * HOST_MARGIN > PAPER_MEM_MB["resnet20"]
    assert low.resources([cell])["mem_mb"] == PAPER_MEM_MB["resnet20"]
    s = Shape(model="resnet20", dataset="cifar10", precision="fp32", executor="batched", nodes=8, pack=1, compile=False)
    assert measured_times(base, {s: _m(peak_rss_mb=5000.0)}, provenance="t")["host_mb"] == {"resnet20": 5000.0}


def test_the_preflight_job_asks_for_one_gpu_the_hungriest_host_memory_and_every_shape_timeout():
    """preflight_resources (the workflow's preflight rule): one GPU as gpu_request says, the
    largest host request of the shapes' models, and the shapes' timeouts as runtime, capped."""
    from lpdl_core.pipeline.workflow.preflight import preflight_resources
    from lpdl_core.pipeline.workflow.resources import Planner

    found = shapes(PAPER, load_cells(tables=PAPER["tables"]))
    base = StepTimes.load(ROOT / "config/step-times.yaml")
    planner = Planner(profile="paper", step_times=base)
    res = preflight_resources(planner, found, timeout_s=600, max_minutes=2880)
    assert res["gpu"] == 1 and "gres" not in res
    assert res["runtime"] == len(found) * 10 + 10
    assert res["mem_mb"] == max(planner.host_request_mb(s.model) for s in found)
    gres = preflight_resources(Planner(profile="paper", gpu_request="gres", step_times=base), found, max_minutes=60)
    assert (gres["gpu"], gres["gres"], gres["runtime"]) == (0, "gpu:1", 60)


@pytest.mark.slow
def test_snakemake_preflight_is_one_job_that_writes_the_step_times_and_the_verdicts(tmp_path):
    """`snakemake --configfile config/paper.yaml preflight`: the download rule verifies the data
    first, then one job runs lpdl preflight over the config's plan (here one Table 3 shape on
    rehearsal data, on this CPU) with the config's `preflight:` options; its outputs are the
    step-times file, one verdict line per shape (also printed) and the config it measured."""
    from repo_copy import copy_repo, small_paper_dir, snakemake_on_rehearsal

    repo = copy_repo(tmp_path / "repo")
    small_paper_dir(repo / "small", n=1, table="table3")
    p = snakemake_on_rehearsal(repo, tmp_path / "data", "preflight={steps: 1, warmup: 1, shapes: [resnet20/]}",
                               targets=("preflight",))
    assert p.returncode == 0, p.stderr[-3000:]
    out = repo / "results/paper/preflight"
    verdicts = (out / "verdicts.txt").read_text().splitlines()
    assert verdicts[0].startswith("resnet20/cifar10 fp32 batched n=8: ")
    assert verdicts[-1].startswith("lpdl preflight: ") and verdicts[0] in p.stderr
    times = yaml.safe_load((out / "step-times.yaml").read_text())
    assert times["preflight"]["resnet20/cifar10 fp32 batched n=8"]["rehearsal"] is True
    assert yaml.safe_load((out / "config.yaml").read_text())["preflight"]["steps"] == 1
    assert (repo / "results/paper/download.json").is_file()


def test_an_interrupted_preflight_keeps_what_it_measured(monkeypatch):
    """`save` gets the step-times mapping after each measured shape, so a preflight killed at its
    time limit leaves a file of every shape measured before (the CLI writes it atomically)."""
    import lpdl_core.pipeline.workflow.preflight as pf
    from lpdl_core.pipeline.workflow.resources import Planner

    calls = []

    def measure(shape, cell, **kw):
        if calls:
            raise KeyboardInterrupt
        calls.append(shape)
        return _m(first_step_s=1.0, torch="t", threads=2)

    monkeypatch.setattr(pf, "measure_shape", measure)
    base = StepTimes.load(ROOT / "config/step-times.yaml")
    saved, lines = [], []
    with pytest.raises(KeyboardInterrupt):
        pf.run_preflight(PAPER, load_cells(tables=PAPER["tables"]), base, root=str(ROOT),
                         planner=Planner(profile="paper", step_times=base), say=lines.append, save=saved.append)
    assert len(saved) == 1 and list(saved[0]["preflight"]) == [calls[0].name]
    assert saved[0]["measured"][calls[0].model][calls[0].precision][calls[0].column] > 0
    assert any(calls[0].name in line and "step 0.5000 s" in line for line in lines)
    with pytest.raises(ValueError, match="no shape of the plan matches 'nosuch'"):
        pf.run_preflight(PAPER, load_cells(tables=PAPER["tables"]), base, root=str(ROOT),
                         planner=Planner(profile="paper", step_times=base), only=("nosuch",))
