"""The paper's Tables 1-5 (and Figure 1's runs) re-built in the paper's own shape from the
per-table CSVs (one row per cell): rows are the table's settings (graph, nodes, compression,
skew), columns its algorithm x precision variants (lpdl_core.pipeline.cells.shapes), each cell the reproduced
value beside the paper's."""
from __future__ import annotations

from ..pipeline.cells.shapes import SHAPES, TABLE_TITLES
from .data import rows_of
from .model import Entry, PaperTable, ReportData, Row


def _entry(row: dict) -> Entry:
    return Entry(cell_id=row["cell_id"], status=row["status"], reproduced=row["reproduced"],
                 std=row["reproduced_std"] if row["seeds"] > 1 else None, seeds=int(row["seeds"]),
                 paper=row["paper"], delta=row["delta"], diverged_at=row["diverged_at"] or "",
                 chance=row["chance"], same_run_as=row["same_run_as"] or "", problem=row.get("problem") or "")


def paper_table(data: ReportData, table: str) -> PaperTable:
    """One paper table (every paper cell present; cells without runs as status 'missing')."""
    shape = SHAPES[table]
    cells = [c for c in data.cells if c.table == table]
    by_id = {r["cell_id"]: r for r in rows_of(data, table)}
    columns = tuple(dict.fromkeys(shape.column_of(c) for c in cells))
    grid: dict[tuple[str, ...], dict[str, Entry]] = {}
    for c in cells:
        row = by_id.get(c.cell_id)
        entry = _entry(row) if row else Entry(cell_id=c.cell_id, status="missing", paper=c.paper_acc)
        grid.setdefault(shape.row_of(c), {})[shape.column_of(c)] = entry
    rows = tuple(Row(labels=labels, entries=tuple(cols.get(k) for k in columns))
                 for labels, cols in grid.items())
    mappings = sorted({m.strip() for r in by_id.values() for m in (r["mapping"] or "").split(";") if m.strip()})
    note = ("Mini profile: " + "; ".join(mappings) + ".") if data.profile == "mini" and mappings else ""
    return PaperTable(name=table, caption=shape.caption, row_axes=shape.row_axes, columns=columns, rows=rows,
                      note=note, compare="effects" if data.profile == "mini" else "absolute",
                      title=TABLE_TITLES.get(table, table))


def paper_tables(data: ReportData) -> list[PaperTable]:
    """Every table that has cells in `data`, in paper order."""
    present = dict.fromkeys(c.table for c in data.cells)
    return [paper_table(data, t) for t in SHAPES if t in present]
