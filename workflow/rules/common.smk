import json
import re
import sys
from pathlib import Path

import yaml

from lpdl_core.errors import LpdlError


def _fail(msg):
    """One line, before any job runs (snakemake's own validation prints pages)."""
    sys.stderr.write(f"lpdl config error: {msg}\n")
    sys.exit(1)


SCHEMA = yaml.safe_load(
    Path(workflow.current_basedir, "../schemas/config.schema.yaml").read_text()
)


def _checked_config(cfg):
    """Checked against the schema, the optional keys' defaults filled in (lpdl_core.pipeline.workflow.wfconfig,
    which `lpdl status` reads the config with too)."""
    from lpdl_core.pipeline.workflow.wfconfig import resolve

    try:
        return resolve(cfg, SCHEMA)
    except LpdlError as e:
        _fail(e)


def _check_cluster_env():
    """A profile that takes the SLURM account or partition from LPDL_SLURM_* (workflow/profiles/slurm)
    needs the variable set, empty meaning none: unset, Snakemake would hand the literal text
    '${LPDL_SLURM_ACCOUNT}' to sbatch and fail only at the first submission."""
    import os

    res = workflow.resource_settings.default_resources
    for key, var in (
        ("slurm_account", "LPDL_SLURM_ACCOUNT"),
        ("slurm_partition", "LPDL_SLURM_PARTITION"),
    ):
        raw = getattr(res[key], "raw", "") if res is not None and key in res else ""
        if var in str(raw) and var not in os.environ:
            _fail(
                f"{var} is not set; the slurm profile takes {key} from it: export {var}=<name> "
                f"(or {var}= for {'no account' if key == 'slurm_account' else 'the default partition'})"
            )


_check_cluster_env()
_cfg = _checked_config(config)
config.clear()
config.update(_cfg)

from lpdl_core.pipeline.cells.tables import load_cells, paper_dir_path  # noqa: E402
from lpdl_core.pipeline.cells.grids import (
    grid_folder,
    grid_path,
    load_grid,
)  # noqa: E402
from lpdl_core.config import TABLES, Fidelity, results_name  # noqa: E402
from lpdl_core.specs.executors import executor_spec  # noqa: E402
from lpdl_core.pipeline.workflow.wfconfig import (
    defining_fidelity_json,
    modes,
)  # noqa: E402
from lpdl_core.pipeline.workflow.jobs import plan_jobs  # noqa: E402
from lpdl_core.pipeline.workflow.runtime import StepTimes, step_kind  # noqa: E402
from lpdl_core.pipeline.workflow.resources import (
    Planner,
    job_priority as priority_of,
)  # noqa: E402
from lpdl_core.pipeline.run.runstore import (
    ARTIFACTS as RUN_ARTIFACTS,
    run_data,
    run_identity,
)  # noqa: E402

PROFILE = config["profile"]
REPORT_DIR = config["report_dir"].rstrip("/")
try:
    CELLS = load_cells(config["paper_dir"], tables=config["tables"])
    FIDELITY = Fidelity.from_mapping(config["fidelity"])
except LpdlError as e:
    _fail(e)
CELL_BY_ID = {c.cell_id: c for c in CELLS}
JOBS = plan_jobs(CELLS, PROFILE, config.get("cells_per_job"))
# Extension grids (config/extensions/<name>.yaml, `extensions` in the config): their cells (ids
# prefixed by the grid's name) run by the same rules into results/<profile>-<name>/.
try:
    GRIDS = {name: load_grid(name) for name in dict.fromkeys(config["extensions"])}
except LpdlError as e:
    _fail(e)
GRID_CELLS = [c for g in GRIDS.values() for c in g.cells]
# one namespace: a grid's ids begin with its name, which no paper id prefix or other grid shares
for _c in GRID_CELLS:
    if _c.cell_id in CELL_BY_ID:
        _fail(
            f"cell id {_c.cell_id} of grid {_c.table} is also {CELL_BY_ID[_c.cell_id].table}'s"
        )
    CELL_BY_ID[_c.cell_id] = _c
GRID_JOBS = {
    name: plan_jobs(g.cells, PROFILE, config.get("cells_per_job"))
    for name, g in GRIDS.items()
}
# results/{results}: the profile's folder in this fidelity mode (results/mini, results/mini-official);
# with compare_modes, the other mode's folder too, so the report shows both side by side
RESULTS = results_name(PROFILE, FIDELITY)
MODES = modes(config)
# each grid's folder (the config's fidelity mode) -> its name
GRID_RESULTS = {grid_folder(RESULTS, name): name for name in GRIDS}
FIDELITY_OF = {**MODES, **{r: MODES[RESULTS] for r in GRID_RESULTS}}
CELLS_IN = {
    **{r: CELLS for r in MODES},
    **{r: GRIDS[n].cells for r, n in GRID_RESULTS.items()},
}
COMPARE = next((r for r in MODES if r != RESULTS), None)
RUN_DIR = "results/{results}/runs/{cell}/seed{seed}"

# How a job runs, never what it computes (device, executor, paths, threads), reaches the train
# script from the config, not through params, so changing it never reruns a finished cell.


def fidelity_json(wildcards) -> str:
    """The mode's fidelity as typed JSON for the train command: the options that define its
    runs (the train script adds the rounding-only ones from the config)."""
    return defining_fidelity_json(FIDELITY_OF[wildcards.results])


wildcard_constraints:
    cell=r"[a-z0-9.-]+",
    seed=r"\d+",
    results="|".join(re.escape(r) for r in MODES),
    table="|".join(TABLES),


def run_files(wildcards=None, *, results=None):
    """What the aggregate step reads: every cell's metrics.json and curve.csv, every seed (of the
    folder `results`, or the job's wildcard: a mode's paper cells, or a grid's cells).
    """
    results = results or wildcards.results
    return expand(
        f"{RUN_DIR}/{{name}}",
        results=results,
        cell=[c.cell_id for c in CELLS_IN[results]],
        seed=config["seeds"],
        name=("metrics.json", "curve.csv"),
    )


TABLE_FILES = [
    f"results/{{results}}/tables/{t}{kind}.csv"
    for t in config["tables"]
    for kind in ("", "-paper")
]
PAPER_CSVS = [
    str(paper_dir_path(config["paper_dir"]) / f"{t}.csv") for t in config["tables"]
]


def job_identity(job, wildcards):
    """What defines the job's runs (each cell's columns, seed, profile, fidelity): a change reruns
    the job (its other cells come back from .kept, not recomputed)."""
    idents = [
        run_identity(
            CELL_BY_ID[c],
            profile=PROFILE,
            seed=int(wildcards.seed),
            fidelity=FIDELITY_OF[wildcards.results],
            data=run_data(CELL_BY_ID[c], PROFILE, config["data_root"]),
        )
        for c in job.cells
    ]
    return json.dumps(idents, sort_keys=True)


# What each train job asks its scheduler for (lpdl_core.pipeline.workflow.resources): memory, runtime (paper:
# from measured GPU step times, capped at max_runtime), GPUs as gpu_request says, SLURM tasks for the
# distributed executor, and a priority that starts the longest jobs first.
try:
    PLANNER = Planner(
        profile=PROFILE,
        distributed=executor_spec(config["executor"]).per_node_process,
        gpu_request=config.get("gpu_request", "gpus"),
        step_times=StepTimes.load(config["step_times"]) if PROFILE == "paper" else None,
        step_kind=step_kind(config["executor"], config.get("compile", False)),
        margin=config["runtime_margin"],
        max_minutes=config["max_runtime"],
        pack_size=(
            config.get("pack_size", 4) if config.get("cells_per_job") == "pack" else 1
        ),
    )
    JOB_RESOURCES = {
        j.name: PLANNER.resources([CELL_BY_ID[c] for c in j.cells], j.name)
        for j in [*JOBS, *(j for jobs in GRID_JOBS.values() for j in jobs)]
    }
except LpdlError as e:
    _fail(e)


def job_priority(job):
    shared = dict(job.shares)
    return priority_of([CELL_BY_ID[c] for c in job.cells if c not in shared])


def long_jobs_check(wildcards):
    """An input function of rule all, so that it runs once per DAG, when Snakemake's retries are
    known (not when the Snakefile is parsed): one line if some paper jobs need more attempts than
    --retries (or the profile's retries:) allow. Returns no input. See runtime.retries_warning.
    """
    global _LONG_JOBS_CHECKED
    if PROFILE != "paper" or _LONG_JOBS_CHECKED:
        return []
    _LONG_JOBS_CHECKED = True
    from lpdl_core.pipeline.workflow.runtime import retries_warning

    attempts = PLANNER.attempts(JOBS, CELL_BY_ID)
    settings = getattr(workflow, "execution_settings", None)
    line = retries_warning(
        attempts,
        retries=getattr(settings, "retries", None),
        max_minutes=config["max_runtime"],
    )
    if line:
        sys.stderr.write(line + "\n")
    return []


_LONG_JOBS_CHECKED = False
