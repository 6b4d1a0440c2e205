"""The paper's Tables 1-5 (and Figure 1's runs) re-built in the paper's own shape, each cell the
reproduced value beside the paper's: rows are the table's settings (graph, nodes, compression,
skew), columns its algorithm x precision variants."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..cells import Cell
from .data import chance_of
from .model import Entry, PaperTable, ReportData, Row

MODEL_NAMES = {"resnet20": "ResNet-20", "resnet54": "ResNet-54", "vgg11": "VGG-11",
               "resnet18": "ResNet-18", "distilbert": "DistilBERT", "mobilenetv2": "MobileNetV2"}
DATASET_NAMES = {"cifar10": "CIFAR-10", "cifar100": "CIFAR-100", "imagenette": "Imagenette",
                 "agnews": "AG News", "sentlen": "Sentlen"}
TOPOLOGY_NAMES = {"directed-ring": "Directed Ring", "ring": "Ring", "torus": "Torus",
                  "single": "single node"}
NORM_NAMES = {"bn": "BatchNorm", "gn": "GroupNorm", "evonorm": "EvoNorm-S0",
              "range-evonorm": "Range EvoNorm", "range-bn": "Range BatchNorm",
              "range-evonorm-fp": "Range EvoNorm (FP)"}
ALGO_NAMES = {"ds": "DS", "choco": "CHOCO", "dpsgd": "D-PSGD", "none": ""}


def _name(table: dict, key: str) -> str:
    return table.get(key, key)


def _variant(c: Cell) -> str:
    """'DS (32-bit)', 'LP-CHOCO (8-bit)', ... as the paper's column headers."""
    algo = _name(ALGO_NAMES, c.algorithm)
    lp = c.precision == "int8"
    label = f"{'LP-' if lp else ''}{algo}" if algo else ("Acc. (LP)" if lp else "Acc. (FP)")
    if c.momentum == "qgm":
        return f"{label} with QGM"
    return f"{label} ({'8' if lp else '32'}-bit)" if algo else label


def _graph(c: Cell) -> str:
    return f"{_name(MODEL_NAMES, c.model)} / {_name(TOPOLOGY_NAMES, c.topology)}"


@dataclass(frozen=True)
class _Shape:
    caption: str
    row_axes: tuple[str, ...]
    row_of: Callable[[Cell], tuple[str, ...]]
    column_of: Callable[[Cell], str] = _variant


def _pct(v: float) -> str:
    return f"{v:g}"


SHAPES = {
    "table1": _Shape("Table 1. Single-node training: full precision (FP) vs 8-bit (LP) test accuracy.",
                     ("Dataset", "Model"),
                     lambda c: (_name(DATASET_NAMES, c.dataset), _name(MODEL_NAMES, c.model))),
    "table2": _Shape("Table 2. Decentralized training of CIFAR-10 over various graph topologies and "
                     "models.", ("Model / Graph", "Nodes (n)", "Compression (%)", "Skew"),
                     lambda c: (_graph(c), str(c.nodes), _pct(c.compression), _pct(c.skew))),
    "table3": _Shape("Table 3. CIFAR-10, ResNet-20, 8-node directed ring: CHOCO-SGD with "
                     "quasi-global momentum (QGM), full and low precision.",
                     ("Compression (%)", "Skew"), lambda c: (_pct(c.compression), _pct(c.skew))),
    "table4": _Shape("Table 4. Decentralized training on Imagenette over different graph "
                     "topologies (CHOCO-SGD).", ("Model / Graph (n)", "Compression (%)", "Skew"),
                     lambda c: (f"{_graph(c)} ({c.nodes})", _pct(c.compression), _pct(c.skew))),
    "table5": _Shape("Table 5. Decentralized training of NLP tasks (DistilBERT) over a directed "
                     "ring.", ("Dataset / Model", "Nodes (n)", "Compression (%)", "Skew"),
                     lambda c: (f"{_name(DATASET_NAMES, c.dataset)} / {_name(MODEL_NAMES, c.model)}",
                                str(c.nodes), _pct(c.compression), _pct(c.skew))),
    "fig1": _Shape("Figure 1 runs: final test accuracy per normalization layer (ResNet-20, 8-node "
                   "directed ring, skew 0.8); the paper plots curves and reports no number.",
                   ("Normalization",), lambda c: (_name(NORM_NAMES, c.norm),)),
}


def _entry(row: dict, data: ReportData) -> Entry:
    runs = data.runs.get(row["cell_id"], ())
    shared = next((r.metrics["config"]["same_run_as"] for r in runs
                   if r.metrics.get("config", {}).get("same_run_as")), "")
    return Entry(cell_id=row["cell_id"], status=row["status"], reproduced=row["reproduced"],
                 std=row["reproduced_std"] if row["seeds"] > 1 else None, seeds=row["seeds"],
                 paper=row["paper"], delta=row["delta"], diverged_at=row.get("diverged_at") or "",
                 chance=chance_of(data, row["cell_id"]), same_run_as=shared)


def paper_table(data: ReportData, table: str) -> PaperTable:
    """One paper table from the aggregate rows of `data` (every paper cell present, missing ones
    as status 'missing')."""
    shape = SHAPES[table]
    cells = [c for c in data.cells if c.table == table]
    by_id = {r["cell_id"]: r for r in data.rows.get(table, [])}
    columns = tuple(dict.fromkeys(shape.column_of(c) for c in cells))
    grid: dict[tuple[str, ...], dict[str, Entry]] = {}
    for c in cells:
        row = by_id.get(c.cell_id)
        entry = _entry(row, data) if row else Entry(cell_id=c.cell_id, status="missing", paper=c.paper_acc)
        grid.setdefault(shape.row_of(c), {})[shape.column_of(c)] = entry
    rows = tuple(Row(labels=labels, entries=tuple(cols.get(k) for k in columns))
                 for labels, cols in grid.items())
    mappings = sorted({m for c in cells for r in data.runs.get(c.cell_id, ())
                       for m in r.metrics.get("config", {}).get("mapping", [])
                       if not m.startswith("same run as")})  # per cell: shown in the cell itself
    note = ("Mini profile: " + "; ".join(mappings) + ".") if data.profile == "mini" and mappings else ""
    return PaperTable(name=table, caption=shape.caption, row_axes=shape.row_axes, columns=columns,
                      rows=rows, note=note, compare="effects" if data.profile == "mini" else "absolute")


def paper_tables(data: ReportData) -> list[PaperTable]:
    """Every table that has cells in `data`, in paper order."""
    present = dict.fromkeys(c.table for c in data.cells)
    return [paper_table(data, t) for t in SHAPES if t in present]
