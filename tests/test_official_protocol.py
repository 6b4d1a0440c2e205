"""The official trainer's protocol as named options (lpdl_core.config.Fidelity; RunCfg): when each
epoch is tested, how many final rounds run, the trailing forward and the test batch."""
import dataclasses

import pytest
import torch

from lpdl_core.config import Fidelity
from lpdl_core.decentral.algorithms.base import GossipCfg
from lpdl_core.decentral.compress import CompressorCfg
from lpdl_core.decentral.engine import EngineCfg, Simulator
from lpdl_core.decentral.optim import OptimCfg
from lpdl_core.decentral.topology import Topology
from lpdl_core.errors import ConfigError
from lpdl_core.training import train as train_mod
from lpdl_core.training.run_cfg import RunCfg
from lpdl_core.training.train import train
from lpdl_core.data.registry import load_dataset
from test_train import small_cnn, subset

GOSSIP = GossipCfg(algorithm="choco", eta=0.5, compressor=CompressorCfg(kind="topk", ratio=0.9))


def _sim(executor="loop"):
    torch.manual_seed(0)
    return Simulator(small_cnn, topology=Topology(name="directed-ring", n=4), gossip=GOSSIP,
                     optim_cfg=OptimCfg(), engine=EngineCfg(executor=executor, device="cpu"))


def _batches(k):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 8, 3, 16, 16, generator=g), torch.randint(0, 10, (4, 8), generator=g)) for _ in range(k)]


@pytest.mark.parametrize("executor", ["loop", "batched"])
def test_premix_view_shows_each_models_local_step_before_its_gossip_and_changes_nothing(executor):
    """Inside premix_view the models read x̃/u of the kept step: the x̃ the step handed to its
    gossip round. Afterwards z is x/u again, and training goes on bitwise as a run that never
    looked (the view copies; the step's arithmetic is the same)."""
    kept, plain, seen = _sim(executor), _sim(executor), {}
    orig = plain._gossip

    def spy(x_tilde, lr):
        seen["x_tilde"], seen["u"] = x_tilde.clone(), plain.u.clone()
        orig(x_tilde, lr)

    plain._gossip = spy
    batches = _batches(4)
    for i, (xb, yb) in enumerate(batches[:3]):
        kept.keep_premix = i == 2
        kept.train_step(xb, yb, 0.05)
        plain.train_step(xb, yb, 0.05)
    kept.keep_premix = False
    after = kept.z.clone()
    with kept.premix_view():
        assert torch.equal(kept.z, seen["x_tilde"] / seen["u"][:, None])
        assert not torch.equal(kept.z, after)  # the gossip round did move the models
    assert torch.equal(kept.z, after) and kept.premix is None
    kept.train_step(*batches[3], 0.05)
    plain.train_step(*batches[3], 0.05)
    assert torch.equal(kept.x, plain.x)
    with pytest.raises(RuntimeError, match="keep_premix"):
        with kept.premix_view():
            pass


def test_a_kept_step_runs_eagerly_even_when_the_step_is_compiled():
    """The compiled step has no x̃ to keep: the one step per epoch that must keep it runs the
    eager step (the same update; the compiled-vs-eager tests bound their difference)."""
    sim = _sim("batched")
    calls = []
    sim.compiled = lambda *a: calls.append(a)
    xb, yb = _batches(1)[0]
    sim.train_step(xb, yb, 0.05)
    assert len(calls) == 1
    sim.keep_premix = True
    sim.train_step(xb, yb, 0.05)
    assert len(calls) == 1 and sim.premix is not None


def _train(split, **run_kw):
    return train(small_cnn, split, topology=Topology(name="directed-ring", n=4), gossip=GOSSIP,
                 optim_cfg=OptimCfg(), engine=EngineCfg(device="cpu"),
                 run=RunCfg(epochs=2, batch_size=16, lr=0.05, skew=0.8, final_gossip_rounds=3, **run_kw))


def test_testing_before_the_last_gossip_shifts_the_curve_not_the_training():
    """The official epoch test reads each model before the epoch's last gossip (which models
    premix_view shows is checked above): every epoch's consensus distance is another one, while
    the trained models, and so the training losses and the final result, are bitwise those of
    the default."""
    split = subset(load_dataset("digits"))
    after, before = _train(split), _train(split, epoch_test="before-last-gossip")
    assert before.final == after.final
    assert [r["train_loss"] for r in before.curve] == [r["train_loss"] for r in after.curve]
    assert all(b["consensus_distance"] != a["consensus_distance"] for a, b in zip(after.curve, before.curve))


@pytest.mark.parametrize("rounds,L,limit,want", [(50, 196, "epoch-batches", 50), (50, 37, "epoch-batches", 36),
                                                 (50, 22, "epoch-batches", 21), (50, 22, "cell", 50),
                                                 (0, 22, "epoch-batches", 0), (50, 1, "epoch-batches", 0)])
def test_final_round_count(rounds, L, limit, want):
    """Official: the final rounds loop over one epoch's L batches and apply min(50, L − 1) gossips
    (CIFAR L = 196: 50; Imagenette L = 37: 36; the mini profile's L = 22: 21)."""
    run = RunCfg(epochs=1, batch_size=8, lr=0.1, final_gossip_rounds=rounds, final_round_limit=limit,
                 final_rounds="train-forward")
    assert run.final_round_count(L) == want


@pytest.mark.parametrize("trailing", [False, True])
def test_final_rounds_forwards_and_gossips(trailing):
    """train-forward final rounds: a forward before each gossip; with the trailing forward, one
    more forward after the last gossip, whose gossip never happens (official: 51 forwards, 50
    gossips). Counted on the simulator: gossip rounds by its round counter, forwards by calls."""
    sim, forwards = _sim(), []
    orig = sim._loss_and_grad
    sim._loss_and_grad = lambda xb, yb: forwards.append(1) or orig(xb, yb)
    run = RunCfg(epochs=1, batch_size=8, lr=0.1, final_gossip_rounds=5, final_rounds="train-forward",
                 final_round_limit="epoch-batches", final_trailing_forward=trailing)
    batches = iter(_batches(8))
    t0 = sim.t
    train_mod.run_final_rounds(sim, run, 4, lambda: next(batches))  # L = 4: 3 rounds
    assert sim.t - t0 == 3 and len(forwards) == 3 + trailing


def test_the_test_batch_reaches_every_evaluation(monkeypatch):
    seen = []
    real = train_mod.evaluate

    def spy(*a, batch_size=1024, **kw):
        seen.append(batch_size)
        return real(*a, batch_size=batch_size, **kw)

    monkeypatch.setattr(train_mod, "evaluate", spy)
    _train(subset(load_dataset("digits"), n_train=128, n_test=64), test_batch=64)
    assert seen == [64, 64, 64, 64]  # two epochs, before the final rounds and after them


def test_official_preset_sets_the_protocol_and_paper_keeps_lpdls():
    off, paper = Fidelity.preset("official"), Fidelity()
    assert (off.epoch_test, off.final_round_limit, off.final_trailing_forward, off.test_batch) == \
        ("before-last-gossip", "epoch-batches", True, 64)
    assert (paper.epoch_test, paper.final_round_limit, paper.final_trailing_forward, paper.test_batch) == \
        ("after-gossip", "cell", False, 1024)
    with pytest.raises(ConfigError, match="final_trailing_forward"):
        Fidelity(final_trailing_forward=True)
    with pytest.raises(ConfigError, match="test_batch"):
        Fidelity.from_pairs(["test_batch=32"])
    with pytest.raises(ValueError, match="final_trailing_forward"):
        dataclasses.replace(RunCfg(epochs=1, batch_size=8, lr=0.1), final_trailing_forward=True)


def test_plan_cell_hands_the_protocol_options_to_the_run():
    from lpdl_core.pipeline.cells.tables import load_cells
    from lpdl_core.pipeline.run.runcell import plan_cell
    cell = next(c for c in load_cells() if c.final_gossip_rounds)
    run = plan_cell(cell, "mini", fidelity=Fidelity.preset("official")).run
    assert (run.epoch_test, run.final_round_limit, run.final_trailing_forward, run.test_batch) == \
        ("before-last-gossip", "epoch-batches", True, 64)


def test_each_run_records_its_models_before_the_final_rounds_and_what_an_exact_average_scores():
    """before_final holds the trained models' evaluation before the final rounds merge them (the
    merge gain is final − before_final). Its avg_model_acc is what one exact average (all-reduce)
    scores: here one gossip round of η = 1 on the complete graph is such an average, and after it
    every node scores that accuracy. The two averages sum in another order (float32 rounding), so
    a test sample on a near-tie may flip: one sample of slack."""
    split = subset(load_dataset("digits"), n_train=256, n_test=128)
    res = train(small_cnn, split, topology=Topology(name="complete", n=4), gossip=GossipCfg(algorithm="ds", eta=1.0),
                optim_cfg=OptimCfg(), engine=EngineCfg(device="cpu"),
                run=RunCfg(epochs=2, batch_size=16, lr=0.05, skew=1.0, final_gossip_rounds=1))
    b, f = res.before_final, res.final
    assert b is not None and b["consensus_distance"] > 0 and f["consensus_distance"] < 1e-5
    one = 100.0 / 128
    assert all(abs(a - b["avg_model_acc"]) <= one for a in f["node_acc"])
    none = train(
        small_cnn, split, topology=Topology(name="complete", n=4), gossip=GossipCfg(), optim_cfg=OptimCfg(),
        engine=EngineCfg(device="cpu"), run=RunCfg(epochs=1, batch_size=16, lr=0.05))
    assert none.before_final is None  # no final rounds: nothing merged them


def test_runs_csv_carries_the_before_final_numbers_and_survives_garbage():
    from lpdl_core.pipeline.cells.tables import load_cells
    from lpdl_core.pipeline.aggregation.tidy import RUN_COLUMNS, run_row
    cell = load_cells()[0]
    m = {"status": "ok", "final": {"mean_acc": 50.0, "avg_model_acc": 60.0, "node_acc": [50.0]},
         "before_final": {"mean_acc": 40.0, "avg_model_acc": 58.0, "consensus_distance": 2.0}, "config": {}}
    row = run_row(cell, 1234, "mini", m)
    assert (row["before_final_mean_acc"], row["before_final_avg_model_acc"], row["before_final_consensus_distance"]) \
        == (40.0, 58.0, 2.0)
    assert {k for k in row if k.startswith("before_final")} <= set(RUN_COLUMNS)
    m["before_final"] = {"mean_acc": "forty", "avg_model_acc": float("nan")}
    row = run_row(cell, 1234, "mini", m)
    assert row["before_final_mean_acc"] is None and row["before_final_avg_model_acc"] is None
    del m["before_final"]
    assert run_row(cell, 1234, "mini", m)["before_final_mean_acc"] is None


def _int8_with_dropout():
    from lpdl_core.quant.layers import make_conv, make_linear
    from lpdl_core.quant.quantizer import QuantCfg
    q = QuantCfg(act_rounding="stochastic")  # noise in the forward (activations) and backward (gradients)
    return torch.nn.Sequential(make_conv(1, 4, 3, padding=1, bias=True, qcfg=q), torch.nn.Tanh(),
                               torch.nn.Dropout(0.3), torch.nn.Flatten(), make_linear(256, 10, qcfg=q))


@pytest.mark.parametrize("executor", ["loop", "batched"])
def test_shared_streams_give_nodes_with_the_same_batches_the_same_noise_and_dropout(executor):
    """rng_streams shared (the official ranks, seeded alike): nodes given the same batch draw the
    same rounding noise and dropout masks, so from the same x_0 they stay equal (DS at η = 1 on a
    ring mixes equal models into equal models). Per-node streams set them apart. (The
    distributed executor: tests/test_distributed.py.)"""
    g = torch.Generator().manual_seed(3)
    batches = [(torch.randn(1, 6, 1, 8, 8, generator=g).expand(4, -1, -1, -1, -1).clone(),
                torch.randint(0, 10, (1, 6), generator=g).expand(4, -1).clone()) for _ in range(3)]
    spread = {}
    for streams in ("shared", "per-node"):
        torch.manual_seed(0)
        sim = Simulator(_int8_with_dropout, topology=Topology(name="directed-ring", n=4), gossip=GossipCfg(),
                        optim_cfg=OptimCfg(), engine=EngineCfg(executor=executor, device="cpu", rng_streams=streams))
        for xb, yb in batches:
            sim.train_step(xb, yb, 0.1)
        spread[streams] = float((sim.x - sim.x[0]).abs().max())
    # loop: every node runs the same operators on the same values, so they stay bitwise equal.
    # batched: vmap's grouped convolution computes the equal node groups in one call, and a CPU
    # kernel may block groups differently; any residue is that arithmetic, far below what
    # independent noise and dropout do
    if executor == "loop":
        assert spread["shared"] == 0.0, spread
    assert spread["shared"] < spread["per-node"] / 100 and spread["per-node"] > 1e-4, spread


def test_shared_streams_give_identical_shards_identical_batches():
    """The sampler's local index order is the same permutation on every node when shared (each
    official rank shuffles its own shard with the same seed); per node it differs."""
    import numpy as np
    from lpdl_core.data.sampler import NodeSampler
    parts = [np.arange(40), np.arange(40), np.arange(100, 140)]
    shared = next(NodeSampler(parts, 8, seed=5, shared=True).epoch(2))
    assert torch.equal(shared[0], shared[1]) and torch.equal(shared[2] - 100, shared[0])
    own = next(NodeSampler(parts, 8, seed=5).epoch(2))
    assert not torch.equal(own[0], own[1])


@pytest.mark.parametrize("augment", ["crop-flip", "rrc-flip"])
def test_shared_augmentation_draws_one_nodes_crops_for_every_node(augment):
    """Shared: every node row gets the draws one row would get from the same generator state, and
    the generator ends there (as each official rank's own generator); per node the rows differ."""
    from lpdl_core.data.augment import augment_batch
    split = dataclasses.replace(load_dataset("digits"), augment=augment, image_size=8)
    x = split.x_train[:5].unsqueeze(0).expand(3, -1, -1, -1, -1).clone()
    g, one = torch.Generator().manual_seed(4), torch.Generator().manual_seed(4)
    out = augment_batch(x, split, train=True, generator=g, shared=True)
    want = augment_batch(x[:1], split, train=True, generator=one)
    assert all(torch.equal(row, want[0]) for row in out)
    assert torch.equal(g.get_state(), one.get_state())
    own = augment_batch(x, split, train=True, generator=torch.Generator().manual_seed(4))
    assert not torch.equal(own[0], own[1])


def test_a_run_with_shared_streams_trains_and_its_checkpoint_names_them(tmp_path):
    """Shared streams reach the run (sampler, augmentation, executor), and a checkpoint written
    with per-node streams is not resumed by a shared run (the fingerprint names them)."""
    from lpdl_core.training.checkpoint import fingerprint
    from lpdl_core.training.train import shared_streams
    split = subset(load_dataset("digits"), n_train=128, n_test=64)
    res = train(small_cnn, split, topology=Topology(name="directed-ring", n=4), gossip=GOSSIP, optim_cfg=OptimCfg(),
                engine=EngineCfg(device="cpu", rng_streams="shared"),
                run=RunCfg(epochs=1, batch_size=16, lr=0.05, skew=0.0))
    assert res.status == "ok"
    assert shared_streams(EngineCfg()) == {}  # per-node fingerprints read as before the option
    assert fingerprint(identity=None, **shared_streams(EngineCfg(rng_streams="shared"))) != \
        fingerprint(identity=None, **shared_streams(EngineCfg()))


@pytest.mark.parametrize("executor", ["loop", "batched"])
def test_allreduce_round_is_one_exact_average_of_models_and_buffers(executor):
    """final_rounds allreduce: every node's z becomes z̄ (push-sum weights kept), floating buffers
    their node average, and a ring all-reduce's 2(n − 1)/n · d float32 values are counted."""
    from test_step_ops import _sim as step_sim, _batch
    sim = step_sim("int8", n=4, executor=executor)  # 8-bit: activation ranges are buffers
    for s in range(2):
        sim.train_step(*_batch(4, seed=s), 0.1)
    zbar, want_buffers = sim.z.mean(0), sim.average_buffers()
    sent = sim.bytes_sent.clone()
    sim.allreduce_round()
    assert torch.allclose(sim.z, zbar.expand_as(sim.z), rtol=1e-6, atol=1e-7)  # x/u·u/u: one rounding each
    got = sim.executor.stacked_buffers()
    for k, b in want_buffers.items():
        if b.is_floating_point():
            assert torch.equal(got[k], b.expand_as(got[k])), k
    assert torch.equal(sim.bytes_sent - sent, torch.full_like(sent, 2 * 3 / 4 * sim.layout.d * 4))


def test_allreduce_in_a_pack_averages_each_cell_alone():
    from lpdl_core.decentral.engine.packed import PackedSimulator, PackMember
    members = [PackMember(topology=Topology(name="directed-ring", n=4), gossip=GOSSIP, seed=s) for s in (1, 2)]
    sim = PackedSimulator(small_cnn, members=members, optim_cfg=OptimCfg(), engine=EngineCfg(device="cpu"))
    xb, yb = _batches(1)[0]
    sim.train_step(torch.cat([xb, xb]), torch.cat([yb, yb]), 0.05)
    means = [sim.cell_average(k) for k in range(2)]
    sim.allreduce_round()
    for k, rows in enumerate(sim.rows_of):
        assert torch.allclose(sim.z[rows], means[k].expand_as(sim.z[rows]), rtol=1e-6, atol=1e-7)
    assert not torch.allclose(means[0], means[1])


def test_a_run_with_allreduce_final_rounds_ends_in_consensus():
    split = subset(load_dataset("digits"), n_train=128, n_test=64)
    res = _train(split, final_rounds="allreduce")
    assert res.final["consensus_distance"] < 1e-5 < res.before_final["consensus_distance"]
    assert Fidelity(final_rounds="allreduce").mode == "mixed"
