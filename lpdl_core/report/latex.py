"""LaTeX rendering of the report: booktabs tables, a complete article, and the PDF build.

Packages used: booktabs, graphicx, xcolor (with its `table` option, which loads colortbl),
plus geometry and hyperref when present (guarded with \\IfFileExists). All of them ship in
Debian's texlive-latex-base / texlive-latex-recommended. Compile with pdflatex via latexmk.
"""
from __future__ import annotations

import re
import shutil
import subprocess
import unicodedata
from pathlib import Path

from .model import DELTA_BANDS, Claim, Entry, Figure, Header, PaperTable, delta_class

_ESCAPES = {
    "\\": r"\textbackslash{}", "&": r"\&", "%": r"\%", "$": r"\$", "#": r"\#", "_": r"\_",
    "{": r"\{", "}": r"\}", "~": r"\textasciitilde{}", "^": r"\textasciicircum{}",
    "<": r"\textless{}", ">": r"\textgreater{}", "|": r"\textbar{}",
    "±": r"$\pm$", "—": "---", "–": "--", "≈": r"$\approx$", "≥": r"$\geq$", "≤": r"$\leq$",
    "→": r"$\rightarrow$", "×": r"$\times$", "·": r"$\cdot$", "…": r"\ldots{}",
    "−": "-", "Δ": r"$\Delta$", "δ": r"$\delta$", "α": r"$\alpha$", "β": r"$\beta$",
    "γ": r"$\gamma$", "η": r"$\eta$", "λ": r"$\lambda$", "μ": r"$\mu$", "σ": r"$\sigma$",
    "†": r"$^\dagger$", "\u00a0": "~", "“": "``", "”": "''", "‘": "`", "’": "'", "°": r"$^\circ$",
}
# cell background per delta class (colortbl's \cellcolor with an inline HTML colour)
_CELL_COLOURS = {"close": "D8F0D8", "near": "FFF0C2", "far": "F8D3D3"}
_FLAT_COLOUR = "ECEFF1"  # did not learn
_VERDICT_COLOURS = {"holds": "2E7D32", "does not hold": "C62828", "within noise": "B36B00",
                    "not enough cells": "757575"}

NO_ENGINE = ("no LaTeX engine found (install texlive-latex-base texlive-latex-recommended "
             "latexmk): report.pdf not built")


def tex_escape(text) -> str:
    """Escape LaTeX specials; map common Unicode to commands, drop what pdflatex can't set."""
    out = []
    for ch in str(text):
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 128:
            out.append(ch if ch.isprintable() else " ")  # newlines too: no \par in captions
        else:
            ascii_ = unicodedata.normalize("NFKD", ch).encode("ascii", "ignore").decode()
            out.append(tex_escape(ascii_) if ascii_ else "?")
    return "".join(out)


def _safe_name(name: str) -> str:
    """A file stem / label that LaTeX and the file system both accept."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", name).strip("-") or "unnamed"


def _num(x: float) -> str:
    return f"{x:.2f}"


def _signed(x: float) -> str:
    return f"$+${x:.2f}" if x >= 0 else f"$-${-x:.2f}"


def _cell(e: Entry | None, compare: str = "absolute") -> str:
    if e is None:
        return ""
    paper = _num(e.paper) if e.paper is not None else "?"
    if e.status == "missing":
        return f"-- / {paper}"
    if e.status == "diverged":
        return f"div. / {paper}"
    rep = _num(e.reproduced) if e.reproduced is not None else "?"
    if e.seeds > 1 and e.std is not None:
        rep += r"$\pm$" + _num(e.std)
    if e.status == "partly-diverged":
        rep += r"$^\dagger$"
    if e.same_run_as:
        rep += r"$^{=}$"
    text = f"{rep} / {paper}"
    if compare != "effects" and e.delta is not None:  # mini: absolute numbers cannot match, no delta
        text += f" ({_signed(e.delta)})"
    if e.learned is False:  # within 5 points of chance: grey whatever the delta
        return r"\cellcolor[HTML]{%s}%s (n.l.)" % (_FLAT_COLOUR, text)
    if compare == "effects":
        return text
    colour = _CELL_COLOURS.get(delta_class(e.delta))
    return (r"\cellcolor[HTML]{%s}" % colour + text) if colour else text


def _sentence(text: str) -> str:
    text = text.strip()
    return text if text.endswith((".", "!", "?", ":")) else text + "."


def _legend(compare: str = "absolute") -> str:
    lo, hi = DELTA_BANDS
    flags = (r" \colorbox[HTML]{%s}{n.l.}: did not learn (within 5 points of chance); $^{=}$: the same "
             r"run as another cell, computed once." % _FLAT_COLOUR)
    if compare == "effects":
        return (r"Cells: reproduced (mean$\pm$std over seeds) / paper. Mini profile: stand-in data and "
                r"models, so absolute numbers are not comparable with the paper's; compare the effects "
                r"table. div.: all seeds diverged; --: missing; $^\dagger$: some seeds diverged." + flags)
    return (r"Cells: reproduced (mean$\pm$std over seeds) / paper (reproduced $-$ paper). "
            r"div.: all seeds diverged; --: missing (no result); $^\dagger$: some seeds "
            r"diverged, mean of the others; blank: no such cell in the paper. "
            r"Background: \colorbox[HTML]{%s}{$|\Delta|<%g$}, \colorbox[HTML]{%s}{$%g\leq|\Delta|<%g$},"
            r" \colorbox[HTML]{%s}{$|\Delta|\geq%g$} accuracy points."
            % (_CELL_COLOURS["close"], lo, _CELL_COLOURS["near"], lo, hi,
               _CELL_COLOURS["far"], hi)) + flags


def table_tex(t: PaperTable) -> str:
    """A booktabs `table` float in the paper's shape (needs booktabs, graphicx, xcolor+colortbl)."""
    spec = "l" * len(t.row_axes) + "c" * len(t.columns)
    head = " & ".join(r"\textbf{%s}" % tex_escape(h) for h in (*t.row_axes, *t.columns))
    lines, prev = [], None
    for row in t.rows:
        labels = []
        for i, label in enumerate(row.labels):
            same = prev is not None and tuple(prev[: i + 1]) == tuple(row.labels[: i + 1])
            labels.append("" if same else tex_escape(label))
        lines.append(" & ".join(labels + [_cell(e, t.compare) for e in row.entries]) + r" \\")
        prev = row.labels
    caption = " ".join(_sentence(tex_escape(s)) for s in (t.caption, t.note) if s.strip())
    caption += " " + _legend(t.compare)
    short = tex_escape(t.caption) or tex_escape(t.name)
    return "\n".join([
        r"\begin{table}[!htbp]", r"\centering", r"\small",
        r"\caption[%s]{%s}" % (short, caption), r"\label{tab:%s}" % _safe_name(t.name),
        # shrink to the text width only when wider than it
        r"\resizebox{\ifdim\width>\linewidth\linewidth\else\width\fi}{!}{%",
        r"\begin{tabular}{%s}" % spec, r"\toprule", head + r" \\", r"\midrule",
        *lines, r"\bottomrule", r"\end{tabular}}", r"\end{table}", ""])


def report_tex(header: Header, tables: list[PaperTable], claims: list[Claim],
               figures: list[Figure], figure_files: dict[str, str], effects: list | None = None) -> str:
    """A complete article that inputs tables/<name>.tex and includes figure_files[name]."""
    out = [r"\documentclass[11pt]{article}",
           r"\IfFileExists{geometry.sty}{\usepackage[margin=2cm]{geometry}}{}",
           r"\usepackage{booktabs}", r"\usepackage{graphicx}", r"\usepackage[table]{xcolor}",
           r"\usepackage{longtable}",
           r"\IfFileExists{hyperref.sty}{\usepackage[hidelinks]{hyperref}}{}",
           r"\setcounter{totalnumber}{6}\renewcommand{\textfraction}{0.1}",
           r"\title{%s}" % tex_escape(header.title), r"\author{}", r"\date{}",
           r"\begin{document}", r"\maketitle"]
    if header.profile == "mini":
        banner = (r"\textbf{PROFILE: MINI} --- numbers come from stand-in data and small models "
                  r"and are \textbf{NOT a reproduction of the paper}. " + tex_escape(header.profile_note))
        colour = "FFF3DC"
    else:
        banner = r"\textbf{PROFILE: %s} --- %s" % (tex_escape(header.profile.upper()),
                                                   tex_escape(header.profile_note))
        colour = "E6F0FB"
    out.append(r"\noindent\colorbox[HTML]{%s}{\parbox{\dimexpr\linewidth-2\fboxsep}{%s}}"
               % (colour, banner))
    if header.facts:
        out += [r"\begin{description}"]
        out += [r"\item[%s] %s" % (tex_escape(k), tex_escape(v)) for k, v in header.facts]
        out += [r"\end{description}"]
    if header.warnings:
        out += [r"\paragraph{Warnings}", r"\begin{itemize}"]
        out += [r"\item \textcolor[HTML]{C62828}{%s}" % tex_escape(w) for w in header.warnings]
        out += [r"\end{itemize}"]
    out += [r"\section{Claims check}"]
    if claims:
        out.append(r"\begin{itemize}")
        for c in claims:
            colour = _VERDICT_COLOURS.get(c.verdict, "757575")
            out.append(r"\item[\textbf{%d.}] \textbf{\textcolor[HTML]{%s}{[%s]}} %s\\ "
                       r"\emph{Evidence:} %s" % (int(c.number), colour, tex_escape(c.verdict),
                                                 tex_escape(c.text), tex_escape(c.evidence)))
        out.append(r"\end{itemize}")
    else:
        out.append("No claims checked.")
    if effects is not None:
        from .effects_view import effects_tex
        out += [r"\clearpage", effects_tex(effects, tex_escape)]
    out += [r"\clearpage", r"\section{Tables}"]
    out += [r"\input{tables/%s.tex}" % _safe_name(t.name) for t in tables] or ["No tables."]
    out += [r"\clearpage", r"\section{Figures}"]
    for f in figures:
        path = figure_files.get(f.name)
        if not path:
            continue
        out += [r"\begin{figure}[!htbp]", r"\centering",
                r"\includegraphics[width=\linewidth,height=0.8\textheight,keepaspectratio]{%s}"
                % path,
                r"\caption{\textbf{%s.} %s}" % (tex_escape(f.title), tex_escape(f.caption)),
                r"\label{fig:%s}" % _safe_name(f.name), r"\end{figure}", r"\clearpage"]
    out += [r"\end{document}", ""]
    return "\n".join(out)


def write_latex(out_dir: Path, header: Header, tables: list[PaperTable], claims: list[Claim],
                figures: list[Figure], effects: list | None = None) -> dict:
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
    report.write_text(report_tex(header, tables, claims, figures, figure_files, effects), encoding="utf-8")
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
