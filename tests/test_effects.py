"""The mini profile's report compares effects, not absolute numbers: pairs differ in one axis,
cells near chance are flagged and left out, seed noise is called noise, shared runs say so."""
import json
from pathlib import Path

import pytest

from lpdl_core.cells import load_cells
from lpdl_core.report.build import build_report, mini_effects
from lpdl_core.report.claims import check_claims
from lpdl_core.report.data import load_report_data
from lpdl_core.report.effects import block_effects
from lpdl_core.report.tables import paper_table
from lpdl_core.runstore import run_identity

PAPER = Path(__file__).resolve().parents[1] / "workflow" / "paper"
CELLS = {c.cell_id: c for c in load_cells(PAPER)}
FID = {"official_quant": False, "choco_form": "paper", "choco_replicas": "per-neighbour", "bytes_metric": "exact"}


def run(root: Path, cell_id: str, seed: int, acc: float, classes: int = 10, **config) -> None:
    d = root / "runs" / cell_id / f"seed{seed}"
    d.mkdir(parents=True)
    c = CELLS[cell_id]
    m = {"status": "ok", "epochs_done": 4, "diverged_at": None, "num_classes": classes,
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
    assert fp_lp["table5", "agnews-distilbert"].verdict == "opposite"      # paper: FP > LP
    assert fp_lp["table1", "agnews-distilbert"].verdict == "agrees"


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
    data = load_report_data(mini, PAPER, tables=["table2"])
    t = paper_table(data, "table2")
    entries = {e.cell_id: e for r in t.rows for e in r.entries if e is not None}
    assert t.compare == "effects"
    assert entries[t2(0.9, "ds", "fp32")].learned is False and entries[t2(0, "ds", "fp32")].learned is True
    assert entries[t2(0, "choco", "fp32")].same_run_as == t2(0, "ds", "fp32")
    effects = {r.effect: r for r in mini_effects(data) if r.block == "resnet20-dring8"}
    assert effects["FP − LP"].reproduced == pytest.approx(2.25) and effects["FP − LP"].verdict == "agrees"
    assert effects["skew drop (smallest − largest skew)"].verdict == "not learned"


def test_mini_report_shows_effects_and_flags(mini, tmp_path):
    r = build_report(mini, tmp_path / "rep", paper_dir=PAPER, tables=["table2"], pdf=False, log=lambda s: None)
    html = r["html"].read_text()
    assert 'id="effects"' in html and "Effects: paper vs reproduction" in html
    assert "did not learn (chance 10.00)" in html and "same run as " + t2(0, "ds", "fp32") in html
    assert "1 of 128 cells did not learn" in html
    assert 'class="close' not in html and 'class="far' not in html   # no |delta| colours in mini
    tex = (tmp_path / "rep" / "report.tex").read_text()
    assert "Effects: paper vs reproduction" in tex
    # claims skip the flat cell: the skew claim has no learned pair
    data = load_report_data(mini, PAPER, tables=["table2"])
    assert all(t2(0.9, "ds", "fp32") not in c.evidence for c in check_claims(data))


def test_paper_profile_keeps_absolute_comparison(tmp_path):
    root = tmp_path / "results" / "paper"
    run(root, t2(0, "ds", "fp32"), 1234, 90.0)
    r = build_report(root, tmp_path / "rep", paper_dir=PAPER, tables=["table2"], pdf=False, log=lambda s: None)
    html = r["html"].read_text()
    assert 'id="effects"' not in html and "&Delta; -0.56" in html   # paper 90.56


def test_a_claim_that_fails_within_seed_noise_says_within_noise(tmp_path):
    root = tmp_path / "results" / "mini"
    # CHOCO - DS per seed: -3, +2 (compressed pairs, so distinct runs): mean -0.5, spread 3.5
    for skew, base in ((0, 90.0), (0.4, 85.0)):
        for seed, d in ((1, -3.0), (2, 2.0)):
            run(root, t2(skew, "ds", "fp32", 99), seed, base)
            run(root, t2(skew, "choco", "fp32", 99), seed, base + d)
    claims = {c.number: c for c in check_claims(load_report_data(root, PAPER, tables=["table2"]))}
    assert claims[3].verdict == "within noise" and "over 2 seeds -0.50 ± 3.54" in claims[3].evidence
