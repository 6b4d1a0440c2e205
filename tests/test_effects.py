"""The mini profile's report compares effects, not absolute numbers: pairs differ in one axis,
cells near chance are flagged and left out, seed noise is called noise, shared runs say so."""
import json
import re
from pathlib import Path

import pytest
from report_inputs import CELLS, PAPER, finish, report_data

from lpdl_core.config import Fidelity
from lpdl_core.pipeline.run.runstore import run_identity
from lpdl_core.report.build import build_report, mini_effects
from lpdl_core.report.claims import check_claims
from lpdl_core.report.data import not_learned_cells
from lpdl_core.report.effects import EffectRow, block_effects
from lpdl_core.report.effects_view import effects_html, effects_tex
from lpdl_core.report.header import build_header
from lpdl_core.report.latex import tex_escape
from lpdl_core.report.tables import paper_table

FID = Fidelity().as_dict()


def run(root: Path, cell_id: str, seed: int, acc: float, classes: int | None = 10, **config) -> None:
    """One finished run's metrics.json (classes None: written before num_classes was recorded)."""
    d = root / "runs" / cell_id / f"seed{seed}"
    d.mkdir(parents=True)
    c = CELLS[cell_id]
    m = {"status": "ok", "epochs_done": 4, "diverged_at": None, **({"num_classes": classes} if classes else {}),
         "identity": run_identity(c, profile=root.name, seed=seed, fidelity=FID),
         "final": {"mean_acc": acc, "avg_model_acc": acc, "consensus_distance": 0.1, "mean_loss": 0.5},
         "bytes_per_node": 1.0, "wall_time_s": 5.0, "executor": "loop", "device": "cpu",
         "config": {"cell_id": cell_id, "fidelity": FID, "mapping": ["model resnet20 -> mini-resnet20"], **config},
         "provenance": {"git_sha": "abc", "git_dirty": False}}
    (d / "metrics.json").write_text(json.dumps(m))


def t2(skew, algo, prec, comp=0):
    return f"t2-resnet20-dring8-c{comp}-s{skew:g}-{algo}-{prec}"


def test_effect_pairs_differ_in_one_axis_and_keep_tables_apart():
    cells = [CELLS[i] for i in ("t1-agnews-distilbert-single-c0-s0-none-fp32",
                                "t1-agnews-distilbert-single-c0-s0-none-int8",
                                "t5-agnews-distilbert-dring4-c0-s0-ds-fp32",
                                "t5-agnews-distilbert-dring4-c0-s0-ds-int8")]
    acc = {(cells[0].cell_id, 1): 70.0, (cells[1].cell_id, 1): 66.0,
           (cells[2].cell_id, 1): 60.0, (cells[3].cell_id, 1): 61.0}
    rows = block_effects(cells, acc, [1], {c.cell_id: 4 for c in cells})
    fp_lp = {(r.table, r.block): r for r in rows if r.effect == "FP − LP"}
    # both tables name their block "agnews-distilbert": one row each, one pair each
    assert fp_lp["table1", "agnews-distilbert"].pairs == 1 and fp_lp["table1", "agnews-distilbert"].reproduced == 4.0
    assert fp_lp["table5", "agnews-distilbert"].reproduced == -1.0
    assert fp_lp["table5", "agnews-distilbert"].verdict == "opposite sign"      # paper: FP > LP
    assert fp_lp["table1", "agnews-distilbert"].verdict == "same sign"


def test_cells_near_chance_are_left_out_and_seed_noise_is_noise():
    ids = [t2(0, "ds", "fp32"), t2(0, "ds", "int8")]
    cells = [CELLS[i] for i in ids]
    classes = {i: 10 for i in ids}
    flat = block_effects(cells, {(ids[0], 1): 90.0, (ids[1], 1): 14.0}, [1], classes)
    assert [r.verdict for r in flat if r.effect == "FP − LP"] == ["not learned"]
    noisy = {(ids[0], 1): 90.0, (ids[1], 1): 88.0, (ids[0], 2): 88.0, (ids[1], 2): 90.0,
             (ids[0], 3): 91.0, (ids[1], 3): 90.0}
    r = next(r for r in block_effects(cells, noisy, [1, 2, 3], classes) if r.effect == "FP − LP")
    assert r.seeds == 3 and r.reproduced == pytest.approx(1 / 3) and r.spread == pytest.approx(2.0817, abs=1e-4)
    assert r.verdict == "within noise"


@pytest.fixture
def mini(tmp_path: Path) -> Path:
    root = tmp_path / "results" / "mini"
    for seed, (fp, lp) in zip((1, 2), ((95.0, 93.0), (96.0, 93.5))):
        run(root, t2(0, "ds", "fp32"), seed, fp)
        run(root, t2(0, "ds", "int8"), seed, lp)
        run(root, t2(0, "choco", "fp32"), seed, fp, same_run_as=t2(0, "ds", "fp32"))
        run(root, t2(0, "choco", "int8"), seed, lp, same_run_as=t2(0, "ds", "int8"))
        run(root, t2(0.9, "ds", "fp32"), seed, 12.0)   # within 5 points of chance (10 %)
    return root


def test_mini_tables_flag_flat_cells_and_shared_runs_without_delta_colours(mini):
    data = report_data(mini, ["table2"])
    t = paper_table(data, "table2")
    entries = {e.cell_id: e for r in t.rows for e in r.entries if e is not None}
    assert t.compare == "effects"
    assert entries[t2(0.9, "ds", "fp32")].learned is False and entries[t2(0, "ds", "fp32")].learned is True
    assert entries[t2(0, "choco", "fp32")].same_run_as == t2(0, "ds", "fp32")
    effects = {r.effect: r for r in mini_effects(data) if r.block == "resnet20-dring8"}
    assert effects["FP − LP"].reproduced == pytest.approx(2.25) and effects["FP − LP"].verdict == "same sign"
    assert effects["skew drop (smallest − largest skew)"].verdict == "not learned"


def test_mini_report_shows_effects_and_flags(mini, tmp_path):
    r = build_report(finish(mini, ["table2"]), tmp_path / "rep", paper_dir=PAPER, tables=["table2"], pdf=False,
                     log=lambda s: None)
    html = r["html"].read_text()
    assert 'id="effects"' in html and "Effects: paper vs reproduction" in html
    assert "did not learn (chance 10.00)" in html and "same run as " + t2(0, "ds", "fp32") in html
    assert "1 of 128 cells did not learn" in html
    assert not re.search(r'class="data row\d+ col\d+ (close|near|far) ', html)   # no |delta| colours in mini
    tex = (tmp_path / "rep" / "report.tex").read_text()
    assert "Effects: paper vs reproduction" in tex
    table = (tmp_path / "rep" / "tables" / "table2.tex").read_text()
    assert r"\cellcolor[HTML]{ECEFF1} 12.00$\pm$0.00 / 83.82 (n.l.)" in table and "($-$" not in table
    assert r"95.50$\pm$0.71$^{=}$ / 90.96 &" in table
    # claims skip the flat cell: the skew claim has no learned pair
    data = report_data(mini, ["table2"])
    assert all(t2(0.9, "ds", "fp32") not in c.evidence for c in check_claims(data))


def test_paper_profile_keeps_absolute_comparison(tmp_path):
    root = tmp_path / "results" / "paper"
    run(root, t2(0, "ds", "fp32"), 1234, 90.0)
    r = build_report(finish(root, ["table2"]), tmp_path / "rep", paper_dir=PAPER, tables=["table2"], pdf=False,
                     log=lambda s: None)
    html = r["html"].read_text()
    assert 'id="effects"' not in html and "&Delta; -0.56" in html   # paper 90.56


def test_a_claim_that_fails_within_seed_noise_says_within_noise(tmp_path):
    root = tmp_path / "results" / "mini"
    # CHOCO - DS per seed: -3, +2 (compressed pairs, so distinct runs): mean -0.5, spread 3.5
    for skew, base in ((0, 90.0), (0.4, 85.0)):
        for seed, d in ((1, -3.0), (2, 2.0)):
            run(root, t2(skew, "ds", "fp32", 99), seed, base)
            run(root, t2(skew, "choco", "fp32", 99), seed, base + d)
    claims = {c.number: c for c in check_claims(report_data(root, ["table2"]))}
    assert claims[3].verdict == "within noise" and "at 4 epochs: -0.50 ± 3.54 over 2 seeds" in claims[3].evidence


def test_pairs_differ_in_the_effect_axis_alone():
    """8 vs 16 nodes pairs only the uncompressed cells of the same setting (block and batch per
    node change with the node count); a CHOCO result at one skew never pairs with DS at another."""
    c0 = [c for c in CELLS.values() if c.table == "table2" and c.model == "resnet20" and c.compression == 0]
    acc = {(c.cell_id, 1): 92.0 if c.nodes == 8 else 89.0 for c in c0}
    acc["t2-resnet20-dring16-c90-s0-ds-fp32", 1] = 20.0     # compressed: no 8-node partner
    rows = {(r.effect, r.block): r for r in block_effects(CELLS.values(), acc, [1], {})}
    nodes = rows["8 − 16 nodes", "resnet20-dring8 vs resnet20-dring16"]
    assert (nodes.pairs, nodes.reproduced, nodes.verdict) == (16, 3.0, "same sign")
    assert nodes.paper == pytest.approx(2.1525)       # the paper's mean over the same 16 pairs
    assert rows["CHOCO − DS", "resnet20-dring8"].reproduced == 0.0
    lone = {(t2(0, "choco", "fp32"), 1): 91.0, (t2(0.4, "ds", "fp32"), 1): 80.0}
    choco = next(r for r in block_effects(CELLS.values(), lone, [1], {}) if r.effect == "CHOCO − DS"
                 and r.block == "resnet20-dring8")
    assert choco.verdict == "missing" and choco.pairs == 0 and choco.reproduced is None


def test_sign_and_noise_verdicts():
    ids = [t2(0, "ds", "fp32", 99), t2(0, "ds", "int8", 99)]  # paper: FP 88.67 > LP 87.58
    cells, classes = [CELLS[i] for i in ids], {i: 10 for i in ids}

    def verdict(per_seed: dict[int, tuple[float, float]]) -> str:
        acc = {(i, s): v for s, pair in per_seed.items() for i, v in zip(ids, pair)}
        return next(r for r in block_effects(cells, acc, per_seed, classes) if r.effect == "FP − LP").verdict

    assert verdict({1: (90.0, 87.0), 2: (91.0, 87.5)}) == "same sign"        # +3.5 ± 0.7
    assert verdict({1: (87.0, 90.0), 2: (87.5, 91.0)}) == "opposite sign"      # -3.5 ± 0.7
    assert verdict({1: (90.0, 89.0), 2: (89.0, 89.5)}) == "within noise"  # +0.25 ± 1.06
    assert verdict({1: (90.0, 89.0)}) == "same sign"                          # one seed: no spread
    assert verdict({1: (90.0, 90.0), 2: (89.0, 89.0)}) == "no sign"          # 0 ± 0: no sign, no noise


def test_chance_comes_from_the_runs_classes(tmp_path):
    """Chance is 100 / the classes the run recorded (num_classes, else partition.csv's class
    columns), never a per-table constant: 28 % is flat on 4 classes and learned on 10."""
    root = tmp_path / "results" / "mini"
    run(root, t2(0, "ds", "fp32"), 1, 28.0, classes=4)
    run(root, t2(0, "ds", "int8"), 1, 28.0, classes=10)
    run(root, t2(0, "choco", "fp32"), 1, 40.0, classes=None)   # older run: no num_classes ...
    part = root / "runs" / t2(0, "choco", "fp32") / "seed1" / "partition.csv"
    part.write_text("node,a,b,total\n0,5,5,10\n")              # ... but 2 classes in its partition
    run(root, t2(0, "choco", "int8"), 1, 60.0, classes=None)   # nothing recorded: cannot judge
    data = report_data(root, ["table2"])
    e = {x.cell_id: x for r in paper_table(data, "table2").rows for x in r.entries if x}
    assert (e[t2(0, "ds", "fp32")].chance, e[t2(0, "ds", "fp32")].learned) == (25.0, False)
    assert (e[t2(0, "ds", "int8")].chance, e[t2(0, "ds", "int8")].learned) == (10.0, True)
    assert (e[t2(0, "choco", "fp32")].chance, e[t2(0, "choco", "fp32")].learned) == (50.0, False)
    assert e[t2(0, "choco", "int8")].chance is None and e[t2(0, "choco", "int8")].learned is None
    assert not_learned_cells(data) == [t2(0, "ds", "fp32"), t2(0, "choco", "fp32")]


def test_every_block_has_an_effects_row_with_or_without_results(mini):
    rows = mini_effects(report_data(mini, ["table2"]))
    assert len(rows) == 17            # 4 blocks x (FP-LP, CHOCO-DS, skew, 0%-compressed) + 8-16 nodes
    by = {(r.effect, r.block): r.verdict for r in rows}
    assert by["FP − LP", "resnet54-dring8"] == "missing"
    assert by["CHOCO − DS", "resnet20-dring8"] == "no sign"       # the same run: exactly 0 ± 0
    assert by["FP − LP", "resnet20-dring8"] == "same sign"


def test_effects_view_groups_by_table_and_colours_rows_by_verdict():
    def row(table, block, verdict, reproduced=None, spread=None, seeds=0):
        return EffectRow(effect="FP − LP", table=table, block=block, pairs=1 if seeds else 0, paper=0.5,
                         reproduced=reproduced, spread=spread, seeds=seeds, verdict=verdict)
    rows = [row("table5", "agnews-distilbert", "opposite sign", -1.0, None, 1),
            row("table1", "cifar10-resnet20", "same sign", 1.25, 0.4, 3),
            row("table2", "resnet20-dring8", "missing")]
    html = effects_html(rows)
    assert html.index("Table 1 (single node)") < html.index("Table 2") < html.index("Table 5 (NLP)")
    assert re.search(r'>cifar10-resnet20</th>\s*<td class="data row0 col0 same-sign effect" >', html)
    assert re.search(r'>agnews-distilbert</th>\s*<td class="data row0 col0 opposite-sign effect" >', html)
    assert ' missing effect" >' in html and "1 same sign, 1 opposite sign, 1 missing" in html
    assert "+1.25 ± 0.40" in html and "-1.00 ±" not in html     # ± only with two or more seeds
    tex = effects_tex(rows, tex_escape)
    assert r"cifar10-resnet20 & \cellcolor{green!15} FP - LP" in tex
    assert r"agnews-distilbert & \cellcolor{red!15} FP - LP" in tex
    assert tex.count(r"\begin{longtable}") == 3


def test_header_counts_shared_runs_and_flat_cells(mini, tmp_path):
    h = build_header(report_data(mini, ["table2"]))
    facts = dict(h.facts)
    assert facts["shared runs"].startswith("2 cells share a run with another cell")
    assert facts["runs"] == "10 (4 recorded as the same run as another cell, computed once)"
    assert any(w.startswith("1 of 128 cells did not learn") and "left out of the effects" in w
               for w in h.warnings)
    root = tmp_path / "results" / "paper"                   # no same_run_as key anywhere
    run(root, t2(0, "ds", "fp32"), 1234, 90.0)
    data = report_data(root, ["table2"])
    assert dict(build_header(data).facts)["shared runs"].startswith("none")
    assert all(e.same_run_as == "" for r in paper_table(data, "table2").rows for e in r.entries if e)


def test_paper_profile_flags_flat_cells_but_keeps_deltas_and_claims(tmp_path):
    root = tmp_path / "results" / "paper"
    for skew, fp, lp in ((0, 90.0, 89.0), (0.4, 88.0, 87.5)):
        run(root, t2(skew, "ds", "fp32"), 1234, fp)
        run(root, t2(skew, "ds", "int8"), 1234, lp)
    run(root, t2(0.9, "ds", "fp32"), 1234, 11.0)
    run(root, t2(0.9, "ds", "int8"), 1234, 12.0)
    r = build_report(finish(root, ["table2"]), tmp_path / "rep", paper_dir=PAPER, tables=["table2"], pdf=False,
                     log=lambda s: None)
    html = r["html"].read_text()
    assert 'id="effects"' not in html and "did not learn (chance 10.00)" in html
    assert re.search(r'class="data row\d+ col\d+ far ok flat"', html)          # |Δ| colours kept
    assert re.search(r'class="data row\d+ col\d+ close ok"', html)
    assert "2 of 128 cells did not learn" in html and "still used by the claims" in html
    table = (tmp_path / "rep" / "tables" / "table2.tex").read_text()
    assert r"\cellcolor[HTML]{ECEFF1} 11.00 / 83.82 ($-$72.82) (n.l.)" in table
    claims = {c.number: c for c in r["claims"]}
    assert claims[1].cells == 3                      # the flat pair is judged in the paper profile
    assert claims[4].verdict == "holds" and "at the paper's protocol: +78.00" in claims[4].evidence


def test_mini_claims_skip_flat_pairs(tmp_path):
    root = tmp_path / "results" / "mini"
    for skew, fp, lp in ((0, 90.0, 89.0), (0.4, 88.0, 87.5), (0.9, 11.0, 60.0)):
        run(root, t2(skew, "ds", "fp32"), 1, fp)
        run(root, t2(skew, "ds", "int8"), 1, lp)
    claims = {c.number: c for c in check_claims(report_data(root, ["table2"]))}
    assert claims[1].cells == 2 and "at 4 epochs: +0.75" in claims[1].evidence   # skew-0.9 pair left out
    assert claims[1].verdict == "not judged at one length" and "make reproduce-claims" in claims[1].evidence
    # skew trend over learned cells only: fp32 0 -> 0.4 drops 2 (not 79 to the flat 11), int8 0 -> 0.9 29
    assert claims[4].verdict == "holds" and claims[4].cells == 2 and "at 4 epochs: +15.50" in claims[4].evidence


def test_skew_claim_within_seed_noise(tmp_path):
    root = tmp_path / "results" / "mini"
    # drop (skew 0 - skew 0.9) per seed: seed 1 -4, seed 2 +3 -> mean -0.5, spread 4.95
    for seed, d in ((1, -4.0), (2, 3.0)):
        for algo in ("ds", "choco"):
            run(root, t2(0, algo, "fp32", 99), seed, 80.0)
            run(root, t2(0.9, algo, "fp32", 99), seed, 80.0 - d)
    c4 = {c.number: c for c in check_claims(report_data(root, ["table2"]))}[4]
    assert c4.verdict == "within noise" and "at 4 epochs: -0.50 ± 4.95 over 2 seeds" in c4.evidence
