"""HTML renderer of the report (Jinja2 templates + pandas Styler), from hand-made report objects
(the fixtures here are shared with test_report_render_tex)."""
from __future__ import annotations

import io
import os
import re
import shutil
import subprocess
from dataclasses import replace

import pytest

from lpdl_core.report.effects import EffectRow
from lpdl_core.report.html import render_html
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
    return report_parts()


def report_parts():
    """(header, tables, claims, figures) of a small hostile-named report (the `report` fixture)."""
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
        note="mini: ResNet-20 -> tiny CNN", title="Table 2")
    claims = [Claim(number=1, text="LP-DS matches DS", verdict="holds", evidence="0.2 < 1"),
              Claim(number=2, text="QGM helps", verdict="does not hold", evidence="-2.0"),
              Claim(number=3, text="Skew hurts", verdict="not enough cells", evidence="n/a")]
    figures = [Figure(name="fig1-norm-curves", title="Norm curves",
                      caption="Loss <b>bold</b> & more", png=png, pdf=pdf),
               Figure(name="fig2_png_only", title="PNG only", caption="no pdf", png=png)]
    return header, [table], claims, figures


HOSTILE = "<script>alert(1)</script> & 50% a_b {x} #1 $y ~z ^w \\ | ]"


def _effect(block, verdict, title="", effect="FP − LP", table="table2", reproduced=1.25, seeds=3):
    return EffectRow(effect=effect, table=table, block=block, pairs=2 if seeds else 0, paper=0.5,
                     reproduced=reproduced if seeds else None, spread=0.4 if seeds > 1 else None,
                     seeds=seeds, verdict=verdict, title=title)


EFFECTS = [_effect("resnet20-dring8", "same sign", "ResNet-20, directed ring, 8 nodes"),
           _effect("resnet20-dring8", "within noise", "ResNet-20, directed ring, 8 nodes", "CHOCO − DS"),
           _effect("resnet20-dring16", "opposite sign", reproduced=-1.0, seeds=1),
           _effect("vgg-ring8", "missing", "VGG <i>ring</i> & 8 % nodes", seeds=0),
           _effect("tiny_text", "not learned", table="table5", seeds=0),
           _effect("x", "no sign", table="table9", reproduced=0.0)]


def _hostile_report(report):
    """Every string the renderers take from the data made hostile."""
    header, tables, claims, figures = report
    h = replace(header, title=HOSTILE, profile_note=HOSTILE, facts=((HOSTILE, HOSTILE),),
                warnings=(HOSTILE,))
    t = tables[0]
    e = replace(t.rows[0].entries[0], cell_id=HOSTILE, same_run_as=HOSTILE)
    rows = (replace(t.rows[0], labels=(HOSTILE, HOSTILE), entries=(e, *t.rows[0].entries[1:])),
            *t.rows[1:])
    t = replace(t, caption=HOSTILE, note=HOSTILE, row_axes=(HOSTILE, "Nodes " + HOSTILE),
                columns=(HOSTILE, "LP " + HOSTILE), rows=rows, title=HOSTILE)
    c = [replace(claims[0], text=HOSTILE, evidence=HOSTILE)] + claims[1:]
    f = [replace(figures[0], title=HOSTILE, caption=HOSTILE)] + figures[1:]
    eff = [replace(EFFECTS[0], title=HOSTILE, effect=HOSTILE)] + EFFECTS[1:]
    return (h, [t], c, f), eff


def _cells(doc: str) -> list[str]:
    return re.findall(r"<td[^>]*>.*?</td>", doc, flags=re.S)


def _classes(td: str) -> set[str]:
    """A Styler data cell's own classes (without Styler's 'data rowN colM')."""
    cls = re.search(r'class="([^"]*)"', td).group(1).split()
    return {c for c in cls if c != "data" and not re.fullmatch(r"(row|col)\d+", c)}


def _text(fragment: str) -> list[str]:
    return re.sub(r"<[^>]*>", " ", fragment).split()


def test_html_cells(report):
    doc = render_html(*report)
    assert doc.startswith("<!DOCTYPE html>") and '<meta charset="utf-8">' in doc
    assert "<title>LP-DL report &lt;mini&gt;</title>" in doc
    cells = _cells(doc)
    assert len(cells) == 4 + 2  # 6 data cells (one None), no other <td>
    ok, div, miss, part, single, absent = cells
    assert "71.23 &plusmn; 0.46" in ok and "paper 72.00" in ok and "-0.77" in ok
    assert _classes(ok) == {"close", "ok"} and 'title="c"' in ok
    assert "diverged (epoch 3)" in div and _classes(div) == {"diverged"}
    # missing: the paper's number for reference, no reproduced number and no delta
    assert _text(miss) == ["missing", "paper", "69.00"] and _classes(miss) == {"missing"}
    assert 'title="c: no result"' in miss
    assert "65.00" in part and "&dagger;" in part and _classes(part) == {"far", "partly-diverged"}
    assert "-3.50" in part and "some seeds diverged (epoch 7); mean of 2 ok seed(s)" in part
    assert "80.00" in single and "&plusmn;" not in single and "+1.75" in single
    assert _classes(single) == {"near", "ok"}
    assert "&mdash;" in absent and _classes(absent) == {"absent"}
    assert 'title="no such cell in the paper"' in absent
    assert '<th id="T_table2_level0_col1" class="col_heading level0 col1" >LP-DS #8</th>' in doc
    assert re.search(r'<th class="index_name level0" >Model/Graph</th>', doc)


def test_html_merges_repeated_row_labels(report):
    doc = render_html(*report)
    ths = re.findall(r'<th id="T_table2_level(\d)_row\d+" class="row_heading[^"]*" ?(rowspan="(\d+)")?>(.*?)</th>', doc)
    # ResNet_20/Ring heads two rows (one cell, rowspan 2); the node counts stay per row
    assert [(lvl, span, text) for lvl, _, span, text in ths] == [
        ("0", "2", "ResNet_20/Ring"), ("1", "", "16"), ("1", "", "32"), ("0", "", "VGG &amp; co"),
        ("1", "", "16")]
    assert doc.count('rowspan="2"') == 1


def test_html_cell_flags_did_not_learn_and_same_run(report):
    header, tables, *rest = report
    flat = Entry(cell_id="c<1>", status="ok", reproduced=12.0, std=0.0, seeds=2, paper=83.82,
                 delta=-71.82, chance=10.0, same_run_as="c&2")
    t = replace(tables[0], rows=(Row(labels=("a", "b"), entries=(flat, None)),), compare="effects")
    td = _cells(render_html(header, [t], *rest))[0]
    assert _classes(td) == {"mini", "ok", "flat"}
    assert "did not learn (chance 10.00)" in td and "= same run as c&amp;2" in td
    assert "c&lt;1&gt;; within 5 points of chance (10.00); computed once: same run as c&amp;2" in td
    assert "&Delta;" not in td  # mini: no delta


def test_html_headings_are_titles_not_ids(report):
    header, tables, *rest = report
    fallback = [replace(tables[0], title=""), replace(tables[0], name="fig1", title="fig1"),
                replace(tables[0], name="table9", title="  ")]
    for doc, heads in ((render_html(*report), ["Table 2"]),
                       (render_html(header, fallback, *rest), ["Table 2", "Figure 1 runs", "Table 9"])):
        h3 = re.findall(r'<section id="table-([^"]*)">\s*<h3>(.*?)</h3>', doc)
        assert [h for _, h in h3] == heads
        toc = re.findall(r'<li><a href="#table-[^"]*">(.*?)</a></li>', doc)
        assert toc == heads
        assert not re.search(r"<h3>(table|fig)\d", doc) and ">table2<" not in doc
    # a caption that repeats its heading does not say it twice
    doc = render_html(header, [replace(tables[0], caption="Table 2. Accuracy of CIFAR-10")], *rest)
    assert '<p class="caption">Accuracy of CIFAR-10</p>' in doc
    # anchors stay derived from the ids
    doc = render_html(header, fallback, *rest)
    assert [a for a, _ in re.findall(r'<section id="table-([^"]*)">\s*<h3>(.*?)</h3>', doc)] == [
        "table2", "fig1", "table9"]


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
    assert "<script" not in doc.lower() and "<style" not in doc.split("</head>")[1]
    for anchor in ("claims", "tables", "figures", "table-table2", "fig-fig1-norm-curves"):
        assert f'href="#{anchor}"' in doc and f'id="{anchor}"' in doc
    # mini: no |delta| bands (stand-in numbers are not comparable); paper: the bands
    assert "not coloured by their" in doc and "|&Delta;| &lt; 1 (close)" not in doc
    assert 'href="#effects"' not in doc  # no effects view given: no link to it
    header, *rest = report
    paper_doc = render_html(replace(header, profile="paper"), *rest)
    assert "|&Delta;| &lt; 1 (close)" in paper_doc and "|&Delta;| &ge; 3 (far)" in paper_doc


def test_html_escapes_every_string_from_the_data(report):
    hostile, effects = _hostile_report(report)
    doc = render_html(*hostile, effects)
    assert "<script" not in doc.lower() and "alert(1)" in doc
    assert "&lt;script&gt;alert(1)&lt;/script&gt; &amp; 50% a_b {x} #1 $y ~z ^w \\ | ]" in doc
    assert "<i>ring</i>" not in doc and "VGG &lt;i&gt;ring&lt;/i&gt; &amp; 8 % nodes" in doc
    # the hostile cell id is escaped inside the title attribute too
    assert 'title="&lt;script&gt;alert(1)&lt;/script&gt; &amp; 50% a_b' in doc
    assert "http://" not in doc and "https://" not in doc


def test_html_paper_profile_has_no_mini_banner(report):
    header, *rest = report
    paper = Header(title="t", profile="paper", profile_note="Full scale.")
    doc = render_html(paper, *rest)
    assert "NOT a reproduction" not in doc and "Profile: paper" in doc


def test_html_mini_tables_are_not_coloured_by_delta(report):
    header, tables, *rest = report
    mini = replace(tables[0], compare="effects")
    cells = _cells(render_html(header, [mini], *rest))
    bands = {"close", "near", "far"}
    assert all(not (_classes(td) & bands) for td in cells)
    assert {"mini", "ok"} <= _classes(cells[0]) and "&Delta;" not in cells[0]
    assert "paper 72.00" in cells[0]


def test_effects_view_html(report):
    doc = render_html(*report, EFFECTS)
    assert 'id="effects"' in doc and 'href="#effects"' in doc
    assert doc.index('id="effects"') < doc.index('id="tables"')
    section = doc[doc.index('<section id="effects">'):doc.index('<section id="tables">')]
    # headings: readable titles, anchors from the ids
    assert re.findall(r'<h3 id="([^"]*)">(.*?)</h3>', section) == [
        ("effects-table2", "Table 2 (CIFAR-10, decentralized)"), ("effects-table5", "Table 5 (NLP)"),
        ("effects-table9", "Table 9")]
    # rows show the block's title when given, else its id; a block's rows share one label
    blocks = re.findall(r'<th class="row_heading[^"]*" ?(?:rowspan="(\d+)")?>(.*?)</th>', section)
    assert blocks[:3] == [("2", "ResNet-20, directed ring, 8 nodes"), ("", "resnet20-dring16"),
                          ("", "VGG &lt;i&gt;ring&lt;/i&gt; &amp; 8 % nodes")]
    assert "resnet20-dring8" not in section
    cells = _cells(section)
    verdicts = [(_classes(td) - {"effect", "num", "verdict"}) for td in cells[::6]]
    assert verdicts == [{"same-sign"}, {"within-noise"}, {"opposite-sign"}, {"missing"},
                        {"not-learned"}, {"no-sign"}]
    assert all(_classes(td) >= {"same-sign"} for td in cells[:6])   # the whole row coloured
    assert "+1.25 ± 0.40" in section and "-1.00 ±" not in section
    assert "3 same sign" not in section and "1 same sign, 1 opposite sign" in section


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
