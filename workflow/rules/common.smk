import json
import shlex
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


_cfg = _checked_config(config)
config.clear()
config.update(_cfg)

from lpdl_core.cells import load_cells  # noqa: E402
from lpdl_core.config import Fidelity  # noqa: E402
from lpdl_core.runstore import run_identity  # noqa: E402

PROFILE = config["profile"]
REPORT_DIR = config["report_dir"].rstrip("/")
try:
    CELLS = load_cells(config["paper_dir"], tables=config["tables"])
    FIDELITY = Fidelity.from_mapping(config["fidelity"])
except LpdlError as e:
    _fail(e)
CELL_BY_ID = {c.cell_id: c for c in CELLS}
RUN_DIR = "results/{profile}/runs/{cell}/seed{seed}"

# How a job runs, never what it computes: these reach the train command as globals, not params,
# so changing them (or the spelling of a path) never reruns a finished cell. Every value is
# shell-quoted here.
PAPER_DIR_Q = shlex.quote(config["paper_dir"])
DEVICE_Q = shlex.quote(config["device"])
EXECUTOR_Q = shlex.quote(config["executor"])
DATA_ROOT_OPT = f"--data-root {shlex.quote(config['data_root'])}" if config["data_root"] else ""
FIDELITY_OPT = " ".join(shlex.quote(f"{k}={str(v).lower()}") for k, v in sorted(FIDELITY.as_dict().items()))

wildcard_constraints:
    cell=r"[a-z0-9.-]+",
    seed=r"\d+",
    profile=r"mini|paper",
    table=r"table[1-5]|fig1",


def metrics_of(table):
    ids = [c.cell_id for c in CELLS if c.table == table]
    return expand(RUN_DIR + "/metrics.json", profile=PROFILE, cell=ids, seed=config["seeds"])


def run_identity_of(wildcards):
    """What defines the run (cell columns, seed, profile, fidelity): a change reruns the cell."""
    ident = run_identity(CELL_BY_ID[wildcards.cell], profile=wildcards.profile, seed=int(wildcards.seed),
                         fidelity=FIDELITY)
    return json.dumps(ident, sort_keys=True)


def train_resources(cell_id):
    """Per-cell resources: tiny in the mini profile; by model size in the paper profile."""
    c = CELL_BY_ID[cell_id]
    if PROFILE == "mini":
        return {"mem_mb": 3000, "runtime": 30, "gpu": 0}
    big = c.model in ("vgg11", "resnet18", "distilbert")
    hours = {"resnet20": 6, "resnet54": 12, "vgg11": 12, "resnet18": 12, "distilbert": 8}[c.model]
    return {"mem_mb": 64000 if big else 24000, "runtime": 60 * hours, "gpu": 1}
