"""SLURM: the cluster profile (slurm/config.yaml) is well formed, and (slow, root) the 2-cell
subset of table3 really runs through a throwaway single-host SLURM cluster (scripts/local-slurm.sh)
with the same results as a local run."""
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from repo_copy import copy_repo, small_paper_dir

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SNAKEMAKE = str(BIN / "snakemake")
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}"}
SCRIPT = ROOT / "scripts/local-slurm.sh"
TEST_PROFILE = ROOT / "workflow/profiles/slurm-test"
PLUGIN = "snakemake-executor-plugin-slurm>=2.8"
RUN_TIMEOUT = int(os.environ.get("LPDL_SLURM_TEST_TIMEOUT", 600))  # whole SLURM run (2 cells + aggregate)


# --- fast: the profiles -------------------------------------------------------------------------

def test_cluster_profile_is_valid_yaml_with_the_recommended_keys():
    text = (ROOT / "workflow/profiles/slurm/config.yaml").read_text()
    cfg = yaml.safe_load(text)
    assert cfg["executor"] == "slurm"
    for key in ("jobs", "latency-wait", "retries", "default-resources", "slurm-logdir"):
        assert key in cfg, key
    assert int(cfg["retries"]) >= 1 and int(cfg["latency-wait"]) >= 5
    res = cfg["default-resources"]
    for key in ("slurm_account", "slurm_partition", "mem_mb", "runtime"):
        assert key in res, key
    # the cluster facts come from the environment (or an edit), never a hard-coded site value
    assert "LPDL_SLURM_ACCOUNT" in str(res["slurm_account"])
    assert "LPDL_SLURM_PARTITION" in str(res["slurm_partition"])
    assert cfg.get("slurm-requeue") is True  # preempted jobs come back and resume from checkpoints
    # the sacct-less fallback is at least documented (without it Snakemake hangs on such clusters)
    assert "slurm-status-command: squeue" in text
    assert cfg.get("slurm-status-command", "squeue") in ("squeue", "sacct")
    # GPU requests come from the rules, not from the profile
    assert "gpu" not in res and "gres" not in res


def test_cluster_profile_keeps_every_slurm_log():
    cfg = yaml.safe_load((ROOT / "workflow/profiles/slurm/config.yaml").read_text())
    assert cfg["slurm-delete-logfiles-older-than"] == 0 and cfg["slurm-keep-successful-logs"] is True


def _dry_run(env_overrides: dict, drop=()):
    env = {k: v for k, v in ENV.items() if k not in drop}
    return subprocess.run([SNAKEMAKE, "--profile", "slurm", "-n", "--configfile", "config/paper.yaml"], cwd=ROOT,
                          env={**env, **env_overrides}, capture_output=True, text=True, timeout=300,
                          stdin=subprocess.DEVNULL)


def test_the_readme_slurm_dry_run_plans_the_paper_grid():
    """`snakemake --profile slurm -n --configfile config/paper.yaml`, as the README says, in the
    setup's venv (the SLURM executor plugin is a dependency), with no account needed (empty)."""
    p = _dry_run({"LPDL_SLURM_ACCOUNT": "", "LPDL_SLURM_PARTITION": ""})
    assert p.returncode == 0, p.stderr[-3000:]
    assert "This was a dry-run" in p.stdout + p.stderr
    # paper.yaml: one job per block and precision (33 jobs for 226 cells)
    assert "train_table2_resnet20_dring8_int8" in p.stdout + p.stderr


@pytest.mark.parametrize("request_, asked", [("gpus", "gpu=1"), ("gres", "gres=gpu:1")])
def test_gpus_are_asked_as_the_site_wants(request_, asked):
    """gpu=1 becomes sbatch --gpus=1; gres=gpu:1 becomes --gres=gpu:1 (the plugin's mapping)."""
    p = subprocess.run([SNAKEMAKE, "--profile", "slurm", "-n", "--configfile", "config/paper.yaml", "--config",
                        f"gpu_request={request_}", "tables=[table3]"], cwd=ROOT, capture_output=True, text=True,
                       env={**ENV, "LPDL_SLURM_ACCOUNT": "", "LPDL_SLURM_PARTITION": ""}, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    train = [l for l in (p.stdout + p.stderr).splitlines()
             if "resources:" in l and "mem_mb=24000" in l]  # the ResNet-20 train jobs
    assert train and all(asked in l for l in train)
    if request_ == "gres":
        assert all("gpu=0" in l for l in train)  # not both


def test_a_distributed_paper_job_asks_one_task_and_one_gpu_per_node():
    """executor=distributed: each 8-node Table 3 job is one SLURM job of 8 tasks (the plugin's mpi
    path: --ntasks=8), 8 GPUs, one per task (--ntasks-per-gpu=1)."""
    p = subprocess.run([SNAKEMAKE, "--profile", "slurm", "-n", "--configfile", "config/paper.yaml", "--config",
                        "executor=distributed", "compile=false", "cells_per_job=cell", "tables=[table3]"],
                       cwd=ROOT, capture_output=True, text=True,
                       env={**ENV, "LPDL_SLURM_ACCOUNT": "", "LPDL_SLURM_PARTITION": ""}, timeout=300)
    assert p.returncode == 0, p.stderr[-2000:]
    train = [l for l in (p.stdout + p.stderr).splitlines() if "resources:" in l and "mpi=" in l]
    assert len(train) == 16, (p.stdout + p.stderr)[-3000:]
    assert all("gpu=8" in l and "mpi=srun" in l and "tasks=8" in l and "tasks_per_gpu=1" in l for l in train)


@pytest.mark.parametrize("unset", ["LPDL_SLURM_ACCOUNT", "LPDL_SLURM_PARTITION"])
def test_an_unset_account_or_partition_stops_the_dry_run_in_one_line(unset):
    other = ({"LPDL_SLURM_ACCOUNT", "LPDL_SLURM_PARTITION"} - {unset}).pop()
    p = _dry_run({other: ""}, drop=(unset,))
    assert p.returncode == 1
    errors = [l for l in p.stderr.splitlines() if l.startswith("lpdl config error:")]
    assert len(errors) == 1 and unset in errors[0] and f"export {unset}=" in errors[0], p.stderr
    assert "Traceback" not in p.stderr


def test_test_profile_targets_the_local_cluster():
    assert TEST_PROFILE.name != "default"  # `default` would be picked up by every run in cwd
    cfg = yaml.safe_load((TEST_PROFILE / "config.yaml").read_text())
    assert cfg["executor"] == "slurm"
    assert cfg["slurm-status-command"] == "squeue"  # no slurmdbd on the local cluster
    assert cfg["slurm-init-seconds-before-status-checks"] <= 5
    assert cfg["default-resources"]["slurm_partition"] == "local"
    assert cfg["retries"] == 1 and cfg["slurm-keep-successful-logs"] is True


def test_local_slurm_script_is_valid_bash_with_usage():
    assert subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True).returncode == 0
    p = subprocess.run(["bash", str(SCRIPT), "bogus"], capture_output=True, text=True, timeout=30)
    assert p.returncode == 2 and "usage" in p.stderr


# --- slow: a real local SLURM cluster -----------------------------------------------------------

def _plugin_version():
    from importlib import metadata
    try:
        return metadata.version("snakemake-executor-plugin-slurm")
    except metadata.PackageNotFoundError:
        return None


def _ensure_plugin():
    v = _plugin_version()
    if v is not None and tuple(int(x) for x in re.findall(r"\d+", v)[:2]) >= (2, 8):
        return
    p = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", PLUGIN], capture_output=True,
                       text=True, timeout=600, stdin=subprocess.DEVNULL)
    if p.returncode != 0:
        pytest.skip(f"cannot pip install {PLUGIN}: {p.stderr.strip()[-500:]}")


def _script(cmd, timeout=900):
    return subprocess.run(["bash", str(SCRIPT), cmd], capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def _scancel_prefix(prefix):
    """Cancel every job on the cluster whose name starts with prefix (our run's jobs only)."""
    p = subprocess.run(["squeue", "-h", "-o", "%i %j"], capture_output=True, text=True, timeout=30)
    ids = [l.split()[0] for l in p.stdout.splitlines() if len(l.split()) == 2 and l.split()[1].startswith(prefix)]
    if ids:
        subprocess.run(["scancel", *ids], capture_output=True, timeout=30)


@pytest.fixture(scope="module")
def slurm_cluster():
    """The local cluster, started by scripts/local-slurm.sh (and stopped again if we started it)."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("needs root: scripts/local-slurm.sh installs SLURM packages and writes /etc/slurm")
    if shutil.which("slurmctld") is None and shutil.which("apt-get") is None:
        pytest.skip("SLURM is not installed and apt-get is unavailable to install it")
    _ensure_plugin()
    was_running = _script("status", timeout=60).returncode == 0
    p = _script("start")
    if p.returncode == 4:
        pytest.skip(f"cannot install the SLURM packages with apt-get: {p.stderr.strip()[-500:]}")
    if p.returncode == 3:
        pytest.skip(f"a SLURM setup not made by scripts/local-slurm.sh is present: {p.stderr.strip()}")
    try:
        assert p.returncode == 0, f"local-slurm.sh start failed:\n{p.stdout}\n{p.stderr}"
        yield
    finally:
        if not was_running:
            s = _script("stop", timeout=120)
            assert s.returncode == 0, s.stderr




def _snakemake_slurm(repo: Path, tmp_path: Path, *config: str) -> tuple[str, float]:
    """`snakemake --profile slurm-test --config ...` in repo to its end (killed and its jobs
    cancelled after RUN_TIMEOUT): its output and wall seconds; asserts exit 0."""
    prefix = yaml.safe_load((TEST_PROFILE / "config.yaml").read_text())["slurm-jobname-prefix"] + "_"
    out_log = tmp_path / "snakemake.out"
    t0 = time.time()
    with open(out_log, "w") as out:
        proc = subprocess.Popen([SNAKEMAKE, "--profile", str(TEST_PROFILE), "--config", *config], cwd=repo, env=ENV,
                                stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = proc.wait(timeout=RUN_TIMEOUT)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            if proc.poll() is None:  # Ctrl-C would make Snakemake wait for its jobs: kill, then scancel
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
                _scancel_prefix(prefix)
    text = out_log.read_text()
    assert rc is not None, f"SLURM run exceeded {RUN_TIMEOUT}s (jobs cancelled):\n{text[-4000:]}"
    assert rc == 0, text[-4000:]
    return text, time.time() - t0


@pytest.mark.slow
@pytest.mark.ci
def test_two_cells_through_local_slurm_match_a_local_run(slurm_cluster, tmp_path):
    repo = copy_repo(tmp_path / "repo")
    small_paper_dir(repo / "small", mini_epochs=1)  # one mini epoch each: the submission is under test
    prefix = yaml.safe_load((TEST_PROFILE / "config.yaml").read_text())["slurm-jobname-prefix"] + "_"
    text, elapsed = _snakemake_slurm(repo, tmp_path, "paper_dir=small", "tables=[table3]")

    # the jobs really went through SLURM: submitted, logged by SLURM, and known to the controller
    jobids = re.findall(r"has been submitted with SLURM jobid (\d+)", text)
    # the 2 train jobs; cost, aggregate, partitions and report are local rules (test_cheap_steps_are_local_rules)
    assert len(set(jobids)) == 2, text[-4000:]
    logs = list((repo / "results/slurm-logs").rglob("*.log"))
    assert {p.stem for p in logs} >= set(jobids), logs
    assert len([p for p in logs if "rule_train" in str(p)]) == 2, logs
    assert not [p for p in logs if "rule_cost" in str(p)], logs
    q = subprocess.run(["squeue", "-h", "-t", "all", "-j", ",".join(jobids), "-o", "%i %j %T %P"],
                       capture_output=True, text=True, timeout=30)
    states = {l.split()[0]: l.split()[1:] for l in q.stdout.splitlines()}
    assert set(states) == set(jobids), q.stdout + q.stderr
    assert all(s[0].startswith(prefix) and s[1] == "COMPLETED" and s[2] == "local" for s in states.values()), states

    # same numbers as a local run of the same cells
    runs = sorted((repo / "results/mini/runs").glob("*/seed1234/metrics.json"))
    assert len(runs) == 2, runs
    for m in runs:
        cell = m.parent.parent.name
        ref_dir = tmp_path / "ref" / cell
        subprocess.run([sys.executable, "-m", "lpdl_core", "train", "--cell", cell, "--out", str(ref_dir),
                        "--paper-dir", str(repo / "small"), "--device", "cpu"], check=True,
                       env={**ENV, "OMP_NUM_THREADS": "1"}, capture_output=True, timeout=600, cwd=repo)
        got, ref = json.loads(m.read_text()), json.loads((ref_dir / "metrics.json").read_text())
        assert got["final"] == ref["final"], cell
        assert got["bytes_per_node"] == ref["bytes_per_node"], cell
    table = (repo / "results/mini/tables/table3.csv").read_text().splitlines()
    assert len(table) == 3 and not any(",missing," in l for l in table)
    assert "2 of 2 cells with results" in (repo / "results/mini/logs/report.log").read_text()
    print(f"SLURM run of 2 cells + aggregate + report: {elapsed:.0f}s")


@pytest.mark.slow
@pytest.mark.ci
def test_a_distributed_cell_runs_as_one_slurm_job_of_n_tasks(slurm_cluster, tmp_path):
    """`executor: distributed`: the 4-node cell's train job is one SLURM job of 4 tasks (srun starts
    one rank per task, env:// rendezvous), and its result equals a local loop run of the cell."""
    cell = "t4-imagenette-vgg11-dring4-c90-s0.6-choco-int8"
    repo = copy_repo(tmp_path / "repo")
    small_paper_dir(repo / "small", table="table4", cell=cell, mini_epochs=1)
    text, elapsed = _snakemake_slurm(repo, tmp_path, "paper_dir=small", "tables=[table4]", "executor=distributed",
                                     "dist_timeout=120")
    # the train job's SLURM log is results/slurm-logs/rule_train_.../<jobid>.log
    train_ids = [p.stem for p in (repo / "results/slurm-logs").rglob("*.log") if "rule_train" in str(p)]
    assert len(train_ids) == 1, text[-4000:]
    q = subprocess.run(["squeue", "-h", "-t", "all", "-j", train_ids[0], "-o", "%T %D %C"],
                       capture_output=True, text=True, timeout=30)
    state, _nodes, cpus = q.stdout.split()
    assert state == "COMPLETED" and int(cpus) >= 4, q.stdout  # 4 tasks of one CPU each
    run = repo / f"results/mini/runs/{cell}/seed1234/metrics.json"
    got = json.loads(run.read_text())
    assert got["executor"] == "distributed" and got["config"]["processes"] == 4
    assert [s["rank"] for s in got["step_split"]] == [0, 1, 2, 3]
    ref_dir = tmp_path / "ref"
    subprocess.run([sys.executable, "-m", "lpdl_core", "train", "--cell", cell, "--out", str(ref_dir),
                    "--paper-dir", str(repo / "small"), "--device", "cpu"], check=True,
                   env={**ENV, "OMP_NUM_THREADS": "1"}, capture_output=True, timeout=600, cwd=repo)
    ref = json.loads((ref_dir / "metrics.json").read_text())
    one_sample = 100 / 360 + 1e-4  # the tolerance of tests/test_distributed_train.py
    for a, b in zip(got["final"]["node_acc"], ref["final"]["node_acc"]):
        assert abs(a - b) <= one_sample
    assert got["bytes_per_node"] == ref["bytes_per_node"]
    print(f"SLURM run of one distributed cell (4 tasks) + aggregate + report: {elapsed:.0f}s")


def test_cheap_steps_are_local_rules():
    """Figure 3's analytic cost model, the partitions, the aggregate and the report run where
    Snakemake runs (a login node): they are never submitted as (GPU) jobs. Snakemake 9's dry run
    does not mark local rules, so this reads the Snakefile's localrules block."""
    import re
    text = (ROOT / "Snakefile").read_text(encoding="utf-8")
    block = re.search(r"^localrules:\n((?:    \w+,\n)+)", text, re.M)
    assert block, "Snakefile has no localrules block"
    local = set(re.findall(r"(\w+),", block.group(1)))
    assert {"cost", "partitions", "aggregate", "report", "download", "all"} <= local
    cost = ((ROOT / "workflow/rules/aggregate.smk").read_text(encoding="utf-8")
            .split("rule cost:")[1].split("\nrule ")[0])
    assert "gpu" not in cost and "--device auto" in cost


@pytest.mark.parametrize("extra, warns", [((), False), (("--retries", "1"), True)])
def test_the_long_jobs_warning_follows_the_retries_in_force(extra, warns):
    """With max_runtime=480 the longest paper jobs need 3 attempts. The slurm profile's retries: 3
    covers them, so the dry run says nothing; --retries 1 does not, so it says what is needed."""
    p = subprocess.run([SNAKEMAKE, "--profile", "slurm", "-n", "--configfile", "config/paper.yaml",
                        "--config", "max_runtime=480", *extra], cwd=ROOT, capture_output=True, text=True,
                       env={**ENV, "LPDL_SLURM_ACCOUNT": "", "LPDL_SLURM_PARTITION": ""}, timeout=300,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = [l for l in p.stderr.splitlines() if "estimated longer than max_runtime" in l]
    if warns:
        assert len(lines) == 1 and "--retries 2 or more (this run allows 1)" in lines[0], p.stderr[-2000:]
    else:
        assert lines == []
