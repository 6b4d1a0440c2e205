"""HTML and LaTeX renderers of the report, from hand-made report objects."""
from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
from dataclasses import replace

import pytest

from lpdl_core.report import latex
from lpdl_core.report.html import render_html
from lpdl_core.report.latex import build_pdf, table_tex, write_latex
from lpdl_core.report.model import Claim, Entry, Figure, Header, PaperTable, Row

# CI (.ci/run installs texlive, latexmk and chromium) must build the PDF and render the page:
# there a missing engine fails these tests instead of skipping them.
IN_CI = os.environ.get("CI") == "true"
NO_LATEX = shutil.which("latexmk") is None or shutil.which("pdflatex") is None


def _figure_bytes() -> tuple[bytes, bytes]:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(2, 1.5), dpi=40)
    ax.plot([0, 1, 2], [1, 0, 2])
    out = []
    for fmt in ("png", "pdf"):
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt)
        out.append(buf.getvalue())
    plt.close(fig)
    return out[0], out[1]


@pytest.fixture(scope="module")
def report():
    png, pdf = _figure_bytes()
    header = Header(title="LP-DL report <mini>", profile="mini",
                    profile_note="Stand-in data & tiny models.",
                    facts=(("seeds", "0, 1, 2"), ("git SHA", "abc123")),
                    warnings=("1 cell missing",))
    e = dict(cell_id="c")
    rows = (
        Row(labels=("ResNet_20/Ring", "16"), entries=(
            Entry(**e, status="ok", reproduced=71.234, std=0.456, seeds=3, paper=72.0,
                  delta=-0.766),
            Entry(**e, status="diverged", paper=70.5, diverged_at="[3]"))),
        Row(labels=("ResNet_20/Ring", "32"), entries=(
            Entry(**e, status="missing", paper=69.0),
            Entry(**e, status="partly-diverged", reproduced=65.0, seeds=2, std=1.0,
                  paper=68.5, delta=-3.5, diverged_at="[7]"))),
        Row(labels=("VGG & co", "16"), entries=(
            Entry(**e, status="ok", reproduced=80.0, seeds=1, paper=78.25, delta=1.75),
            None)),
    )
    table = PaperTable(name="table2", caption="Accuracy 100% of CIFAR_10", row_axes=(
        "Model/Graph", "Nodes"), columns=("DS (32-bit)", "LP-DS #8"), rows=rows,
        note="mini: ResNet-20 -> tiny CNN")
    claims = [Claim(number=1, text="LP-DS matches DS", verdict="holds", evidence="0.2 < 1"),
              Claim(number=2, text="QGM helps", verdict="does not hold", evidence="-2.0"),
              Claim(number=3, text="Skew hurts", verdict="not enough cells", evidence="n/a")]
    figures = [Figure(name="fig1-norm-curves", title="Norm curves",
                      caption="Loss <b>bold</b> & more", png=png, pdf=pdf),
               Figure(name="fig2_png_only", title="PNG only", caption="no pdf", png=png)]
    return header, [table], claims, figures


def _cells(doc: str) -> list[str]:
    return re.findall(r"<td[^>]*>.*?</td>", doc, flags=re.S)


def test_html_cells(report):
    doc = render_html(*report)
    assert doc.startswith("<!DOCTYPE html>") and '<meta charset="utf-8">' in doc
    assert "<title>LP-DL report &lt;mini&gt;</title>" in doc
    cells = _cells(doc)
    assert len(cells) == 4 + 2  # 6 data cells (one None), no other <td>
    ok, div, miss, part, single, absent = cells
    assert "71.23 &plusmn; 0.46" in ok and "paper 72.00" in ok and "-0.77" in ok
    assert 'class="close ok"' in ok
    assert "diverged (epoch 3)" in div and 'class="diverged"' in div
    # missing: the paper's number for reference, no reproduced number and no delta
    assert re.sub(r"<[^>]*>", " ", miss).split() == ["missing", "paper", "69.00"]
    assert "65.00" in part and "&dagger;" in part and 'class="far partly-diverged"' in part
    assert "-3.50" in part
    assert "80.00" in single and "&plusmn;" not in single and "+1.75" in single
    assert 'class="near ok"' in single
    assert "&mdash;" in absent
    # merged row labels: second row blanks the repeated model, keeps its own node count
    ths = re.findall(r'<th scope="row" class="axis[^"]*">(.*?)</th>', doc)
    assert ths == ["ResNet_20/Ring", "16", "", "32", "VGG &amp; co", "16"]
    assert "<th scope=\"col\">LP-DS #8</th>" in doc


def test_html_header_claims_figures(report):
    doc = render_html(*report)
    assert "NOT a reproduction of the paper" in doc and "Stand-in data &amp; tiny models." in doc
    assert "<dt>git SHA</dt><dd>abc123</dd>" in doc and "1 cell missing" in doc
    assert re.search(r'class="badge v-holds">holds<', doc)
    assert re.search(r'class="badge v-fails">does not hold<', doc)
    assert re.search(r'class="badge v-na">not enough cells<', doc)
    assert doc.count('src="data:image/png;base64,iVBOR') == 2
    assert 'alt="Norm curves"' in doc
    assert "Loss &lt;b&gt;bold&lt;/b&gt; &amp; more" in doc and "<b>bold</b>" not in doc
    assert not re.search(r'(src|href)\s*=\s*["\']?\s*(https?:)?//', doc, flags=re.I)
    assert "http://" not in doc and "https://" not in doc
    for anchor in ("claims", "tables", "figures", "table-table2", "fig-fig1-norm-curves"):
        assert f'href="#{anchor}"' in doc and f'id="{anchor}"' in doc
    # mini: no |delta| bands (stand-in numbers are not comparable); paper: the bands
    assert "not coloured by their difference" in doc and "|&Delta;| &lt; 1 (close)" not in doc
    header, *rest = report
    paper_doc = render_html(replace(header, profile="paper"), *rest)
    assert "|&Delta;| &lt; 1 (close)" in paper_doc and "|&Delta;| &ge; 3 (far)" in paper_doc


def test_html_paper_profile_has_no_mini_banner(report):
    header, *rest = report
    paper = Header(title="t", profile="paper", profile_note="Full scale.")
    doc = render_html(paper, *rest)
    assert "NOT a reproduction" not in doc and "Profile: paper" in doc


def test_latex_table(report):
    tex = table_tex(report[1][0])
    for rule in (r"\toprule", r"\midrule", r"\bottomrule", r"\begin{table}", r"\end{table}"):
        assert rule in tex
    assert r"\label{tab:table2}" in tex and r"Accuracy 100\% of CIFAR\_10" in tex
    assert r"ResNet\_20/Ring" in tex and r"VGG \& co" in tex and r"LP-DS \#8" in tex
    assert "ResNet_20" not in tex
    body = tex.split(r"\midrule")[1].split(r"\bottomrule")[0].strip().splitlines()
    assert body[1].startswith(" & 32 & --")  # repeated label blanked, missing as --
    assert r"71.23$\pm$0.46 / 72.00 ($-$0.77)" in body[0] and "div. / 70.50" in body[0]
    assert r"65.00$\pm$1.00$^\dagger$" in body[1] and r"\cellcolor[HTML]{F8D3D3}" in body[1]
    assert body[2].endswith(r"($+$1.75) &  \\")  # None: blank cell
    assert latex.tex_escape("a_b%c&d#e$f{g}h~i^j\\k") == (
        r"a\_b\%c\&d\#e\$f\{g\}h\textasciitilde{}i\textasciicircum{}j\textbackslash{}k")


def test_write_latex(tmp_path, report):
    paths = write_latex(tmp_path, *report)
    assert paths["report"] == tmp_path / "report.tex"
    assert paths["tables"]["table2"].read_text().count(r"\toprule") == 1
    assert paths["figures"]["fig1-norm-curves"].read_bytes().startswith(b"%PDF")
    assert paths["figures"]["fig2_png_only"].suffix == ".png"
    tex = paths["report"].read_text()
    assert r"\input{tables/table2.tex}" in tex
    assert r"\includegraphics" in tex and "figures/fig1-norm-curves.pdf" in tex
    assert r"Loss \textless{}b\textgreater{}bold" in tex and "NOT a reproduction" in tex


def test_build_pdf_without_engine(tmp_path, monkeypatch):
    monkeypatch.setattr(latex.shutil, "which", lambda name: None)
    ok, msg = build_pdf(tmp_path)
    assert ok is False and "no LaTeX engine found" in msg
    monkeypatch.undo()
    monkeypatch.setenv("PATH", str(tmp_path))
    assert build_pdf(tmp_path)[0] is False


@pytest.mark.skipif(NO_LATEX and not IN_CI, reason="latexmk/pdflatex not installed")
def test_build_pdf(tmp_path, report):
    write_latex(tmp_path, *report)
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


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


# Chromium (--enable-logging=stderr) prints each console message of the page, errors and
# uncaught exceptions included, as:  [pid:tid:time:INFO:CONSOLE:<line>] "<msg>", source: <url> (<line>)
_CONSOLE = re.compile(r":CONSOLE(:\d+)?\]|Uncaught")


def _headless(page, tmp_path) -> tuple[object, list[str]]:
    """Screenshot `page` with headless chromium; (png path, page console lines on stderr)."""
    shot = page.with_suffix(".png")
    cmd = [_chromium(), "--headless", "--no-sandbox", "--disable-gpu",
           "--disable-background-networking", f"--user-data-dir={tmp_path / 'profile'}",
           f"--screenshot={shot}", "--window-size=1280,2000", "--enable-logging=stderr",
           "--v=0", page.as_uri()]
    proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          errors="replace", timeout=60)
    assert shot.is_file(), proc.stderr[-3000:]
    return shot, [ln for ln in proc.stderr.splitlines() if _CONSOLE.search(ln)]


@pytest.mark.slow
@pytest.mark.skipif(_chromium() is None and not IN_CI, reason="chromium not installed")
def test_html_renders_in_headless_chromium(tmp_path, report):
    # control: a page with a deliberate console error proves the log format is still detected
    control = tmp_path / "control.html"
    control.write_text('<!DOCTYPE html><html><head><meta charset="utf-8"><title>c</title>'
                       '</head><body><script>console.error("x")</script></body></html>')
    assert _headless(control, tmp_path)[1], "chromium console messages no longer detected"

    page = tmp_path / "report.html"
    page.write_text(render_html(*report), encoding="utf-8")
    shot, console = _headless(page, tmp_path)
    import matplotlib.image as mpimg

    img = mpimg.imread(shot)
    assert img.shape[0] >= 1000 and img.shape[1] >= 1000
    assert img[..., :3].std() > 0.02  # not a blank page
    assert console == [], console
