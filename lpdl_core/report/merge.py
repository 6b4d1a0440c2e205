"""The merge step as a result of its own: what the final gossip-only rounds add to a run's
accuracy, beside no merge and one exact average (a pure function of runs.csv; torch-free).

A run with final rounds ends training with the nodes' models x_1 .. x_n (parameters and buffers);
the R final rounds then only gossip (the official code's gossip_avg), giving x_1^(R) .. x_n^(R)
(each round the run's own gossip step, compressed where the run compresses). With acc(x) the
test accuracy of a model, the three merges of one run are

    (a) no merge        a = 1/n sum_i acc(x_i)              runs.csv before_final_mean_acc
    (b) gossip merge    g = 1/n sum_i acc(x_i^(R))          runs.csv mean_acc (the paper's number)
    (c) one all-reduce  e = acc(xbar),  xbar = 1/n sum_i x_i   runs.csv before_final_avg_model_acc

and the gains g - a and e - a. (c) is one all-reduce by construction: the averaged model before
the final rounds is exactly the model one exact average of the trained models gives every node.

Per paper table (the runs' `table`), group (skew, compression) and the whole table, each
quantity is the mean over the group's runs (cells and seeds). A run counts when its status is
"ok" and a, g and e are all recorded (runs without final rounds, or made before the before-final
evaluation was recorded, have them empty); a run recorded as the same run as another cell of the
group (`same_run_as`, computed once) counts once. A table where no run counts gets one line
saying why instead of numbers.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import pandas as pd

from ..pipeline.cells.shapes import TABLE_TITLES

TITLE = "The merge step"
SECTION_ID = "merge"
TABLE_ORDER = tuple(TABLE_TITLES)
ACCURACIES = {"before": "before_final_mean_acc", "gossip": "mean_acc", "allreduce": "before_final_avg_model_acc"}
MINI_NOTE = ("Mini profile: stand-in data and small models, so these are not the paper's numbers; "
             "compare the gains' signs, not the accuracies.")

# why a table shows no numbers: the first reason that holds for its runs
EMPTY_REASONS: tuple[tuple[Callable[[pd.DataFrame], bool], str], ...] = (
    (lambda t: bool(pd.to_numeric(t["final_gossip_rounds"], errors="coerce").fillna(0).eq(0).all()),
     "its cells have no final rounds, so nothing merges their models."),
    (lambda t: not t["status"].eq("ok").any(),
     "no run finished (every run diverged or is damaged)."),
    (lambda t: True,
     "no run records its accuracy before the final rounds: runs made before that was recorded must be rerun."),
)


@dataclass(frozen=True, kw_only=True)
class MergeGroup:
    skew: float | None             # None: every skew of the table (its "all" row)
    compression: int | None        # percent; None: every compression
    runs: int                      # runs that count (0: the group's values are None)
    before: float | None = None    # (a) mean node accuracy before the final rounds
    gossip: float | None = None    # (b) mean node accuracy after the final rounds
    allreduce: float | None = None  # (c) the averaged model's accuracy before the final rounds
    gossip_gain: float | None = None     # mean of g - a
    allreduce_gain: float | None = None  # mean of e - a


@dataclass(frozen=True, kw_only=True)
class MergeTable:
    table: str                     # id: anchors only
    title: str                     # "Table 2"
    groups: tuple[MergeGroup, ...] = ()  # one per (skew, compression) of its runs, then the table's
    empty: str = ""                # why no run counts ("" when some do)
    left_out: str = ""             # the runs that do not count, counted by why


@dataclass(frozen=True, kw_only=True)
class MergeView:
    profile: str
    tables: tuple[MergeTable, ...]
    title: str = TITLE
    profile_note: str = ""         # the mini profile's label ("" otherwise)

    @property
    def counted(self) -> int:
        """Runs that count, over every table (each table's "all" row)."""
        return sum(t.groups[-1].runs for t in self.tables if t.groups)


def _mean(s: pd.Series) -> float | None:
    return float(s.mean()) if len(s) else None


def group_of(runs: pd.DataFrame, skew: float | None = None, compression: int | None = None) -> MergeGroup:
    """The group's means over `runs` (the runs that count, already chosen)."""
    a, g, e = (runs[c].astype(float) for c in ACCURACIES.values())
    return MergeGroup(skew=skew, compression=compression, runs=len(runs), before=_mean(a), gossip=_mean(g),
                      allreduce=_mean(e), gossip_gain=_mean(g - a), allreduce_gain=_mean(e - a))


def counted(runs: pd.DataFrame) -> pd.Series:
    """Which runs count: status ok with a, g and e all recorded."""
    cols = runs.reindex(columns=list(ACCURACIES.values()))
    return runs["status"].eq("ok") & cols.apply(pd.to_numeric, errors="coerce").notna().all(axis=1)


def _once(runs: pd.DataFrame) -> pd.DataFrame:
    """runs less those recorded as the same run as another of them (same cell as primary, same seed)."""
    keys = set(zip(runs["cell_id"], runs["seed"]))
    dup = [bool(s) and (s, seed) in keys for s, seed in zip(runs["same_run_as"].fillna(""), runs["seed"])]
    return runs[[not d for d in dup]]


def _left_out(t: pd.DataFrame, ok: pd.Series, shared: int) -> str:
    parts = {"not ok (diverged or damaged)": int((~t["status"].eq("ok")).sum()),
             "without the before-final numbers": int((t["status"].eq("ok") & ~ok).sum()),
             "recorded as the same run as another cell (counted once)": shared}
    text = "; ".join(f"{n} {why}" for why, n in parts.items() if n)
    return f"Runs left out: {text}." if text else ""


def merge_table(table: str, t: pd.DataFrame) -> MergeTable:
    """One paper table's groups from its runs (every status)."""
    title = TABLE_TITLES.get(table, str(table))
    ok = counted(t)
    use = t[ok]
    once = _once(use)
    left = _left_out(t, ok, len(use) - len(once))
    if once.empty:
        why = next(msg for holds, msg in EMPTY_REASONS if holds(t))
        return MergeTable(table=table, title=title, empty=why, left_out=left)
    keys = sorted(set(zip(t["skew"].astype(float), t["compression"].astype(int))))
    groups = [group_of(once[(once["skew"].astype(float) == s) & (once["compression"].astype(int) == c)], s, c)
              for s, c in keys]
    return MergeTable(table=table, title=title, groups=(*groups, group_of(once)), left_out=left)


def merge_view(runs: pd.DataFrame, profile: str) -> MergeView:
    """The section's contents: one MergeTable per paper table with runs, in paper order."""
    runs = runs.reindex(columns=list(dict.fromkeys([*runs.columns, *ACCURACIES.values()])))
    order = {t: i for i, t in enumerate(TABLE_ORDER)}
    names = sorted(dict.fromkeys(runs["table"]), key=lambda t: (order.get(t, len(order)), str(t)))
    return MergeView(profile=profile, tables=tuple(merge_table(n, runs[runs["table"] == n]) for n in names),
                     profile_note=MINI_NOTE if profile == "mini" else "")
