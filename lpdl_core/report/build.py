"""Build the whole report from what the DAG gives it (report.data), a pure function of those files:

    report/report.html        self-contained (figures embedded)
    report/report.tex         + tables/*.tex + figures/*.pdf|png
    report/report.pdf         when latexmk + pdflatex exist (otherwise the reason is stated once,
                              in the header's PDF line, and logged)
    report/claims.json        the claims check, machine-readable

No torch is imported and no model is built here: Figure 3's numbers come from cost.json.
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

from ..atomic import write_atomic, write_json
from ..provenance import git
from ..pipeline.cells.shapes import block_title
from .claims import check_claims
from .data import cell_classes, load_grids_data, load_report_data, per_seed_acc
from .header import build_header
from .model import Figure, ReportData


def _figures(data: ReportData, log: Callable[[str], None]) -> tuple[list[Figure], list[str]]:
    """The figures and the ones that failed (with why)."""
    from .figures import all_figures

    t0 = time.perf_counter()
    errors: list[str] = []
    figs = all_figures(data, errors=errors)
    log(f"figures: {len(figs)} in {time.perf_counter() - t0:.1f}s")
    for err in errors:
        log(f"figure failed: {err}")
    return figs, errors


def mini_effects(data: ReportData) -> list:
    """The effects view's rows (report.effects) for every block of the cells in `data`, each with
    its block's display title: blocks without results are kept (verdict 'missing')."""
    from .effects import block_effects

    acc = per_seed_acc(data)
    seeds = sorted({s for _, s in acc})
    first = {}
    for c in data.cells:
        first.setdefault((c.table, c.block), c)
    rows = block_effects(data.cells, acc, seeds, cell_classes(data))

    def title(r) -> str:
        parts = r.block.split(" vs ")
        return " vs ".join(block_title(first[r.table, b]) if (r.table, b) in first else b for b in parts)

    return [replace(r, title=title(r)) for r in rows]


def pdf_status(ok: bool, why: str) -> str:
    """The header's PDF line: 'report.pdf', or 'not built: <the reason's last line>' (once)."""
    if ok:
        return "report.pdf"
    reason = (why.strip().splitlines() or [why])[-1]
    return "not built: " + reason.removesuffix(": report.pdf not built")


def build_report(results_dir: str | Path | None, out_dir: str | Path = "report", *,
                 paper_dir: str | Path | None = None, tables=None, pdf: bool = True,
                 log: Callable[[str], None] | None = None, compare_dir: str | Path | None = None,
                 grid_dirs: list[str | Path] = ()) -> dict:
    """Write the report for results_dir (results/{profile}, holding runs.csv, curves.csv,
    tables/*.csv, cost.json, partitions.csv); returns what was written and the claims.
    compare_dir: another results folder of the same profile in the other fidelity mode (its
    runs.csv and tables/*.csv), shown side by side ("Paper text vs official code"). grid_dirs:
    extension grids' results folders (runs.csv, tables/<grid>.csv, grid.json), one section each
    (report.grids). results_dir None: no paper tables, a report of the grids alone (its header
    from their runs; no claims, paper tables, paper figures, effects, modes or merge step)."""
    from .html import render_html
    from .latex import build_pdf, write_latex
    from .figures_style import MINI_NOTE
    from .claims_figure import claims_figure
    from .grids import grid_section
    from .merge import merge_view
    from .modes_view import modes_view
    from .tables import paper_tables

    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paper = results_dir is not None  # None: no paper tables (config `tables: []`), the grids alone
    grids = [grid_section(d) for d in grid_dirs]
    claim_runs = [g.runs for g in grids if g.spec.claims]  # the claims grids' runs are claims evidence
    if paper:
        data = load_report_data(results_dir, paper_dir, tables=tables, compare_dir=compare_dir)
        log(f"report: profile {data.profile}, {int((data.summary['status'] != 'missing').sum())} of "
            f"{len(data.cells)} cells with results ({len(data.runs)} runs)")
        figs, fig_errors = _figures(data, log)
        claims = check_claims(data, grid_runs=claim_runs)
    else:
        data = load_grids_data(grid_dirs)
        log(f"report: profile {data.profile}, extension grids only ({len(data.runs)} runs)")
        figs, fig_errors = [], []
        claims = check_claims(data, grid_runs=claim_runs, with_cost=False) if claim_runs else []
    claims_fig = claims_figure(claims, MINI_NOTE if data.profile == "mini" else "")
    figs += [claims_fig] if claims_fig is not None else []
    header = build_header(data, generated_by={"git_sha": git("rev-parse", "HEAD")}, grids_only=not paper)
    if fig_errors:
        header = replace(header, warnings=header.warnings + tuple(f"Figure not drawn: {e}" for e in fig_errors))
    ptables = paper_tables(data) if paper else []
    effects = mini_effects(data) if paper and data.profile == "mini" else None
    modes = modes_view(data) if paper else None
    if modes is not None:
        log(f"modes: {modes.title} ({compare_dir}): {modes.sentence}")
    for g in grids:
        log(f"grid {g.spec.name}: {g.finished} of {g.cells} cells finished, {len(g.effects)} effects")
    figs += [g.figure for g in grids if g.figure is not None]
    note = MINI_NOTE if data.profile == "mini" else ""
    grids_part = (grids, note) if grids else None
    merge = merge_view(data.runs, data.profile) if paper else None
    if merge is not None:
        log(f"merge: {merge.counted} runs with the accuracy before the final rounds, over {len(merge.tables)} tables")
    written = write_latex(out, header, ptables, claims, figs, effects, modes, merge, grids_part)
    ok, why = build_pdf(out) if pdf else (False, "PDF disabled (pdf=False)")
    header = replace(header, facts=header.facts + (("PDF", pdf_status(ok, why)),))
    html_path = write_atomic(out / "report.html",
                             render_html(header, ptables, claims, figs, effects, modes, merge, grids_part))
    claims_path = write_json(out / "claims.json", [asdict(c) for c in claims])
    for c in claims:
        log(f"claim {c.number}: {c.verdict}: {c.evidence}")
    log(f"report: {html_path}" + (f", {out / 'report.pdf'}" if ok else f" (PDF {pdf_status(ok, why)})"))
    return {"html": html_path, "pdf": out / "report.pdf" if ok else None, "pdf_message": why,
            "claims": claims, "claims_json": claims_path, "latex": written, "figures": [f.name for f in figs],
            "tables": [t.name for t in ptables], "modes": modes.headline if modes is not None else None}


def main_json(result: dict) -> str:
    """A short JSON summary of build_report's result (for the CLI)."""
    return json.dumps({"html": str(result["html"]), "pdf": str(result["pdf"]) if result["pdf"] else None,
                       "claims": {c.number: c.verdict for c in result["claims"]},
                       "figures": result["figures"], "tables": result["tables"]}, indent=1)
