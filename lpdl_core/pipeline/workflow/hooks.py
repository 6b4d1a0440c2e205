"""What the workflow does before its first job and after its last (the Snakefile's `onstart` and
`onsuccess` call these; torch-free, as the Snakefile itself).

* Before: verify the data the train jobs load (`prefetch_before_training`). Not a job upstream of
  the train jobs: Snakemake does not evaluate the jobs below a job that must rerun, so a manifest
  read as ancient() hid every train job whenever the download reran (the invocation ran only the
  download and said "100% done"), and a plain input would rerun every finished cell. The hook
  runs after the DAG is planned and before any job, so each train job reruns exactly when its own
  run changes.
* After: check that what the report shows is what the run folders hold and the config asks for
  (`check_results_current`, lpdl_core.pipeline.workflow.status).

Both end a failed invocation with one line and exit 1 (SystemExit: Snakemake stops there).
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Iterable, Mapping

from .prefetch import manifest_serves, request_args
from .status import config_status


def planned_rules(workflow) -> set[str] | None:
    """The rule names of the jobs Snakemake is about to run (None when its plan cannot be read)."""
    try:
        return {job.rule.name for job in workflow.dag.needrun_jobs()}
    except Exception:  # noqa: BLE001  (an internal of Snakemake: None means "do not know")
        return None


def targets_rule(workflow, rule: str) -> bool:
    """Whether this invocation builds `rule`'s job as a target (True when it cannot be told)."""
    try:
        return any(job.rule.name == rule for job in workflow.dag.targetjobs)
    except Exception:  # noqa: BLE001
        return True


def prefetch_before_training(*, profile: str, request: Mapping, manifest: str | Path, log: str | Path,
                             planned: set[str] | None) -> None:
    """`lpdl prefetch` of `request` into the manifest, when train jobs are planned (or the plan is
    unknown) and the manifest does not already record this request. The mini profile loads only
    embedded stand-ins: nothing to do. On failure, its one error line and SystemExit(1)."""
    trains = planned is None or any(name.startswith("train_") for name in planned)
    if profile == "mini" or not trains or manifest_serves(manifest, request):
        return
    sys.stderr.write(f"lpdl: fetching and verifying the data the cells load, before any train job (log: {log})\n")
    log = Path(log)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "w") as f:
        rc = subprocess.run([sys.executable, "-m", "lpdl_core", "prefetch", *request_args(request), "--out",
                             str(manifest)], stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL).returncode
    if rc:
        errors = [line for line in log.read_text(errors="replace").splitlines()
                  if line.startswith("lpdl prefetch: error:")]
        sys.stderr.write((errors[-1] if errors else f"lpdl prefetch: error: failed (exit {rc}); see {log}") + "\n")
        raise SystemExit(1)  # before any job: nothing was started


def check_results_current(config: Mapping, cells: Iterable, grids: Mapping[str, Iterable]) -> None:
    """After the default target is built: runs.csv of every results folder the resolved config
    writes holds exactly the run files the config names, and the report is newer than runs.csv
    and the tables (status.config_status, which `lpdl status` prints). Otherwise the problems,
    one line each, then one error line and SystemExit(1): "100% done" never stands beside a
    report that does not match the files and the config. Damaged runs (and runs of other settings
    put there by hand), which the report marks as such, are named one line each without failing.
    grids: each extension grid's name -> its cells."""
    folders = config_status(config, cells, grids)
    for st in folders:
        if not st.current:
            for line in st.lines(limit=10):
                sys.stderr.write(f"lpdl: {line}\n")
    if not all(st.consistent for st in folders):
        sys.stderr.write("lpdl: error: the report does not match the run folders and the config (above; "
                         "`lpdl status` lists every run): run snakemake again, or report this as a bug of lpdl\n")
        raise SystemExit(1)
