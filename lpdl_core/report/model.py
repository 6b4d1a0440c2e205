"""What a report is made of, independent of how it is rendered (HTML, LaTeX).

`ReportData` is everything the DAG gives the report (tidy pandas frames and two small files);
`PaperTable`, `Claim`, `Figure` and `Header` are what the renderers draw. Values are accuracies in
percent; None means missing.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from ..config import LEARNED_MARGIN  # noqa: F401  (re-exported for the report modules)
from ..pipeline.cells.cell import Cell

# partly-*: some seeds finished (the number is theirs); damaged: a run whose files cannot be used
STATUSES = ("ok", "partly-diverged", "partly-damaged", "diverged", "damaged", "missing")
NO_NUMBER = ("missing", "diverged", "damaged")  # statuses shown without a reproduced value
# a claim's verdict (report.claims; the trend ones: report.trend); claim 6 may also say
# "holds for the all-8-bit scheme; <r>x as implemented"
VERDICTS = ("holds", "does not hold", "within noise", "not enough cells", "converging", "not settled",
            "not judged at one length")
# how a verdict is coloured: holds, fails, noise, moving (still changing with length), partly (holds for
# the paper's assumptions, not as implemented), na (nothing to judge)
VERDICT_KIND = {"holds": "holds", "does not hold": "fails", "within noise": "noise", "converging": "moving",
                "not settled": "moving", "not judged at one length": "na", "not enough cells": "na"}


def verdict_kind(verdict: str) -> str:
    return VERDICT_KIND.get(verdict) or ("partly" if verdict.startswith("holds for") else "na")


def has_paper_part(tables, grids) -> bool:
    """Whether a rendered report has its paper part (claims, tables): not when it holds extension
    grids alone (config `tables: []`, so no paper table and some grid section)."""
    return bool(tables) or grids is None


@dataclass(frozen=True, kw_only=True, eq=False)
class ReportData:
    """Everything the report reads, as the DAG gives it (report.data.load_report_data)."""

    profile: str                   # mini | paper
    cells: tuple[Cell, ...]        # every cell of the requested tables, in paper order
    runs: pd.DataFrame             # runs.csv: one row per (cell, seed) with a finished run
    curves: pd.DataFrame           # curves.csv: one row per (cell, seed, epoch)
    summary: pd.DataFrame          # tables/*.csv: one row per paper cell (missing ones included)
    cost: dict | None = None       # cost.json (Figure 3); None: not given
    partitions: pd.DataFrame | None = None  # partitions.csv (Figures 2, 5-7); None: not given
    notes: tuple[str, ...] = ()    # what could not be drawn and why (shown as header warnings)
    # paper text vs official code (report.modes; only with a compare folder): one row per cell of
    # both folders, the two modes' reproduced accuracies and delta = official - paper_text
    modes: pd.DataFrame | None = None
    mode_names: tuple[str, ...] = ()   # modes of modes' paper_text and official columns, e.g. ("paper", "official")
    # (option, the paper_text side's values, the official side's) of each fidelity option that differs
    mode_options: tuple[tuple[str, str, str], ...] = ()


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
    problem: str = ""              # damaged runs: why their files cannot be used (one line each)

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
    points: tuple = ()             # report.trend.Point per length (the claims figure), claims 1-5
    what: str = ""                 # the effect and its bound, e.g. "FP − LP < 1"


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
