"""What a report is made of, independent of how it is rendered (HTML, LaTeX).

`ReportData` is everything read from one results folder; `PaperTable`, `Claim`, `Figure` and
`Header` are what the renderers draw. Values are accuracies in percent; None means missing.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..cells import Cell
from ..config import LEARNED_MARGIN  # noqa: F401  (re-exported for the report modules)

STATUSES = ("ok", "partly-diverged", "diverged", "missing")
VERDICTS = ("holds", "does not hold", "within noise", "not enough cells")


@dataclass(frozen=True, kw_only=True)
class Run:
    """One finished (or diverged) training run: results/{profile}/runs/{cell}/seed{seed}/."""

    cell_id: str
    seed: int
    metrics: dict                  # metrics.json
    curve: tuple[dict, ...] = ()   # curve.csv rows: epoch, lr, train_loss, mean_acc, avg_model_acc,
                                   # consensus_distance, test_loss, bytes_per_node (floats)
    partition: tuple[dict, ...] = ()  # partition.csv rows: node, <class name>..., total (ints)

    @property
    def status(self) -> str:
        return self.metrics.get("status", "ok")


@dataclass(frozen=True, kw_only=True)
class ReportData:
    profile: str                   # mini | paper
    cells: tuple[Cell, ...]        # every cell of the requested tables, in paper order
    runs: dict[str, tuple[Run, ...]]  # cell_id -> its runs (one per seed found); absent = missing
    rows: dict[str, list[dict]]    # table -> aggregate rows (lpdl_core.aggregate.aggregate_table)


@dataclass(frozen=True, kw_only=True)
class Entry:
    """One table cell: the reproduction (mean over ok seeds) beside the paper's number."""

    cell_id: str
    status: str                    # one of STATUSES
    reproduced: float | None = None
    std: float | None = None       # over seeds; None with one seed
    seeds: int = 0                 # ok seeds behind `reproduced`
    paper: float | None = None
    delta: float | None = None     # reproduced - paper
    diverged_at: str = ""          # epochs where seeds diverged, e.g. "[3]"
    chance: float | None = None    # 100 / classes of the data the runs trained on
    same_run_as: str = ""          # the cell whose run this cell's is (mini: computed once)

    @property
    def learned(self) -> bool | None:
        """False when the reproduced accuracy is within LEARNED_MARGIN points of chance."""
        if self.reproduced is None or self.chance is None:
            return None
        return self.reproduced > self.chance + LEARNED_MARGIN


@dataclass(frozen=True, kw_only=True)
class Row:
    labels: tuple[str, ...]        # one per PaperTable.row_axes
    entries: tuple[Entry | None, ...]  # one per PaperTable.columns; None: no such cell in the paper


@dataclass(frozen=True, kw_only=True)
class PaperTable:
    name: str                      # table1 .. table5, fig1 (anchors and file names only)
    caption: str
    row_axes: tuple[str, ...]      # e.g. ("Model/Graph", "Nodes", "Compression (%)", "Skew")
    columns: tuple[str, ...]       # e.g. ("DS (32-bit)", "LP-DS (8-bit)", ...)
    rows: tuple[Row, ...]
    note: str = ""                 # e.g. the mini-profile mapping
    compare: str = "absolute"      # "absolute": coloured by |delta| to the paper (paper profile);
                                   # "effects": absolute numbers cannot match (mini), no delta colour
    title: str = ""                # the heading a reader sees, e.g. "Table 2" (never the id)


@dataclass(frozen=True, kw_only=True)
class Claim:
    number: int
    text: str                      # the paper's claim
    verdict: str                   # one of VERDICTS
    evidence: str                  # what was compared, with the numbers
    cells: int = 0                 # how many cell pairs were used


@dataclass(frozen=True, kw_only=True)
class Figure:
    name: str                      # file stem, e.g. "fig1-norm-curves"
    title: str
    caption: str
    png: bytes                     # rendered PNG
    pdf: bytes = b""               # vector version for LaTeX (optional)


@dataclass(frozen=True, kw_only=True)
class Header:
    title: str
    profile: str                   # mini | paper
    profile_note: str              # one sentence on what the profile means (stand-ins or not)
    facts: tuple[tuple[str, str], ...] = field(default=())  # (label, value): seeds, git SHA, ...
    warnings: tuple[str, ...] = ()   # e.g. "12 cells missing", "results from 2 git SHAs"


DELTA_BANDS = (1.0, 3.0)  # |delta| in accuracy points: < 1 close, < 3 near, else far


def delta_class(delta: float | None) -> str:
    """Colour band of a delta, shared by the renderers: close | near | far | none."""
    if delta is None:
        return "none"
    a = abs(delta)
    return "close" if a < DELTA_BANDS[0] else "near" if a < DELTA_BANDS[1] else "far"
