"""Each cell column's roles are declared once, on Cell (lpdl_core.pipeline.cells.column_roles): every list
of columns derives from them, and a grid's table keeps every column its cells differ in."""
from __future__ import annotations

from dataclasses import dataclass, fields

import pandas as pd
import pytest

from lpdl_core.pipeline.cells import column_roles
from lpdl_core.pipeline.aggregation.aggregate import AXES, GRID_AXES, write_aggregate
from lpdl_core.pipeline.cells.cell import NOT_COLUMNS, Cell, columns, parse_column
from lpdl_core.pipeline.cells.tables import COLUMNS, EXTENSION_COLUMNS, load_cells
from lpdl_core.pipeline.cells.grids import available, load_grid

GRID = """\
description: every kind of column a grid may vary
fixed: {dataset: cifar10, model: resnet20, nodes: 8, topology: ring, optimizer: sgd, lr: 0.1,
        epochs: 200, batch_per_node: 32, seed: 1234, skew: 0.0, algorithm: choco, momentum: nesterov,
        precision: fp32, norm: evonorm, compression: 0, eta: 1.0, lr_schedule: resnet}
axes:
  compressor: {topk: {compressor: topk}, qsgd: {compressor: "qsgd:4"}}
  partition: {skew: {partition: skew}, dirichlet: {partition: "dirichlet:0.1"}}
  final_gossip_rounds: [0, 50]
  schedule:
    resnet: {lr_schedule: resnet}
    steps: {lr_schedule: multistep, milestones: "100;150"}
lengths: [3, 6]
"""
GRID_FIELDS = ("compressor", "partition", "final_gossip_rounds", "lr_schedule", "milestones", "mini_epochs")


def test_every_column_declares_its_roles_and_every_role_is_used():
    declared = {f.name for f in fields(Cell) if "roles" in f.metadata}
    assert declared == {f.name for f in fields(Cell)} - set(NOT_COLUMNS) and NOT_COLUMNS == ("id_suffix",)
    for role in column_roles.ROLES:
        assert columns(role), role
    assert COLUMNS + EXTENSION_COLUMNS == tuple(f.name for f in fields(Cell) if f.name not in NOT_COLUMNS)
    # the run identity and runs.csv leave out only what does not change a run / is no table value
    assert set(f.name for f in fields(Cell)) - set(columns("identity")) == {"seed", "paper_acc", "notes", "id_suffix"}
    assert set(columns("table")) <= set(columns("runs")) and AXES[2] == "cell_id"


def test_a_bad_declaration_fails_at_import_time():
    with pytest.raises(ValueError, match="unknown role 'axes'"):
        column_roles.column("axes")
    with pytest.raises(ValueError, match="unknown kind"):
        column_roles.column("csv", kind="date")
    with pytest.raises(ValueError, match="not_axis is for settable"):
        column_roles.column("csv", not_axis="why")
    with pytest.raises(ValueError, match="unknown role"):
        columns("axis")

    @dataclass(frozen=True, kw_only=True)
    class Row:
        a: int = column_roles.column("csv", kind="int")
        b: str = column_roles.column("csv", "optional", default="x")

    assert column_roles.columns(Row, "csv") == ("a", "b") and column_roles.defaults(Row, "optional") == {"b": "x"}


@pytest.mark.parametrize("name, text, value", [
    ("nodes", " 8 ", 8), ("lr", "0.1", 0.1), ("milestones", "100;150", (100, 150)), ("milestones", "", ()),
    ("paper_acc", "", None), ("paper_acc", "91.5", 91.5), ("topology", " ring ", "ring")])
def test_a_columns_kind_parses_its_text(name, text, value):
    assert parse_column(name, text) == value


@pytest.mark.parametrize("name, text", [("lr", "inf"), ("nodes", "8.5"), ("paper_acc", "nan")])
def test_a_malformed_value_is_a_value_error(name, text):
    with pytest.raises(ValueError):
        parse_column(name, text)


def _differing(cells) -> set[str]:
    return {c for c in columns("settable") if len({getattr(x, c) for x in cells}) > 1} - {"seed"}


def test_a_grid_table_keeps_every_column_its_cells_differ_in(tmp_path):
    (tmp_path / "config" / "extensions").mkdir(parents=True)
    (tmp_path / "config" / "extensions" / "kinds.yaml").write_text(GRID)
    grid = load_grid("kinds", tmp_path)
    assert _differing(grid.cells) == set(GRID_FIELDS)
    write_aggregate(tmp_path / "results", grid.cells, profile="mini", tables=["kinds"], paper_shape=False)
    table = pd.read_csv(tmp_path / "results" / "tables" / "kinds.csv", keep_default_na=False)
    assert list(table.columns[:len(GRID_AXES)]) == list(GRID_AXES) and (table["status"] == "missing").all()
    for cell, row in zip(grid.cells, table.to_dict("records")):
        assert row["cell_id"] == cell.cell_id
        for col in GRID_FIELDS:
            want = getattr(cell, col)
            want = ";".join(map(str, want)) if col == "milestones" else want
            assert str(row[col]) == str(want), (cell.cell_id, col)


@pytest.mark.parametrize("name", available("."))
def test_the_shipped_grids_tables_have_the_columns_they_vary(name):
    assert _differing(load_grid(name, ".").cells) <= set(GRID_AXES)


def test_the_paper_tables_keep_their_columns(tmp_path):
    """Nothing a user sees changes for the paper's tables: the grid columns stay out of them."""
    cells = load_cells(tables=["table3"])
    write_aggregate(tmp_path, cells, profile="mini", tables=["table3"])
    assert tuple(pd.read_csv(tmp_path / "tables" / "table3.csv").columns[:len(AXES)]) == AXES
    assert not set(GRID_FIELDS) & set(pd.read_csv(tmp_path / "tables" / "table3.csv").columns)
