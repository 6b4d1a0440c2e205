"""Snakemake script: the metrics of one table's runs -> results/{profile}/tables/{table}.csv."""
import sys

from lpdl_core.aggregate import aggregate_table, load_runs
from lpdl_core.cells import load_cells
from lpdl_core.results import write_rows

sm = snakemake  # noqa: F821  (injected by Snakemake)
with open(sm.log[0], "w") as log:
    sys.stderr = log
    cells = load_cells(sm.params.paper_dir, tables=[sm.wildcards.table])
    rows = aggregate_table(cells, load_runs(sm.input), sm.wildcards.profile)
    write_rows(sm.output[0], rows)
    done = sum(r["status"] != "missing" for r in rows)
    print(f"{sm.wildcards.table}: {done}/{len(rows)} cells", file=log)
