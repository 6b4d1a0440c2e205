"""Build the whole report from one results folder:

    report/report.html        self-contained (figures embedded)
    report/report.tex         + tables/*.tex + figures/*.pdf|png
    report/report.pdf         when latexmk + pdflatex exist (otherwise the reason is printed and
                              stated in the HTML header)
    report/claims.json        the claims check, machine-readable
"""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path
from typing import Callable

from ..results import provenance, write_atomic, write_json
from .claims import check_claims
from .data import load_report_data
from .header import build_header
from .model import Figure, ReportData


def _figures(data: ReportData, log: Callable[[str], None]) -> tuple[list[Figure], dict | None, list[str]]:
    """The figures, Figure 3's cost data, and the figures that failed (with why)."""
    from .cost import training_cost
    from .figures import all_figures
    t0 = time.perf_counter()
    errors: list[str] = []
    try:
        cost = training_cost()
    except Exception as e:  # noqa: BLE001  (claim 6 then has no data; the report says why)
        cost = None
        errors.append(f"Figure 3 cost model: {type(e).__name__}: {e}")
    figs = all_figures(data, cost, errors=errors)
    log(f"figures: {len(figs)} in {time.perf_counter() - t0:.1f}s")
    for err in errors:
        log(f"figure failed: {err}")
    return figs, cost, errors


def mini_effects(data: ReportData) -> list:
    """The effects view's rows (report.effects) for every block of the cells in `data`: blocks
    without results are kept (verdict 'missing'), so the view shows what is still to run."""
    from .data import cell_classes, per_seed_acc
    from .effects import block_effects

    acc = per_seed_acc(data)
    seeds = sorted({s for _, s in acc})
    classes = {cid: k for cid in data.runs if (k := cell_classes(data, cid))}
    return block_effects(data.cells, acc, seeds, classes)


def build_report(results_dir: str | Path, out_dir: str | Path = "report", *,
                 paper_dir: str | Path = "workflow/paper", tables=None, seeds=None,
                 fidelity=None, pdf: bool = True, log: Callable[[str], None] | None = None) -> dict:
    """Write the report for results_dir (results/{profile}); returns what was written and the
    claims. Missing cells stay missing; nothing is computed here beyond Figure 3's cost model."""
    from .html import render_html
    from .latex import build_pdf, write_latex
    from .tables import paper_tables

    log = log or (lambda s: print(s, file=sys.stderr, flush=True))
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    data = load_report_data(results_dir, paper_dir, tables=tables, seeds=seeds, fidelity=fidelity)
    done = sum(len(v) for v in data.runs.values())
    log(f"report: profile {data.profile}, {len(data.runs)} of {len(data.cells)} cells with results "
        f"({done} runs)")
    figs, cost, fig_errors = _figures(data, log)
    claims = check_claims(data, cost)
    header = build_header(data, generated_by=provenance())
    if fig_errors:
        header = replace(header, warnings=header.warnings + tuple(
            f"Figure not drawn: {e}" for e in fig_errors))
    ptables = paper_tables(data)
    effects = mini_effects(data) if data.profile == "mini" else None
    written = write_latex(out, header, ptables, claims, figs, effects)
    if pdf:
        ok, why = build_pdf(out)
    else:
        ok, why = False, "PDF disabled (pdf=False)"
    pdf_fact = ("PDF", "report.pdf" if ok else f"not built: {why.strip().splitlines()[-1] if why.strip() else why}")
    header = replace(header, facts=header.facts + (pdf_fact,))
    html_path = write_atomic(out / "report.html", render_html(header, ptables, claims, figs, effects))
    claims_path = write_json(out / "claims.json", [asdict(c) for c in claims])
    for c in claims:
        log(f"claim {c.number}: {c.verdict}: {c.evidence}")
    log(f"report: {html_path}" + (f", {out / 'report.pdf'}" if ok else f" (no PDF: {pdf_fact[1]})"))
    return {"html": html_path, "pdf": out / "report.pdf" if ok else None, "pdf_message": why,
            "claims": claims, "claims_json": claims_path, "latex": written, "figures": [f.name for f in figs],
            "tables": [t.name for t in ptables]}


def main_json(result: dict) -> str:
    """A short JSON summary of build_report's result (for the CLI)."""
    return json.dumps({"html": str(result["html"]), "pdf": str(result["pdf"]) if result["pdf"] else None,
                       "claims": {c.number: c.verdict for c in result["claims"]},
                       "figures": result["figures"], "tables": result["tables"]}, indent=1)
