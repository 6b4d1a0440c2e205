"""Snakemake script: every run -> runs.csv, curves.csv and the per-table CSVs (lpdl_core.pipeline.aggregate).
An expected failure (corrupt or mislabelled metrics.json) is one line in the log and on stderr."""
import sys
from pathlib import Path

from lpdl_core.errors import LpdlError
from lpdl_core.pipeline.aggregate import write_aggregate
from lpdl_core.pipeline.cells import load_cells

sm = snakemake  # noqa: F821  (injected by Snakemake)
with open(sm.log[0], "w") as log:
    try:
        cfg, profile = sm.config, sm.config["profile"]
        cells = load_cells(cfg["paper_dir"], tables=cfg["tables"])
        written = write_aggregate(Path(sm.output.runs).parent, cells, profile=profile, tables=cfg["tables"],
                                  seeds=cfg["seeds"], fidelity=sm.params.fidelity)
        print(f"aggregate: {len(cells)} cells, wrote {len(written)} files", file=log)
    except LpdlError as e:
        line = f"lpdl aggregate: error: {e}"
        print(line, file=log, flush=True)
        print(line, file=sys.stderr, flush=True)
        sys.exit(1)
