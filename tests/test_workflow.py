"""The Snakemake workflow: config validation, the full DAG, and resume after kill -9."""
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from lpdl_core.pipeline.cells.tables import PAPER_DIR
from repo_copy import copy_repo, small_paper_dir

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SNAKEMAKE = str(BIN / "snakemake")
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}




# Snakemake's own notice that it loaded the workflow profile (profiles/default) is not an error.
SNAKEMAKE_NOTICE = re.compile(r"^Using (profiles? .* and )?workflow specific profile ")


def _smk(cwd, *args, timeout=600, **kw):
    return subprocess.run([SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, env=ENV,
                          timeout=timeout, **kw)


def test_dry_run_has_every_paper_cell():
    p = _smk(ROOT, "-n", "--forceall", "--nolock", "--quiet", "rules")
    assert p.returncode == 0, p.stderr[-2000:]
    # Snakemake found the workflow profile (rerun triggers, rerun-incomplete) beside the root Snakefile
    assert "Using workflow specific profile profiles/default" in p.stdout + p.stderr
    counts = {l.split()[0]: int(l.split()[1]) for l in p.stdout.splitlines() if l[:1].isalpha() and len(l.split()) == 2
              and l.split()[1].isdigit()}
    train = {k: v for k, v in counts.items() if k.startswith("train_")}
    from lpdl_core.pipeline.cells.tables import load_cells
    from lpdl_core.pipeline.workflow.jobs import plan_jobs

    cells = load_cells(PAPER_DIR)
    assert len(cells) == 14 + 128 + 16 + 16 + 48 + 4
    jobs = plan_jobs(cells, "mini")  # a block's cells of one precision per job
    assert set(train) == {j.rule for j in jobs} and all(v == 1 for v in train.values())
    assert sum(len(j.cells) for j in jobs) == len(cells)
    assert counts["aggregate"] == 1 and counts["report"] == 1 and counts["all"] == 1   # one aggregate job: all tables
    assert counts["cost"] == 1 and counts["partitions"] == 1


@pytest.mark.parametrize("profile", ["mini", "paper"])
def test_planning_the_dag_imports_no_torch(tmp_path, profile):
    """`snakemake -n` builds the whole DAG (cells, jobs, identities, config check) with the
    torch-free vocabulary: a `torch` that raises on import, first on the path, must not be hit."""
    poison = tmp_path / "poison" / "torch"
    poison.mkdir(parents=True)
    (poison / "__init__.py").write_text('raise ImportError("torch was imported while planning the DAG")\n')
    env = {**ENV, "PYTHONPATH": os.pathsep.join([str(poison.parent), str(ROOT)])}
    extra = ["--configfile", "config/paper.yaml"] if profile == "paper" else []
    p = subprocess.run([SNAKEMAKE, "-n", "--forceall", "--nolock", "--quiet", "rules", *extra], cwd=ROOT,
                       capture_output=True, text=True, env=env, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "train_" in p.stdout
    check = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True, text=True, env=env)
    assert "torch was imported while planning" in check.stderr   # the poison works


def test_paper_profile_dry_run_writes_its_report_apart():
    p = _smk(ROOT, "-n", "--forceall", "--nolock", "--configfile", "config/paper.yaml")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "report/paper/report.html" in p.stdout and "results/paper/tables/table5.csv" in p.stdout
    jobs = re.findall(r"^rule (train_\w+):", p.stdout, flags=re.M)
    assert len(jobs) == len(set(jobs)) == 33  # paper.yaml: a block's cells of one precision per job


@pytest.mark.parametrize("bad,key", [("profile=foo", "profile"), ("seeds=[-1]", "seeds/0"),
                                     ("tables=[table9]", "tables/0"),
                                     ("report_dir='a b'", "report_dir")])
def test_bad_config_is_one_line_before_any_job(bad, key):
    p = _smk(ROOT, "-n", "--config", bad)
    assert p.returncode != 0
    lines = [l for l in p.stderr.splitlines() if l.strip() and not SNAKEMAKE_NOTICE.match(l)]
    assert len(lines) == 1 and lines[0].startswith(f"lpdl config error: {key}:"), p.stderr


def _small_paper_dir(dst: Path, rows=(1, 2)) -> None:
    """A paper dir whose table3 holds only the given rows (1-based; same header and validation).
    Rows 1 and 2 are one setting in FP and LP (two jobs); rows 1 and 3 are two FP cells of one
    block (one job in the mini profile)."""
    lines = (PAPER_DIR / "table3.csv").read_text().splitlines()
    dst.mkdir(parents=True)
    (dst / "table3.csv").write_text("\n".join([lines[0]] + [lines[r] for r in rows]) + "\n")


@pytest.mark.slow
@pytest.mark.parametrize("rows", [(1, 2), (1, 3)], ids=["two-jobs", "one-job"])
def test_kill_9_then_rerun_recomputes_nothing_finished_and_resumes_exactly(tmp_path, rows):
    repo = copy_repo(tmp_path / "repo")
    _small_paper_dir(repo / "small", rows)
    cfg = ["--config", "paper_dir=small", "tables=[table3]"]
    runs = repo / "results/mini/runs"
    proc = subprocess.Popen([SNAKEMAKE, "-c1", *cfg], cwd=repo, env=ENV, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)
    try:  # kill the whole pipeline once one cell is done and the other has a checkpoint
        deadline = time.time() + 400
        while time.time() < deadline:
            done = list(runs.glob("*/seed1234/metrics.json"))
            ckpt = list(runs.glob("*/seed1234/checkpoint.pt"))
            if len(done) == 1 and ckpt and ckpt[0].parent != done[0].parent:
                break
            assert proc.poll() is None, "pipeline finished before it could be killed"
            time.sleep(0.2)
        else:
            pytest.fail("never reached the kill point")
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    finished, interrupted = done[0], ckpt[0].parent
    mtime, content = finished.stat().st_mtime_ns, finished.read_bytes()
    # what `make reproduce` does: clear the lock the killed run left behind, then the same command
    assert _smk(repo, "--unlock", *cfg).returncode == 0
    p = _smk(repo, "-c1", *cfg)
    assert p.returncode == 0, p.stderr[-3000:]
    cell, done_cell = interrupted.parent.name, finished.parent.parent.name
    logs = [p.read_text() for p in (repo / "results/mini/logs/train").glob("*/seed1234.log")]
    log = next(text for text in logs if f"[{cell}]" in text)
    assert f"[{cell}] resuming at epoch" in log
    assert finished.read_bytes() == content  # not recomputed ...
    if rows == (1, 2):  # ... its job was not rerun at all
        assert finished.stat().st_mtime_ns == mtime
    else:  # ... its job was rerun (incomplete): restored from its kept copy, no epoch trained
        assert f"[{done_cell}] restored the finished result" in log and f"[{done_cell}] epoch" not in log
    assert not list(finished.parent.glob(".*.tmp"))
    resumed = json.loads((interrupted / "metrics.json").read_text())
    # the same cell, uninterrupted
    ref_dir = tmp_path / "ref"
    subprocess.run([sys.executable, "-m", "lpdl_core", "train", "--cell", cell, "--out", str(ref_dir),
                    "--paper-dir", str(repo / "small"), "--device", "cpu"], check=True,
                   env={**ENV, "OMP_NUM_THREADS": "1"},  # as the Snakemake job (threads: 1): same float order
                   capture_output=True, timeout=600, cwd=repo)
    ref = json.loads((ref_dir / "metrics.json").read_text())
    assert resumed["final"] == ref["final"] and resumed["bytes_per_node"] == ref["bytes_per_node"]
    table = (repo / "results/mini/tables/table3.csv").read_text().splitlines()
    assert len(table) == 3 and not any(",missing," in l for l in table)
    # the pipeline ended with the report, which Snakemake's own --report also packages
    assert "2 of 2 cells with results" in (repo / "results/mini/logs/report.log").read_text()
    assert (repo / "report/report.html").stat().st_size > 0
    p = _smk(repo, "--report", str(tmp_path / "smk-report.zip"), *cfg)
    assert p.returncode == 0 and (tmp_path / "smk-report.zip").stat().st_size > 0, p.stderr[-2000:]


def test_the_workflow_lints_clean():
    """`snakemake --lint` finds nothing (paths by f-string, no rule reads a global in its shell)."""
    p = subprocess.run([str(Path(sys.executable).parent / "snakemake"), "--lint"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0 and "Congratulations" in p.stdout + p.stderr, (p.stdout + p.stderr)[-3000:]


def test_the_train_script_hands_typed_fidelity_and_the_config_to_lpdl_train(tmp_path, monkeypatch):
    """workflow/scripts/train.py: the job's cells, the mode's fidelity as JSON (typed, never
    re-parsed: the params' options with the config mode's rounding-only ones), how the job runs
    from the config; OMP_NUM_THREADS set before torch loads."""
    import runpy
    from types import SimpleNamespace

    calls = {}
    monkeypatch.setattr(os, "environ", dict(os.environ))  # the script sets OMP/HF_* variables: keep them here
    monkeypatch.setattr(os, "execv", lambda exe, argv: calls.update(argv=argv))
    monkeypatch.setattr(os, "dup2", lambda a, b: None)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    fid = json.dumps({"quant_ranges": "gossiped", "cell_settings": "run.sh"})
    sm = SimpleNamespace(config={"profile": "mini", "paper_dir": "my paper", "device": "cpu", "executor": "batched",
                                 "data_root": "", "fidelity": "official"},
                         wildcards=SimpleNamespace(seed="7", results="mini-official"), threads=3,
                         params=SimpleNamespace(cells=["a-cell", "b-cell"], fidelity=fid),
                         log=[str(tmp_path / "job.log")])
    runpy.run_path(str(ROOT / "workflow/scripts/train.py"), init_globals={"snakemake": sm})
    argv = calls["argv"]
    assert argv[1:4] == ["-m", "lpdl_core", "train"]
    # the params' options, and the rounding-only ones from the folder's mode in the config
    assert json.loads(argv[argv.index("--fidelity-json") + 1]) == {**json.loads(fid), "int8_arithmetic": "fake"}
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--cell"] == ["a-cell", "b-cell"]
    assert argv[argv.index("--out") + 1] == "results/mini-official/runs/{cell}/seed7"
    assert argv[argv.index("--paper-dir") + 1] == "my paper" and "--data-root" not in argv
    assert (argv[argv.index("--executor") + 1], os.environ["OMP_NUM_THREADS"]) == ("batched", "3")


@pytest.mark.slow
def test_the_catalog_test_config_runs_end_to_end(tmp_path):
    """`snakemake --directory .test -c2`: the workflow's .test config (four Table 3 cells) through
    train, aggregate, cost, partitions and report, in a copy of the repository (the mini profile
    has nothing to download); `lpdl status` finds everything current afterwards."""
    repo = copy_repo(tmp_path / "repo")
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    p = subprocess.run([str(bin_dir / "snakemake"), "--directory", ".test", "-c2"], cwd=repo, env=env,
                       capture_output=True, text=True, timeout=900, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr[-3000:]
    test = repo / ".test"
    rows = (test / "results/mini/tables/table3.csv").read_text().splitlines()
    assert len(rows) == 1 + 4
    grid = (test / "results/mini-tiny/tables/tiny.csv").read_text().splitlines()  # the extension grid
    assert len(grid) == 1 + 2 and all(",ok," in r for r in grid[1:]), grid
    assert sorted(p.name for p in (test / "results/mini-tiny/runs").iterdir()) == [
        "tiny-resnet20-ring4-c0-dir0.1-ds-fp32", "tiny-resnet20-ring4-c0-s0-ds-fp32"]
    html = (test / "report/report.html").read_text()
    assert "Grid tiny" in html and "Dirichlet 0.1 − skew 0" in html and 'id="fig-grid-tiny-accuracy-bytes"' in html
    assert (test / "report/report.html").is_file()
    assert "2 current" not in p.stderr  # the last check stays quiet when everything is current
    assert not (repo / "results/mini").exists()  # everything stayed under .test/
    st = subprocess.run([sys.executable, "-m", "lpdl_core", "status", "--directory", ".test"], cwd=repo,
                        capture_output=True, text=True, env=env)
    assert st.returncode == 0, st.stdout + st.stderr


@pytest.mark.parametrize("in_slurm", [False, True])
def test_the_train_script_runs_a_distributed_job_as_n_processes(tmp_path, monkeypatch, in_slurm):
    """executor distributed: in a SLURM job of n tasks the script runs `srun --ntasks=n
    --kill-on-bad-exit=1 ... lpdl train` with the rendezvous host and port exported; elsewhere it
    runs `lpdl train`, which starts the n processes itself (torchrun)."""
    import runpy
    from types import SimpleNamespace

    calls = {}
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items()
                                        if not k.startswith(("SLURM_", "MASTER_"))})
    monkeypatch.setattr(os, "execvp", lambda exe, argv: calls.setdefault("argv", argv))
    monkeypatch.setattr(os, "dup2", lambda a, b: None)
    if in_slurm:
        os.environ.update(SLURM_JOB_ID="4242", SLURM_NTASKS="4", SLURM_CPUS_PER_TASK="2")
    sm = SimpleNamespace(config={"profile": "mini", "paper_dir": None, "device": "cpu", "executor": "distributed",
                                 "data_root": "", "dist_timeout": 45},
                         wildcards=SimpleNamespace(seed="1234", results="mini"), threads=1,
                         params=SimpleNamespace(cells=["a-cell"], fidelity="{}"), resources={"tasks": 4, "mpi": "srun"},
                         log=[str(tmp_path / "job.log")])
    runpy.run_path(str(ROOT / "workflow/scripts/train.py"), init_globals={"snakemake": sm})
    argv = calls["argv"]
    assert argv[argv.index("--executor") + 1] == "distributed" and argv[argv.index("--dist-timeout") + 1] == "45"
    if in_slurm:
        assert argv[:3] == ["srun", "--ntasks=4", "--kill-on-bad-exit=1"] and argv[4:7] == ["-m", "lpdl_core", "train"]
        assert os.environ["MASTER_PORT"] == str(20000 + 4242) and os.environ["MASTER_ADDR"]
        assert os.environ["OMP_NUM_THREADS"] == "2"  # the task's CPUs
    else:
        assert argv[1:4] == ["-m", "lpdl_core", "train"] and "MASTER_ADDR" not in os.environ


@pytest.mark.parametrize("executor", ["loop", "batched", "distributed"])
def test_the_train_script_runs_on_the_resolved_config_with_no_optional_key_set(tmp_path, monkeypatch, executor):
    """The config the workflow hands its scripts is wfconfig.load's: every optional key the schema
    (or config.py, for the keys whose default lives there) gives a default for is filled in, so the
    train script reads each with no KeyError, whatever the executor."""
    import runpy
    from types import SimpleNamespace

    from lpdl_core.pipeline.workflow.wfconfig import SCHEMA, load, with_vocabulary

    cfg = load(ROOT, overrides=[f"executor={executor}"])
    schema = with_vocabulary(yaml.safe_load((ROOT / SCHEMA).read_text()))
    assert {k for k, spec in schema["properties"].items() if "default" in spec} <= set(cfg)
    assert cfg["dist_timeout"] == schema["properties"]["dist_timeout"]["default"]
    calls = {}
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "MASTER_"))})
    monkeypatch.setattr(os, "execvp", lambda exe, argv: calls.setdefault("argv", argv))
    monkeypatch.setattr(os, "dup2", lambda a, b: None)
    sm = SimpleNamespace(config=cfg, wildcards=SimpleNamespace(seed="1234", results="mini"), threads=1,
                         params=SimpleNamespace(cells=["a-cell"], fidelity="{}"), resources={},
                         log=[str(tmp_path / "job.log")])
    runpy.run_path(str(ROOT / "workflow/scripts/train.py"), init_globals={"snakemake": sm})
    argv = calls["argv"]
    assert argv[argv.index("--executor") + 1] == executor
    assert ("--dist-timeout" in argv) == (executor == "distributed")


@pytest.mark.slow
@pytest.mark.ci
@pytest.mark.parametrize("executor", ["loop", "batched", "distributed"])
def test_each_executor_runs_a_cell_under_snakemake_with_no_optional_key_set(tmp_path, executor):
    """`snakemake -c2 --config executor=<e>` and nothing else set (every other key the config's or
    the schema's default): the 4-node cell trains, through aggregate and report. Distributed: the
    job starts 4 processes (lpdl train under torchrun) on this host and the run says so. The cell
    runs one mini epoch (the cells CSV's mini_epochs column): the machinery is under test."""
    cell = "t4-imagenette-vgg11-dring4-c90-s0.6-choco-int8"
    repo = copy_repo(tmp_path / "repo")
    small_paper_dir(repo / "small", table="table4", cell=cell, mini_epochs=1)
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    p = subprocess.run([str(bin_dir / "snakemake"), "-c2", "--config", "paper_dir=small", "tables=[table4]",
                        f"executor={executor}"], cwd=repo, env=env, capture_output=True, text=True, timeout=900,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr[-3000:]
    m = json.loads((repo / f"results/mini/runs/{cell}/seed1234/metrics.json").read_text())
    assert m["executor"] == executor and m["status"] == "ok" and m["epochs_done"] == 1
    log = next((repo / "results/mini/logs/train").rglob("seed1234.log")).read_text()
    assert log.count(f"[{cell}] ok:") == 1
    if executor == "distributed":
        assert m["config"]["processes"] == 4 and len(m["step_split"]) == 4 and "starting 4 processes" in log
    assert len((repo / "results/mini/tables/table4.csv").read_text().splitlines()) == 2


def test_an_extension_grid_joins_the_dag_in_its_own_folder():
    """`--config extensions=[heterogeneity]`: the grid's jobs (its 140 cells, DS/CHOCO twins at
    0 % sharing runs as in the paper's tables) write into results/mini-heterogeneity/ only, and
    one aggregate per grid makes its tidy table; the paper's jobs are the same as without it."""
    from lpdl_core.pipeline.cells.grids import load_grid
    from lpdl_core.pipeline.workflow.jobs import plan_jobs

    base = _smk(ROOT, "-n", "--forceall", "--nolock", "--quiet", "rules")
    p = _smk(ROOT, "-n", "--forceall", "--nolock", "--config", "extensions=[heterogeneity]")
    assert base.returncode == 0 and p.returncode == 0, p.stderr[-2000:]
    jobs = plan_jobs(load_grid("heterogeneity").cells, "mini")
    assert sum(len(j.cells) for j in jobs) == 140
    rules = set(re.findall(r"^rule (\w+):", p.stdout, flags=re.M))
    paper_rules = {l.split()[0] for l in base.stdout.splitlines() if l.startswith("train_")}
    assert {j.rule for j in jobs} | paper_rules | {"aggregate_heterogeneity"} <= rules
    assert "results/mini-heterogeneity/tables/heterogeneity.csv" in p.stdout
    grid_outputs = re.findall(r"results/[\w.-]+/runs/heterogeneity-[\w.-]+/seed\d+/metrics\.json", p.stdout)
    assert len(set(grid_outputs)) == 140 and all(o.startswith("results/mini-heterogeneity/") for o in grid_outputs)
    bad = _smk(ROOT, "-n", "--config", "extensions=[nosuchgrid]")
    lines = [l for l in bad.stderr.splitlines() if l.strip() and not SNAKEMAKE_NOTICE.match(l)]
    assert bad.returncode != 0 and len(lines) == 1 and "nosuchgrid" in lines[0], bad.stderr


def test_a_grid_alone_runs_without_the_paper_cells():
    """`tables: []` with a grid (config/extensions.yaml): only the grid's jobs, its aggregate and a
    report of it alone (no paper aggregate, cost or partitions job); `tables: []` without a grid is
    one line."""
    p = _smk(ROOT, "-n", "--forceall", "--nolock", "--config", "tables=[]", "extensions=[heterogeneity]")
    assert p.returncode == 0, p.stderr[-2000:]
    rules = set(re.findall(r"^rule (\w+):", p.stdout, flags=re.M))
    assert {"aggregate_heterogeneity", "report"} <= rules
    assert not rules & {"aggregate", "cost", "partitions"}
    trained = re.findall(r"results/[\w.-]+/runs/([\w.-]+)/seed\d+/metrics\.json", p.stdout)
    assert trained and all(c.startswith("heterogeneity-") for c in trained)
    bad = _smk(ROOT, "-n", "--config", "tables=[]")
    lines = [l for l in bad.stderr.splitlines() if l.strip() and not SNAKEMAKE_NOTICE.match(l)]
    assert bad.returncode != 0 and len(lines) == 1 and "nothing to run" in lines[0], bad.stderr


def test_the_train_script_names_the_grid_of_a_grid_job(tmp_path, monkeypatch):
    import runpy
    from types import SimpleNamespace

    calls = {}
    monkeypatch.setattr(os, "environ", dict(os.environ))
    monkeypatch.setattr(os, "execv", lambda exe, argv: calls.update(argv=argv))
    monkeypatch.setattr(os, "dup2", lambda a, b: None)
    def run(results, cells):
        sm = SimpleNamespace(config={"profile": "mini", "paper_dir": None, "device": "cpu", "executor": "loop",
                                     "data_root": None, "fused_quant": True, "extensions": ["heterogeneity"]},
                             wildcards=SimpleNamespace(seed="1234", results=results), threads=1,
                             params=SimpleNamespace(cells=cells, fidelity="{}"), log=[str(tmp_path / "job.log")])
        runpy.run_path(str(ROOT / "workflow/scripts/train.py"), init_globals={"snakemake": sm})
        return calls["argv"]

    argv = run("mini-heterogeneity", ["heterogeneity-x"])
    assert argv[argv.index("--grid") + 1] == "heterogeneity" and "--fused-quant" in argv
    assert argv[argv.index("--out") + 1] == "results/mini-heterogeneity/runs/{cell}/seed1234"
    # a grid cell that is a paper cell's mini run reuses it from the same mode's paper folder
    assert argv[argv.index("--reuse-runs") + 1] == "results/mini/runs/{cell}/seed1234"
    official = run("mini-official-heterogeneity", ["h"])
    assert official[official.index("--grid") + 1] == "heterogeneity"
    assert official[official.index("--reuse-runs") + 1] == "results/mini-official/runs/{cell}/seed1234"
    assert "--grid" not in run("mini", ["t3-x"]) and "--grid" not in run("mini-official", ["t3-x"])
    assert "--reuse-runs" not in run("mini", ["t3-x"])


def test_the_train_rules_params_are_only_what_defines_the_runs():
    """Snakemake reruns a job whose params changed (rerun-triggers: params): a param added to the
    train rules would rerun every finished cell after an upgrade. So they stay the identity, the
    cells and the fidelity; how a job runs (a grid's name included) comes from the config."""
    text = (ROOT / "workflow/rules/train.smk").read_text()
    block = text[text.index("        params:"):text.index("        script:")]
    keys = re.findall(r"^            (\w+)=", block, flags=re.M)
    assert keys == ["identity", "cells", "fidelity"], keys
