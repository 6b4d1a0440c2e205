"""The report's "Paper text vs official code" section, in HTML and LaTeX (only with a compare
folder: ReportData.modes, report.modes).

A headline sentence (mean |Δ| over the cells with a result on both sides, the largest |Δ| and its
cell), one line on the fidelity options that differ between the two folders' runs, then one table
per paper table ("Table 2", never the id): rows named as a reader names a cell (block title,
compression, skew, variant such as "LP-DS (8-bit)"; levels that are the same for every cell of the
table are left out), columns the paper-text side, the official side, Δ (signed, 2 decimals) and
the paper's number. Cells without a result on either side are left out of the tables (and
counted). Each table is a DataFrame drawn with pandas' Styler like the paper tables
(report.table_style): repeated group labels merged (rowspan / \\multirow), Δ coloured by the
report's bands (|Δ| < 1, < 3, else), a side that did not learn grey and marked "n.l.".
"""
from __future__ import annotations

import html
from dataclasses import dataclass
from typing import Callable

import pandas as pd

from ..pipeline.cells.cell import Cell
from ..pipeline.cells.shapes import NORM_NAMES, TABLE_TITLES, block_title, name, variant
from .model import DELTA_BANDS, LEARNED_MARGIN, NO_NUMBER, ReportData, delta_class
from .modes import MODE_LABELS, SIDES, headline, mode_labels
from .table_style import CELL_COLOURS, FLAT_COLOUR, Styler, escaped
from .templating import Markup, Tex, anchor, css_class, html_env, signed, signed_tex, tex, tex_env

LEVELS = ("Block", "Compression (%)", "Skew", "Variant")
DELTA, PAPER = "Δ", "Paper"
SECTION_ID = "modes"
BLOCK_COLUMN = r">{\raggedright\arraybackslash}p{2.9cm}"  # LaTeX: block titles wrap


@dataclass(frozen=True, kw_only=True)
class ModesTable:
    table: str                     # id: anchors only
    title: str                     # "Table 2"
    rows: tuple[dict, ...]         # report.modes rows (cells with a result on at least one side)
    labels: tuple[tuple[str, ...], ...]  # each row's display labels, one per `levels`
    levels: tuple[str, ...]        # the row axes shown (LEVELS less the constant ones)
    left_out: int = 0              # cells of the table without a result on either side


@dataclass(frozen=True, kw_only=True)
class ModesView:
    title: str                     # "Paper text vs official code"
    modes: tuple[str, str]         # modes of the two columns, e.g. ("paper", "official")
    labels: tuple[str, str]        # their headings, e.g. ("Paper text", "Official code")
    headline: dict                 # report.modes.headline
    sentence: str                  # the headline as a sentence
    options: str                   # one line: the fidelity options that differ
    tables: tuple[ModesTable, ...]
    note: str = ""                 # what is not shown (cells without results) and the legend


def _pct(v) -> str:
    return "" if v is None else f"{float(v):g}"


def _labels(rows: list[dict], cells: dict[str, Cell]) -> tuple[tuple[str, ...], list[tuple[str, ...]]]:
    """(levels, one label tuple per row): LEVELS less those constant over the table's rows; the
    variant gets the normalization's name when the other labels do not tell two cells apart."""
    full = []
    for r in rows:
        c = cells.get(r["cell_id"])
        full.append([block_title(c) if c else str(r["block"]), _pct(r["compression"]), _pct(r["skew"]),
                     variant(c) if c else str(r["cell_id"])])
    if len({tuple(f) for f in full}) < len(full):
        for f, r in zip(full, rows):
            if r.get("norm"):
                f[3] += f", {name(NORM_NAMES, r['norm'])}"
    keep = [i for i, lv in enumerate(LEVELS) if lv in ("Block", "Variant") or len({f[i] for f in full}) > 1]
    return tuple(LEVELS[i] for i in keep), [tuple(f[i] for i in keep) for f in full]


def cell_name(title: str, levels: tuple[str, ...], labels: tuple[str, ...]) -> str:
    """A cell as a reader names it: 'Table 2: ResNet-20, Directed Ring, 8 nodes, 0 % compression,
    skew 0, LP-DS (8-bit)'."""
    parts = []
    for lv, lab in zip(levels, labels):
        parts.append(f"{lab} % compression" if lv == "Compression (%)" else f"skew {lab}" if lv == "Skew" else lab)
    return f"{title}: " + ", ".join(parts)


def _has_result(r: dict, side: str) -> bool:
    return r[f"status_{side}"] != "missing"


def _sentence(h: dict, labels: tuple[str, str], name_of: dict[str, str]) -> str:
    left, right = labels
    if not h["cells"]:
        return f"No cell has a result in both folders yet: nothing to compare ({right} beside {left})."
    cells = f"{h['cells']} cell{'s' if h['cells'] != 1 else ''}"
    return (f"Mean |Δ| = {h['mean_abs_delta']:.2f} accuracy points over {cells} with a result on both "
            f"sides (Δ = {right.lower()} − {left.lower()}); the largest |Δ| is {h['max_abs_delta']:.2f} "
            f"(Δ = {signed(h['max_delta'])}) at {name_of.get(h['max_cell'], h['max_cell'])}.")


def _options_line(options: tuple[tuple[str, str, str], ...], labels: tuple[str, str],
                  modes: tuple[str, str]) -> str:
    if "unknown" in modes:
        which = " and ".join(lab for lab, m in zip(labels, modes) if m == "unknown")
        return (f"Fidelity options that differ: not known ({which}: its runs.csv records no known "
                f"fidelity options).")
    if not options:
        return "Fidelity options that differ: none (both folders' runs have the same fidelity options)."
    return (f"Fidelity options that differ ({labels[0].lower()} → {labels[1].lower()}): "
            + "; ".join(f"{k} ({a} → {b})" for k, a, b in options) + ".")


def modes_view(data: ReportData) -> ModesView | None:
    """The section's contents, None without a compare folder (data.modes None)."""
    if data.modes is None:
        return None
    modes = tuple(data.mode_names) if len(data.mode_names) == 2 else \
        tuple(data.modes.attrs.get("modes", ("unknown", "unknown")))
    labels = mode_labels(modes)
    cells = {c.cell_id: c for c in data.cells}
    records = [{k: (None if _isna(v) else v) for k, v in r.items()} for r in data.modes.to_dict("records")]
    tables, name_of, left_out = [], {}, 0
    for t in dict.fromkeys(r["table"] for r in records):
        mine = [r for r in records if r["table"] == t]
        levels, labs = _labels(mine, cells)
        title = TABLE_TITLES.get(t, str(t))
        name_of.update({r["cell_id"]: cell_name(title, levels, lab) for r, lab in zip(mine, labs)})
        shown = [(r, lab) for r, lab in zip(mine, labs) if any(_has_result(r, s) for s in SIDES)]
        left_out += len(mine) - len(shown)
        if shown:
            tables.append(ModesTable(table=t, title=title, rows=tuple(r for r, _ in shown),
                                     labels=tuple(lab for _, lab in shown), levels=levels,
                                     left_out=len(mine) - len(shown)))
    h = headline(data.modes)
    title = f"{MODE_LABELS.get(modes[0], modes[0])} vs {MODE_LABELS.get(modes[1], modes[1]).lower()}"
    note = (f"{left_out} cell{'s' if left_out != 1 else ''} without a result in either folder "
            f"{'are' if left_out != 1 else 'is'} left out. " if left_out else "")
    return ModesView(title=title, modes=modes, labels=labels, headline=h, sentence=_sentence(h, labels, name_of),
                     options=_options_line(tuple(data.mode_options), labels, modes), tables=tuple(tables),
                     note=note)


def _isna(v) -> bool:
    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


# ---- one table as a frame, drawn with Styler -------------------------------------------------

def _side_text(r: dict, side: str, nl: str) -> str:
    status = r[f"status_{side}"]
    if status in NO_NUMBER:
        return status
    v = r[side]
    text = "–" if v is None else f"{v:.2f}"
    if status == "partly-diverged":
        text += "†"
    if status == "partly-damaged":
        text += "‡"
    return text + (f" {nl}" if r[f"learned_{side}"] is False else "")


def frame(t: ModesTable, labels: tuple[str, str]) -> pd.DataFrame:
    """The table as strings: index the row labels (levels t.levels), columns the two sides, Δ and
    the paper's value."""
    index = pd.MultiIndex.from_tuples(list(t.labels), names=list(t.levels))
    values = [[*(_side_text(r, s, "n.l.") for s in SIDES),
               "–" if r["delta"] is None else signed(r["delta"]),
               "–" if r["paper"] is None else f"{r['paper']:.2f}"] for r in t.rows]
    return pd.DataFrame(values, index=index, columns=[*labels, DELTA, PAPER], dtype=object)


def _side_class(r: dict, side: str) -> str:
    status = r[f"status_{side}"]
    if status in NO_NUMBER:
        return status
    return "num " + css_class(status) + (" flat" if r[f"learned_{side}"] is False else "")


def _classes(t: ModesTable) -> list[list[str]]:
    return [[_side_class(r, s) for s in SIDES] + [f"num delta {delta_class(r['delta'])}", "num paper-value"]
            for r in t.rows]


def _tooltips(t: ModesTable, labels: tuple[str, str]) -> list[list[str]]:
    out = []
    for r in t.rows:
        sides = [f"{r['cell_id']} ({lab}): {r[f'status_{s}']}, {r[f'seeds_{s}']} ok seed(s)"
                 + ("; did not learn" if r[f"learned_{s}"] is False else "") for s, lab in zip(SIDES, labels)]
        out.append([*sides, f"{r['cell_id']}: {labels[1]} − {labels[0]}", f"{r['cell_id']}: the paper's value"])
    return out


def _styler(df: pd.DataFrame, esc: Callable[[str], str], uuid: str, **kw):
    return Styler(escaped(df, esc), uuid=css_class(uuid), **kw).format(esc)


def table_html(t: ModesTable, labels: tuple[str, str]) -> Markup:
    esc = lambda s: html.escape(str(s), quote=True)  # noqa: E731
    styler = _styler(frame(t, labels), esc, f"modes-{t.table}")
    shape = dict(index=styler.data.index, columns=styler.data.columns)
    tips = pd.DataFrame([[esc(x) for x in row] for row in _tooltips(t, labels)], **shape)
    return Markup(styler.set_td_classes(pd.DataFrame(_classes(t), **shape))
                  .set_tooltips(tips, as_title_attribute=True)
                  .to_html(table_attributes='class="paper modes"', sparse_index=True))


def _tex_style(r: dict, col: int) -> str:
    if col < 2:
        side = SIDES[col]
        return f"cellcolor:[HTML]{{{FLAT_COLOUR}}};" if r[f"learned_{side}"] is False else ""
    colour = CELL_COLOURS.get(delta_class(r["delta"])) if col == 2 else None
    return f"cellcolor:[HTML]{{{colour}}};" if colour else ""


def table_tex(t: ModesTable, labels: tuple[str, str]) -> Tex:
    """A longtable (pages break inside it: Table 2 has 128 cells). A group's label is set on its
    first row (multirow_align "naive") so that the block title wraps in its fixed-width column
    and the table fits the text width."""
    df = frame(t, labels)
    # Δ signed as in the paper tables: $+$1.25 / $-$0.77
    df[DELTA] = [Tex("--") if r["delta"] is None else signed_tex(r["delta"]) for r in t.rows]
    styler = _styler(df, tex, "modes", cell_ids=False)
    styles = pd.DataFrame([[_tex_style(r, i) for i in range(4)] for r in t.rows],
                          index=styler.data.index, columns=styler.data.columns)
    return Tex(styler.map_index(lambda _: "textbf:--rwrap;", axis="columns")
               .apply(lambda _: styles, axis=None)
               .to_latex(environment="longtable", hrules=True, sparse_index=True, multirow_align="naive",
                         column_format=BLOCK_COLUMN + "l" * (len(t.levels) - 1) + "rrrr"))


def modes_html(view: ModesView) -> str:
    tables = [dict(id=anchor(SECTION_ID, t.table), title=t.title, html=table_html(t, view.labels))
              for t in view.tables]
    return html_env().get_template("modes.html.j2").render(
        view=view, tables=tables, section_id=SECTION_ID, bands=DELTA_BANDS, margin=LEARNED_MARGIN)


def modes_tex(view: ModesView) -> str:
    tables = [dict(title=t.title, tex=table_tex(t, view.labels)) for t in view.tables]
    return tex_env().get_template("modes.tex.j2").render(
        view=view, tables=tables, bands=DELTA_BANDS, colours=CELL_COLOURS, flat=FLAT_COLOUR,
        margin=LEARNED_MARGIN)
