"""Packed cells (issue 24): K cells' nodes in one stacked state with block-diagonal mixing.

The reference is each cell's solo run. A packed cell gets the same x_0, batches, augmentation
draws, mixing and messages, and its gossip round is the same algorithm call on the same rows; the
forward and backward pass run stacked, where a kernel over K·n rows may sum in another order than
one over n. So FP results agree to floating-point rounding, amplified by training: the tolerances
below are 1e-5 relative for one step (a few ulps of float32 through a short chain) and 1e-3
relative for whole short runs (two epochs; an ulp-level difference could flip a top-k choice or a
rounding, which moves a loss by far less than that on these models). Byte counts are integers and
must be equal. On this machine the runs come out bitwise equal. The 8-bit layers' stochastic
rounding draws from one stream for the pack, so 8-bit packed runs equal solo runs in distribution
only: that test bounds the first epoch's loss.
"""
import dataclasses
import math

import pytest
import torch
from kill_helpers import Killed, kill_after_epoch
from test_train import small_cnn, subset

from lpdl_core.config import ALGORITHMS, UNCOMPRESSED_ALGORITHMS
from lpdl_core.data.registry import load_dataset
from lpdl_core.decentral.algorithms.base import GossipCfg
from lpdl_core.decentral.compress import CompressorCfg
from lpdl_core.decentral.engine import EngineCfg, Simulator
from lpdl_core.decentral.engine.packed import BlockTopology, PackedSimulator, PackMember
from lpdl_core.decentral.optim import OptimCfg
from lpdl_core.decentral.spectral import is_column_stochastic
from lpdl_core.decentral.topology import Topology
from lpdl_core.run_options import RunOptions
from lpdl_core.training.pack import PackedRun, train_pack
from lpdl_core.training.run_cfg import RunCfg
from lpdl_core.training.train import train

PACK_CPU = RunOptions(executor="batched", pack_size=4, device="cpu")

N = 4
TOPK = lambda r: CompressorCfg(kind="topk", ratio=r)  # noqa: E731


def members(algorithm: str) -> list[PackMember]:
    """Three cells that differ in graph (one time-varying), compression, eta and seed (as far as the
    algorithm allows: bagua-lp and gut need fixed doubly stochastic graphs, dpsgd and gut send
    uncompressed messages at η = 1)."""
    fixed = algorithm in ("bagua-lp", "gut")
    graphs = ["ring", "torus", "directed-ring" if algorithm == "gut" else "ring"] if fixed else \
        ["directed-ring", "time-varying-exponential", "torus"]
    exact = algorithm in UNCOMPRESSED_ALGORITHMS
    comp = [CompressorCfg()] * 3 if exact else [TOPK(0.9), CompressorCfg(), TOPK(0.5)]
    eta = [1.0] * 3 if algorithm == "gut" else [0.5, 1.0, 0.2]
    return [PackMember(topology=Topology(name=g, n=N), gossip=GossipCfg(algorithm=algorithm, eta=e, compressor=c),
                       seed=s) for g, c, e, s in zip(graphs, comp, eta, (11, 12, 13))]


def tiny():
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def batches(steps: int, rows: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(rows, 5, 12, generator=g), torch.randint(0, 3, (rows, 5), generator=g)) for _ in range(steps)]


def test_block_topology_is_block_diagonal_and_column_stochastic():
    topo = BlockTopology(tuple(m.topology for m in members("choco")))
    assert topo.n == 3 * N and topo.period == Topology(name="time-varying-exponential", n=N).period
    for t in range(2 * topo.period):
        W = topo.W(t)
        assert is_column_stochastic(W)
        for k, m in enumerate(members("choco")):
            s = slice(k * N, (k + 1) * N)
            assert (W[s, s] == m.topology.W(t)).all()
            assert (W[s, :].sum() - W[s, s].sum()) == 0  # no weight crosses between cells


@pytest.mark.parametrize("executor", ["loop", "batched"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_packed_steps_equal_each_cells_solo_steps(algorithm, executor):
    ms = members(algorithm)
    optim_cfg = OptimCfg(momentum="qgm")
    pack = PackedSimulator(tiny, members=ms, optim_cfg=optim_cfg, engine=EngineCfg(device="cpu", executor=executor))
    solos = [Simulator(tiny, topology=m.topology, gossip=m.gossip, optim_cfg=optim_cfg,
                       engine=EngineCfg(device="cpu", executor=executor, seed=m.seed)) for m in ms]
    for xb, yb in batches(4, 3 * N):
        losses = pack.train_step(xb, yb, 0.1)
        for k, solo in enumerate(solos):
            rows = pack.rows_of[k]
            torch.testing.assert_close(losses[rows], solo.train_step(xb[rows], yb[rows], 0.1), rtol=1e-5, atol=1e-6)
    for k, solo in enumerate(solos):
        rows = pack.rows_of[k]
        torch.testing.assert_close(pack.x[rows], solo.x, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(pack.u[rows], solo.u, rtol=1e-6, atol=1e-7)
        assert torch.equal(pack.bytes_sent[rows], solo.bytes_sent)  # integer byte counts


def test_a_diverged_cell_cannot_reach_the_others():
    ms = members("choco")
    pack = PackedSimulator(tiny, members=ms, engine=EngineCfg(device="cpu", executor="batched"))
    solo = Simulator(tiny, topology=ms[1].topology, gossip=ms[1].gossip,
                     engine=EngineCfg(device="cpu", executor="batched", seed=ms[1].seed))
    pack.x[pack.rows_of[0]] = float("nan")
    pack.z.copy_(pack.x / pack.u[:, None])
    for xb, yb in batches(3, 3 * N):
        losses = pack.train_step(xb, yb, 0.1)
        assert losses[pack.rows_of[0]].isnan().all()
        torch.testing.assert_close(pack.x[pack.rows_of[1]], (solo.train_step(xb[4:8], yb[4:8], 0.1), solo.x)[1],
                                   rtol=1e-5, atol=1e-6)
    assert torch.isfinite(pack.x[N:]).all()


def test_what_cannot_share_a_pack_is_refused_in_one_line():
    ring = Topology(name="directed-ring", n=N)
    ok = PackMember(topology=ring, gossip=GossipCfg(), seed=1)
    cases = [
        ([ok, PackMember(topology=Topology(name="directed-ring", n=8), gossip=GossipCfg(), seed=2)],
         "same number of nodes"),
        ([ok, PackMember(topology=ring, gossip=GossipCfg(algorithm="choco"), seed=2)], "same algorithm"),
        ([ok, PackMember(topology=ring, gossip=GossipCfg(compressor=CompressorCfg(kind="randomk", ratio=0.5)), seed=2)],
         "deterministic compressors"),
    ]
    for ms, why in cases:
        with pytest.raises(ValueError, match=why):
            PackedSimulator(tiny, members=ms, engine=EngineCfg(device="cpu"))
    with pytest.raises(ValueError, match="one process"):
        PackedSimulator(tiny, members=[ok], engine=EngineCfg(device="cpu", executor="distributed"))
    split = subset(load_dataset("digits"), 256, 64)
    run = RunCfg(epochs=1, batch_size=16, lr=0.05)
    with pytest.raises(ValueError, match="run.lr differs"):
        train_pack(small_cnn, split, [PackedRun(topology=ring, gossip=GossipCfg(), run=run),
                                      PackedRun(topology=ring, gossip=GossipCfg(),
                                                run=dataclasses.replace(run, lr=0.1))],
                   optim_cfg=OptimCfg(), engine=EngineCfg(device="cpu"))
    with pytest.raises(ValueError, match="different batch plans"):
        train_pack(small_cnn, split, [PackedRun(topology=ring, gossip=GossipCfg(), run=run),
                                      PackedRun(topology=ring, gossip=GossipCfg(),
                                                run=dataclasses.replace(run, skew=0.8))],
                   optim_cfg=OptimCfg(), engine=EngineCfg(device="cpu"))


# the official trainer's protocol (Fidelity's epoch_test, final_rounds, final_round_limit,
# final_trailing_forward, test_batch), which a pack runs through the same helpers as a solo run
OFFICIAL_PROTOCOL = dict(epoch_test="before-last-gossip", final_rounds="train-forward",
                         final_round_limit="epoch-batches", final_trailing_forward=True, test_batch=64)


def runs(epochs: int = 2, **protocol) -> list[PackedRun]:
    run = RunCfg(epochs=epochs, batch_size=16, lr=0.05, skew=0.8, final_gossip_rounds=3, **protocol)
    return [
        PackedRun(topology=Topology(name="directed-ring", n=N), run=dataclasses.replace(run, partition_seed=1),
                  gossip=GossipCfg(algorithm="choco", eta=0.5, compressor=TOPK(0.9))),
        PackedRun(topology=Topology(name="time-varying-exponential", n=N),
                  run=dataclasses.replace(run, partition_seed=7),
                  gossip=GossipCfg(algorithm="choco", eta=1.0)),
        PackedRun(topology=Topology(name="torus", n=N), run=dataclasses.replace(run, partition_seed=3, skew=0.9),
                  gossip=GossipCfg(algorithm="choco", eta=0.1, compressor=TOPK(0.99))),
    ]


def assert_same_run(packed, solo, rtol: float) -> None:
    assert packed.status == solo.status and packed.epochs_done == solo.epochs_done
    assert packed.bytes_per_node == solo.bytes_per_node and (packed.partition == solo.partition).all()
    for a, b in zip(packed.curve, solo.curve):
        assert a["bytes_per_node"] == b["bytes_per_node"] and a["lr"] == b["lr"]
        for key in ("train_loss", "test_loss", "consensus_distance"):
            assert math.isclose(a[key], b[key], rel_tol=rtol), (key, a[key], b[key])
    for key in ("mean_loss", "consensus_distance"):
        assert math.isclose(packed.final[key], solo.final[key], rel_tol=rtol), key


@pytest.mark.parametrize("protocol", [{}, OFFICIAL_PROTOCOL], ids=["paper", "official-protocol"])
def test_each_packed_cell_equals_its_solo_run(protocol):
    split = subset(load_dataset("digits"), 512, 128)
    opt, engine = OptimCfg(momentum="qgm"), EngineCfg(device="cpu", executor="batched")
    packed = train_pack(small_cnn, split, runs(**protocol), optim_cfg=opt, engine=engine)
    for r, p in zip(runs(**protocol), packed):
        solo = train(small_cnn, split, topology=r.topology, gossip=r.gossip, optim_cfg=opt, run=r.run,
                     engine=dataclasses.replace(engine, seed=r.run.partition_seed))
        assert_same_run(p, solo, rtol=1e-3)


def test_a_pack_killed_halfway_resumes_every_cell(tmp_path):
    split = subset(load_dataset("digits"), 512, 128)
    opt, engine = OptimCfg(), EngineCfg(device="cpu", executor="batched")
    ckpt = tmp_path / "checkpoint.pack.pt"
    whole = train_pack(small_cnn, split, runs(3), optim_cfg=opt, engine=engine)
    with pytest.raises(Killed):
        train_pack(small_cnn, split, runs(3), optim_cfg=opt, engine=engine, checkpoint=ckpt,
                   progress=kill_after_epoch(1))
    events = []
    resumed = train_pack(small_cnn, split, runs(3), optim_cfg=opt, engine=engine, checkpoint=ckpt,
                         progress=events.append)
    assert {"event": "resumed", "epoch": 2, "epochs": 3} in events
    for a, b in zip(resumed, whole):  # the same process and machine: resume is exact
        assert a.curve == b.curve and a.final == b.final and a.bytes_per_node == b.bytes_per_node
    # another pack (one cell's graph changed) does not take this pack's checkpoint
    other = runs(3)
    other[0] = dataclasses.replace(other[0], topology=Topology(name="ring", n=N))
    events.clear()
    train_pack(small_cnn, split, other, optim_cfg=opt, engine=engine, checkpoint=ckpt, progress=events.append)
    aside = [e for e in events if e["event"] == "checkpoint-set-aside"]
    assert len(aside) == 1 and "written for another run" in aside[0]["reason"]


def test_an_8bit_pack_trains_like_its_solo_runs():
    from lpdl_core.models.mini import build_standin

    split = subset(load_dataset("digits"), 256, 64)
    make = lambda: build_standin("resnet20", precision="int8", norm="range-evonorm", num_classes=10)  # noqa: E731
    rs = [dataclasses.replace(r, run=dataclasses.replace(r.run, epochs=1, skew=0.8, final_gossip_rounds=0,
                                                         lr=0.1))
          for r in runs()[:2]]
    opt, engine = OptimCfg(), EngineCfg(device="cpu", executor="batched")
    packed = train_pack(make, split, rs, optim_cfg=opt, engine=engine)
    for r, p in zip(rs, packed):
        solo = train(make, split, topology=r.topology, gossip=r.gossip, optim_cfg=opt, run=r.run,
                     engine=dataclasses.replace(engine, seed=r.run.partition_seed))
        assert p.status == solo.status == "ok" and p.bytes_per_node == solo.bytes_per_node
        # one epoch (8 steps) from the same x_0 on the same batches: only the rounding noise differs,
        # zero-mean and at most one 8-bit level per value; it moves the mean loss by well under 2 %
        assert math.isclose(p.curve[0]["train_loss"], solo.curve[0]["train_loss"], rel_tol=0.02)


def test_packed_mini_cells_write_their_own_runs_equal_to_solo(tmp_path):
    from lpdl_core.pipeline.cells.tables import cells_by_id, load_cells
    from lpdl_core.pipeline.run.runcell import run_cell
    from lpdl_core.pipeline.run.runpack import PACK_CHECKPOINT, run_cells_packed

    cells = cells_by_id(load_cells())
    ids = ["t2-resnet20-dring8-c0-s0-choco-fp32", "t2-resnet20-dring8-c99-s0-choco-fp32"]
    out_of = lambda cid: str(tmp_path / "packed" / cid)  # noqa: E731
    done = run_cells_packed([cells[i] for i in ids], out_of, "mini", options=PACK_CPU)
    assert all(isinstance(m, dict) and m["status"] == "ok" for m in done.values())
    assert not (tmp_path / "packed" / ids[0] / PACK_CHECKPOINT).exists()
    solo = run_cell(cells[ids[1]], tmp_path / "solo", "mini", options=RunOptions(executor="batched", device="cpu"))
    packed = done[ids[1]]
    assert packed["identity"] == solo["identity"]  # packing is how a run is computed, not which run
    assert packed["config"]["packed_with"] == [ids[0]] and "packed_with" not in solo["config"]
    assert packed["bytes_per_node"] == solo["bytes_per_node"]
    assert math.isclose(packed["final"]["mean_loss"], solo["final"]["mean_loss"], rel_tol=1e-3)
    # a second call finds both finished and trains nothing
    events = []
    again = run_cells_packed([cells[i] for i in ids], out_of, "mini", options=PACK_CPU,
                             progress=lambda cid, ev: events.append(ev))
    assert again == done and not events


def test_the_planner_counts_the_stacks_the_jobs_form():
    from lpdl_core.pipeline.cells.tables import load_cells
    from lpdl_core.pipeline.recipe.packing import batch_plan, pack_key, pack_stacks
    from lpdl_core.pipeline.workflow.jobs import plan_jobs

    cells = load_cells()
    jobs = plan_jobs(cells, "paper", "pack")
    assert len(jobs) * 4 <= len(cells)  # at least 4x fewer GPU jobs than one per cell
    by_id = {c.cell_id: c for c in cells}
    for job in jobs:
        stacks = pack_stacks([by_id[c] for c in job.cells], 4)
        assert sorted(c.cell_id for s in stacks for c in s) == sorted(job.cells)
        for s in stacks:
            assert 1 <= len(s) <= 4
            assert len({pack_key(c) for c in s}) == 1 and len({batch_plan(c) for c in s}) == 1
    # CIFAR-10 on 8 nodes: skew 0.8 leaves 8 samples unused, so its epochs are one sample shorter
    c0, c8 = by_id["t2-resnet20-dring8-c0-s0-ds-fp32"], by_id["t2-resnet20-dring8-c0-s0.8-ds-fp32"]
    assert batch_plan(c0) == (196, 6250) and batch_plan(c8) == (196, 6249)


def test_the_planner_and_the_run_agree_on_every_partitions_batches():
    """The paper-profile planner (pipeline.recipe.packing.batch_plan, torch-free, on the dataset's class sizes)
    and the training run (training.pack.batch_plan, on the loaded labels) give a cell the same
    (iterations per epoch, L): the skew split's L is its largest shard, a Dirichlet split's its
    mean shard (partition.epoch_samples), so Dirichlet cells of any alpha stack together."""
    from types import SimpleNamespace

    from lpdl_core.decentral.partition import KNOWN_CLASS_SIZES, labels_from_class_sizes
    from lpdl_core.pipeline.run.runcell import plan_cell
    from lpdl_core.pipeline.cells.grids import load_grid
    from lpdl_core.pipeline.recipe.packing import batch_plan as planned
    from lpdl_core.training.pack import batch_plan as trained

    cells = load_grid("heterogeneity").cells
    alphas = {c.dirichlet_alpha for c in cells}
    assert {1.0, 0.1, 0.01} <= alphas and None in alphas
    labels = torch.from_numpy(labels_from_class_sizes(KNOWN_CLASS_SIZES["cifar10"]))
    split = SimpleNamespace(y_train=labels)
    seen = {}
    for c in cells:
        if c.topology != "ring" or c.precision != "fp32" or c.algorithm != "ds" or c.compression:
            continue
        p = plan_cell(c, "paper", seed=c.seed)
        assert planned(c) == trained(split, p.topology, p.run), c.cell_id
        seen[c.dirichlet_alpha if c.dirichlet_alpha is not None else f"skew {c.skew}"] = planned(c)
    assert {seen[a] for a in (1.0, 0.1, 0.01)} == {(196, 6250)}  # 50,000 / 8 at batch 32
    assert seen["skew 0.8"] == (196, 6249)


def test_a_pack_is_billed_by_its_measured_step_or_as_its_solo_steps():
    from lpdl_core.pipeline.cells.tables import load_cells
    from lpdl_core.pipeline.workflow.runtime import StepTimes

    cell = next(c for c in load_cells() if c.cell_id == "t2-resnet20-dring8-c0-s0-ds-int8")
    base = dict(ref_model="resnet20", ref_nodes=8, ref_batch=32, macs_per_sample={"resnet20": 1.0},
                train_samples={"cifar10": 50000})
    solo_only = StepTimes(measured={"resnet20": {"int8": {"batched+compiled": 0.01}}}, **base)
    t, how = solo_only.step_basis(cell, "batched+compiled", 3)
    assert t == pytest.approx(0.03) and "packed step not measured" in how
    packed = StepTimes(measured={"resnet20": {"int8": {"batched+compiled": 0.01, "batched+compiled@pack4": 0.02}}},
                       **base)
    assert packed.step_basis(cell, "batched+compiled", 4) == (0.02, "measured")
    t, how = packed.step_basis(cell, "batched+compiled", 2)
    assert t == 0.02 and "a pack of 4 for 2 cells" in how
    assert packed.stack_seconds([cell] * 4, "batched+compiled") == pytest.approx(
        packed.steps(cell) * 0.02 * (1 + packed.eval_share))


@pytest.mark.slow
def test_a_pack_compiles_as_one_graph_and_equals_its_eager_steps():
    """The compiled step over a pack (fullgraph: any graph break is an error). Compiled and eager
    FP steps differ only by inductor's summation order: 1e-4 relative over 5 steps of this tanh MLP."""
    ms = [m for m in members("choco")]
    eager = PackedSimulator(tiny, members=ms, engine=EngineCfg(device="cpu", executor="batched"))
    compiled = PackedSimulator(tiny, members=ms, engine=EngineCfg(device="cpu", executor="batched", compile=True))
    for xb, yb in batches(5, 3 * N):
        torch.testing.assert_close(compiled.train_step(xb, yb, 0.1), eager.train_step(xb, yb, 0.1),
                                   rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(compiled.x, eager.x, rtol=1e-4, atol=1e-5)
    assert torch.equal(compiled.bytes_sent, eager.bytes_sent)
    assert compiled.compiled.one_graph


def test_the_workflow_config_takes_pack_and_refuses_it_with_distributed_ranks():
    import yaml

    from lpdl_core.pipeline.workflow.wfconfig import check_workflow_config
    from lpdl_core.errors import ConfigError

    cfg = yaml.safe_load(open("config/config.yaml"))
    schema = yaml.safe_load(open("workflow/schemas/config.schema.yaml"))
    assert check_workflow_config({**cfg, "cells_per_job": "pack", "pack_size": 8}, schema)["pack_size"] == 8
    assert yaml.safe_load(open("config/paper.yaml"))["cells_per_job"] == "pack"
    with pytest.raises(ConfigError, match="pack_size"):
        check_workflow_config({**cfg, "cells_per_job": "pack", "pack_size": 0}, schema)
    with pytest.raises(ConfigError, match="packed cells .* need executor loop or batched"):
        check_workflow_config({**cfg, "cells_per_job": "pack", "executor": "distributed"}, schema)


@pytest.mark.slow
def test_a_packed_job_killed_halfway_resumes_every_cell_from_its_checkpoint(tmp_path):
    from lpdl_core.pipeline.cells.tables import cells_by_id, load_cells
    from lpdl_core.pipeline.run.runpack import PACK_CHECKPOINT, run_cells_packed

    cells = cells_by_id(load_cells())
    todo = [cells[i] for i in ("t2-resnet20-dring8-c0-s0-choco-fp32", "t2-resnet20-dring8-c99-s0-choco-fp32")]
    whole = run_cells_packed(todo, lambda cid: str(tmp_path / "whole" / cid), "mini", options=PACK_CPU)

    def kill(cid, ev):
        if ev["event"] == "epoch" and ev["epoch"] == 2:
            raise Killed

    out_of = lambda cid: str(tmp_path / "killed" / cid)  # noqa: E731
    with pytest.raises(Killed):
        run_cells_packed(todo, out_of, "mini", options=PACK_CPU, progress=kill)
    assert (tmp_path / "killed" / todo[0].cell_id / PACK_CHECKPOINT).exists()
    assert not any((tmp_path / "killed" / c.cell_id / "metrics.json").exists() for c in todo)
    events = []
    resumed = run_cells_packed(todo, out_of, "mini", options=PACK_CPU,
                               progress=lambda cid, ev: events.append((cid, ev["event"], ev.get("epoch"))))
    assert {(c.cell_id, "resumed", 3) for c in todo} <= set(events)
    for c in todo:  # the same machine and process: a resumed run ends with the uninterrupted run's metrics
        assert resumed[c.cell_id]["final"] == whole[c.cell_id]["final"]
        assert resumed[c.cell_id]["identity"] == whole[c.cell_id]["identity"]
    assert not (tmp_path / "killed" / todo[0].cell_id / PACK_CHECKPOINT).exists()


def test_a_pack_whose_data_is_missing_reports_each_cell_and_goes_on(tmp_path):
    from lpdl_core.pipeline.cells.tables import cells_by_id, load_cells
    from lpdl_core.pipeline.run.runpack import run_cells_packed

    cells = cells_by_id(load_cells())
    todo = [cells[i] for i in ("t2-resnet20-dring8-c0-s0-choco-fp32", "t2-resnet20-dring8-c99-s0-choco-fp32")]
    out = run_cells_packed(todo, lambda cid: str(tmp_path / "runs" / cid), "paper",
                           options=dataclasses.replace(PACK_CPU, data_root=str(tmp_path / "no-data"), offline=True))
    assert set(out) == {c.cell_id for c in todo}
    assert all(isinstance(e, Exception) and "cifar10" in str(e).lower() for e in out.values()), out
