"""Cell + profile -> run: the mini profile keeps every axis but data/model/epochs; paper keeps all."""
import json

import pytest

from lpdl_core.pipeline.cells.tables import cells_by_id, load_cells
from lpdl_core.pipeline.recipe.mini import IMAGE_EPOCHS, WARMUP_FRACTION
from lpdl_core.pipeline.run.runcell import Fidelity, plan_cell, run_cell
from lpdl_core.run_options import RunOptions

CELLS = cells_by_id(load_cells())


def test_mini_keeps_axes_and_records_mapping():
    c = CELLS["t2-resnet20-dring16-c90-s0.9-choco-int8"]
    p = plan_cell(c, "mini")
    assert p.topology.name == "directed-ring" and p.topology.n == 16
    assert p.gossip.algorithm == "choco" and p.gossip.eta == c.eta == 0.1
    assert p.gossip.compressor.kind == "topk" and p.gossip.compressor.ratio == pytest.approx(0.9)
    assert p.run.skew == 0.9 and p.run.batch_size == 16 // 4 and p.run.final_gossip_rounds == 50
    assert p.optim.momentum == "nesterov" and p.dataset == "digits" and p.run.epochs == IMAGE_EPOCHS
    assert p.dataset_kwargs == {"augment": "none", "image_size": 8, "standin_for": "cifar10"}
    assert p.run.schedule.kind == "cosine" and p.run.schedule.warmup_fraction == WARMUP_FRACTION
    assert any("resnet20 -> mini-resnet20" in m for m in p.mapping) and any("digits" in m for m in p.mapping)
    assert any("batch per node 16 -> 4" in m for m in p.mapping)
    model = p.make_model()
    assert type(model.conv1).__name__ == "QConv2d"  # int8 kept


def test_paper_profile_is_the_cell():
    c = CELLS["t4-imagenette-resnet18-torus8-c90-s0.6-choco-fp32"]
    p = plan_cell(c, "paper")
    assert (p.dataset, p.model, p.run.epochs, p.mapping) == ("imagenette", "resnet18", 100, ())
    assert p.run.schedule.kind == "multistep" and p.run.schedule.milestones == (50, 75)
    assert p.run.schedule.warmup_epochs == 1 and p.topology.name == "torus"


def test_nlp_and_single_node_and_qgm():
    t5 = plan_cell(CELLS["t5-sentlen-distilbert-dring4-c99-s0.5-ds-int8"], "mini")
    assert t5.optim.momentum == "adam" and t5.optim.beta2 == 0.9 and t5.dataset == "sentlen-standin"
    assert t5.run.schedule.kind == "cosine" and t5.run.lr == pytest.approx(5e-3) and t5.run.batch_size == 8
    assert t5.model == "distilbert-tiny" and t5.run.epochs == 6
    t1 = plan_cell(CELLS["t1-resnet54-single-c0-s0-none-fp32"], "mini")
    assert t1.topology.n == 1 and t1.gossip.algorithm == "dpsgd" and t1.run.batch_size == 256 // 4
    t3 = plan_cell(CELLS["t3-resnet20-dring8-c0-s0.4-choco-int8-qgm"], "paper")
    assert t3.optim.momentum == "qgm" and t3.run.final_gossip_rounds == 50


def test_fidelity_options_reach_the_run():
    c = CELLS["t2-resnet20-dring8-c99-s0.8-choco-int8"]
    p = plan_cell(c, "mini", fidelity=Fidelity(quant_ranges="gossiped", act_rounding="stochastic", choco_form="code",
                                               choco_replicas="official-aggregate", bytes_metric="legacy"))
    assert p.gossip.choco_form == "code" and p.gossip.choco_replicas == "official-aggregate"
    assert p.gossip.compressor.bytes_metric == "legacy"
    q = p.make_model().conv1.qcfg
    assert q.measure_as_parameters and q.act_rounding == q.eval_rounding == "stochastic"
    with pytest.raises(ValueError):
        plan_cell(c, "huge")


def test_run_cell_writes_once_then_skips(tmp_path, monkeypatch):
    c = CELLS["fig1-resnet20-dring8-c0-s0.8-choco-fp32-evonorm"]
    m = run_cell(c, tmp_path, "mini", options=RunOptions(device="cpu"))
    assert m["status"] == "ok" and m["config"]["cell_id"] == c.cell_id and m["config"]["profile"] == "mini"
    assert (tmp_path / "partition.csv").exists() and not (tmp_path / "checkpoint.pt").exists()
    assert len((tmp_path / "curve.csv").read_text().splitlines()) == 1 + IMAGE_EPOCHS
    import lpdl_core.pipeline.run.runcell as rc
    monkeypatch.setattr(rc, "train", lambda *a, **k: pytest.fail("finished cell recomputed"))
    assert run_cell(c, tmp_path, "mini") == json.loads((tmp_path / "metrics.json").read_text())


@pytest.mark.parametrize("profile", ["mini", "paper"])
def test_range_evonorm_fp_gate_reaches_the_model(profile):
    from lpdl_core.quant.norms import EvoNormS0, RangeEvoNorm

    def gates(cell_id, fidelity=Fidelity()):
        model = plan_cell(CELLS[cell_id], profile, fidelity=fidelity).make_model()
        return {type(m).__name__: getattr(m, "activation", None) for m in model.modules()
                if isinstance(m, (RangeEvoNorm, EvoNormS0))}

    fp = "fig1-resnet20-dring8-c0-s0.8-choco-fp32-range-evonorm-fp"
    assert gates(fp) == {"RangeEvoNorm": "hardsigmoid"}  # the paper's eq. 2 by default
    assert gates(fp, Fidelity(range_evonorm_fp="sigmoid")) == {"RangeEvoNorm": "sigmoid"}
    # the option touches only the FP Range EvoNorm: neither EvoNorm-S0 nor the 8-bit Range EvoNorm
    assert gates("fig1-resnet20-dring8-c0-s0.8-choco-fp32-evonorm", Fidelity(range_evonorm_fp="sigmoid")) \
        == {"EvoNormS0": None}
    assert gates("t2-resnet20-dring8-c99-s0.8-choco-int8", Fidelity(range_evonorm_fp="sigmoid")) \
        == {"RangeEvoNorm": "hardsigmoid"}
