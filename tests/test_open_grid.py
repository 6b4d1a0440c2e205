"""The open grid: every registered compressor, partition, algorithm and graph is reachable from a
cell (the columns `compressor` and `partition` beyond the paper's, and the existing `algorithm` and
`topology`), and each such cell plans and trains. The paper's cells keep their ids and identities."""
from __future__ import annotations

import csv
import math
from dataclasses import replace

import pytest
import torch

from lpdl_core.config import ALGORITHMS, COMPRESSORS, GRAPHS
from lpdl_core.data.registry import load_dataset
from lpdl_core.decentral.engine import EngineCfg
from lpdl_core.pipeline.cells.tables import COLUMNS, EXTENSION_COLUMNS, PAPER_DIR, load_cells
from lpdl_core.pipeline.run.runcell import plan_cell
from lpdl_core.pipeline.run.runstore import run_identity, run_key
from lpdl_core.decentral.partition import DIRICHLET_EPOCH
from lpdl_core.training.train import train

CELLS = load_cells()
BASE = next(c for c in CELLS if c.cell_id == "t2-resnet20-dring8-c0-s0-ds-fp32")
COMPRESSOR_CELLS = {  # every registered compressor kind, with a parameter where it takes one
    "topk": dict(compressor="topk", compression=90, eta=0.1),
    "randomk": dict(compressor="randomk", compression=90, eta=0.1),
    "qsgd": dict(compressor="qsgd:4", compression=0, eta=0.5),
    "minmax8": dict(compressor="minmax8:8", compression=0, eta=0.5),
    "identity": dict(compressor="identity", compression=0, eta=1.0),
}
CASES = ([("compressor", k, v) for k, v in COMPRESSOR_CELLS.items()]
         + [("partition", "skew", dict(skew=0.8)), ("partition", "dirichlet", dict(partition="dirichlet:0.5"))]
         + [("algorithm", a, dict(algorithm=a, topology="ring") if a == "bagua-lp" else dict(algorithm=a))
            for a in ALGORITHMS]
         + [("graph", g, dict(topology=g)) for g in GRAPHS])


def test_the_cases_cover_every_registry():
    assert {k for axis, k, _ in CASES if axis == "compressor"} == set(COMPRESSORS)
    assert {k for axis, k, _ in CASES if axis == "algorithm"} == set(ALGORITHMS)
    assert {k for axis, k, _ in CASES if axis == "graph"} == set(GRAPHS)


@pytest.mark.parametrize("axis, name, changes", CASES, ids=[f"{a}-{n}" for a, n, _ in CASES])
def test_a_cell_of_every_registered_value_plans_and_trains(axis, name, changes):
    cell = replace(BASE, **changes)
    plan = plan_cell(cell, "mini")
    if axis == "compressor":
        assert plan.gossip.compressor.kind == ("identity" if name == "identity" else name)
    if axis == "partition":
        assert plan.run.dirichlet_alpha == (0.5 if name == "dirichlet" else None)
    split = load_dataset(plan.dataset, **plan.dataset_kwargs)
    split = replace(split, x_train=split.x_train[:128], y_train=split.y_train[:128],
                    x_test=split.x_test[:64], y_test=split.y_test[:64])
    run = replace(plan.run, epochs=1, final_gossip_rounds=1, curve_eval_samples=None)
    result = train(plan.make_model, split, topology=plan.topology, gossip=plan.gossip, optim_cfg=plan.optim,
                   engine=EngineCfg(device="cpu", seed=run.partition_seed), run=run)
    assert result.status == "ok" and math.isfinite(result.final["mean_acc"])
    # every node holds data; the skew partition gives equal shares and leaves the rest out (as the
    # official code does), a Dirichlet split places every sample once
    assert (result.partition.sum(1) > 0).all() and result.partition.sum() <= 128
    if axis == "partition" and name == "dirichlet":
        assert result.partition.sum() == 128


def test_extension_ids_name_what_differs():
    assert replace(BASE, compressor="randomk", compression=90, eta=0.1).cell_id == "t2-resnet20-dring8-rk90-s0-ds-fp32"
    assert replace(BASE, compressor="qsgd:4", eta=0.5).cell_id == "t2-resnet20-dring8-qsgd4-s0-ds-fp32"
    assert replace(BASE, compressor="minmax8:8", eta=0.5).cell_id == "t2-resnet20-dring8-mm8-s0-ds-fp32"
    assert replace(BASE, partition="dirichlet:0.1").cell_id == "t2-resnet20-dring8-c0-dir0.1-ds-fp32"


def test_the_paper_cells_keep_their_ids_and_identities():
    """The new columns at their defaults change nothing: not the ids, not the run identities (so
    no finished run is recomputed and every checkpoint's identity holds)."""
    for c in CELLS:
        assert (c.compressor, c.partition) == ("topk", "skew")
        ident = run_identity(c, profile="mini", seed=1234, fidelity={})
        assert not set(EXTENSION_COLUMNS) & set(ident["cell"])
        assert "epoch_samples" not in ident
    assert len({c.cell_id for c in CELLS}) == len(CELLS) == 226


def test_a_dirichlet_runs_identity_names_its_epoch_rule():
    """A Dirichlet cell's epoch is its mean shard (partition.epoch_samples); its runs under the
    earlier rule (the largest shard) are other runs, recomputed."""
    cell = replace(BASE, partition="dirichlet:0.1")
    ident = run_identity(cell, profile="mini", seed=1234, fidelity={})
    assert ident["epoch_samples"] == DIRICHLET_EPOCH == "mean shard"
    earlier = {k: v for k, v in ident.items() if k != "epoch_samples"}
    assert run_key(earlier) != run_key(ident)


def _csv(tmp_path, extra: dict, where=lambda r: True):
    """The first two rows of the paper's table2.csv that `where` accepts, with `extra` columns."""
    with open(PAPER_DIR / "table2.csv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if where(r)][:2]
    cols = COLUMNS + tuple(extra)
    for r in rows:
        r.update(extra)
    with open(tmp_path / "table2.csv", "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=cols)
        w.writeheader()
        w.writerows(rows)
    return tmp_path


@pytest.mark.parametrize("extra, message", [
    ({"compressor": "zip"}, r"table2\.csv:2: compressor: 'zip' is not one of identity, topk"),
    ({"compressor": "qsgd:99"}, r"table2\.csv:2: compressor: qsgd takes its level as qsgd:<1\.\.32>"),
    ({"compressor": "topk:5"}, r"table2\.csv:2: compressor: topk takes no parameter"),
    ({"partition": "dirichlet:-1"}, r"table2\.csv:2: partition: dirichlet takes alpha > 0"),
    ({"partition": "zipf:2"}, r"table2\.csv:2: partition: is skew or dirichlet:<alpha>"),
])
def test_a_bad_extension_value_is_file_line_column_why(tmp_path, extra, message):
    with pytest.raises(ValueError, match=message):
        load_cells(_csv(tmp_path, extra), tables=["table2"])


def test_incompatible_values_fail_at_load_time(tmp_path):
    # QSGD has no percent: a compressed (c90) row is refused; a Dirichlet partition takes no skew
    with pytest.raises(ValueError, match=r"table2\.csv:2: compression: is the percent top-k or random-k drops"):
        load_cells(_csv(tmp_path, {"compressor": "qsgd:4"}, lambda r: r["compression"] != "0"), tables=["table2"])
    with pytest.raises(ValueError, match=r"table2\.csv:2: skew: must be 0 with partition dirichlet:1"):
        load_cells(_csv(tmp_path, {"partition": "dirichlet:1"}, lambda r: float(r["skew"]) > 0), tables=["table2"])


def test_a_csv_with_the_extension_columns_at_their_defaults_is_the_paper(tmp_path):
    cells = load_cells(_csv(tmp_path, {"compressor": "topk", "partition": "skew"}), tables=["table2"])
    assert [c.cell_id for c in cells] == [c.cell_id for c in CELLS if c.table == "table2"][:2]


def test_the_header_takes_extension_columns_only_after_the_papers(tmp_path):
    path = _csv(tmp_path, {"partition": "skew", "compressor": "topk"})  # wrong order
    with pytest.raises(ValueError, match=r"table2\.csv:1: header: must be exactly"):
        load_cells(path, tables=["table2"])


def _star(n, rows, seed, t):
    """Node 0 sends to every other node, each other node to node 0."""
    return tuple(tuple(range(1, n)) if j == 0 else (0,) for j in range(n))


def _sign_apply(x, out, u, cfg):
    out.copy_(torch.sign(x) * x.abs().mean(1, keepdim=True))


def test_a_toy_compressor_and_graph_added_through_the_checklist_plan_and_train(monkeypatch):
    """docs/extending.md's checklists, followed in a temporary registry and nowhere else: a graph is
    its spec (specs/graphs.py) and its peers in topology.REGISTRY; a compressor is its spec
    (specs/compressors.py) and its kernels' REGISTRY entry (decentral/compress.py; a packed wire
    format, for the one-process-per-node executor only, is not needed here, and without one that
    executor refuses it in one line). A cell with each is valid, has an id, plans and trains one
    epoch on the mini data."""
    from lpdl_core.decentral import compress, topology, wire
    from lpdl_core.specs import compressors as compressor_specs, graphs as graph_specs

    with pytest.raises(Exception, match="star"):
        replace(BASE, topology="star")
    monkeypatch.setitem(graph_specs.SPECS, "star", graph_specs.GraphSpec(name="star", display="Star"))
    monkeypatch.setitem(topology.REGISTRY, "star", topology.Graph(_star))
    monkeypatch.setitem(compressor_specs.SPECS, "sign",
                        compressor_specs.CompressorSpec(name="sign", cell_id="sign"))
    monkeypatch.setitem(compress.REGISTRY, "sign", compress.Compressor(
        apply=_sign_apply, wire_bytes=lambda m, cfg, value_bytes: value_bytes + (m + 7) // 8))
    cases = {"t2-resnet20-star8-c0-s0-ds-fp32": dict(topology="star"),
             "t2-resnet20-dring8-sign-s0-ds-fp32": dict(compressor="sign", compression=0, eta=0.5)}
    for cell_id, changes in cases.items():
        cell = replace(BASE, **changes)
        assert cell.cell_id == cell_id
        plan = plan_cell(cell, "mini")
        assert plan.topology.W(0).sum(0) == pytest.approx(1.0)   # column-stochastic
        split = plan.load_data()
        split = replace(split, x_train=split.x_train[:128], y_train=split.y_train[:128],
                        x_test=split.x_test[:64], y_test=split.y_test[:64])
        run = replace(plan.run, epochs=1, final_gossip_rounds=1, curve_eval_samples=None)
        result = train(plan.make_model, split, topology=plan.topology, gossip=plan.gossip, optim_cfg=plan.optim,
                       engine=EngineCfg(device="cpu", seed=run.partition_seed), run=run)
        assert result.status == "ok" and math.isfinite(result.final["mean_acc"]), cell_id
        assert result.bytes_per_node > 0
    with pytest.raises(ValueError, match="'sign' has no packed wire format .* use an in-process executor"):
        wire.codec_of(compress.CompressorCfg.make("sign", drop=0.0))
