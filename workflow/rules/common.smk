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


def _checked_config(cfg):
    from lpdl_core.config import check_workflow_config

    schema = yaml.safe_load(Path(workflow.basedir, "workflow/schemas/config.schema.yaml").read_text())
    try:
        return check_workflow_config(cfg, schema)
    except LpdlError as e:
        _fail(e)


def _check_cluster_env():
    """A profile that takes the SLURM account or partition from LPDL_SLURM_* (slurm/config.yaml)
    needs the variable set, empty meaning none: unset, Snakemake would hand the literal text
    '${LPDL_SLURM_ACCOUNT}' to sbatch and fail only at the first submission."""
    import os

    res = workflow.resource_settings.default_resources
    for key, var in (("slurm_account", "LPDL_SLURM_ACCOUNT"), ("slurm_partition", "LPDL_SLURM_PARTITION")):
        raw = getattr(res[key], "raw", "") if res is not None and key in res else ""
        if var in str(raw) and var not in os.environ:
            _fail(f"{var} is not set; the slurm profile takes {key} from it: export {var}=<name> "
                  f"(or {var}= for {'no account' if key == 'slurm_account' else 'the default partition'})")


_check_cluster_env()
_cfg = _checked_config(config)
config.clear()
config.update(_cfg)

from lpdl_core.pipeline.cells import load_cells  # noqa: E402
from lpdl_core.config import TABLES, Fidelity, other_mode, results_name  # noqa: E402
from lpdl_core.pipeline.jobs import plan_jobs  # noqa: E402
from lpdl_core.pipeline.runstore import ARTIFACTS as RUN_ARTIFACTS, run_identity  # noqa: E402

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
MODES = {RESULTS: FIDELITY}
COMPARE = None
if config.get("compare_modes"):
    COMPARE, _other = other_mode(PROFILE, FIDELITY)
    MODES[COMPARE] = _other
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


def run_files(wildcards):
    """What the aggregate step reads: every cell's metrics.json and curve.csv, every seed."""
    return expand(f"{RUN_DIR}/{{name}}", results=wildcards.results, cell=[c.cell_id for c in CELLS],
                  seed=config["seeds"], name=("metrics.json", "curve.csv"))


TABLE_FILES = [f"results/{{results}}/tables/{t}{kind}.csv" for t in config["tables"] for kind in ("", "-paper")]
PAPER_CSVS = [f"{config['paper_dir']}/{t}.csv" for t in config["tables"]]


def job_identity(job, wildcards):
    """What defines the job's runs (each cell's columns, seed, profile, fidelity): a change reruns
    the job (its other cells come back from .kept, not recomputed)."""
    idents = [run_identity(CELL_BY_ID[c], profile=PROFILE, seed=int(wildcards.seed),
                           fidelity=MODES[wildcards.results])
              for c in job.cells]
    return json.dumps(idents, sort_keys=True)




# Minutes per mini cell on one CPU thread (measured on a 2-core machine: 1-25 s per cell plus the
# job's start-up); hours per paper cell on one GPU by model.
MINI_CELL_MINUTES = 2
PAPER_HOURS = {"resnet20": 6, "resnet54": 12, "vgg11": 12, "resnet18": 12, "distilbert": 8}


# Relative cost of one cell's step by model (measured step times of the mini stand-ins), used to
# start the longest jobs first so that the last job to finish is a short one.
_STEP_COST = {"resnet20": 1.0, "resnet54": 1.8, "vgg11": 0.9, "resnet18": 2.0, "mobilenetv2": 1.0,
              "distilbert": 0.6}


def job_priority(job):
    cells = [CELL_BY_ID[c] for c in job.cells if c not in dict(job.shares)]
    cost = sum(_STEP_COST.get(c.model, 1.0) * max(c.nodes, 1) * (2.3 if c.precision == "int8" else 1.0)
               for c in cells)
    return int(cost)


GPU_REQUEST = config.get("gpu_request", "gpus")


def gres(gpus: int):
    """--gres=gpu:N for sites that count GPUs as generic resources (gpu_request: gres), else none."""
    return f"gpu:{gpus}" if GPU_REQUEST == "gres" and gpus else None


def train_resources(job):
    """Per-job resources: tiny in the mini profile; by model size in the paper profile."""
    cells = [CELL_BY_ID[c] for c in job.cells]
    if PROFILE == "mini":
        return {"mem_mb": 3000, "runtime": 10 + MINI_CELL_MINUTES * len(cells), "gpu": 0}
    big = any(c.model in ("vgg11", "resnet18", "distilbert") for c in cells)
    hours = sum(PAPER_HOURS[c.model] for c in cells)
    return {"mem_mb": 64000 if big else 24000, "runtime": 60 * hours, "gpu": 1}
