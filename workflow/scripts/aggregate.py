"""Snakemake script: every run -> runs.csv, curves.csv and the per-table CSVs
(lpdl_core.pipeline.aggregation.aggregate).
A damaged run (corrupt or mislabelled metrics.json, unreadable curve) is a marked cell and one
warning line in the log and on stderr; an expected failure (e.g. a full disk) is one error line."""
import sys
from pathlib import Path

from lpdl_core.errors import LpdlError
from lpdl_core.pipeline.aggregation.aggregate import write_aggregate
from lpdl_core.pipeline.cells.tables import load_cells
from lpdl_core.pipeline.cells.grids import load_grid

sm = snakemake  # noqa: F821  (injected by Snakemake)
with open(sm.log[0], "w") as log:
    try:
        cfg, profile = sm.config, sm.config["profile"]
        grid = getattr(sm.params, "grid", "")  # an extension grid's folder: its cells, one tidy table
        cells = load_grid(grid).cells if grid else load_cells(cfg["paper_dir"], tables=cfg["tables"])
        def warn(line: str) -> None:  # a damaged run: a marked cell, never a failed step
            print(f"lpdl: aggregate: damaged run, shown as such: {line}", file=log, flush=True)
            print(f"lpdl: aggregate: damaged run, shown as such: {line}", file=sys.stderr, flush=True)

        written = write_aggregate(Path(sm.output.runs).parent, cells, profile=profile,
                                  tables=[grid] if grid else cfg["tables"], seeds=cfg["seeds"],
                                  fidelity=sm.params.fidelity, warn=warn, paper_shape=not grid)
        if grid:  # the grid's axes and each cell's labels, for its report section
            from lpdl_core.atomic import write_json
            from lpdl_core.report.grids import spec_dict

            write_json(sm.output.grid, spec_dict(load_grid(grid)))
        print(f"aggregate: {len(cells)} cells, wrote {len(written)} files", file=log)
    except LpdlError as e:
        line = f"lpdl aggregate: error: {e}"
        print(line, file=log, flush=True)
        print(line, file=sys.stderr, flush=True)
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C: one line; rerunning aggregates again (its writes are atomic)
        print("lpdl aggregate: interrupted", file=log, flush=True)
        print("lpdl aggregate: interrupted (rerun snakemake to aggregate again)", file=sys.stderr, flush=True)
        sys.exit(130)
