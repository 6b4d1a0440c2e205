"""Snakemake script: the runs of one table -> results/{profile}/tables/{table}.csv.
An expected failure (corrupt or mislabelled metrics.json) is one line in the log and on stderr."""
import sys
from pathlib import Path

from lpdl_core.aggregate import aggregate_table, collect_runs
from lpdl_core.cells import load_cells
from lpdl_core.errors import LpdlError
from lpdl_core.results import write_rows

sm = snakemake  # noqa: F821  (injected by Snakemake)
with open(sm.log[0], "w") as log:
    try:
        cfg, table, profile = sm.config, sm.wildcards.table, sm.wildcards.profile
        cells = load_cells(cfg["paper_dir"], tables=[table])
        runs = collect_runs(cells, Path(sm.output[0]).parents[1], profile=profile, seeds=cfg["seeds"],
                            fidelity=cfg["fidelity"])
        rows = aggregate_table(cells, runs, profile)
        write_rows(sm.output[0], rows)
        done = sum(r["status"] != "missing" for r in rows)
        print(f"{table}: {done}/{len(rows)} cells", file=log)
    except LpdlError as e:
        line = f"lpdl aggregate {sm.wildcards.table}: error: {e}"
        print(line, file=log, flush=True)
        print(line, file=sys.stderr, flush=True)
        sys.exit(1)
