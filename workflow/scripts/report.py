"""Snakemake script: the declared inputs (runs.csv, curves.csv, tables, cost.json, partitions.csv)
-> the report (HTML, LaTeX, PDF when an engine exists). Imports no torch.
An expected failure (corrupt or mislabelled metrics.json), or Ctrl-C, is one line in the log and on stderr."""
import sys
from pathlib import Path

from lpdl_core.errors import LpdlError

sm = snakemake  # noqa: F821  (injected by Snakemake)
with open(sm.log[0], "w") as log:
    def say(line: str) -> None:
        print(line, file=log, flush=True)

    cfg = sm.config
    try:  # the import too: a Ctrl-C while pandas and matplotlib load is the same one line
        from lpdl_core.report.build import build_report

        # no paper tables (tables: []): the extension grids alone
        build_report(Path(sm.input.runs).parent if cfg["tables"] else None, Path(sm.output.html).parent,
                     paper_dir=cfg["paper_dir"],
                     tables=cfg["tables"], log=say,
                     compare_dir=Path(sm.input.compare[0]).parent if sm.input.compare else None,
                     grid_dirs=[Path(p).parent for p in sm.input.grids if p.endswith("grid.json")])
    except LpdlError as e:
        line = f"lpdl report: error: {e}"
        say(line)
        print(line, file=sys.stderr, flush=True)
        sys.exit(1)
    except KeyboardInterrupt:  # Ctrl-C: one line, as everywhere; rerunning builds the report again
        say("lpdl report: interrupted")
        print("lpdl report: interrupted (rerun snakemake to build the report)", file=sys.stderr, flush=True)
        sys.exit(130)
