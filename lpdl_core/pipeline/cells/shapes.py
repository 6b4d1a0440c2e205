"""The paper's tables as a reader sees them: display names, each table's title and caption, its
row axes (graph, nodes, compression, skew, ...) and its columns (algorithm x precision), as
functions of a cell. Torch- and pandas-free: the aggregate step pivots the per-table CSVs with it
and the report draws the tables with it, so both show the same shape."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ...specs.algorithms import SPECS as ALGORITHM_SPECS
from ...specs.datasets import DATASET_SPECS
from ...specs.graphs import SINGLE, SPECS as GRAPH_SPECS
from ...specs.models import SPECS as MODEL_SPECS
from .cell import Cell

MODEL_NAMES = {n: s.display for n, s in MODEL_SPECS.items()}
DATASET_NAMES = {n: s.display for n, s in DATASET_SPECS.items() if s.display}
TOPOLOGY_NAMES = {**{n: s.display for n, s in GRAPH_SPECS.items()}, SINGLE: "single node"}
NORM_NAMES = {"bn": "BatchNorm", "gn": "GroupNorm", "evonorm": "EvoNorm-S0",
              "range-evonorm": "Range EvoNorm", "range-bn": "Range BatchNorm",
              "range-evonorm-fp": "Range EvoNorm (FP)"}
ALGO_NAMES = {**{n: s.display for n, s in ALGORITHM_SPECS.items()}, "none": ""}
PRECISION_NAMES = {"fp32": "FP (32-bit)", "int8": "LP (8-bit)"}
TABLE_TITLES = {"table1": "Table 1", "table2": "Table 2", "table3": "Table 3", "table4": "Table 4",
                "table5": "Table 5", "fig1": "Figure 1 runs"}


def name(table: dict, key: str) -> str:
    """The display name of `key` in one of the tables above (the key itself when absent)."""
    return table.get(key, key)


def variant(c: Cell) -> str:
    """'DS (32-bit)', 'LP-CHOCO (8-bit)', 'Acc. (FP)', ... as the paper's column headers."""
    algo = name(ALGO_NAMES, c.algorithm)
    lp = c.precision == "int8"
    label = f"{'LP-' if lp else ''}{algo}" if algo else ("Acc. (LP)" if lp else "Acc. (FP)")
    if c.momentum == "qgm":
        return f"{label} with QGM"
    return f"{label} ({'8' if lp else '32'}-bit)" if algo else label


def graph(c: Cell) -> str:
    return f"{name(MODEL_NAMES, c.model)} / {name(TOPOLOGY_NAMES, c.topology)}"


def block_title(c: Cell) -> str:
    """A block as a reader names it: 'ResNet-20, Directed Ring, 8 nodes', 'CIFAR-10, VGG-11',
    'AG News, DistilBERT, Directed Ring, 4 nodes, QGM'."""
    parts = [name(DATASET_NAMES, c.dataset)] if c.table in ("table1", "table5") else []
    parts.append(name(MODEL_NAMES, c.model))
    if c.nodes > 1:
        parts += [name(TOPOLOGY_NAMES, c.topology), f"{c.nodes} nodes"]
    if c.momentum == "qgm":
        parts.append("QGM")
    if c.table == "fig1":
        parts.append(f"skew {c.skew:g}")
    return ", ".join(parts)


def _pct(v: float) -> str:
    return f"{v:g}"


@dataclass(frozen=True)
class Shape:
    caption: str
    row_axes: tuple[str, ...]
    row_of: Callable[[Cell], tuple[str, ...]]
    column_of: Callable[[Cell], str] = variant


SHAPES = {
    "table1": Shape("Table 1. Single-node training: full precision (FP) vs 8-bit (LP) test accuracy.",
                    ("Dataset", "Model"),
                    lambda c: (name(DATASET_NAMES, c.dataset), name(MODEL_NAMES, c.model))),
    "table2": Shape("Table 2. Decentralized training of CIFAR-10 over various graph topologies and "
                    "models.", ("Model / Graph", "Nodes (n)", "Compression (%)", "Skew"),
                    lambda c: (graph(c), str(c.nodes), _pct(c.compression), _pct(c.skew))),
    "table3": Shape("Table 3. CIFAR-10, ResNet-20, 8-node directed ring: CHOCO-SGD with "
                    "quasi-global momentum (QGM), full and low precision.",
                    ("Compression (%)", "Skew"), lambda c: (_pct(c.compression), _pct(c.skew))),
    "table4": Shape("Table 4. Decentralized training on Imagenette over different graph "
                    "topologies (CHOCO-SGD).", ("Model / Graph (n)", "Compression (%)", "Skew"),
                    lambda c: (f"{graph(c)} ({c.nodes})", _pct(c.compression), _pct(c.skew))),
    "table5": Shape("Table 5. Decentralized training of NLP tasks (DistilBERT) over a directed "
                    "ring.", ("Dataset / Model", "Nodes (n)", "Compression (%)", "Skew"),
                    lambda c: (f"{name(DATASET_NAMES, c.dataset)} / {name(MODEL_NAMES, c.model)}",
                               str(c.nodes), _pct(c.compression), _pct(c.skew))),
    "fig1": Shape("Figure 1 runs: final test accuracy per normalization layer (ResNet-20, 8-node "
                  "directed ring, skew 0.8); the paper plots curves and reports no number.",
                  ("Normalization",), lambda c: (name(NORM_NAMES, c.norm),)),
}
