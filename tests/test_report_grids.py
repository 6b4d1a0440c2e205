"""An extension grid's report section (lpdl_core.report.grids, grids_view): effects per varying
axis against the axis's first value, verdicts, the accuracy-versus-bytes figure, and its files."""
import json

import pandas as pd
import pytest

from lpdl_core.errors import CorruptFile
from lpdl_core.report.grids import GridSpec, bytes_figure, grid_effects, grid_section, load_spec
from lpdl_core.report.grids_view import grids_html, grids_tex

SPEC = GridSpec(name="g", description="two methods in two precisions",
                axes={"method": ["A", "B"], "precision": ["fp32", "int8"], "graph": ["ring"]},
                labels={f"g-{m}-{p}": {"method": m, "precision": p, "graph": "ring"}
                        for m in "AB" for p in ("fp32", "int8")})


def _runs(acc: dict, status=None) -> pd.DataFrame:
    """acc: (cell suffix, seed) -> accuracy; 10 classes (chance 10 %)."""
    return pd.DataFrame([{"cell_id": f"g-{c}", "seed": s, "status": (status or {}).get((c, s), "ok"),
                          "mean_acc": a, "num_classes": 10, "mb_per_node": 1.0 + len(c)} for (c, s), a in acc.items()])


def test_effects_compare_each_value_with_the_axis_first_over_matching_pairs():
    acc = {("A-fp32", 1): 80.0, ("B-fp32", 1): 84.0, ("A-int8", 1): 70.0, ("B-int8", 1): 76.0,
           ("A-fp32", 2): 82.0, ("B-fp32", 2): 85.0, ("A-int8", 2): 71.0, ("B-int8", 2): 78.0}
    rows = {r.axis: r for r in grid_effects(SPEC, _runs(acc))}
    assert set(rows) == {"method", "precision"}  # graph has one value: nothing to compare
    m = rows["method"]  # B − A: seed 1 (4 + 6)/2 = 5, seed 2 (3 + 7)/2 = 5
    assert (m.compared, m.pairs, m.seeds, m.effect, m.spread, m.verdict) == ("B − A", 2, 2, 5.0, 0.0, "higher")
    p = rows["precision"]  # int8 − fp32: seed 1 (−10 − 8)/2 = −9, seed 2 (−11 − 7)/2 = −9
    assert (p.compared, p.effect, p.verdict) == ("int8 − fp32", -9.0, "lower")


@pytest.mark.parametrize("acc,status,verdict", [
    # seed spread (|5 − (−5)|: stdev 7.07) larger than the effect (0): within noise
    ({("A-fp32", 1): 80, ("B-fp32", 1): 85, ("A-fp32", 2): 80, ("B-fp32", 2): 75}, None, "within noise"),
    ({("A-fp32", 1): 80, ("B-fp32", 1): 80.01}, None, "no sign"),                  # under SIGN_EPS
    ({("A-fp32", 1): 80, ("B-fp32", 1): 12}, None, "not learned"),                 # B at chance + 2
    ({("A-fp32", 1): 80, ("B-fp32", 1): 90}, {("B-fp32", 1): "diverged"}, "missing"),
])
def test_effect_verdicts(acc, status, verdict):
    rows = {r.axis: r for r in grid_effects(SPEC, _runs(acc, status))}
    assert rows["method"].verdict == verdict


def test_the_figure_and_the_section_from_the_grids_files(tmp_path):
    acc = {("A-fp32", 1): 80.0, ("B-fp32", 1): 84.0, ("A-int8", 1): 70.0}
    assert bytes_figure(SPEC, _runs(acc, {k: "diverged" for k in acc})) is None
    fig = bytes_figure(SPEC, _runs(acc))
    assert fig.png.startswith(b"\x89PNG") and fig.pdf.startswith(b"%PDF") and fig.name == "grid-g-accuracy-bytes"
    (tmp_path / "grid.json").write_text(json.dumps({"name": SPEC.name, "description": SPEC.description,
                                                    "axes": SPEC.axes, "labels": SPEC.labels}))
    _runs(acc).to_csv(tmp_path / "runs.csv", index=False)
    s = grid_section(tmp_path)
    assert (s.cells, s.finished) == (4, 3) and s.figure is not None
    html, tex = grids_html([s], "Mini profile"), grids_tex([s], "Mini profile")
    assert "Grid g" in html and "B − A" in html and "3 of 4 cells finished" in html
    assert "Grid g" in tex and r"\begin{longtable}" in tex and "−" not in tex  # escaped for pdflatex
    (tmp_path / "grid.json").write_text("{not json")
    with pytest.raises(CorruptFile, match="grid.json: not a grid description"):
        load_spec(tmp_path / "grid.json")


def test_grid_json_round_trips_a_loaded_grid():
    from lpdl_core.pipeline.cells.grids import load_grid
    from lpdl_core.report.grids import spec_dict

    g = load_grid("heterogeneity")
    spec = GridSpec(**{k: v for k, v in spec_dict(g).items()})
    assert spec.varying() == g.varying() and spec.labels == g.labels
    assert [r.axis for r in grid_effects(spec, _runs({}))][:1] == ["method"]


def test_a_report_of_grids_alone_has_their_sections_and_no_paper_part(tmp_path):
    """Config `tables: []`: build_report(None, ...) reads only the grids' runs.csv,
    tables/<grid>.csv and grid.json; the header describes their runs; no claims, paper tables or
    paper figures, and claims.json is an empty list."""
    from lpdl_core.report.build import build_report

    grid = tmp_path / "results/mini-g"
    (grid / "tables").mkdir(parents=True)
    (grid / "grid.json").write_text(json.dumps({"name": SPEC.name, "description": SPEC.description,
                                                "axes": SPEC.axes, "labels": SPEC.labels}))
    acc = {("A-fp32", 1): 80.0, ("B-fp32", 1): 84.0, ("A-int8", 1): 70.0}
    runs = _runs(acc).assign(profile="mini", same_run_as="", git_sha="abc", python="3", torch="2",
                             device="cpu", device_name="x", executor="loop", wall_time_s=10.0, git_dirty=False)
    runs.to_csv(grid / "runs.csv", index=False)
    summary = pd.DataFrame([{"cell_id": c, "profile": "mini", "status": "ok" if any(k[0] == c[2:] for k in acc)
                             else "missing", "learned": True} for c in SPEC.labels])
    summary.to_csv(grid / "tables/g.csv", index=False)
    out = build_report(None, tmp_path / "report", grid_dirs=[grid], pdf=False, log=lambda s: None)
    html = out["html"].read_text()
    assert "lpdl report: Extension grids (mini profile)" in html and "Grid g" in html
    assert "3 of 4 (3 ok, 0 diverged, 0 with a damaged run, 1 missing)" in html
    assert 'id="claims"' not in html and 'id="tables"' not in html and "Claims check" not in html
    assert out["figures"] == ["grid-g-accuracy-bytes"] and out["tables"] == [] and out["claims"] == []
    assert json.loads((tmp_path / "report/claims.json").read_text()) == []
    tex = (tmp_path / "report/report.tex").read_text()
    assert r"\section{Claims check}" not in tex and r"\section{Tables}" not in tex and "Grid g" in tex
    with pytest.raises(CorruptFile, match="at least one extension grid"):
        build_report(None, tmp_path / "r2", grid_dirs=[], pdf=False, log=lambda s: None)


def test_the_header_states_the_mini_epochs_the_runs_used():
    """A grid whose cells set mini_epochs trains fewer epochs than the mini profile's: the report's
    protocol line says what the runs used, not the profile's default."""
    from lpdl_core.pipeline.recipe import mini
    from lpdl_core.report.header import mini_protocol

    default = f"{mini.IMAGE_EPOCHS} epochs for images, {mini.TEXT_EPOCHS} for text"
    assert default in mini_protocol(pd.DataFrame({"cell_id": ["a"]}))  # runs.csv of before the column
    assert default in mini_protocol(pd.DataFrame({"mini_epochs": [0, 0]}))
    only = mini_protocol(pd.DataFrame({"mini_epochs": [4, 4]}))
    assert "4 epochs (the cells' mini_epochs)" in only and default not in only
    mixed = mini_protocol(pd.DataFrame({"mini_epochs": [4, None]}))
    assert default in mixed and "4 where a cell's mini_epochs sets them" in mixed


def test_total_compute_time_counts_a_pack_once():
    """Each cell of a pack records the pack's wall time; the header's total counts it once per seed."""
    from lpdl_core.report.header import compute_seconds

    runs = pd.DataFrame({"cell_id": ["a", "b", "c", "a", "b"], "seed": [1, 1, 1, 2, 2],
                         "packed_with": ["b", "a", "", "b", "a"], "wall_time_s": [100.0, 100.0, 10.0, 90.0, 90.0]})
    assert compute_seconds(runs) == 200.0
    assert compute_seconds(runs.drop(columns="packed_with")) == 390.0  # a runs.csv of before the column
    assert compute_seconds(runs.iloc[:0]) == 0.0
