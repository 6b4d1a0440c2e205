"""`lpdl status` and the workflow's last check (lpdl_core.pipeline.workflow.status): for every run a config
names, whether it is the run asked for and whether runs.csv (so the tables and the report) holds
exactly that file; whether the report is newer than what it shows. The pipeline cases are in
tests/test_hostile.py (section 8); here each state on a results folder built by hand."""
import json
import os
import time

from test_aggregate import T3, _metrics, _write

from lpdl_core.cli import main
from lpdl_core.config import Fidelity
from lpdl_core.pipeline.aggregation.aggregate import write_aggregate
from lpdl_core.pipeline.workflow.status import folder_status
from lpdl_core.pipeline.aggregation.tidy import run_dir

CELLS = T3[:3]


def _results(tmp_path):
    root = tmp_path / "results" / "mini"
    for c in CELLS:
        _write(root, c, _metrics(c, 90.0, classes=10))
    write_aggregate(root, CELLS, profile="mini", tables=["table3"], seeds=[1])
    return root


def _status(root, report=None, **kw):
    return folder_status(CELLS, root, profile="mini", seeds=[1], fidelity=Fidelity(**kw),
                         report_dir=report, tables=["table3"])


def test_a_freshly_aggregated_folder_is_current(tmp_path):
    st = _status(_results(tmp_path))
    assert st.current and st.consistent and st.counts["current"] == 3


def test_each_way_a_folder_falls_behind_is_named(tmp_path):
    root = _results(tmp_path)
    a, b, c = CELLS
    (run_dir(root, a.cell_id, 1) / "metrics.json").unlink()                       # missing
    (run_dir(root, b.cell_id, 1) / "metrics.json").write_text("{not json")        # damaged, after aggregating
    m = _metrics(c, 80.0, classes=10)                                             # a new result, not aggregated
    (run_dir(root, c.cell_id, 1) / "metrics.json").write_text(json.dumps(m))
    st = _status(root)
    states = {r.cell_id: (r.state, r.aggregated) for r in st.runs}
    assert states == {a.cell_id: ("missing", False), b.cell_id: ("damaged", False), c.cell_id: ("current", False)}
    assert not st.consistent and not st.current
    text = "\n".join(st.lines())
    assert "1 current, 1 missing, 1 damaged; 2 not in runs.csv" in text and "does not hold this result" in text
    write_aggregate(root, CELLS, profile="mini", tables=["table3"], seeds=[1])
    st = _status(root)  # damaged is marked in runs.csv: consistent, but not current; missing stays missing
    assert [r.state for r in st.runs] == ["missing", "damaged", "current"] and not st.consistent
    (run_dir(root, a.cell_id, 1) / "metrics.json").write_text(json.dumps(_metrics(a, 90.0, classes=10)))
    write_aggregate(root, CELLS, profile="mini", tables=["table3"], seeds=[1])
    st = _status(root)
    assert st.consistent and not st.current  # the damaged run is shown as such: the report tells the truth


def test_a_run_of_other_settings_is_another_run(tmp_path):
    st = _status(_results(tmp_path), act_rounding="stochastic")  # the config changed since the runs
    assert {r.state for r in st.runs} == {"other-run"} and "fidelity.act_rounding" in st.runs[0].why


def test_the_report_must_be_newer_than_what_it_shows(tmp_path):
    root = _results(tmp_path)
    report = tmp_path / "report"
    report.mkdir()
    assert _status(root, report).report == f"no {report / 'report.html'}"
    (report / "report.html").write_text("<html>")
    past = time.time() - 60
    os.utime(report / "report.html", (past, past))
    assert "is older than" in _status(root, report).report
    os.utime(report / "report.html")
    assert _status(root, report).current


def test_runs_the_config_does_not_name_make_runs_csv_stale(tmp_path):
    root = _results(tmp_path)
    st = folder_status(CELLS[:2], root, profile="mini", seeds=[1], fidelity=Fidelity())
    assert not st.consistent and st.extra == (f"{CELLS[2].cell_id} seed 1",)


def test_lpdl_status_reads_the_config_as_snakemake_does(tmp_path, capsys, monkeypatch):
    """In a workflow folder: config/config.yaml, then --configfile (read, as Snakemake reads it,
    relative to where the command starts, not to --directory), then --config; exit 1 and one line
    per run that is not current, exit 0 when everything is."""
    import shutil

    from repo_copy import ROOT

    work = tmp_path / "wf"
    (work / "workflow" / "schemas").mkdir(parents=True)
    shutil.copy(ROOT / "workflow/schemas/config.schema.yaml", work / "workflow/schemas/")
    (work / "config").mkdir()
    shutil.copy(ROOT / "config/config.yaml", work / "config/")
    (work / "more.yaml").write_text("seeds: [1]\n")
    root = _results(work)
    monkeypatch.chdir(work)  # more.yaml is in the folder the command starts in
    argv = ["status", "--directory", str(work), "--configfile", "more.yaml", "--config", "tables=[table3]"]
    assert main(argv) == 1  # only 3 of table3's 16 cells have runs, and there is no report
    out = capsys.readouterr().out
    assert f"{root}: 16 cells x 1 seed: 3 current, 13 missing" in out and "report: no " in out
    assert main(argv + ["--config", "seeds=[2]"]) == 1
    assert "0 current, 16 missing" in capsys.readouterr().out
    assert main(["status", "--directory", str(work), "--config", "seeds=[1,x]"]) == 2
    assert "seeds/1" in capsys.readouterr().err


def test_an_extension_grids_folder_is_checked_by_status_and_the_last_check(tmp_path, capsys, monkeypatch):
    """`extensions: [tiny]`: `lpdl status` and the workflow's last check (hooks) hold the grid's
    folder, results/mini-tiny/, to the same standard: a missing grid run fails both."""
    import shutil

    import pytest

    from lpdl_core.pipeline.cells.grids import load_grid
    from lpdl_core.pipeline.workflow.hooks import check_results_current
    from lpdl_core.pipeline.workflow.wfconfig import load
    from repo_copy import ROOT

    work = tmp_path / "wf"
    (work / "workflow" / "schemas").mkdir(parents=True)
    shutil.copy(ROOT / "workflow/schemas/config.schema.yaml", work / "workflow/schemas/")
    (work / "config" / "extensions").mkdir(parents=True)
    shutil.copy(ROOT / "config/config.yaml", work / "config/")
    shutil.copy(ROOT / ".test/config/extensions/tiny.yaml", work / "config/extensions/")
    argv = ["status", "--directory", str(work), "--config", "tables=[table3]", "extensions=[tiny]", "seeds=[1]"]
    assert main(argv) == 1
    assert f"{work / 'results' / 'mini-tiny'}: 2 cells x 1 seed: 0 current, 2 missing" in capsys.readouterr().out
    grid = load_grid("tiny", work)
    monkeypatch.chdir(work)
    with pytest.raises(SystemExit):
        check_results_current(load(work, (), ["tables=[]", "extensions=[tiny]", "seeds=[1]"]), [],
                              {"tiny": grid.cells})
    assert "mini-tiny" in capsys.readouterr().err
    # tables: [] -> the grid alone: no line about the paper's empty folder
    capsys.readouterr()
    assert main(argv[:4] + ["tables=[]", "extensions=[tiny]", "seeds=[1]"]) == 1
    out = capsys.readouterr().out
    assert "mini-tiny: 2 cells x 1 seed" in out and f"{work / 'results' / 'mini'}:" not in out


def test_the_report_must_be_newer_than_a_grids_runs(tmp_path, monkeypatch):
    """The report shows the grids: a runs.csv of a grid newer than report.html is not current."""
    import os

    from lpdl_core.pipeline.workflow.status import folder_status

    grid, report = tmp_path / "results/mini-tiny", tmp_path / "report"
    grid.mkdir(parents=True)
    report.mkdir()
    (report / "report.html").write_text("x")
    (grid / "runs.csv").write_text("cell_id,seed\n")
    os.utime(report / "report.html", (1, 1))
    st = folder_status([], grid, profile="mini", seeds=[1], fidelity=Fidelity(), report_dir=report)
    assert not st.consistent and "older than" in st.report


def test_status_and_the_last_check_hold_the_same_folders(tmp_path):
    """One list of results folders per config (status.config_status), for `lpdl status` and the
    check after `snakemake`: each mode's folder of the paper cells, then each grid's folder in the
    config's mode; the report is checked with the folder it shows and with every grid's."""
    import shutil

    from lpdl_core.pipeline.workflow.status import config_status
    from lpdl_core.pipeline.workflow.wfconfig import load
    from repo_copy import ROOT

    (tmp_path / "workflow" / "schemas").mkdir(parents=True)
    shutil.copy(ROOT / "workflow/schemas/config.schema.yaml", tmp_path / "workflow/schemas/")
    (tmp_path / "config" / "extensions").mkdir(parents=True)
    shutil.copy(ROOT / "config/config.yaml", tmp_path / "config/")
    cfg = load(tmp_path, (), ["tables=[table3]", "compare_modes=true", "seeds=[1]"])
    folders = config_status(cfg, CELLS, {"tiny": CELLS[:1]}, tmp_path)
    assert [st.results.relative_to(tmp_path).as_posix() for st in folders] == [
        "results/mini", "results/mini-official", "results/mini-tiny"]
    assert [st.report is not None for st in folders] == [True, False, True]
    assert [len(st.runs) for st in folders] == [3, 3, 1]
    official = load(tmp_path, (), ["tables=[]", "fidelity=official", "seeds=[1]", "extensions=[tiny]"])
    assert [st.results.name for st in config_status(official, [], {"tiny": CELLS[:1]}, tmp_path)] == [
        "mini-official-tiny"]
