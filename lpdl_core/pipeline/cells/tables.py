"""The cell tables: one row of <paper_dir>/<table>.csv = one training run (a `Cell`).

`load_cells()` reads and validates every row (errors name the file and line). The paper's own cells
ship with the package (PAPER_DIR, lpdl_core/pipeline/paper/), so an installed lpdl has them; its
README.md documents the columns and every assumption behind them. A copy of that folder, edited or
extended, can be given instead as `paper_dir`. What one row means and how it is validated:
lpdl_core.pipeline.cells.cell.
"""
from __future__ import annotations

import codecs
import csv
import io
from pathlib import Path

from ...bounded import MAX_CSV_BYTES
from ...config import PACKAGE_DIR, TABLES
from ...errors import ConfigError
from . import column_roles
from .cell import Cell, CellError, columns, parse_column

# rows per artifact in the paper (fig1: one run per normalization layer compared)
expected_counts = {"table1": 14, "table2": 128, "table3": 16, "table4": 16, "table5": 48, "fig1": 4}
assert tuple(expected_counts) == TABLES

# the open grid's columns: optional in a CSV, after the paper's COLUMNS, defaults the paper's
EXTENSION_COLUMNS = columns("optional")
COLUMNS = columns("csv")  # every paper CSV's header
# their defaults: a run identity leaves a column out at its default, so the paper's runs keep theirs
EXTENSION_DEFAULTS = column_roles.defaults(Cell, "optional")


# the paper's cells, packaged with the library (package data: found wherever lpdl is installed)
PAPER_DIR = PACKAGE_DIR / "pipeline" / "paper"


def paper_dir_path(paper_dir: str | Path | None = None) -> Path:
    """The folder of cell tables: `paper_dir` as given (relative to the working directory), or the
    packaged paper cells when None."""
    return PAPER_DIR if paper_dir in (None, "") else Path(paper_dir)


def load_cells(paper_dir: str | Path | None = None, tables=None) -> list[Cell]:
    """Read and validate <paper_dir>/<table>.csv for each table (paper_dir None: the packaged paper
    cells; tables None: every table file that exists there; naming a table whose file is missing
    is an error). Every malformed row, and a cell id used twice, is a ConfigError
    `file:line: column: why`; so are a file that is not UTF-8 text (a leading byte order mark, as
    Excel writes it, is fine) and a file with a header but no rows."""
    root = paper_dir_path(paper_dir)
    if not root.is_dir():
        raise ConfigError(f"paper dir {paper_dir}: no such folder (it holds the paper's cells as "
                          f"table1.csv ... fig1.csv)")
    if tables is None:
        tables = [t for t in expected_counts if (root / f"{t}.csv").exists()]
        if not tables:
            raise ConfigError(f"no table CSVs ({', '.join(expected_counts)}) in {root}")
    for table in tables:
        if table not in expected_counts:
            raise ConfigError(f"table {table!r} is not one of {', '.join(expected_counts)}")
    cells: list[Cell] = []
    seen: dict[str, str] = {}
    for table in tables:
        path = root / f"{table}.csv"
        if not path.is_file():
            raise ConfigError(f"{path}: no such file (the cells of {table})")
        with io.StringIO(_read_text(path), newline="") as fh:
            reader = csv.DictReader(fh)
            header = tuple(reader.fieldnames or ())
            extra = header[len(COLUMNS):]
            if header[:len(COLUMNS)] != COLUMNS or list(extra) != [c for c in EXTENSION_COLUMNS if c in extra]:
                raise ConfigError(f"{path}:1: header: must be exactly {','.join(COLUMNS)} (then, optionally, "
                                  f"any of {','.join(EXTENSION_COLUMNS)} in that order)")
            present = header
            after_header, rows = reader.line_num + 1, 0
            for row in reader:
                rows += 1
                where = f"{path}:{reader.line_num}"
                if None in row:
                    raise ConfigError(f"{where}: (row): more fields than the {len(present)} columns")
                kwargs = {}
                for col in present:
                    if row[col] is None:
                        raise ConfigError(f"{where}: {col}: missing (fewer fields than the {len(present)} columns)")
                    try:
                        kwargs[col] = parse_column(col, row[col])
                    except ValueError as e:
                        raise ConfigError(f"{where}: {col}: cannot parse {row[col]!r} ({e})") from None
                if kwargs["table"] != table:
                    raise ConfigError(f"{where}: table: is {kwargs['table']!r}, expected {table!r}")
                try:
                    cell = Cell(**kwargs)
                except CellError as e:
                    raise ConfigError(f"{where}: {e.column}: {e.why}") from None
                if cell.cell_id in seen:
                    raise ConfigError(f"{where}: cell_id: {cell.cell_id} is already defined at {seen[cell.cell_id]}")
                seen[cell.cell_id] = where
                cells.append(cell)
            if not rows:  # a table without cells would only fail later, as missing outputs
                raise ConfigError(f"{path}:{after_header}: no cells (the file has a header but no rows)")
    return cells


def _read_text(path: Path) -> str:
    """The CSV's text: UTF-8, with or without the byte order mark that Excel writes first;
    ConfigError `file:line: not UTF-8 text (byte 0x.. at column ..)` otherwise."""
    try:
        size = path.stat().st_size
        if size > MAX_CSV_BYTES:
            raise ConfigError(f"{path}: {size:,} bytes, more than a cell table may have ({MAX_CSV_BYTES:,})")
        data = path.read_bytes().removeprefix(codecs.BOM_UTF8)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror or e})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        start = data.rfind(b"\n", 0, e.start) + 1
        line = data.count(b"\n", 0, e.start) + 1
        column = len(data[start:e.start].decode("utf-8")) + 1  # valid: before the first bad byte
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x} at column {column}); "
                          f"save it as UTF-8") from None


def by_cell_id(items, what: str = "cell") -> dict:
    """{item.cell_id: item} for cells or anything keyed by a cell id; ConfigError on a duplicate."""
    out: dict = {}
    for c in items:
        if c.cell_id in out:
            raise ConfigError(f"duplicate {what} id {c.cell_id!r}")
        out[c.cell_id] = c
    return out


def cells_by_id(cells) -> dict[str, Cell]:
    """{cell_id: cell}; raises on a duplicate id."""
    return by_cell_id(cells)
