"""LaTeX renderer of the report (Jinja2 templates + pandas Styler tabulars) and the PDF build,
from the hand-made report objects of test_report_render."""
from __future__ import annotations

import fnmatch
import os
import tomllib
from dataclasses import replace
from importlib.resources import files

import pytest

from lpdl_core.report import latex
from lpdl_core.report.effects_view import effects_html, effects_tex
from lpdl_core.report.latex import build_pdf, table_tex, write_latex
from lpdl_core.report.model import Entry, Row

from test_report_render import EFFECTS, HOSTILE, IN_CI, NO_LATEX, _hostile_report, report_parts


@pytest.fixture(scope="module")
def report():
    return report_parts()


def test_effects_view_tex():
    tex = effects_tex(EFFECTS, latex.tex_escape)
    assert tex.count(r"\begin{longtable}") == 3 and tex.count(r"\toprule") == 6  # head repeated
    assert r"\subsection*{Table 2 (CIFAR-10, decentralized)}" in tex and r"\subsection*{Table 9}" in tex
    assert r"\multirow[t]{2}{*}{ResNet-20, directed ring, 8 nodes}" in tex
    assert r"VGG \textless{}i\textgreater{}ring\textless{}/i\textgreater{} \& 8 \% nodes" in tex
    assert r"\cellcolor{green!15} FP - LP" in tex and r"\cellcolor{red!15} FP - LP" in tex
    assert r"\cellcolor{yellow!25} CHOCO - DS" in tex and r"\cellcolor{gray!8} FP - LP" in tex
    assert r"+1.25 $\pm$ 0.40" in tex
    assert "resnet20-dring8" not in tex
    assert "No effects" in effects_html([]) and "No effects" in effects_tex([], latex.tex_escape)


def test_latex_table(report):
    tex = table_tex(report[1][0])
    for rule in (r"\toprule", r"\midrule", r"\bottomrule", r"\begin{table}", r"\end{table}"):
        assert rule in tex
    assert r"\label{tab:table2}" in tex and r"Accuracy 100\% of CIFAR\_10" in tex
    assert r"\renewcommand{\tablename}{Table}\renewcommand{\thetable}{2}" in tex  # the paper's number
    fig1 = table_tex(replace(report[1][0], name="fig1", title="", caption="Figure 1 runs: norms"))
    assert r"\renewcommand{\tablename}{Figure}\renewcommand{\thetable}{1 runs}" in fig1
    assert r"\caption[{norms}]{norms.}" in fig1 and r"\label{tab:fig1}" in fig1
    # the note and the legend follow the tabular in small type, not inside the caption
    assert fig1.index(r"\footnotesize") > fig1.index(r"\end{tabular}") and "Cells: reproduced" in fig1
    assert r"ResNet\_20/Ring" in tex and r"VGG \& co" in tex and r"LP-DS \#8" in tex
    assert "ResNet_20" not in tex
    body = tex.split(r"\midrule")[1].split(r"\bottomrule")[0].strip().splitlines()
    # the repeated group label is one \multirow over its two rows; missing shows the paper's value
    assert body[0].startswith(r"\multirow[t]{2}{*}{ResNet\_20/Ring} & 16 & ")
    assert body[1].startswith(r" & 32 & \textit{missing} / 69.00 & ")
    assert r"\cellcolor[HTML]{D8F0D8} 71.23$\pm$0.46 / 72.00 ($-$0.77)" in body[0]
    assert r"\textit{diverged (epoch 3)} / 70.50" in body[0]
    assert r"65.00$\pm$1.00$^\dagger$" in body[1] and r"\cellcolor[HTML]{F8D3D3}" in body[1]
    assert body[2].startswith(r"VGG \& co & 16 & \cellcolor[HTML]{FFF0C2} 80.00 / 78.25 ($+$1.75)")
    assert body[2].endswith(r"& --- \\")  # None: an em dash
    assert latex.tex_escape("a_b%c&d#e$f{g}h~i^j\\k") == (
        r"a\_b\%c\&d\#e\$f\{g\}h\textasciitilde{}i\textasciicircum{}j\textbackslash{}k")
    # mini: no delta and no delta colour; did-not-learn grey whatever the profile
    flat = Entry(cell_id="c", status="ok", reproduced=12.0, std=0.0, seeds=2, paper=83.82,
                 delta=-71.82, chance=10.0, same_run_as="d")
    mini = replace(report[1][0], compare="effects", rows=(
        *report[1][0].rows, Row(labels=("x", "1"), entries=(flat, None))))
    tex = table_tex(mini)
    assert "D8F0D8}" not in tex.split(r"\midrule")[1] and "($-$" not in tex
    assert r"\cellcolor[HTML]{ECEFF1} 12.00$\pm$0.00$^{=}$ / 83.82 (n.l.)" in tex


def test_latex_escapes_every_string_from_the_data(report, tmp_path):
    hostile, effects = _hostile_report(report)
    paths = write_latex(tmp_path, *hostile, effects)
    escaped = latex.tex_escape(HOSTILE)
    for tex in (paths["report"].read_text(), paths["tables"]["table2"].read_text()):
        assert "<script>" not in tex and "50%" not in tex and "a_b" not in tex and "{x}" not in tex
        assert escaped in tex
    assert r"\caption[{" + escaped + "}]" in paths["tables"]["table2"].read_text()


def test_write_latex(tmp_path, report):
    paths = write_latex(tmp_path, *report, EFFECTS)
    assert paths["report"] == tmp_path / "report.tex"
    assert paths["tables"]["table2"].read_text().count(r"\toprule") == 1
    assert paths["figures"]["fig1-norm-curves"].read_bytes().startswith(b"%PDF")
    assert paths["figures"]["fig2_png_only"].suffix == ".png"
    tex = paths["report"].read_text()
    assert r"\input{tables/table2.tex}" in tex
    assert r"\includegraphics" in tex and "figures/fig1-norm-curves.pdf" in tex
    assert r"Loss \textless{}b\textgreater{}bold" in tex and "NOT a reproduction" in tex
    assert r"\IfFileExists{multirow.sty}{\usepackage{multirow}}{}" in tex
    assert r"\providecommand{\multirow}[4][t]{#4}" in tex
    assert "Effects: paper vs reproduction" in tex and r"\begin{longtable}" in tex
    assert r"\label{fig:fig2_png_only}" in tex


def test_build_pdf_without_engine(tmp_path, monkeypatch):
    monkeypatch.setattr(latex.shutil, "which", lambda name: None)
    ok, msg = build_pdf(tmp_path)
    assert ok is False and "no LaTeX engine found" in msg
    monkeypatch.undo()
    monkeypatch.setenv("PATH", str(tmp_path))
    assert build_pdf(tmp_path)[0] is False


@pytest.mark.skipif(NO_LATEX and not IN_CI, reason="latexmk/pdflatex not installed")
@pytest.mark.parametrize("hostile", [False, True], ids=["plain", "hostile"])
def test_build_pdf(tmp_path, report, hostile):
    """The whole article, effects (longtable, \\multirow) and hostile strings included, compiles."""
    if hostile:
        write_latex(tmp_path, *_hostile_report(report)[0], _hostile_report(report)[1])
    else:
        write_latex(tmp_path, *report, EFFECTS)
    ok, msg = build_pdf(tmp_path, timeout=120)
    assert ok, msg
    assert (tmp_path / "report.pdf").read_bytes().startswith(b"%PDF")
    assert not (tmp_path / "report.aux").exists()  # latexmk -c cleaned up


@pytest.mark.skipif(NO_LATEX and not IN_CI, reason="latexmk/pdflatex not installed")
def test_build_pdf_reports_tex_error(tmp_path):
    (tmp_path / "report.tex").write_text(
        r"\documentclass{article}\begin{document}\nosuchmacro\end{document}")
    ok, msg = build_pdf(tmp_path, timeout=60)
    assert not ok and "Undefined control sequence" in msg
    assert not (tmp_path / "report.pdf").exists()


def test_templates_ship_with_the_package():
    names = {p.name for p in (files("lpdl_core.report") / "templates").iterdir()}
    assert {"report.html.j2", "report.css", "report.tex.j2", "table.tex.j2", "cells.html.j2",
            "cells.tex.j2", "effects.html.j2", "effects.tex.j2", "styler_style.tpl"} <= names
    root = os.path.join(os.path.dirname(__file__), "..", "pyproject.toml")
    with open(root, "rb") as f:
        data = tomllib.load(f)["tool"]["setuptools"]["package-data"]["lpdl_core.report"]
    assert all(any(fnmatch.fnmatch(f"templates/{n}", pat) for pat in data) for n in names)
