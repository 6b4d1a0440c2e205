"""One training run's settings, validated: a `Cell` is one row of a cell table.

Every column is checked when a Cell is built; a bad value is a `CellError` naming the column, which
the CSV reader (lpdl_core.pipeline.cells.tables) turns into `file:line: column: why`. `Cell.cell_id` is a
readable unique slug such as ``t2-resnet20-dring8-c99-s0.8-choco-int8``. The valid names come from
the torch-free vocabulary (lpdl_core.config); the table columns' meaning and the assumptions behind
the paper's values: lpdl_core/pipeline/paper/README.md.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

from ... import config
from ...config import MAX_SEED, MODEL_DATASETS, TABLES, TEXT_MODELS, UNCOMPRESSED_ALGORITHMS
from ...specs.compressors import SPARSIFIERS, SPECS as COMPRESSOR_SPECS
from ...specs.graphs import SINGLE, SPECS as GRAPH_SPECS
from ...errors import ConfigError
from . import column_roles
from .column_roles import column

CELL_MOMENTA = ("nesterov", "qgm", "none")   # the paper's: local Nesterov SGD, QGM, or Adam's own
NLP_MODELS = TEXT_MODELS
FP_NORMS = ("evonorm", "range-evonorm-fp", "range-bn", "bn", "gn")  # as lpdl_core.quant.norms.make_norm
LP_NORMS = ("range-evonorm", "range-bn")


class CellError(ConfigError):
    """A cell's column holds an invalid value."""

    def __init__(self, column: str, why: str):
        super().__init__(f"{column}: {why}")
        self.column, self.why = column, why



def valid_names() -> dict[str, tuple[str, ...]]:
    """column -> its valid values, all from the torch-free vocabulary (lpdl_core.config), read when a
    cell is checked: a name added there (a graph, an algorithm) is a valid cell value."""
    return dict(topology=tuple(GRAPH_SPECS) + (SINGLE,), algorithm=config.ALGORITHMS + ("none",),
                dataset=config.PAPER_DATASETS, model=config.MODELS, norm=config.NORMS + ("none",),
                lr_schedule=config.SCHEDULES, precision=config.PRECISIONS, momentum=CELL_MOMENTA,
                optimizer=config.OPTIMIZERS)
# a grid's name, its cells' table (lpdl_core.pipeline.cells.grids): lower-case words joined by '-'
GRID_NAME = re.compile(r"[a-z][a-z0-9]*(?:-[a-z0-9]+)*")
# the paper's ids begin t<k>- or fig<k>-: no grid may be named so (its ids would be the paper's)
PAPER_ID_PREFIX = re.compile(r"(t|table|fig)\d*")
ID_SUFFIX = re.compile(r"(?:-[a-z0-9.]+)+")


def is_grid_name(name: str) -> bool:
    """Lower-case words joined by '-', the first not shaped like the paper's id prefixes (t3, fig1,
    table...), so that a grid's ids never are the paper's."""
    return bool(GRID_NAME.fullmatch(name)) and not PAPER_ID_PREFIX.fullmatch(name.split("-")[0])


# the roles of each column (lpdl_core.pipeline.cells.column_roles.ROLES): which lists of columns it is in
_SETTING = ("identity", "mini", "settable", "setting")          # a mini run's setting of the claims study
_AXIS = ("csv", "table", "runs", "compare")                     # a paper column and a table axis


@dataclass(frozen=True, kw_only=True)
class Cell:
    table: str = column("csv", "identity", "table", "runs", "pairing")
    block: str = column("csv", "identity", "table", "runs")
    dataset: str = column(*_AXIS, *_SETTING, "pack", "pairing")
    model: str = column(*_AXIS, *_SETTING, "pack", "pairing")
    nodes: int = column(*_AXIS, *_SETTING, "pack", "pairing", kind="int")
    topology: str = column(*_AXIS, *_SETTING, "pairing")
    # percent of each tensor dropped by top-k (0 = dense)
    compression: int = column(*_AXIS, *_SETTING, "pairing", kind="int")
    eta: float = column(*_AXIS, *_SETTING, kind="float", id_code="eta")   # averaging rate (consensus step)
    skew: float = column(*_AXIS, *_SETTING, "pairing", kind="float")
    # not "mini": a mini run reads the algorithm's gossip kind (lpdl_core.pipeline.recipe.mini.gossip_kind)
    algorithm: str = column(*_AXIS, "identity", "settable", "setting", "pack", "pairing")
    precision: str = column(*_AXIS, *_SETTING, "pack", "pairing")   # fp32 | int8
    momentum: str = column(*_AXIS, *_SETTING, "pack", "pairing")
    # not "setting" nor "pairing": FP runs use EvoNorm, LP ones Range EvoNorm (the paper's pairs)
    norm: str = column(*_AXIS, "identity", "mini", "settable", "pack")
    optimizer: str = column("csv", "table", "runs", *_SETTING, "pack", "pairing")
    lr: float = column("csv", "table", "runs", *_SETTING, "pack", "pairing", kind="float", id_code="lr")
    lr_schedule: str = column("csv", "grid-table", "runs", "identity", "settable", "pack")
    milestones: tuple[int, ...] = column("csv", "grid-table", "identity", "settable", "pack", kind="ints",
                                         default=(), id_code="ms")
    epochs: int = column("csv", "table", "runs", "identity", "settable", "pack", "pairing", kind="int",
                         id_code="ep")
    batch_per_node: int = column("csv", "table", "runs", *_SETTING, "pack", kind="int", id_code="b")
    final_gossip_rounds: int = column("csv", "grid-table", "runs", *_SETTING, "pack", kind="int", id_code="fr")
    seed: int = column("csv", "settable", kind="int",
                       not_axis="a grid's runs take the config's seeds (`seeds`), not a column's")
    paper_acc: float | None = column("csv", kind="float?", default=None)
    notes: str = column("csv", default="")
    # the open grid's columns, beyond the paper's (optional in a CSV; their defaults are the paper's)
    # topk | randomk (both drop `compression` %) | qsgd:<level> | minmax8:<bits> | identity
    compressor: str = column("optional", "grid-table", "runs", *_SETTING, "pack", default="topk")
    # skew (the paper's, by the skew column) | dirichlet:<alpha>
    partition: str = column("optional", "grid-table", "runs", *_SETTING, default="skew")
    # epochs of the cell's mini run; 0: the mini profile's own (lpdl_core.pipeline.recipe.mini)
    mini_epochs: int = column("optional", "grid-table", "runs", "identity", "settable", "pack", kind="int",
                              default=0, id_code="len", not_axis="give a length ladder as `lengths: [...]`")
    # not a column: what a grid adds to the id where two of its cells would share one (the columns
    # they differ in, e.g. "-len12"; lpdl_core.pipeline.cells.grids). Not part of the run identity's
    # columns: the id, which holds it, is.
    id_suffix: str = ""

    def _fail(self, column: str, msg: str) -> None:
        raise CellError(column, msg)

    def __post_init__(self) -> None:
        for col in ("eta", "skew", "lr"):
            if not math.isfinite(getattr(self, col)):
                self._fail(col, f"must be a finite number, got {getattr(self, col)}")
        if self.table not in TABLES and not is_grid_name(self.table):
            self._fail("table", f"{self.table!r} is not one of {', '.join(TABLES)} (or a grid's name)")
        for col, valid in valid_names().items():
            if getattr(self, col) not in valid:
                self._fail(col, f"{getattr(self, col)!r} is not one of {', '.join(valid)}")
        if self.dataset not in MODEL_DATASETS[self.model]:
            self._fail("dataset", f"model {self.model} is not built for {self.dataset} "
                                  f"(it is built for {', '.join(MODEL_DATASETS[self.model])})")
        if self.nodes < 1:
            self._fail("nodes", f"must be >= 1, got {self.nodes}")
        single = self.nodes == 1
        if (self.topology == "single") != single or (self.algorithm == "none") != single:
            self._fail("topology", "topology 'single', nodes 1 and algorithm 'none' go together")
        if not 0 <= self.compression < 100:
            self._fail("compression", f"must be a percent in [0, 100), got {self.compression}")
        self._check_compressor()
        if self.algorithm in UNCOMPRESSED_ALGORITHMS and not (self.exact_messages and self.eta == 1.0):
            self._fail("compression", f"{self.algorithm} sends uncompressed messages: 0 %, η 1 and no other compressor")
        if not 0.0 < self.eta <= 1.0 or (self.exact_messages and self.eta != 1.0):
            self._fail("eta", f"must be in (0, 1] and 1.0 without compression, got {self.eta}")
        if not 0.0 <= self.skew <= 1.0:
            self._fail("skew", f"must be in [0, 1], got {self.skew}")
        self._check_partition()
        nlp = self.model in NLP_MODELS
        if (self.norm == "none") != nlp:
            self._fail("norm", "'none' exactly for the NLP models")
        if not nlp and self.norm not in (LP_NORMS if self.precision == "int8" else FP_NORMS):
            self._fail("norm", f"{self.norm} does not fit precision {self.precision}")
        if (self.optimizer == "adam") != (self.momentum == "none"):
            self._fail("momentum", "adam goes with momentum 'none', sgd with nesterov or qgm")
        if self.lr <= 0:
            self._fail("lr", f"must be > 0, got {self.lr}")
        if (self.lr_schedule == "multistep") != bool(self.milestones):
            self._fail("milestones", "given exactly for the 'multistep' schedule")
        ms = list(self.milestones)
        if ms != sorted(set(ms)) or any(not 0 < m < self.epochs for m in ms):
            self._fail("milestones", f"must increase strictly within (0, epochs), got {self.milestones}")
        for col in ("epochs", "batch_per_node"):
            if getattr(self, col) < 1:
                self._fail(col, f"must be >= 1, got {getattr(self, col)}")
        if self.mini_epochs < 0:
            self._fail("mini_epochs", f"must be >= 0 (0: the mini profile's own), got {self.mini_epochs}")
        if self.final_gossip_rounds < 0 or (self.nodes == 1 and self.final_gossip_rounds):
            self._fail("final_gossip_rounds", "must be >= 0, and 0 for a single node")
        if self.id_suffix and not ID_SUFFIX.fullmatch(self.id_suffix):
            self._fail("id_suffix", f"must be '-'-joined lower-case words, got {self.id_suffix!r}")
        if self.paper_acc is not None and not 0.0 <= self.paper_acc <= 100.0:
            self._fail("paper_acc", f"must be a percentage, got {self.paper_acc}")
        if not 0 <= self.seed <= MAX_SEED:  # what numpy's and torch's seeding take (lpdl_core.config)
            self._fail("seed", f"must be in [0, {MAX_SEED}], got {self.seed}")

    def _check_compressor(self) -> None:
        kind, sep, param = self.compressor.partition(":")
        if kind not in COMPRESSOR_SPECS:
            self._fail("compressor", f"{kind!r} is not one of {', '.join(COMPRESSOR_SPECS)}")
        spec = COMPRESSOR_SPECS[kind]
        if spec.param:
            name, lo, hi = spec.param.name, spec.param.lo, spec.param.hi
            if not (param.isdigit() and lo <= int(param) <= hi):
                self._fail("compressor", f"{kind} takes its {name} as {kind}:<{lo}..{hi}>, got {self.compressor!r}")
            if self.compression:
                self._fail("compression", f"is the percent top-k or random-k drops; 0 with {kind}")
        elif sep:
            self._fail("compressor", f"{kind} takes no parameter (the compression column is its percent), "
                                     f"got {self.compressor!r}")
        if kind == "identity" and self.compression:
            self._fail("compression", "0 with compressor identity")
        if self.nodes == 1 and self.compressor != "topk":
            self._fail("compressor", "a single node sends nothing: leave it topk")

    def _check_partition(self) -> None:
        kind, sep, param = self.partition.partition(":")
        if self.partition == "skew":
            return
        if kind != "dirichlet" or not sep:
            self._fail("partition", f"is skew or dirichlet:<alpha>, got {self.partition!r}")
        try:
            alpha = float(param)
        except ValueError:
            alpha = math.nan
        if not (math.isfinite(alpha) and alpha > 0):
            self._fail("partition", f"dirichlet takes alpha > 0, got {param!r}")
        if self.skew:
            self._fail("skew", f"must be 0 with partition {self.partition} (one partition, one parameter)")
        if self.nodes == 1:
            self._fail("partition", "a single node trains on the whole dataset: leave it skew")

    @property
    def compressor_kind(self) -> str:
        return self.compressor.partition(":")[0]

    @property
    def compressor_param(self) -> int | None:
        """QSGD's level or min-max's bits (None for the sparsifiers and identity)."""
        param = self.compressor.partition(":")[2]
        return int(param) if param else None

    @property
    def exact_messages(self) -> bool:
        """Whether the messages are the models themselves (then η must be 1)."""
        return self.compressor_kind == "identity" or (self.compressor_kind in SPARSIFIERS and not self.compression)

    @property
    def dirichlet_alpha(self) -> float | None:
        """α of a Dirichlet partition; None for the paper's skew partition."""
        return float(self.partition.partition(":")[2]) if self.partition != "skew" else None

    @property
    def drop(self) -> float:
        """The fraction of each tensor top-k drops (the official k): compression percent / 100."""
        return self.compression / 100

    @property
    def cell_id(self) -> str:
        """t<k>-[dataset-]model-<topo><n>-c<comp>-s<skew>-<algorithm>-<precision>[-qgm][-<norm>].

        The dataset is named unless it is CIFAR-10; momentum is added when it is QGM and the norm
        for Figure 1 (their only varying axes)."""
        table = "t" + self.table.removeprefix("table") if self.table.startswith("table") else self.table
        topo = SINGLE if self.topology == SINGLE else f"{GRAPH_SPECS[self.topology].short}{self.nodes}"
        parts = [table] + ([self.dataset] if self.dataset != "cifar10" else []) + [
            self.model, topo, self._compression_id(), self._partition_id(), self.algorithm, self.precision]
        if self.momentum == "qgm":
            parts.append("qgm")
        if self.table == "fig1":
            parts.append(self.norm)
        return "-".join(parts) + self.id_suffix

    def _compression_id(self) -> str:
        """c<percent> for the paper's top-k; another compressor names itself (rk90, qsgd4, mm8, ident)."""
        return COMPRESSOR_SPECS[self.compressor_kind].cell_id.format(percent=self.compression,
                                                                      param=self.compressor_param)

    def _partition_id(self) -> str:
        """s<skew> for the paper's partition, dir<alpha> for a Dirichlet one."""
        alpha = self.dirichlet_alpha
        return f"s{self.skew:g}" if alpha is None else f"dir{alpha:g}"


def columns(role: str) -> tuple[str, ...]:
    """Cell's columns with `role` (lpdl_core.pipeline.cells.column_roles.ROLES), in field order."""
    return column_roles.columns(Cell, role)


def parse_column(name: str, text: str):
    """The value of Cell's column `name` from its text in a CSV or grid spec (ValueError when malformed)."""
    return column_roles.parse(Cell, name, text)


NOT_COLUMNS = column_roles.not_columns(Cell)   # Cell fields that are no table column (id_suffix)
