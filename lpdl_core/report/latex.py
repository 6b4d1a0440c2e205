"""LaTeX rendering of the report: booktabs tables, a complete article, and the PDF build.

Both are Jinja2 templates (templates/table.tex.j2, templates/report.tex.j2; delimiters ((* *)),
((( ))), ((= =)), every value tex-escaped unless it is Tex); a table's tabular is pandas Styler
output (report.table_style: repeated group labels as \\multirow[t], cell colours as
\\cellcolor). Packages used: booktabs, graphicx, xcolor (with its `table` option, which loads
colortbl) and longtable, plus geometry, hyperref and multirow when present (guarded with
\\IfFileExists; without multirow.sty, as in Debian's texlive-latex-recommended, a fallback
\\multirow sets a group's label on its first row). All ship in Debian's texlive-latex-base /
texlive-latex-recommended. Compile with pdflatex via latexmk.
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from .effects_view import effects_tex
from .merge import MergeView
from .grids_view import grids_tex
from .merge_view import merge_tex
from .modes_view import ModesView, modes_tex
from .model import DELTA_BANDS, LEARNED_MARGIN, Claim, Figure, Header, PaperTable, has_paper_part, verdict_kind
from .table_style import CELL_COLOURS, FLAT_COLOUR, tex_tabular
from .templating import Tex, caption, heading, tex_env, tex_escape

__all__ = ["NO_ENGINE", "build_pdf", "report_tex", "table_tex", "tex_escape", "write_latex"]

KIND_COLOURS = {"holds": "2E7D32", "fails": "C62828", "noise": "B36B00", "moving": "1565C0", "partly": "558B2F",
                "na": "757575"}

NO_ENGINE = ("no LaTeX engine found (install texlive-latex-base texlive-latex-recommended "
             "latexmk): report.pdf not built")


def _safe_name(name: str) -> str:
    """A file stem / label that LaTeX and the file system both accept."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-") or "unnamed"


def _sentence(text: str) -> str:
    text = text.strip()
    return text if text.endswith((".", "!", "?", ":")) else text + "."


def table_tex(t: PaperTable) -> str:
    """A booktabs `table` float in the paper's shape: the paper's caption, label tab:<name>, the
    Styler tabular shrunk to the text width when wider, then the note and the legend in small type
    below it (not in the caption: LaTeX measures a caption on one line, and a long one overflows
    TeX's largest dimension)."""
    title = heading(t.name, t.title)
    # LaTeX's "Table 1:" becomes the heading: "Table 2:" as in the paper, "Figure 1 runs:"
    name, _, number = title.partition(" ")
    text = caption(t.caption, title)
    return tex_env().get_template("table.tex.j2").render(
        t=t, tabular=tex_tabular(t), label=_safe_name(t.name), name=name, number=number,
        short=text or title, sentences=[_sentence(text)] if text.strip() else [],
        note=_sentence(t.note) if t.note.strip() else "",
        bands=DELTA_BANDS, colours=CELL_COLOURS, flat=FLAT_COLOUR, margin=LEARNED_MARGIN)


def report_tex(header: Header, tables: list[PaperTable], claims: list[Claim],
               figures: list[Figure], figure_files: dict[str, str], effects: list | None = None,
               modes: ModesView | None = None, merge: MergeView | None = None, grids: tuple | None = None) -> str:
    """A complete article that inputs tables/<name>.tex and includes figure_files[name]; modes:
    the paper text beside the official code (report.modes_view), merge: the merge step
    (report.merge_view), each before the tables when given."""
    titles = {t.name: heading(t.name, t.title) for t in tables}
    figs = [dict(path=Tex(figure_files[f.name]), label=Tex(_safe_name(f.name)),
                 title=heading(f.name, f.title), caption=f.caption)
            for f in figures if figure_files.get(f.name)]
    return tex_env().get_template("report.tex.j2").render(
        header=header, claims=list(claims),
        verdict_colours={c.verdict: KIND_COLOURS[verdict_kind(c.verdict)] for c in claims},
        effects=Tex(effects_tex(effects, tex_escape, titles)) if effects is not None else None,
        modes=Tex(modes_tex(modes)) if modes is not None else None,
        merge=Tex(merge_tex(merge)) if merge is not None else None,
        grids=Tex(grids_tex(*grids)) if grids is not None else None,
        tables=[dict(file=Tex(f"{_safe_name(t.name)}.tex")) for t in tables], figures=figs,
        paper=has_paper_part(tables, grids))


def write_latex(out_dir: Path, header: Header, tables: list[PaperTable], claims: list[Claim],
                figures: list[Figure], effects: list | None = None, modes: ModesView | None = None,
                merge: MergeView | None = None, grids: tuple | None = None) -> dict:
    """Write tables/*.tex, figures/*.pdf|png and report.tex under out_dir.

    Returns {"report": Path, "tables": {name: Path}, "figures": {name: Path}}."""
    out_dir = Path(out_dir)
    (out_dir / "tables").mkdir(parents=True, exist_ok=True)
    (out_dir / "figures").mkdir(parents=True, exist_ok=True)
    written: dict = {"tables": {}, "figures": {}}
    for t in tables:
        p = out_dir / "tables" / f"{_safe_name(t.name)}.tex"
        p.write_text(table_tex(t), encoding="utf-8")
        written["tables"][t.name] = p
    figure_files = {}
    for f in figures:
        ext, data = ("pdf", f.pdf) if f.pdf else ("png", f.png)
        rel = f"figures/{_safe_name(f.name)}.{ext}"
        (out_dir / rel).write_bytes(data)
        figure_files[f.name] = rel
        written["figures"][f.name] = out_dir / rel
    report = out_dir / "report.tex"
    report.write_text(report_tex(header, tables, claims, figures, figure_files, effects, modes, merge, grids),
                      encoding="utf-8")
    written["report"] = report
    return written


def build_pdf(out_dir: Path, timeout: int = 300) -> tuple[bool, str]:
    """latexmk -pdf report.tex in out_dir; (ok, message). Never raises for a missing engine."""
    out_dir = Path(out_dir)
    latexmk = shutil.which("latexmk")
    if latexmk is None or shutil.which("pdflatex") is None:
        return False, NO_ENGINE
    (out_dir / "report.pdf").unlink(missing_ok=True)  # never leave a stale PDF behind
    cmd = [latexmk, "-pdf", "-interaction=nonstopmode", "-halt-on-error", "report.tex"]
    try:
        proc = subprocess.run(cmd, cwd=out_dir, stdin=subprocess.DEVNULL, capture_output=True,
                              text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        return False, f"latexmk timed out after {timeout} s: report.pdf not built"
    except OSError as err:
        return False, f"could not run latexmk: {err}"
    pdf = out_dir / "report.pdf"
    if proc.returncode != 0 or not pdf.is_file():
        log = out_dir / "report.log"
        text = log.read_text(errors="replace") if log.is_file() else proc.stdout + proc.stderr
        lines = text.splitlines()
        first = next((i for i, ln in enumerate(lines) if ln.startswith("!")), None)
        # the first TeX error and its context say more than the memory statistics at the end
        tail = "\n".join(lines[first:first + 20] if first is not None else lines[-40:])
        return False, f"latexmk failed (exit {proc.returncode}):\n{tail}"
    subprocess.run([latexmk, "-c", "report.tex"], cwd=out_dir, stdin=subprocess.DEVNULL,
                   capture_output=True, timeout=timeout, check=False)
    return True, "built report.pdf"
