"""Grid specs (config/extensions/<name>.yaml) expand into validated cells with stable ids."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from lpdl_core.errors import ConfigError
from lpdl_core.pipeline.grids import load_grid
from lpdl_core.pipeline.runcell import plan_cell

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
    (("topology: [ring]", "topology: [moebius]"), r"small\.yaml: algorithm=ds, .*topology=moebius: topology: 'moebius' is not one of"),
    (("0 %: {compression: 0, eta: 1.0}", "0 %: {compression: 0, eta: 0.5}"),
     r"compression=0 %.*: eta: must be in \(0, 1\] and 1\.0 without compression"),
    (("  topology: [ring]\n", "  topology: [ring]\n  colour: [red]\n"), r"axes: colour: a list sets the column of that name"),
    (("seed: 1234,", "seed: 1234, table: x,"), r"fixed: 'table' is not a cell column a grid sets"),
    (("    Dirichlet 0.1: {partition: \"dirichlet:0.1\", skew: 0.0}", "    Dirichlet 0.1: {skew: 0.8}"), r"are the same cell small-resnet20-ring8-c0-s0\.8-ds-fp32"),
    (("epochs: 200,", ""), r"epochs: not set by fixed, an axis or derive"),
    (("derive:", "derivation:"), r"unknown key 'derivation'"),
    (("derive:", "exclude: [{algorithm: dpsgd}]\nderive:"), r"exclude: entry 1: algorithm: 'dpsgd' is not a label of that axis"),
])
def test_a_bad_spec_is_one_line_naming_file_cell_and_column(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message):
        _grid(tmp_path, SPEC.replace(*change))


def test_a_missing_grid_names_what_exists(tmp_path):
    _grid(tmp_path)
    with pytest.raises(ConfigError, match=r"no such grid \(available: small\)"):
        load_grid("other", tmp_path)
    with pytest.raises(ConfigError, match="not a paper table's name"):
        load_grid("table2", tmp_path)
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
