"""The report's "The merge step" section, in HTML and LaTeX (report.merge gives its contents).

One table per paper table ("Table 2", never the id): rows (skew, compression) and the whole
table, columns the runs that count, the accuracy before the final rounds (a), after the gossip
merge (b), after one exact average (c), and the gains b - a and c - a. A table without a run that
counts is one line saying why. Each table is a DataFrame drawn with pandas' Styler like the other
sections (report.table_style): repeated skew labels merged (rowspan / \\multirow), gains coloured
by sign (HTML: a class styled by report.css; LaTeX: \\cellcolor).
"""
from __future__ import annotations

import html
from typing import Callable

import pandas as pd

from .merge import SECTION_ID, MergeGroup, MergeTable, MergeView
from .table_style import Styler, escaped
from .templating import Markup, Tex, anchor, css_class, html_env, tex, tex_env

LEVELS = ("Skew", "Compression (%)")
COLUMNS = ("Runs", "Before (a)", "Gossip merge (b)", "All-reduce (c)", "Gossip − before", "All-reduce − before")
ALL = "all"
GAIN_CLASS = {1: "gain", -1: "loss", 0: "even"}
TEX_GAIN_COLOURS = {"gain": "D8F0D8", "loss": "F8D3D3"}
INTRO = ("What the final rounds are worth. After training, each run with final rounds evaluates its nodes' "
         "models twice more: (a) before: the mean of the node accuracies before the final rounds (no merge); "
         "(b) gossip merge: the mean of the node accuracies after the gossip-only final rounds (the paper's and "
         "the official code's number, as in the tables); (c) all-reduce: the accuracy of the nodes' averaged "
         "model (parameters and buffers) before the final rounds. (c) is one all-reduce by construction: one "
         "exact average of the trained models gives every node exactly that averaged model. The gains are "
         "b − a and c − a. Each value is the mean over the group's runs (cells and seeds), accuracy in percent "
         "and gains in points; only runs that finished (status ok) with all three recorded count, and a run "
         "computed once for two cells counts once.")


def _sign(x: float | None) -> int:
    return 0 if x is None or abs(x) < 0.005 else (1 if x > 0 else -1)


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:.2f}"


def _gain(x: float | None) -> str:
    return "–" if x is None else f"{x:+.2f}"


def _labels(g: MergeGroup) -> tuple[str, str]:
    return (ALL if g.skew is None else f"{g.skew:g}", ALL if g.compression is None else f"{g.compression:d}")


def frame(t: MergeTable) -> pd.DataFrame:
    """The table as strings: index (skew, compression), columns COLUMNS."""
    index = pd.MultiIndex.from_tuples([_labels(g) for g in t.groups], names=list(LEVELS))
    values = [[str(g.runs), _num(g.before), _num(g.gossip), _num(g.allreduce), _gain(g.gossip_gain),
               _gain(g.allreduce_gain)] for g in t.groups]
    return pd.DataFrame(values, index=index, columns=list(COLUMNS), dtype=object)


def _classes(g: MergeGroup) -> list[str]:
    row = "num all" if g.skew is None else "num"
    return [row] * 4 + [f"{row} {GAIN_CLASS[_sign(x)]}" for x in (g.gossip_gain, g.allreduce_gain)]


def _styler(t: MergeTable, esc: Callable[[str], str], uuid: str, **kw):
    return Styler(escaped(frame(t), esc), uuid=css_class(uuid), **kw).format(esc)


def table_html(t: MergeTable) -> Markup:
    styler = _styler(t, lambda s: html.escape(str(s), quote=True), f"merge-{t.table}")
    classes = pd.DataFrame([_classes(g) for g in t.groups], index=styler.data.index, columns=styler.data.columns)
    return Markup(styler.set_td_classes(classes).to_html(table_attributes='class="paper merge"', sparse_index=True))


def _tex_style(g: MergeGroup, col: int) -> str:
    if col < 4:
        return ""
    colour = TEX_GAIN_COLOURS.get(GAIN_CLASS[_sign(g.gossip_gain if col == 4 else g.allreduce_gain)])
    return f"cellcolor:[HTML]{{{colour}}};" if colour else ""


def table_tex(t: MergeTable) -> Tex:
    styler = _styler(t, tex, "merge", cell_ids=False)
    styles = pd.DataFrame([[_tex_style(g, i) for i in range(len(COLUMNS))] for g in t.groups],
                          index=styler.data.index, columns=styler.data.columns)
    return Tex(styler.apply(lambda _: styles, axis=None).to_latex(
        environment="longtable", hrules=True, sparse_index=True, multirow_align="t",
        column_format="ll" + "r" * len(COLUMNS)))


def _title(t: MergeTable, view: MergeView) -> str:
    return f"{t.title} (mini profile)" if view.profile == "mini" else t.title


def merge_html(view: MergeView) -> str:
    tables = [dict(id=anchor(SECTION_ID, t.table), title=_title(t, view), empty=t.empty, left_out=t.left_out,
                   html=table_html(t) if t.groups else None) for t in view.tables]
    return html_env().get_template("merge.html.j2").render(
        view=view, intro=INTRO, tables=tables, section_id=SECTION_ID)


def merge_tex(view: MergeView) -> str:
    tables = [dict(title=_title(t, view), empty=t.empty, left_out=t.left_out,
                   tex=table_tex(t) if t.groups else None) for t in view.tables]
    return tex_env().get_template("merge.tex.j2").render(
        view=view, intro=INTRO, tables=tables, colours=TEX_GAIN_COLOURS)
