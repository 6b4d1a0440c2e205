"""Grids beyond the paper: a YAML spec of axes and fixed settings, expanded into cells.

`config/extensions/<name>.yaml`:

    description: one line on the question the grid asks
    fixed:                      # cell columns every cell shares (lpdl_core/pipeline/paper/README.md)
      dataset: cifar10
      model: resnet20
      ...
    axes:                       # the cross product of these; each value sets one or more columns
      precision: [fp32, int8]                        # a list: values of the column the axis names
      method:                                        # a mapping: label -> the columns it sets
        DS: {algorithm: ds}
        QGM: {algorithm: choco, momentum: qgm}
    derive:                     # columns that follow another column's value
      norm: {by: precision, values: {fp32: evonorm, int8: range-evonorm}}
    exclude:                    # combinations left out: each entry names axis labels
      - {method: QG-GUTm, compression: 99 %}
    lengths: [6, 12, 24]        # optional: every cell at each of these mini epochs (axis `length`)
    claims: true                # optional: its runs are evidence for the paper's claims (report.claims)

Every cell is a `Cell` of table `<name>` and is validated as the paper's are; an error names the
file, the cell's axis labels and the column. Cell ids are the usual ones with the grid's name in
front (`heterogeneity-resnet20-ring8-c99-dir0.1-choco-int8-qgm`): stable, readable, and unique.
Where two of the grid's cells would share that id, both name the columns they differ in
(`…-lr0.05`, `…-fr10`), and a length ladder always names the length (`…-len12`), so adding a
rung renames no finished cell: cells with different settings never share an id, and cells equal in
every column are an error. An axis may set any column but the seed (the runs take the config's
`seeds`) and mini_epochs (a ladder of lengths is `lengths`). Grid names cannot look like a
paper table's or its ids' prefix (table…, t3, fig1), so no grid's ids are the paper's.
Torch-free: the workflow plans with it.
"""
from __future__ import annotations

import itertools
import math
from dataclasses import MISSING, dataclass, fields, replace
from pathlib import Path
from typing import Any, Mapping

from ...bounded import load_yaml
from ...errors import ConfigError
from . import column_roles
from .cell import Cell, CellError, columns, is_grid_name, parse_column

EXTENSIONS_DIR = Path("config") / "extensions"   # relative to the working directory (the workflow's)
CELL_COLUMNS = set(columns("csv") + columns("optional"))
SETTABLE = set(columns("settable"))  # the grid's name fills the rest
# why a settable column is no axis (Cell's metadata)
NOT_AXES = {c: column_roles.meta(Cell, c, "not_axis") for c in SETTABLE if column_roles.meta(Cell, c, "not_axis")}
SPEC_KEYS = {"description", "fixed", "axes", "derive", "exclude", "lengths", "claims"}
LENGTH_AXIS = "length"   # the axis `lengths` makes: its labels are mini epochs
MAX_GRID_CELLS = 10_000  # combinations of a grid's axes (the paper has 226 cells; a cell trains minutes)
MAX_LENGTH = 1000        # mini epochs of one rung (the paper's protocol is 200)


@dataclass(frozen=True, kw_only=True)
class Grid:
    name: str
    description: str
    axes: dict[str, dict[str, dict[str, Any]]]   # axis -> label -> the columns it sets
    cells: tuple[Cell, ...]
    labels: dict[str, dict[str, str]]            # cell id -> axis -> label
    lengths: tuple[int, ...] = ()                # the length ladder (mini epochs), if the grid has one
    claims: bool = False                         # its cells are evidence for the paper's claims

    def varying(self) -> list[str]:
        """The axes with more than one value (those an effects table compares)."""
        return [a for a, values in self.axes.items() if len(values) > 1]


def grid_path(name: str, root: str | Path = ".") -> Path:
    if not is_grid_name(name):
        raise ConfigError(f"grid name {name!r}: lower-case words joined by '-', the first not a paper table's "
                          f"or its ids' prefix (table…, t<k>, fig<k>)")
    if name.split("-")[0] == "official":  # results/<profile>-<grid> would be the official mode's folder
        raise ConfigError(f"grid name {name!r}: 'official' is the official code mode's folder suffix")
    return Path(root) / EXTENSIONS_DIR / f"{name}.yaml"


def grid_folder(mode_folder: str, name: str) -> str:
    """The results folder of grid `name` run in the mode whose folder is mode_folder
    (results/<profile>[-official]-<name>)."""
    return f"{mode_folder}-{name}"


def grid_of_folder(folder: str, profile: str, names) -> str:
    """The grid among `names` whose folder (in either fidelity mode) `folder` is, or ""."""
    from ...config import Fidelity, results_name

    modes = [results_name(profile, Fidelity.preset(m)) for m in ("paper", "official")]
    return next((g for g in names if folder in (grid_folder(m, g) for m in modes)), "")


def available(root: str | Path = ".") -> list[str]:
    folder = Path(root) / EXTENSIONS_DIR
    return sorted(p.stem for p in folder.glob("*.yaml")) if folder.is_dir() else []


def _axis_values(path: Path, axis: str, values: Any) -> dict[str, dict[str, Any]]:
    if isinstance(values, list) and values:
        if axis not in CELL_COLUMNS:
            raise ConfigError(f"{path}: axes: {axis}: a list sets the column of that name, and there is "
                              f"no column {axis!r}; give a mapping label -> columns")
        return {str(v): {axis: v} for v in values}
    if isinstance(values, Mapping) and values:
        out = {}
        for label, cols in values.items():
            if not isinstance(cols, Mapping) or not cols:
                raise ConfigError(f"{path}: axes: {axis}: {label}: must be a mapping of cell columns")
            out[str(label)] = dict(cols)
        return out
    raise ConfigError(f"{path}: axes: {axis}: must be a non-empty list or mapping")


def _check_columns(path: Path, where: str, cols: Mapping) -> None:
    bad = sorted(set(cols) - SETTABLE)
    if bad:
        raise ConfigError(f"{path}: {where}: {bad[0]!r} is not a cell column a grid sets "
                          f"(see lpdl_core/pipeline/paper/README.md)")


def load_grid(name: str, root: str | Path = ".") -> Grid:
    """The grid `name` from config/extensions/<name>.yaml under root, expanded and validated."""
    path = grid_path(name, root)
    if not path.is_file():
        have = ", ".join(available(root)) or "none"
        raise ConfigError(f"{path}: no such grid (available: {have})")
    spec = load_yaml(path, "grid spec")
    if not isinstance(spec, Mapping):
        raise ConfigError(f"{path}: must be a mapping with fixed and axes")
    unknown = set(spec) - SPEC_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown key {sorted(unknown)[0]!r}; known: {', '.join(sorted(SPEC_KEYS))}")
    fixed = dict(spec.get("fixed") or {})
    _check_columns(path, "fixed", fixed)
    axes_spec = spec.get("axes")
    if not isinstance(axes_spec, Mapping) or not axes_spec:
        raise ConfigError(f"{path}: axes: at least one axis")
    axes = {str(a): _axis_values(path, str(a), v) for a, v in axes_spec.items()}
    for a, values in axes.items():
        for label, cols in values.items():
            _check_columns(path, f"axes: {a}: {label}", cols)
            for col in set(cols) & set(NOT_AXES):
                raise ConfigError(f"{path}: axes: {a}: {label}: {col}: {NOT_AXES[col]}")
    lengths = _lengths(path, spec.get("lengths"), fixed, axes)
    if lengths:
        axes[LENGTH_AXIS] = {str(n): {"mini_epochs": n} for n in lengths}
    claims = spec.get("claims", False)
    if not isinstance(claims, bool):
        raise ConfigError(f"{path}: claims: true or false, got {claims!r}")
    derive = dict(spec.get("derive") or {})
    for col, rule in derive.items():
        if col not in CELL_COLUMNS or not isinstance(rule, Mapping) or set(rule) != {"by", "values"}:
            raise ConfigError(f"{path}: derive: {col}: must be a cell column with 'by' (a column) and 'values'")
    exclude = _exclude(path, spec.get("exclude") or [], axes)
    count = math.prod(len(v) for v in axes.values())
    if count > MAX_GRID_CELLS:
        sizes = " × ".join(str(len(v)) for v in axes.values())
        raise ConfigError(f"{path}: {count:,} combinations of its axes ({sizes}), more than a grid may have "
                          f"({MAX_GRID_CELLS:,})")
    made: list[tuple[Cell, str, dict[str, str]]] = []
    for combo in itertools.product(*[list(v.items()) for v in axes.values()]):
        chosen = {a: label for a, (label, _) in zip(axes, combo)}
        if any(all(chosen[a] == str(label) for a, label in rule.items()) for rule in exclude):
            continue
        cols = {**fixed, "table": name, "block": name, "notes": ""}
        for _, set_cols in combo:
            cols.update(set_cols)
        for col, rule in derive.items():
            if col not in cols:
                key = str(cols.get(rule["by"]))
                if key not in {str(k) for k in rule["values"]}:
                    raise ConfigError(f"{path}: derive: {col}: no value for {rule['by']} {key}")
                cols[col] = {str(k): v for k, v in rule["values"].items()}[key]
        where = ", ".join(f"{a}={label}" for a, label in chosen.items())
        made.append((_cell(path, where, cols), where, chosen))
    cells = _name_columns(path, made, always=("mini_epochs",) if lengths else ())
    return Grid(name=name, description=str(spec.get("description", "")), axes=axes, cells=tuple(cells),
                labels={c.cell_id: chosen for c, (_, _, chosen) in zip(cells, made)}, lengths=lengths,
                claims=claims)


def _lengths(path: Path, value: Any, fixed: Mapping, axes: Mapping) -> tuple[int, ...]:
    """The grid's length ladder: distinct mini epochs, ascending (none when not given)."""
    if value is None:
        return ()
    if (not isinstance(value, list) or not value
            or not all(isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= MAX_LENGTH for n in value)):
        raise ConfigError(f"{path}: lengths: a list of mini epochs, each 1..{MAX_LENGTH}, got {value!r}")
    if len(set(value)) != len(value):
        raise ConfigError(f"{path}: lengths: {value} names a length twice")
    if "mini_epochs" in fixed or LENGTH_AXIS in axes:
        raise ConfigError(f"{path}: lengths: the ladder sets mini_epochs as the axis {LENGTH_AXIS!r}; "
                          f"leave mini_epochs out of fixed and name no other axis {LENGTH_AXIS!r}")
    return tuple(sorted(value))


def _exclude(path: Path, exclude: Any, axes: Mapping) -> list[Mapping]:
    if not isinstance(exclude, list):
        raise ConfigError(f"{path}: exclude: must be a list of mappings axis -> label")
    for k, rule in enumerate(exclude):
        if not isinstance(rule, Mapping) or not rule:
            raise ConfigError(f"{path}: exclude: entry {k + 1}: must be a mapping axis -> label")
        for a, label in rule.items():
            if a not in axes or str(label) not in axes[a]:
                raise ConfigError(f"{path}: exclude: entry {k + 1}: {a}: {label!r} is not a label of that axis")
    return exclude


def _id_value(col: str, value: Any) -> str:
    if isinstance(value, tuple):
        text = "-".join(str(v) for v in value)
    else:
        text = f"{value:g}" if isinstance(value, float) else str(value)
    return column_roles.meta(Cell, col, "id_code") + text


def _name_columns(path: Path, made: list[tuple[Cell, str, dict]], always: tuple[str, ...] = ()) -> list[Cell]:
    """The grid's cells with ids that name, where two or more cells would share an id, every
    column in which those cells differ (e.g. -lr0.05), and the columns in `always` (the length of a
    ladder: -len12, so that adding a rung renames no finished cell): cells with different settings
    never share an id, and a grid that needs no such name keeps its plain ids. Two cells that agree
    on every column are one cell twice: an error naming both."""
    groups: dict[str, list[int]] = {}
    for k, (cell, _, _) in enumerate(made):
        groups.setdefault(cell.cell_id, []).append(k)
    cells = [cell for cell, _, _ in made]
    settable = columns("settable")
    for members in (m for m in groups.values() if len(m) > 1 or always):
        differ = [col for col in settable if len({getattr(cells[k], col) for k in members}) > 1 or col in always]
        if not differ:
            a, b = (made[k][1] for k in members[:2])
            raise ConfigError(f"{path}: cells {a} and {b} are the same cell {cells[members[0]].cell_id} "
                              f"(they agree on every column)")
        for k in members:
            suffix = "".join("-" + _id_value(col, getattr(cells[k], col)) for col in differ)
            cells[k] = replace(cells[k], id_suffix=suffix)
    seen: dict[str, str] = {}
    for cell, (_, where, _) in zip(cells, made):
        if cell.cell_id in seen:  # a named id that another cell has as its plain one
            raise ConfigError(f"{path}: cells {seen[cell.cell_id]} and {where} would share the id {cell.cell_id}")
        seen[cell.cell_id] = where
    return cells


def _cell(path: Path, where: str, cols: Mapping) -> Cell:
    missing = sorted(c.name for c in fields(Cell) if c.name not in cols
                     and c.default is MISSING and c.default_factory is MISSING)
    if missing:
        raise ConfigError(f"{path}: {where}: {missing[0]}: not set by fixed, an axis or derive")
    kwargs = {}
    for col, value in cols.items():
        try:
            kwargs[col] = parse_column(col, "" if value is None else str(value)) if col != "table" else value
        except ValueError as e:
            raise ConfigError(f"{path}: {where}: {col}: cannot parse {value!r} ({e})") from None
    try:
        return Cell(**kwargs)
    except CellError as e:
        raise ConfigError(f"{path}: {where}: {e.column}: {e.why}") from None
