"""Paper text vs official code: two results folders of one profile, one per fidelity mode, side by
side in the report (report.modes, report.modes_view), built from synthetic run folders through the
files the DAG gives the report (runs.csv and tables/*.csv of both folders)."""
from __future__ import annotations

import argparse
import re
from pathlib import Path

import pandas as pd
import pytest
from report_inputs import PAPER, finish, write_run

from lpdl_core.cli import build_parser
from lpdl_core.config import Fidelity
from lpdl_core.errors import CorruptFile
from lpdl_core.report import build as build_module
from lpdl_core.report.build import build_report
from lpdl_core.report.data import load_report_data
from lpdl_core.report.modes import column_modes, compare_modes, headline, mode_labels, runs_mode

T2 = "t2-resnet20-dring8-c0-s0-{algo}-{prec}"
DS_FP, DS_LP = T2.format(algo="ds", prec="fp32"), T2.format(algo="ds", prec="int8")
CHOCO_FP, CHOCO_LP = T2.format(algo="choco", prec="fp32"), T2.format(algo="choco", prec="int8")
ONLY_OFFICIAL = "t2-resnet20-dring8-c0-s0.4-ds-fp32"
TABLES = ["table2", "fig1"]
OFFICIAL = Fidelity.preset("official").as_dict()


@pytest.fixture
def folders(tmp_path: Path) -> tuple[Path, Path]:
    """results/mini (paper text) and results/mini-official (official code):
    DS fp32 90 vs 92.5 (+2.50), DS int8 mean 80 (2 seeds) vs 79 (-1.00), CHOCO fp32 diverged on
    the official side, CHOCO int8 missing on the official side, one cell only on the official
    side."""
    paper, official = tmp_path / "results" / "mini", tmp_path / "results" / "mini-official"
    write_run(paper, DS_FP, 1, 90.0)
    write_run(official, DS_FP, 1, 92.5, fidelity=OFFICIAL)
    write_run(paper, DS_LP, 1, 79.0)
    write_run(paper, DS_LP, 2, 81.0)
    write_run(official, DS_LP, 1, 79.0, fidelity=OFFICIAL)
    write_run(paper, CHOCO_FP, 1, 85.0)
    write_run(official, CHOCO_FP, 1, None, fidelity=OFFICIAL)
    write_run(paper, CHOCO_LP, 1, 70.0)
    write_run(official, ONLY_OFFICIAL, 1, 60.0, fidelity=OFFICIAL)
    for root in (paper, official):
        finish(root, TABLES, cost=False, partitions=False)
    return paper, official


def _summary(root: Path) -> pd.DataFrame:
    return pd.concat([pd.read_csv(root / "tables" / f"{t}.csv") for t in TABLES], ignore_index=True)


def _by_id(frame: pd.DataFrame) -> dict[str, dict]:
    return {r["cell_id"]: r for r in frame.to_dict("records")}


def test_the_frame_has_each_cells_two_modes_and_their_difference(folders):
    paper, official = folders
    frame = compare_modes(_summary(paper), _summary(official), "paper", "official")
    rows = _by_id(frame)
    assert rows[DS_FP]["paper_text"] == 90.0 and rows[DS_FP]["official"] == 92.5
    assert rows[DS_FP]["delta"] == pytest.approx(2.5)
    assert rows[DS_LP]["paper_text"] == 80.0 and rows[DS_LP]["delta"] == pytest.approx(-1.0)
    assert rows[DS_LP]["seeds_paper_text"] == 2 and rows[DS_LP]["seeds_official"] == 1
    assert rows[DS_FP]["paper"] == 90.56 and rows[DS_FP]["learned_official"] is True
    # diverged or missing on one side: no delta, and the missing side is never filled
    assert rows[CHOCO_FP]["status_official"] == "diverged" and rows[CHOCO_FP]["official"] is None
    assert rows[CHOCO_FP]["delta"] is None
    assert rows[CHOCO_LP]["status_official"] == "missing" and rows[CHOCO_LP]["official"] is None
    assert rows[CHOCO_LP]["delta"] is None and rows[CHOCO_LP]["paper_text"] == 70.0
    assert rows[ONLY_OFFICIAL]["paper_text"] is None and rows[ONLY_OFFICIAL]["official"] == 60.0
    # the cell axes, paper order, and the modes of the two columns
    assert rows[DS_LP]["precision"] == "int8" and rows[DS_LP]["block"] == "resnet20-dring8"
    assert frame["cell_id"].tolist() == _summary(paper)["cell_id"].tolist()
    assert frame.attrs["modes"] == ("paper", "official")


def test_sides_follow_the_modes_not_the_folder_order(folders):
    paper, official = folders
    swapped = compare_modes(_summary(official), _summary(paper), "official", "paper")
    rows = _by_id(swapped)
    assert rows[DS_FP]["paper_text"] == 90.0 and rows[DS_FP]["official"] == 92.5
    assert rows[DS_FP]["delta"] == pytest.approx(2.5)
    assert swapped.attrs["modes"] == ("paper", "official")
    # mixed is labelled mixed, never official or paper text
    assert column_modes("mixed", "official") == (False, ("mixed", "official"))
    assert column_modes("official", "mixed") == (True, ("mixed", "official"))
    assert column_modes("mixed", "paper") == (True, ("paper", "mixed"))
    assert mode_labels(("paper", "mixed")) == ("Paper text", "Mixed fidelity")
    assert mode_labels(("paper", "paper")) == ("Paper text (this folder)", "Paper text (compare folder)")


def test_a_cell_only_in_one_summary_is_not_in_the_frame(folders):
    paper, official = folders
    other = _summary(official)
    other = other[other["cell_id"] != DS_LP]
    frame = compare_modes(_summary(paper), other, "paper", "official")
    assert DS_LP not in set(frame["cell_id"]) and DS_FP in set(frame["cell_id"])
    assert len(frame) == len(other)


def test_headline(folders):
    paper, official = folders
    h = headline(compare_modes(_summary(paper), _summary(official), "paper", "official"))
    assert h["cells"] == 2
    assert h["mean_abs_delta"] == pytest.approx(1.75)
    assert h["max_abs_delta"] == pytest.approx(2.5) and h["max_delta"] == pytest.approx(2.5)
    assert h["max_cell"] == DS_FP
    empty = headline(compare_modes(_summary(paper), _summary(paper).iloc[:0], "paper", "official"))
    assert empty == {"cells": 0, "mean_abs_delta": None, "max_abs_delta": None, "max_delta": None,
                     "max_cell": None}


def test_runs_mode_from_the_fidelity_columns():
    paper = {f"fidelity_{k}": v for k, v in Fidelity().as_dict().items()}
    official = {f"fidelity_{k}": v for k, v in OFFICIAL.items()}
    assert runs_mode(pd.DataFrame([paper, paper])) == "paper"
    assert runs_mode(pd.DataFrame([official])) == "official"
    assert runs_mode(pd.DataFrame([paper, official])) == "mixed"
    assert runs_mode(pd.DataFrame([{**paper, "fidelity_act_rounding": "stochastic"}])) == "mixed"
    assert runs_mode(pd.DataFrame([{"cell_id": "x", "seed": 1}])) == "unknown"     # no fidelity columns
    assert runs_mode(pd.DataFrame([{"fidelity_official_quant": True}])) == "unknown"  # an older runs.csv
    assert runs_mode(pd.DataFrame(columns=list(paper))) == "unknown"               # no runs


def test_load_report_data_reads_the_compare_folder(folders):
    paper, official = folders
    data = load_report_data(paper, PAPER, tables=TABLES, compare_dir=official)
    assert data.mode_names == ("paper", "official")
    assert _by_id(data.modes)[DS_FP]["delta"] == pytest.approx(2.5)
    options = {o for o, _, _ in data.mode_options}
    assert {"quant_ranges", "act_rounding", "choco_form"} <= options
    assert ("quant_ranges", "buffers", "gossiped") in data.mode_options
    # the official folder as this one: the columns still follow the modes
    back = load_report_data(official, PAPER, tables=TABLES, compare_dir=paper)
    assert back.mode_names == ("paper", "official")
    assert _by_id(back.modes)[DS_FP]["paper_text"] == 90.0
    assert ("quant_ranges", "buffers", "gossiped") in back.mode_options
    # without a compare folder nothing changes
    plain = load_report_data(paper, PAPER, tables=TABLES)
    assert plain.modes is None and plain.mode_names == () and plain.mode_options == ()


def test_a_missing_compare_file_is_one_line_naming_it(folders):
    paper, official = folders
    (official / "tables" / "fig1.csv").unlink()
    with pytest.raises(CorruptFile) as e:
        load_report_data(paper, PAPER, tables=TABLES, compare_dir=official)
    assert str(official / "tables" / "fig1.csv") in str(e.value) and "\n" not in str(e.value)
    (official / "runs.csv").unlink()
    with pytest.raises(CorruptFile, match=re.escape(str(official / "runs.csv"))):
        load_report_data(paper, PAPER, tables=TABLES, compare_dir=official)


@pytest.fixture
def no_figures(monkeypatch):
    """The figures are not what these tests check (and take seconds)."""
    monkeypatch.setattr(build_module, "_figures", lambda data, log: ([], []))


def _section(html: str) -> str:
    start = html.index('<section id="modes">')
    return html[start:html.index("</section>", start)]  # the sections after it (the merge step) are not its


def test_the_report_shows_both_modes_side_by_side(folders, tmp_path, no_figures):
    paper, official = folders
    r = build_report(paper, tmp_path / "report", paper_dir=PAPER, tables=TABLES, pdf=False,
                     compare_dir=official, log=lambda s: None)
    assert r["modes"]["cells"] == 2 and r["modes"]["max_cell"] == DS_FP
    html = Path(r["html"]).read_text()
    assert '<a href="#modes">Paper text vs official code</a>' in html   # in the table of contents
    section = _section(html)
    assert "<h2>Paper text vs official code</h2>" in section
    assert "Mean |Δ| = 1.75 accuracy points over 2 cells" in section
    assert "the largest |Δ| is 2.50" in section
    assert "ResNet-20, Directed Ring, 8 nodes, 0 % compression, skew 0, DS (32-bit)" in section
    assert '<h3 id="modes-table2">Table 2</h3>' in section and ">table2<" not in section
    assert ">LP-DS (8-bit)</th>" in section and ">ResNet-20, Directed Ring, 8 nodes</th>" in section
    assert ">+2.50</td>" in section and ">-1.00</td>" in section
    assert ">Paper text</th>" in section and ">Official code</th>" in section
    assert "quant_ranges (buffers → gossiped)" in section
    assert ">diverged</td>" in section and ">missing</td>" in section
    # Δ coloured by the report's bands; a cell without a result in either folder is left out
    assert re.search(r'class="data row\d+ col2 num delta near"[^>]*>\+2\.50<', section)
    assert "t2-resnet20-dring8-c0-s0.4-ds-int8" not in section
    tex = (tmp_path / "report" / "report.tex").read_text()
    assert r"\section*{Paper text vs official code}" in tex
    assert r"$+$2.50" in tex and r"$-$1.00" in tex
    assert "LP-DS (8-bit)" in tex and "ResNet-20, Directed Ring, 8 nodes" in tex
    assert r"\subsection*{Table 2}" in tex and r"quant\_ranges (buffers $\rightarrow$ gossiped)" in tex


def test_a_side_that_did_not_learn_is_marked(tmp_path, no_figures):
    paper, official = tmp_path / "results" / "mini", tmp_path / "results" / "mini-official"
    write_run(paper, DS_FP, 1, 12.0)           # chance 10 %: within the margin
    write_run(official, DS_FP, 1, 50.0, fidelity=OFFICIAL)
    for root in (paper, official):
        finish(root, TABLES, cost=False, partitions=False)
    r = build_report(paper, tmp_path / "report", paper_dir=PAPER, tables=TABLES, pdf=False,
                     compare_dir=official, log=lambda s: None)
    section = _section(Path(r["html"]).read_text())
    assert re.search(r'class="data row0 col0 num ok flat"[^>]*>12\.00 n\.l\.<', section)
    tex = (tmp_path / "report" / "report.tex").read_text()
    assert r"\cellcolor[HTML]{ECEFF1} 12.00 n.l." in tex


def test_without_a_compare_folder_there_is_no_such_section(folders, tmp_path, no_figures):
    paper, _ = folders
    r = build_report(paper, tmp_path / "report", paper_dir=PAPER, tables=TABLES, pdf=False, log=lambda s: None)
    html = Path(r["html"]).read_text()
    tex = (tmp_path / "report" / "report.tex").read_text()
    assert r["modes"] is None
    assert 'id="modes"' not in html and 'href="#modes"' not in html and "Paper text vs" not in html
    assert "Paper text vs" not in tex and "sec:modes" not in tex


def test_a_compare_folder_of_paper_text_runs_is_never_labelled_official(folders, tmp_path, no_figures):
    paper, _ = folders
    other = tmp_path / "results" / "other" / "mini"
    write_run(other, DS_FP, 1, 91.0)
    finish(other, TABLES, cost=False, partitions=False)
    data = load_report_data(paper, PAPER, tables=TABLES, compare_dir=other)
    assert data.mode_names == ("paper", "paper") and data.mode_options == ()
    assert any("not the paper text beside the official code" in n for n in data.notes)
    r = build_report(paper, tmp_path / "report", paper_dir=PAPER, tables=TABLES, pdf=False,
                     compare_dir=other, log=lambda s: None)
    html = Path(r["html"]).read_text()
    section = _section(html)
    assert "<h2>Paper text vs paper text</h2>" in section
    assert ">Paper text (this folder)</th>" in section and ">Paper text (compare folder)</th>" in section
    assert "official" not in section.lower()
    assert ">+1.00</td>" in section
    tex = (tmp_path / "report" / "report.tex").read_text()
    start = tex.index(r"\section*{Paper text vs paper text}")
    modes_tex = tex[start:tex.index(r"\clearpage", start)]  # the next section (the merge step) is not its
    assert "official" not in modes_tex.lower()


def test_the_cli_passes_compare_on(folders, tmp_path, monkeypatch):
    paper, official = folders
    parser = build_parser()
    args = parser.parse_args(["report", "--results", str(paper), "--out", str(tmp_path / "r"),
                              "--compare", str(official), "--no-pdf"])
    assert args.compare == str(official)
    assert parser.parse_args(["report"]).compare is None
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    compare = next(a for a in sub.choices["report"]._actions if a.dest == "compare")
    assert compare.help.startswith("another results folder of the same profile in the other fidelity mode, "
                                   "shown side by side")
    seen = {}
    monkeypatch.setattr(build_module, "build_report", lambda *a, **kw: seen.update(kw) or {
        "html": "x", "pdf": None, "claims": [], "figures": [], "tables": []})
    assert args.func(args) == 0 and seen["compare_dir"] == str(official)


@pytest.mark.slow
def test_the_modes_section_builds_as_pdf(tmp_path, no_figures):
    """Every table of both folders through pdflatex (CI installs LaTeX; elsewhere skipped without it)."""
    import os
    import shutil

    from report_inputs import CELLS
    if shutil.which("latexmk") is None and os.environ.get("CI") != "true":
        pytest.skip("latexmk not installed")
    paper, official = tmp_path / "results" / "mini", tmp_path / "results" / "mini-official"
    for i, cell_id in enumerate(CELLS):
        write_run(paper, cell_id, 1, 20.0 + i % 70)
        if i % 5:
            write_run(official, cell_id, 1, 25.0 + i % 60 if i % 7 else None, fidelity=OFFICIAL)
    for root in (paper, official):
        finish(root, cost=False, partitions=False)
    r = build_report(paper, tmp_path / "report", paper_dir=PAPER, pdf=True, compare_dir=official,
                     log=lambda s: None)
    assert r["pdf"] is not None, r["pdf_message"]
    assert Path(r["pdf"]).read_bytes().startswith(b"%PDF")
