"""Grid specs (config/extensions/<name>.yaml) expand into validated cells with stable ids."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lpdl_core.errors import ConfigError
from lpdl_core.pipeline.cells.grids import load_grid
from lpdl_core.pipeline.run.runcell import plan_cell

ROOT = Path(__file__).resolve().parent.parent
SPEC = """
description: a small grid
fixed: {dataset: cifar10, model: resnet20, nodes: 8, optimizer: sgd, lr: 0.1, lr_schedule: resnet,
        epochs: 200, batch_per_node: 32, final_gossip_rounds: 50, seed: 1234, momentum: nesterov}
axes:
  algorithm: [ds, choco]
  precision: [fp32, int8]
  compression:
    0 %: {compression: 0, eta: 1.0}
    rk 90 %: {compressor: randomk, compression: 90, eta: 0.1}
  partition:
    skew 0.8: {skew: 0.8}
    Dirichlet 0.1: {partition: "dirichlet:0.1", skew: 0.0}
  topology: [ring]
derive:
  norm: {by: precision, values: {fp32: evonorm, int8: range-evonorm}}
"""


def _grid(tmp_path, text=SPEC, name="small"):
    (tmp_path / "config/extensions").mkdir(parents=True, exist_ok=True)
    (tmp_path / f"config/extensions/{name}.yaml").write_text(text)
    return load_grid(name, tmp_path)


def test_the_cross_product_with_stable_readable_ids(tmp_path):
    g = _grid(tmp_path)
    assert len(g.cells) == 2 * 2 * 2 * 2 * 1
    ids = [c.cell_id for c in g.cells]
    assert len(set(ids)) == len(ids)
    assert ids[0] == "small-resnet20-ring8-c0-s0.8-ds-fp32"
    assert "small-resnet20-ring8-rk90-dir0.1-choco-int8" in ids
    assert ids == [c.cell_id for c in _grid(tmp_path).cells]      # the same spec, the same ids in order
    assert g.varying() == ["algorithm", "precision", "compression", "partition"]
    assert g.labels["small-resnet20-ring8-rk90-dir0.1-choco-int8"] == {
        "algorithm": "choco", "precision": "int8", "compression": "rk 90 %", "partition": "Dirichlet 0.1",
        "topology": "ring"}
    for c in g.cells:
        assert c.norm == ("evonorm" if c.precision == "fp32" else "range-evonorm")
        plan_cell(c, "mini")


@pytest.mark.parametrize("change, message", [
    (("topology: [ring]", "topology: [moebius]"),
     r"small\.yaml: algorithm=ds, .*topology=moebius: topology: 'moebius' is not one of"),
    (("0 %: {compression: 0, eta: 1.0}", "0 %: {compression: 0, eta: 0.5}"),
     r"compression=0 %.*: eta: must be in \(0, 1\] and 1\.0 without compression"),
    (("  topology: [ring]\n", "  topology: [ring]\n  colour: [red]\n"),
     r"axes: colour: a list sets the column of that name"),
    (("seed: 1234,", "seed: 1234, table: x,"), r"fixed: 'table' is not a cell column a grid sets"),
    (("    Dirichlet 0.1: {partition: \"dirichlet:0.1\", skew: 0.0}", "    Dirichlet 0.1: {skew: 0.8}"),
     r"are the same cell small-resnet20-ring8-c0-s0\.8-ds-fp32"),
    (("epochs: 200,", ""), r"epochs: not set by fixed, an axis or derive"),
    (("derive:", "derivation:"), r"unknown key 'derivation'"),
    (("derive:", "exclude: [{algorithm: dpsgd}]\nderive:"),
     r"exclude: entry 1: algorithm: 'dpsgd' is not a label of that axis"),
])
def test_a_bad_spec_is_one_line_naming_file_cell_and_column(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message):
        _grid(tmp_path, SPEC.replace(*change))


def test_a_missing_grid_names_what_exists(tmp_path):
    _grid(tmp_path)
    with pytest.raises(ConfigError, match=r"no such grid \(available: small\)"):
        load_grid("other", tmp_path)
    for name in ("table2", "t3", "fig1", "t3-x"):  # a grid t3 would give Table 3's ids
        with pytest.raises(ConfigError, match="not a paper table's or its ids' prefix"):
            load_grid(name, tmp_path)
    with pytest.raises(ConfigError, match="official code mode's folder suffix"):
        load_grid("official", tmp_path)


def test_the_shipped_heterogeneity_grid():
    g = load_grid("heterogeneity", ROOT)
    assert len(g.cells) == 3 * 2 * 5 * 2 * 2 + 1 * 2 * 5 * 1 * 2   # QG-GUTm at 0 % only
    assert {c.dirichlet_alpha for c in g.cells} == {None, 1.0, 0.1, 0.01}
    assert {c.skew for c in g.cells} == {0.0, 0.8}
    assert {c.topology for c in g.cells} == {"ring", "torus"}
    assert {(c.algorithm, c.momentum) for c in g.cells} == {("ds", "nesterov"), ("choco", "nesterov"), ("choco", "qgm"),
                                                           ("gut", "qgm")}
    assert all(c.compression == 0 for c in g.cells if c.algorithm == "gut")
    for c in g.cells:
        plan_cell(c, "mini")  # every cell plans (GUT's doubly stochastic graphs included)


def test_lpdl_cells_lists_a_grid():
    out = subprocess.run([sys.executable, "-m", "lpdl_core", "cells", "--grid", "heterogeneity"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    assert out == [c.cell_id for c in load_grid("heterogeneity", ROOT).cells]


def test_lpdl_train_takes_a_grids_cell_ids_only_with_grid(tmp_path):
    cid = load_grid("heterogeneity", ROOT).cells[0].cell_id
    p = subprocess.run([sys.executable, "-m", "lpdl_core", "train", "--cell", cid, "--out", str(tmp_path / "r")],
                       cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 2 and f"unknown cell '{cid}' of the paper" in p.stderr
    p = subprocess.run([sys.executable, "-m", "lpdl_core", "train", "--grid", "heterogeneity", "--cell", "nope",
                        "--out", str(tmp_path / "r")], cwd=ROOT, capture_output=True, text=True)
    assert p.returncode == 2 and "unknown cell 'nope' of grid heterogeneity" in p.stderr


def test_exclude_leaves_out_combinations(tmp_path):
    g = _grid(tmp_path, SPEC.replace("derive:", "exclude:\n  - {algorithm: ds, compression: rk 90 %}\nderive:"))
    assert len(g.cells) == 16 - 4
    assert not [c for c in g.cells if c.algorithm == "ds" and c.compressor == "randomk"]


def test_two_cells_with_different_settings_never_share_an_id(tmp_path):
    """An axis over a column the plain id does not name (lr, epochs, final rounds, ...): the ids of
    the cells that would share one name the columns they differ in; the others keep theirs."""
    spec = SPEC.replace("  topology: [ring]\n", "  topology: [ring]\n  rate: [{lr: 0.1}, {lr: 0.05}]\n")
    spec = spec.replace("  rate: [{lr: 0.1}, {lr: 0.05}]",
                        "  rate:\n    base: {lr: 0.1}\n    half: {lr: 0.05, final_gossip_rounds: 10}")
    g = _grid(tmp_path, spec)
    ids = [c.cell_id for c in g.cells]
    assert len(set(ids)) == len(ids) == 32
    assert "small-resnet20-ring8-c0-s0.8-ds-fp32-lr0.1-fr50" in ids
    assert "small-resnet20-ring8-c0-s0.8-ds-fp32-lr0.05-fr10" in ids
    plain = _grid(tmp_path, SPEC)  # no such axis: the plain ids, as before
    assert plain.cells[0].cell_id == "small-resnet20-ring8-c0-s0.8-ds-fp32"


def test_a_length_ladder_is_an_axis_of_runs_of_their_own(tmp_path):
    """`lengths` sets mini_epochs, one cell per length: each its own id (-len<n>), its own run
    identity and its own mini protocol, and never the same run as another length."""
    from lpdl_core.pipeline.recipe.mini import mini_run, same_runs
    from lpdl_core.pipeline.run.runstore import run_identity, run_key

    g = _grid(tmp_path, SPEC + "lengths: [12, 6]\n")
    assert g.lengths == (6, 12) and g.axes["length"] == {"6": {"mini_epochs": 6}, "12": {"mini_epochs": 12}}
    assert len(g.cells) == 32 and g.varying()[-1] == "length"
    six, twelve = (c for c in g.cells if c.cell_id.startswith("small-resnet20-ring8-c0-s0.8-ds-fp32-len"))
    assert (six.cell_id, twelve.cell_id) == ("small-resnet20-ring8-c0-s0.8-ds-fp32-len6",
                                             "small-resnet20-ring8-c0-s0.8-ds-fp32-len12")
    assert (mini_run(six).epochs, mini_run(twelve).epochs) == (6, 12)
    keys = {run_key(run_identity(c, profile="mini", seed=1, fidelity={})) for c in (six, twelve)}
    assert len(keys) == 2
    assert six.cell_id not in same_runs([six, twelve]) and twelve.cell_id not in same_runs([six, twelve])


@pytest.mark.parametrize("change, message", [
    ("lengths: [6, 6]", r"lengths: \[6, 6\] names a length twice"),
    ("lengths: [0]", r"lengths: a list of mini epochs, each 1\.\.1000"),
    ("lengths: 6", r"lengths: a list of mini epochs"),
    ("claims: yes please", r"claims: true or false"),
])
def test_a_bad_ladder_or_claims_flag_is_one_line(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message):
        _grid(tmp_path, SPEC + change + "\n")


@pytest.mark.parametrize("axis, message", [
    ("  seeds: [{seed: 1}, {seed: 2}]", r"seed: a grid's runs take the config's seeds"),
    ("  length: [{mini_epochs: 3}, {mini_epochs: 4}]", r"mini_epochs: give a length ladder as `lengths"),
])
def test_seed_and_length_are_not_column_axes(tmp_path, axis, message):
    axis = axis.replace("[{seed: 1}, {seed: 2}]", "\n    a: {seed: 1}\n    b: {seed: 2}")
    axis = axis.replace("[{mini_epochs: 3}, {mini_epochs: 4}]", "\n    a: {mini_epochs: 3}\n    b: {mini_epochs: 4}")
    with pytest.raises(ConfigError, match=message):
        _grid(tmp_path, SPEC.replace("  topology: [ring]\n", "  topology: [ring]\n" + axis + "\n"))


def test_the_shipped_claims_grid_is_table2s_resnet20_cells_at_three_lengths():
    """Every cell of the claims grid at 6 epochs is the mini run of a Table 2 cell (mini.twins),
    so `make reproduce-claims` reuses `make reproduce`'s runs; at 12 and 24 epochs none is."""
    from lpdl_core.pipeline.cells.tables import load_cells
    from lpdl_core.pipeline.recipe.mini import twins

    g = load_grid("claims", ROOT)
    assert g.claims and g.lengths == (6, 12, 24) and len(g.cells) == 4 * 2 * 2 * 2 * 3
    paper = [c for c in load_cells(None, tables=["table2"]) if c.model == "resnet20"]
    t = twins(g.cells, paper)
    assert set(t) == {c.cell_id for c in g.cells if c.mini_epochs == 6}
    assert {p.cell_id for p in t.values()} == {p.cell_id for p in paper if p.skew in (0.0, 0.9)
                                                and not (p.algorithm == "choco" and p.compression == 0)}


def test_adding_a_rung_to_the_ladder_renames_and_replans_no_finished_length(tmp_path):
    """A ladder of one length already names it; a longer ladder keeps every earlier cell's id, run
    identity and training job, so its finished runs are never trained again."""
    from lpdl_core.pipeline.workflow.jobs import plan_jobs
    from lpdl_core.pipeline.run.runstore import run_identity

    one = _grid(tmp_path, SPEC + "lengths: [6]\n")
    two = _grid(tmp_path, SPEC + "lengths: [6, 12]\n")
    assert all(c.cell_id.endswith("-len6") for c in one.cells)
    assert [c.cell_id for c in one.cells] == [c.cell_id for c in two.cells if c.mini_epochs == 6]
    ident = lambda c: run_identity(c, profile="mini", seed=1234, fidelity={})  # noqa: E731
    assert [ident(c) for c in one.cells] == [ident(c) for c in two.cells if c.mini_epochs == 6]
    for per in ("block", "pack"):
        jobs_one = {(j.name, j.cells) for j in plan_jobs(one.cells, "mini", per)}
        assert jobs_one <= {(j.name, j.cells) for j in plan_jobs(two.cells, "mini", per)}
