"""Paper text vs official code: two results folders of one profile, one per fidelity mode, side by
side (torch-free, pandas only).

Every paper cell runs in one of two fidelity modes (lpdl_core.config.Fidelity): "paper" (the
paper's text) or "official" (what the official code ran); a run with some options of each is
"mixed". Both modes' results live side by side (results/{profile}, results/{profile}-official);
the report reads the other folder's per-table CSVs and runs.csv and shows, per cell, the two
reproduced accuracies and their difference.

    runs_mode(runs)                         a runs.csv's mode, from its fidelity_<option> columns
    fidelity_values(runs)                   option -> the values its runs used
    differing_options(left, right)          the options whose values differ between two runs.csv
    column_modes(this_mode, other_mode)     which side goes into which column
    compare_modes(this, other, ...)         one row per cell present in both summaries
    headline(frame)                         mean |delta|, its cell count, the largest |delta|

The frame's two value columns are `paper_text` and `official`, delta = official - paper_text.
The side whose mode is "paper" goes into `paper_text`, the one whose mode is "official" into
`official`; when the two modes are not paper text and official code (both paper text, a mixed
or unknown fidelity), this folder goes left and the compare folder right, and the mode names
(column_modes, frame.attrs["modes"], ReportData.mode_names) say what each really is: a mixed or
paper-text side is never labelled official. A cell missing or diverged on either side has no
delta (None), never a filled value.
"""
from __future__ import annotations

import math

import pandas as pd

from ..config import FIDELITY_CHOICES, Fidelity
from ..errors import ConfigError
from ..pipeline.cells.cell import columns

MODES = ("paper", "official", "mixed", "unknown")
MODE_LABELS = {"paper": "Paper text", "official": "Official code", "mixed": "Mixed fidelity",
               "unknown": "Unknown fidelity"}
# which side goes left (`paper_text`) when the two differ: the paper's text first, official last
_RANK = {"paper": 0, "mixed": 1, "unknown": 1, "official": 2}
CELL_AXES = columns("compare")   # Cell's "compare" columns
SIDES = ("paper_text", "official")
COLUMNS = ("cell_id", "table", "block", *CELL_AXES, "paper_text", "official", "delta",
           "seeds_paper_text", "seeds_official", "status_paper_text", "status_official", "paper",
           "learned_paper_text", "learned_official")


def _option_columns(runs: pd.DataFrame) -> list[str]:
    return [c for c in runs.columns if c.startswith("fidelity_") and c != "fidelity_mode"]


def runs_mode(runs: pd.DataFrame) -> str:
    """The fidelity mode of a runs.csv: "paper" or "official" when every run has that preset's
    options, "mixed" when runs differ or one has some of each, "unknown" without runs, without
    fidelity_<option> columns, or with a value or option lpdl does not know (an older runs.csv)."""
    cols = _option_columns(runs)
    if not len(runs) or not cols:
        return "unknown"
    modes = set()
    for row in runs[cols].drop_duplicates().to_dict("records"):
        if any(_isna(v) for v in row.values()):
            return "unknown"
        try:
            modes.add(Fidelity.from_mapping({k.removeprefix("fidelity_"): v for k, v in row.items()}).mode)
        except ConfigError:
            return "unknown"
    return modes.pop() if len(modes) == 1 else "mixed"


def fidelity_values(runs: pd.DataFrame) -> dict[str, tuple[str, ...]]:
    """option -> the values its runs used, sorted (options without a column are absent)."""
    out = {}
    for col in _option_columns(runs):
        values = sorted({str(v) for v in runs[col] if not _isna(v)})
        if values:
            out[col.removeprefix("fidelity_")] = tuple(values)
    return out


def differing_options(left: pd.DataFrame, right: pd.DataFrame) -> tuple[tuple[str, str, str], ...]:
    """(option, left values, right values) for every fidelity option whose values differ between
    two runs frames ("a / b" when a side's runs used several; "?" when a side has no record), in
    FIDELITY_CHOICES order."""
    a, b = fidelity_values(left), fidelity_values(right)
    order = [*FIDELITY_CHOICES, *sorted((set(a) | set(b)) - set(FIDELITY_CHOICES))]
    return tuple((k, " / ".join(a.get(k, ("?",))), " / ".join(b.get(k, ("?",))))
                 for k in order if (k in a or k in b) and a.get(k) != b.get(k))


def column_modes(this_mode: str, other_mode: str) -> tuple[bool, tuple[str, str]]:
    """(swapped, (mode of the paper_text column, mode of the official column)): the paper-text
    side left and the official side right; otherwise this folder left (swapped False)."""
    swapped = _RANK.get(this_mode, 1) > _RANK.get(other_mode, 1)
    return swapped, ((other_mode, this_mode) if swapped else (this_mode, other_mode))


def mode_labels(modes: tuple[str, str]) -> tuple[str, str]:
    """Column headings of the two sides: 'Paper text', 'Official code', 'Mixed fidelity', ...;
    two sides of one mode are told apart by folder ('(this folder)', '(compare folder)')."""
    left, right = (MODE_LABELS.get(m, m) for m in modes)
    if left == right:
        return f"{left} (this folder)", f"{right} (compare folder)"
    return left, right


def _isna(v) -> bool:
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def _num(v) -> float | None:
    return None if _isna(v) else float(v)


def _learned(v) -> bool | None:
    if _isna(v):
        return None
    if isinstance(v, str):
        return {"true": True, "false": False}.get(v.strip().lower())
    return bool(v)


def compare_modes(this: pd.DataFrame, other: pd.DataFrame, this_mode: str, other_mode: str) -> pd.DataFrame:
    """One row per cell present in both per-table summaries (the concatenated tables/*.csv), in
    `this` frame's (paper) order: the cell's id, table, block and axes, `paper_text` and
    `official` (reproduced on each side, see column_modes), delta = official - paper_text
    (None when either side is missing or diverged), seeds_*, status_* and learned_* of each
    side, and the paper's value. frame.attrs["modes"] holds the two columns' modes."""
    swapped, modes = column_modes(this_mode, other_mode)
    if this is None or other is None or "cell_id" not in this or "cell_id" not in other:
        out = pd.DataFrame(columns=list(COLUMNS))
        out.attrs["modes"] = modes
        return out
    left, right = (other, this) if swapped else (this, other)
    order = {c: i for i, c in enumerate(dict.fromkeys(this["cell_id"]))}
    ids = [c for c in order if c in set(other["cell_id"])]
    lrow = left.drop_duplicates("cell_id").set_index("cell_id")
    rrow = right.drop_duplicates("cell_id").set_index("cell_id")
    base = this.drop_duplicates("cell_id").set_index("cell_id")
    rows = []
    for cid in ids:
        b, lr, rr = base.loc[cid], lrow.loc[cid], rrow.loc[cid]
        lv, rv = _num(lr.get("reproduced")), _num(rr.get("reproduced"))
        row = {"cell_id": cid, "table": b.get("table"), "block": b.get("block"),
               **{k: (None if _isna(b.get(k)) else b.get(k)) for k in CELL_AXES},
               "paper_text": lv, "official": rv,
               "delta": round(rv - lv, 2) if lv is not None and rv is not None else None}
        for side, r in zip(SIDES, (lr, rr)):
            seeds = r.get("seeds")
            row[f"seeds_{side}"] = 0 if _isna(seeds) else int(seeds)
            row[f"status_{side}"] = "missing" if _isna(r.get("status")) else str(r.get("status"))
            row[f"learned_{side}"] = _learned(r.get("learned"))
        row["paper"] = _num(b.get("paper"))
        rows.append(row)
    out = pd.DataFrame(rows, columns=list(COLUMNS), dtype=object)
    out.attrs["modes"] = modes
    return out


def headline(frame: pd.DataFrame) -> dict:
    """{'cells': cells with a value on both sides, 'mean_abs_delta': the mean |delta| over them,
    'max_abs_delta', 'max_delta' (signed) and 'max_cell' (its cell_id)}; None values without
    such cells."""
    both = [(c, float(d)) for c, d in zip(frame.get("cell_id", ()), frame.get("delta", ()))
            if d is not None and not _isna(d) and math.isfinite(float(d))]
    if not both:
        return {"cells": 0, "mean_abs_delta": None, "max_abs_delta": None, "max_delta": None, "max_cell": None}
    cell, top = max(both, key=lambda cd: abs(cd[1]))  # first in paper order on ties
    return {"cells": len(both), "mean_abs_delta": round(sum(abs(d) for _, d in both) / len(both), 2),
            "max_abs_delta": round(abs(top), 2), "max_delta": round(top, 2), "max_cell": cell}
