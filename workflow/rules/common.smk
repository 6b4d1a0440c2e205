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
    Path(workflow.basedir, "schemas/config.schema.yaml").read_text()
)


def _checked_config(cfg):
    """Checked against the schema, the optional keys' defaults filled in (lpdl_core.pipeline.wfconfig,
    which `lpdl status` reads the config with too)."""
    from lpdl_core.pipeline.wfconfig import resolve

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

from lpdl_core.pipeline.cells import load_cells, paper_dir_path  # noqa: E402
from lpdl_core.config import TABLES, Fidelity, results_name  # noqa: E402
from lpdl_core.pipeline.wfconfig import modes  # noqa: E402
from lpdl_core.pipeline.jobs import plan_jobs  # noqa: E402
from lpdl_core.pipeline.runtime import step_kind  # noqa: E402
from lpdl_core.pipeline.runstore import (
    ARTIFACTS as RUN_ARTIFACTS,
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
# results/{results}: the profile's folder in this fidelity mode (results/mini, results/mini-official);
# with compare_modes, the other mode's folder too, so the report shows both side by side
RESULTS = results_name(PROFILE, FIDELITY)
MODES = modes(config)
COMPARE = next((r for r in MODES if r != RESULTS), None)
RUN_DIR = "results/{results}/runs/{cell}/seed{seed}"

# How a job runs, never what it computes (device, executor, paths, threads), reaches the train
# script from the config, not through params, so changing it never reruns a finished cell.


def fidelity_json(wildcards) -> str:
    """The mode's fidelity as typed JSON for the train command (no re-parsing of strings)."""
    return json.dumps(MODES[wildcards.results].as_dict(), sort_keys=True)


wildcard_constraints:
    cell=r"[a-z0-9.-]+",
    seed=r"\d+",
    results="|".join(re.escape(r) for r in MODES),
    table="|".join(TABLES),


def run_files(wildcards=None, *, results=None):
    """What the aggregate step reads: every cell's metrics.json and curve.csv, every seed (of the
    mode's folder `results`, or the job's wildcard)."""
    return expand(
        f"{RUN_DIR}/{{name}}",
        results=results or wildcards.results,
        cell=[c.cell_id for c in CELLS],
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
            fidelity=MODES[wildcards.results],
        )
        for c in job.cells
    ]
    return json.dumps(idents, sort_keys=True)


# Minutes per mini cell on one CPU thread (measured on a 2-core machine: 1-25 s per cell plus the
# job's start-up). Paper cells: from measured GPU step times (config step_times,
# lpdl_core/pipeline/runtime.py) with a margin, capped at max_runtime (the partition's MaxTime): a
# longer job is cut there and its retry resumes from the checkpoint, so the request never grows.
MINI_CELL_MINUTES = 2
# host memory (MB) of a paper job by model: the dataset in memory plus the model's state
PAPER_MEM_MB = {
    "resnet20": 24000,
    "resnet54": 24000,
    "vgg11": 64000,
    "resnet18": 64000,
    "distilbert": 64000,
}
# each further process of a distributed job (its own torch, CUDA context and copy of the dataset);
# an estimate, not measured
EXTRA_PROCESS_MB = {"mini": 1000, "paper": 4000}


def _step_times():
    from lpdl_core.pipeline.runtime import StepTimes

    try:
        return StepTimes.from_mapping(
            yaml.safe_load(Path(config["step_times"]).read_text())
        )
    except OSError as e:
        _fail(f"step_times: cannot read {config['step_times']}: {e.strerror}")
    except (LpdlError, yaml.YAMLError) as e:
        _fail(f"{config['step_times']}: {e}".splitlines()[0])


STEP_TIMES = _step_times() if PROFILE == "paper" else None


# Relative cost of one cell's step by model (measured step times of the mini stand-ins), used to
# start the longest jobs first so that the last job to finish is a short one.
_STEP_COST = {
    "resnet20": 1.0,
    "resnet54": 1.8,
    "vgg11": 0.9,
    "resnet18": 2.0,
    "mobilenetv2": 1.0,
    "distilbert": 0.6,
}


def job_priority(job):
    cells = [CELL_BY_ID[c] for c in job.cells if c not in dict(job.shares)]
    cost = sum(
        _STEP_COST.get(c.model, 1.0)
        * max(c.nodes, 1)
        * (2.3 if c.precision == "int8" else 1.0)
        for c in cells
    )
    return int(cost)


GPU_REQUEST = config.get("gpu_request", "gpus")


def gres(gpus: int):
    """--gres=gpu:N for sites that count GPUs as generic resources (gpu_request: gres), else none."""
    return f"gpu:{gpus}" if GPU_REQUEST == "gres" and gpus else None


DISTRIBUTED = config["executor"] == "distributed"
# the step-time column that sizes the jobs: the executor, compiled or not
STEP_KIND = step_kind(config["executor"], config.get("compile", False))
# cells_per_job pack: the most cells a job trains together (1: none packed)
PACK_SIZE = config.get("pack_size", 4) if config.get("cells_per_job") == "pack" else 1


def job_nodes(job) -> int:
    """The node count of the job's cells (a job's cells share one: a block's)."""
    nodes = {CELL_BY_ID[c].nodes for c in job.cells}
    if len(nodes) != 1:
        _fail(f"job {job.name} mixes cells of {sorted(nodes)} nodes")
    return nodes.pop()


def processes(job) -> int:
    """Processes of the job: one per node with the distributed executor, else one."""
    return job_nodes(job) if DISTRIBUTED else 1


def task_resources(job) -> dict:
    """The distributed executor's SLURM job of n tasks, one per node (`srun -n n` in the train
    script; one GPU per task where the job asks for GPUs). Nothing for one process."""
    n = processes(job)
    if n == 1:
        return {}
    return {
        "mpi": "srun",
        "tasks": n,
        **({"tasks_per_gpu": 1} if PROFILE == "paper" else {}),
    }


def train_resources(job):
    """Per-job resources: tiny in the mini profile; in the paper profile the runtime comes from the
    measured step times (lpdl_core.pipeline.runtime.job_runtime), the memory by model size. The
    distributed executor asks for memory and GPUs per process."""
    cells = [CELL_BY_ID[c] for c in job.cells]
    n = processes(job)
    if PROFILE == "mini":
        return {
            "mem_mb": 3000 + EXTRA_PROCESS_MB["mini"] * (n - 1),
            "runtime": 10 + MINI_CELL_MINUTES * len(cells),
            "gpu": 0,
        }
    from lpdl_core.pipeline.runtime import job_runtime

    req = job_runtime(
        cells,
        STEP_TIMES,
        executor=STEP_KIND,
        margin=config["runtime_margin"],
        max_minutes=config["max_runtime"],
        pack_size=PACK_SIZE,
    )
    return {
        "mem_mb": max(PAPER_MEM_MB[c.model] for c in cells)
        + EXTRA_PROCESS_MB["paper"] * (n - 1),
        "runtime": req.minutes,
        "gpu": n,
    }


def long_jobs_check(wildcards):
    """An input function of rule all, so that it runs once per DAG, when Snakemake's retries are
    known (not when the Snakefile is parsed): one line if some paper jobs need more attempts than
    --retries (or the profile's retries:) allow. Returns no input. See runtime.retries_warning.
    """
    global _LONG_JOBS_CHECKED
    if PROFILE != "paper" or _LONG_JOBS_CHECKED:
        return []
    _LONG_JOBS_CHECKED = True
    from lpdl_core.pipeline.runtime import job_runtime, retries_warning

    attempts = [
        job_runtime(
            [CELL_BY_ID[c] for c in j.cells],
            STEP_TIMES,
            executor=STEP_KIND,
            margin=config["runtime_margin"],
            max_minutes=config["max_runtime"],
            pack_size=PACK_SIZE,
        ).attempts_needed
        for j in JOBS
    ]
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
