"""Snakemake script: results/{profile} -> the report (HTML, LaTeX, PDF when an engine exists)."""
from pathlib import Path

from lpdl_core.report.build import build_report

sm = snakemake  # noqa: F821  (injected by Snakemake)
with open(sm.log[0], "w") as log:
    def say(line: str) -> None:
        print(line, file=log, flush=True)

    build_report(sm.params.results, Path(sm.output.html).parent, paper_dir=sm.params.paper_dir,
                 tables=sm.params.tables, seeds=sm.params.seeds, log=say)
