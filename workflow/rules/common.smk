import sys
from pathlib import Path

import jsonschema
import yaml


def _validate_config(cfg):
    """One line naming the bad key, before any job runs (snakemake's validate prints pages)."""
    schema = yaml.safe_load(Path(workflow.basedir, "workflow/schemas/config.schema.yaml").read_text())
    err = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(cfg))
    if err is not None:
        key = "/".join(str(p) for p in err.absolute_path) or "(top level)"
        sys.stderr.write(f"lpdl config error: {key}: {err.message}\n")
        sys.exit(1)


_validate_config(config)

from lpdl_core.cells import load_cells  # noqa: E402

PROFILE = config["profile"]
REPORT_DIR = config["report_dir"].rstrip("/")
CELLS = load_cells(config["paper_dir"], tables=config["tables"])
CELL_BY_ID = {c.cell_id: c for c in CELLS}
RUN_DIR = "results/{profile}/runs/{cell}/seed{seed}"

wildcard_constraints:
    cell=r"[a-z0-9.-]+",
    seed=r"\d+",
    profile=r"mini|paper",
    table=r"table[1-5]|fig1",


def metrics_of(table):
    ids = [c.cell_id for c in CELLS if c.table == table]
    return expand(RUN_DIR + "/metrics.json", profile=PROFILE, cell=ids, seed=config["seeds"])


def fidelity_args():
    f = config["fidelity"]
    return " ".join(f"{k}={str(v).lower()}" for k, v in sorted(f.items()))


def train_resources(cell_id):
    """Per-cell resources: tiny in the mini profile; by model size in the paper profile."""
    c = CELL_BY_ID[cell_id]
    if PROFILE == "mini":
        return {"mem_mb": 3000, "runtime": 30, "gpu": 0}
    big = c.model in ("vgg11", "resnet18", "distilbert")
    hours = {"resnet20": 6, "resnet54": 12, "vgg11": 12, "resnet18": 12, "distilbert": 8}[c.model]
    return {"mem_mb": 64000 if big else 24000, "runtime": 60 * hours, "gpu": 1}
