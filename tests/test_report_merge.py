"""The merge step (report.merge, report.merge_view): per paper table and (skew, compression), the
mean accuracy before the final rounds, after the gossip merge and after one exact average, and the
gains; from a hand-made runs frame, rendered in HTML and LaTeX, and through the whole report."""
from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
import pytest
from report_inputs import PAPER, finish, write_run

from lpdl_core.report import latex
from lpdl_core.report.build import build_report
from lpdl_core.report.html import render_html
from lpdl_core.report.latex import build_pdf, report_tex, write_latex
from lpdl_core.report.merge import EMPTY_REASONS, MINI_NOTE, merge_view
from lpdl_core.report.merge_view import merge_html, merge_tex

from test_report_render import EFFECTS, IN_CI, NO_LATEX, report  # noqa: F401

NO_FINAL, NONE_OK, RERUN = (msg for _, msg in EMPTY_REASONS)


def _run(table, cell, seed, skew, comp, before=None, gossip=None, allreduce=None, *, status="ok",
         rounds=50, same=""):
    return dict(table=table, cell_id=cell, seed=seed, skew=skew, compression=comp, status=status,
                final_gossip_rounds=rounds, same_run_as=same, mean_acc=gossip,
                before_final_mean_acc=before, before_final_avg_model_acc=allreduce,
                before_final_consensus_distance=None if before is None else 0.5)


RUNS = pd.DataFrame([
    _run("fig1", "f", 1, 0.8, 0, None, 55.0, None),                     # made before the recording
    _run("table2", "a", 1, 0.0, 0, 70.0, 80.0, 83.0),
    _run("table2", "a", 2, 0.0, 0, 60.0, 64.0, 59.0),
    _run("table2", "b", 1, 0.0, 0, 70.0, 80.0, 83.0, same="a"),          # a's run: counted once
    _run("table2", "c", 1, 0.9, 99, 40.0, 50.0, 45.0),
    _run("table2", "c", 2, 0.9, 99, 10.0, 90.0, 90.0, status="diverged"),  # never counted
    _run("table2", "d", 1, 0.9, 0, None, 66.0, None),                   # no before_final: empty group
    _run("table2", "e", 1, 0.4, 0, 50.0, 60.0, float("nan")),           # half recorded: left out
    _run("table1", "s", 1, 0.0, 0, None, 91.0, None, rounds=0),
    _run("table3", "q", 1, 0.0, 0, None, None, None, status="diverged"),
])


def _close(a, b):
    return a is not None and math.isclose(a, b, abs_tol=1e-9)


def test_group_means_and_gains_by_hand():
    view = merge_view(RUNS, "mini")
    assert [t.table for t in view.tables] == ["table1", "table2", "table3", "fig1"]  # paper order
    t2 = view.tables[1]
    assert t2.title == "Table 2" and t2.empty == ""
    keys = [(g.skew, g.compression) for g in t2.groups]
    assert keys == [(0.0, 0), (0.4, 0), (0.9, 0), (0.9, 99), (None, None)]  # the table's row last
    g00, g04, g90, g99, every = t2.groups
    # (0, 0): a seeds 1 and 2 (b is a's run): before (70+60)/2, gossip (80+64)/2, all-reduce (83+59)/2
    assert g00.runs == 2 and _close(g00.before, 65.0) and _close(g00.gossip, 72.0) and _close(g00.allreduce, 71.0)
    assert _close(g00.gossip_gain, 7.0) and _close(g00.allreduce_gain, 6.0)  # (10+4)/2, (13-1)/2
    # (0.9, 99): the diverged seed's numbers (which would move every mean) are left out
    assert g99.runs == 1 and (g99.before, g99.gossip, g99.allreduce) == (40.0, 50.0, 45.0)
    assert (g99.gossip_gain, g99.allreduce_gain) == (10.0, 5.0)
    # groups without a run that counts: shown empty, never as zeros
    for g in (g04, g90):
        assert g.runs == 0 and g.before is g.gossip is g.allreduce is g.gossip_gain is g.allreduce_gain is None
    assert every.runs == 3 and _close(every.before, 170 / 3) and _close(every.gossip, 194 / 3)
    assert _close(every.allreduce, 187 / 3) and _close(every.gossip_gain, 8.0) and _close(every.allreduce_gain, 17 / 3)
    assert t2.left_out == ("Runs left out: 1 not ok (diverged or damaged); 2 without the before-final numbers; "
                           "1 recorded as the same run as another cell (counted once).")
    assert view.counted == 3 and view.profile_note == MINI_NOTE
    assert merge_view(RUNS, "paper").profile_note == ""


def test_a_table_without_a_run_that_counts_says_why_in_one_line():
    by = {t.table: t for t in merge_view(RUNS, "mini").tables}
    assert (by["table1"].groups, by["table1"].empty) == ((), NO_FINAL)
    assert (by["table3"].groups, by["table3"].empty) == ((), NONE_OK)
    assert (by["fig1"].groups, by["fig1"].empty) == ((), RERUN) and "rerun" in RERUN
    # a runs.csv written before the before_final columns existed: every table must be rerun
    old = RUNS[RUNS["table"] == "table2"].drop(columns=[c for c in RUNS if c.startswith("before_final")])
    (t,) = merge_view(old, "paper").tables
    assert t.groups == () and t.empty == RERUN
    assert merge_view(RUNS.iloc[:0], "mini").tables == ()


def test_html_and_latex_sections():
    view = merge_view(RUNS, "mini")
    doc = merge_html(view)
    assert '<section id="merge">' in doc and "<h2>The merge step</h2>" in doc
    assert MINI_NOTE.replace("'", "&#39;") in doc and '<h3 id="merge-table2">Table 2 (mini profile)</h3>' in doc
    assert "<strong>Figure 1 runs (mini profile)</strong>: " + RERUN.replace("'", "&#39;") in doc
    assert "<strong>Table 1 (mini profile)</strong>: " + NO_FINAL in doc
    assert "is one all-reduce by construction" in doc
    assert 'class="data row0 col4 num gain" >+7.00</td>' in doc and 'class="data row1 col1 num" >–</td>' in doc
    assert doc.count('class="paper merge"') == 1  # only Table 2 has numbers
    tex = merge_tex(view)
    assert r"\section*{The merge step}" in tex and r"\subsection*{Table 2 (mini profile)}" in tex
    assert r"\textbf{Figure 1 runs (mini profile):} " + RERUN in tex
    assert (r"0 & 0 & 2 & 65.00 & 72.00 & 71.00 & \cellcolor[HTML]{D8F0D8} +7.00 & "
            r"\cellcolor[HTML]{D8F0D8} +6.00 \\") in tex
    assert r"\multirow[t]{2}{*}{0.9} & 0 & 0 & -- & -- & -- & -- & -- \\" in tex
    assert r"all & all & 3 & 56.67 & 64.67 & 62.33" in tex
    paper = merge_tex(merge_view(RUNS, "paper"))
    assert "mini profile" not in paper and MINI_NOTE not in paper and r"\subsection*{Table 2}" in paper
    assert "No runs yet" in merge_html(merge_view(RUNS.iloc[:0], "mini"))


def test_a_gossip_merge_that_loses_is_coloured_as_a_loss_and_ids_are_escaped():
    runs = pd.DataFrame([_run("<b>t&_%", "x", 1, 0.0, 90, 70.0, 68.5, 71.0)])
    view = merge_view(runs, "paper")
    doc, tex = merge_html(view), merge_tex(view)
    assert 'num loss" >-1.50</td>' in doc and 'num gain" >+1.00</td>' in doc and "<b>t" not in doc
    assert r"\cellcolor[HTML]{F8D3D3} -1.50" in tex and r"\textless{}b\textgreater{}t\&\_\%" in tex


def test_the_report_shows_the_section(report):  # noqa: F811
    view = merge_view(RUNS, "mini")
    doc = render_html(*report, merge=view)
    assert '<li><a href="#merge">The merge step</a></li>' in doc and '<section id="merge">' in doc
    assert doc.index('<section id="merge">') < doc.index('<section id="tables">')
    assert 'id="merge"' not in render_html(*report)
    tex = report_tex(*report, {}, merge=view)
    assert r"\section*{The merge step}" in tex and tex.index("The merge step") < tex.index(r"\section{Tables}")
    assert "The merge step" not in report_tex(*report, {})


@pytest.mark.skipif(NO_LATEX and not IN_CI, reason="latexmk/pdflatex not installed")
def test_the_section_compiles(tmp_path, report):  # noqa: F811
    write_latex(tmp_path, *report, EFFECTS, None, merge_view(RUNS, "mini"))
    ok, msg = build_pdf(tmp_path, timeout=120)
    assert ok, msg


def test_build_report_reads_the_before_final_numbers_from_runs_csv(tmp_path: Path):
    root = tmp_path / "results" / "mini"
    cell = "t2-resnet20-dring8-c0-s0-ds-fp32"
    write_run(root, cell, 1, 80.0, before_final={"mean_acc": 70.0, "avg_model_acc": 83.0, "consensus_distance": 2.0})
    write_run(root, cell, 2, 64.0, before_final={"mean_acc": 60.0, "avg_model_acc": 59.0, "consensus_distance": 1.0})
    write_run(root, "fig1-resnet20-dring8-c0-s0.8-choco-fp32-bn", 1, 50.0)  # before the recording
    finish(root, ["table2", "fig1"])
    lines: list[str] = []
    r = build_report(root, tmp_path / "report", paper_dir=PAPER, tables=["table2", "fig1"], pdf=False,
                     log=lines.append)
    html = Path(r["html"]).read_text()
    section = html[html.index('<section id="merge">'):html.index('<section id="tables">')]
    assert 'col1 num" >65.00</td>' in section and 'col4 num gain" >+7.00</td>' in section
    assert 'col5 num gain" >+6.00</td>' in section and "Figure 1 runs (mini profile)</strong>: " in section
    assert "merge: 2 runs with the accuracy before the final rounds, over 2 tables" in lines
    tex = (tmp_path / "report" / "report.tex").read_text()
    assert r"\section*{The merge step}" in tex and latex.tex_escape(RERUN) in tex
