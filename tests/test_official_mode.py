"""`fidelity: official` as a whole: one switch sets every official-code option, a run records them,
training with gossiped activation ranges and train-mode final rounds resumes bit-exactly on CPU,
and a mini cell runs end to end with both executors."""
import dataclasses
import json

import pytest
from kill_helpers import Killed, kill_after_epoch
import torch
from report_inputs import CELLS
from torch import nn

from lpdl_core.config import FIDELITY_CHOICES, Fidelity, other_mode, results_name
from lpdl_core.data.registry import load_dataset
from lpdl_core.decentral.algorithms.base import GossipCfg
from lpdl_core.decentral.compress import CompressorCfg
from lpdl_core.decentral.engine import EngineCfg
from lpdl_core.decentral.optim import OptimCfg
from lpdl_core.decentral.topology import Topology
from lpdl_core.errors import ConfigError
from lpdl_core.quant.layers import QConv2d, QLinear
from lpdl_core.quant.quantizer import QuantCfg
from lpdl_core.run_options import RunOptions
from lpdl_core.training.run_cfg import RunCfg
from lpdl_core.training.train import train

pytestmark = pytest.mark.usefixtures("one_thread")
OFFICIAL_Q = QuantCfg(measure_as_parameters=True, act_rounding="stochastic", eval_rounding="stochastic")


def test_one_switch_sets_every_official_option():
    off, paper = Fidelity.preset("official"), Fidelity()
    assert off.as_dict() == {k: v[1] for k, v in FIDELITY_CHOICES.items()} and off.mode == "official"
    assert paper.mode == "paper" and paper.differences == ()
    assert set(off.differences) == set(FIDELITY_CHOICES)
    assert Fidelity.from_mapping("official") == off and Fidelity.from_pairs(["official"]) == off
    mixed = Fidelity(bytes_metric="legacy")
    assert mixed.mode == "mixed" and mixed.differences == ("bytes_metric",)
    with pytest.raises(ConfigError, match="'officiall' is not one of paper, official"):
        Fidelity.from_mapping("officiall")


def test_the_two_modes_live_side_by_side():
    assert results_name("mini", Fidelity()) == "mini"
    assert results_name("mini", Fidelity.preset("official")) == "mini-official"
    assert results_name("mini", Fidelity(act_rounding="stochastic")) == "mini"  # mixed: recorded per run
    assert other_mode("mini", Fidelity()) == ("mini-official", Fidelity.preset("official"))
    assert other_mode("paper", Fidelity.preset("official")) == ("paper", Fidelity())


def small_lp_cnn():
    return nn.Sequential(QConv2d(3, 8, 3, stride=2, padding=1, qcfg=OFFICIAL_Q), nn.ReLU(),
                         QConv2d(8, 16, 3, stride=2, padding=1, qcfg=OFFICIAL_Q), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), QLinear(16, 10, qcfg=OFFICIAL_Q))


def test_official_training_resumes_bit_exactly(tmp_path):
    """Gossiped ranges, stochastic rounding, CHOCO code form with the aggregate buffer, legacy bytes
    and train-forward final rounds: killed after epoch 1 and resumed, the run ends exactly as an
    uninterrupted one (same CPU, same process: every RNG is in the checkpoint)."""
    split = load_dataset("digits")
    split = dataclasses.replace(split, x_train=split.x_train[:96], y_train=split.y_train[:96],
                                x_test=split.x_test[:32], y_test=split.y_test[:32])
    gossip = GossipCfg(algorithm="choco", eta=0.5, choco_form="code", choco_replicas="official-aggregate",
                       compressor=CompressorCfg(kind="topk", ratio=0.9, bytes_metric="legacy"))
    kw = dict(topology=Topology(name="directed-ring", n=2), gossip=gossip, optim_cfg=OptimCfg(),
              engine=EngineCfg(device="cpu"),
              run=RunCfg(epochs=3, batch_size=16, lr=0.05, skew=0.8, final_gossip_rounds=3,
                         final_rounds="train-forward"))
    torch.manual_seed(0)
    full = train(small_lp_cnn, split, **kw)

    ck = tmp_path / "ck.pt"
    torch.manual_seed(0)
    with pytest.raises(Killed):
        train(small_lp_cnn, split, **kw, checkpoint=ck, progress=kill_after_epoch(1))
    torch.manual_seed(123)  # the checkpoint restores the torch RNG, whatever it is now
    resumed = train(small_lp_cnn, split, **kw, checkpoint=ck)
    assert resumed.final == full.final and resumed.curve == full.curve
    assert resumed.bytes_per_node == full.bytes_per_node


def test_train_forward_final_rounds_differ_from_gossip_only():
    split = load_dataset("digits")
    split = dataclasses.replace(split, x_train=split.x_train[:64], y_train=split.y_train[:64],
                                x_test=split.x_test[:32], y_test=split.y_test[:32])
    results = {}
    for mode in ("gossip-only", "train-forward"):
        torch.manual_seed(0)
        results[mode] = train(small_lp_cnn, split, topology=Topology(name="directed-ring", n=2),
                              gossip=GossipCfg(algorithm="ds"), optim_cfg=OptimCfg(),
                              engine=EngineCfg(device="cpu"),
                              run=RunCfg(epochs=1, batch_size=16, lr=0.05, final_gossip_rounds=4,
                                         final_rounds=mode))
    a, b = results["gossip-only"], results["train-forward"]
    assert a.curve == b.curve  # the same training
    assert a.bytes_per_node == b.bytes_per_node  # the same number of rounds
    assert a.final["node_acc"] != b.final["node_acc"] or a.final["mean_loss"] != b.final["mean_loss"]


@pytest.mark.slow
@pytest.mark.parametrize("executor", ["loop", "batched"])
def test_a_mini_cell_runs_in_official_mode(tmp_path, executor):
    from lpdl_core.pipeline.run.runcell import run_cell
    from lpdl_core.pipeline.aggregation.tidy import run_row

    cell = CELLS["t2-resnet20-dring8-c99-s0.8-ds-int8"]
    m = run_cell(cell, tmp_path / "run", "mini", fidelity=Fidelity.preset("official"),
                 options=RunOptions(device="cpu", executor=executor))
    assert m["status"] == "ok" and m["executor"] == executor
    saved = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert saved["config"]["fidelity"] == Fidelity.preset("official").as_dict()
    assert run_row(cell, 1234, "mini", saved)["fidelity_mode"] == "official"
