"""A PaperTable as a pandas DataFrame, drawn with pandas' Styler in HTML and in LaTeX.

The frame: one row per Row, indexed by a MultiIndex of the row labels (levels named by
`row_axes`), one column per `columns` entry; each value is the Entry (None: no such cell in the
paper). Styler's sparse index merges repeated group labels: a `rowspan` in HTML, `\\multirow`
in LaTeX. What a cell shows comes from the `cell` macros of templates/cells.html.j2 and
templates/cells.tex.j2 (Styler.format); its colour from its class (HTML: set_td_classes, styled
by report.css) or from `\\cellcolor` (LaTeX: Styler.apply); its tooltip (the cell id and its
flags) is the td's title attribute (set_tooltips).

Styler prints labels, index names and tooltips as they are, so every string from the data is
escaped here first (`escaped`), with html.escape or tex_escape.
"""
from __future__ import annotations

import html
from importlib.resources import files
from typing import Callable

import pandas as pd
from pandas.io.formats.style import Styler as _PandasStyler

from .model import LEARNED_MARGIN, NO_NUMBER, Entry, PaperTable, delta_class
from .templating import Tex, css_class, epochs, html_macro, tex, tex_macro

# LaTeX cell backgrounds (colortbl's \cellcolor with an HTML colour); report.css has the same
CELL_COLOURS = {"close": "D8F0D8", "near": "FFF0C2", "far": "F8D3D3"}
FLAT_COLOUR = "ECEFF1"  # did not learn

# pandas' Styler without its <style> element (report.css styles the tables by class)
Styler = _PandasStyler.from_custom_template(str(files("lpdl_core.report") / "templates"),
                                            html_style="styler_style.tpl")


def _unique(keys: list[tuple]) -> list[tuple]:
    """Keys made unique (Styler styles only unique labels): a repeat gets ' (2)', ' (3)' ..."""
    seen: dict[tuple, int] = {}
    out = []
    for k in keys:
        n = seen[k] = seen.get(k, 0) + 1
        out.append(k if n == 1 else (*k[:-1], f"{k[-1]} ({n})"))
    return out if len(set(out)) == len(out) else _unique(out)


def escaped(df: pd.DataFrame, esc: Callable[[str], str]) -> pd.DataFrame:
    """df with its index labels, index names and column labels escaped (and kept unique)."""
    out = df.copy()
    rows = _unique([tuple(esc(x) for x in (k if isinstance(k, tuple) else (k,))) for k in df.index])
    names = [esc(n) if n is not None else None for n in df.index.names]
    out.index = pd.MultiIndex.from_tuples(rows, names=names) if rows else \
        pd.MultiIndex.from_arrays([[] for _ in names], names=names)
    out.columns = pd.Index([c[0] for c in _unique([(esc(c),) for c in df.columns])],
                           name=df.columns.name)
    return out


def frame(t: PaperTable) -> pd.DataFrame:
    """The table as a frame of Entry | None (MultiIndex of row_axes, columns t.columns)."""
    n = len(t.columns)
    values = [(list(r.entries) + [None] * n)[:n] for r in t.rows]
    index = pd.MultiIndex.from_arrays([[] for _ in t.row_axes], names=list(t.row_axes)) \
        if not t.rows else pd.MultiIndex.from_tuples([tuple(r.labels) for r in t.rows],
                                                      names=list(t.row_axes))
    return pd.DataFrame(values, index=index, columns=list(t.columns), dtype=object)


def entry_class(e: Entry | None, compare: str = "absolute") -> str:
    """CSS classes of a cell: absent | missing | diverged | <band> <status> [flat], where band is
    the delta class (close/near/far/none) in the paper profile and 'mini' otherwise."""
    if e is None:
        return "absent"
    if e.status in NO_NUMBER:
        return e.status
    band = "mini" if compare == "effects" else delta_class(e.delta)
    return f"{band} {css_class(e.status)}" + (" flat" if e.learned is False else "")


def entry_title(e: Entry | None) -> str:
    """The cell's tooltip (plain text): its id, and what its flags mean."""
    if e is None:
        return "no such cell in the paper"
    if e.status == "missing":
        return f"{e.cell_id}: no result"
    if e.status == "diverged":
        return e.cell_id
    if e.status == "damaged":
        return f"{e.cell_id}: {e.problem}"
    title = e.cell_id
    if e.status == "partly-diverged":
        when = epochs(e.diverged_at)
        title += f": some seeds diverged{f' ({when})' if when else ''}; mean of {e.seeds} ok seed(s)"
    if e.status == "partly-damaged":
        title += f": a run cannot be used ({e.problem}); mean of {e.seeds} ok seed(s)"
    if e.learned is False:
        title += f"; within {LEARNED_MARGIN:g} points of chance ({e.chance:.2f})"
    if e.same_run_as:
        title += f"; computed once: same run as {e.same_run_as}"
    return title


def entry_tex_style(e: Entry | None, compare: str = "absolute") -> str:
    """Styler's LaTeX cell style: a \\cellcolor for did-not-learn (grey) or, in the paper
    profile, the delta band; nothing else."""
    if e is None or e.status in NO_NUMBER:
        return ""
    if e.learned is False:
        return f"cellcolor:[HTML]{{{FLAT_COLOUR}}};"
    colour = CELL_COLOURS.get(delta_class(e.delta)) if compare != "effects" else None
    return f"cellcolor:[HTML]{{{colour}}};" if colour else ""


def _cells(df: pd.DataFrame, fn: Callable[[Entry | None], str]) -> pd.DataFrame:
    return pd.DataFrame([[fn(e) for e in row] for row in df.itertuples(index=False)],
                        index=df.index, columns=df.columns, dtype=object)


def html_table(t: PaperTable) -> str:
    """The table's <table class="paper"> (Styler.to_html; ids prefixed T_<table id>)."""
    df = escaped(frame(t), lambda s: html.escape(str(s), quote=True))
    cell = html_macro("cells.html.j2", "cell")
    styler = (Styler(df, uuid=css_class(t.name) or "table")
              .format(lambda e: str(cell(e, t.compare)))
              .set_td_classes(_cells(df, lambda e: entry_class(e, t.compare)))
              .set_tooltips(_cells(df, lambda e: html.escape(entry_title(e), quote=True)),
                            as_title_attribute=True))
    return styler.to_html(table_attributes='class="paper"', sparse_index=True)


def tex_tabular(t: PaperTable) -> Tex:
    """The table's booktabs tabular (Styler.to_latex); repeated labels as \\multirow[t]."""
    df = escaped(frame(t), tex)
    cell = tex_macro("cells.tex.j2", "cell")
    styler = (Styler(df, uuid="t", cell_ids=False)
              .format(lambda e: cell(e, t.compare))
              .map_index(lambda _: "textbf:--rwrap;", axis="columns")
              .apply(lambda d: _cells(d, lambda e: entry_tex_style(e, t.compare)), axis=None))
    spec = "l" * len(t.row_axes) + "c" * len(t.columns)
    return Tex(styler.to_latex(hrules=True, sparse_index=True, multirow_align="t",
                               column_format=spec))
