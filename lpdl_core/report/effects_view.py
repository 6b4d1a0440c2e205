"""The mini profile's effects view, in HTML and LaTeX: one table per paper table, one row per
effect and block (FP - LP, CHOCO - DS, the skew drop, 8 vs 16 nodes, 0 % vs compressed), the
paper's effect beside the reproduced one with its spread over seeds and a verdict
(report.effects). Rows are coloured by verdict, never by the difference to the paper's absolute
accuracy: on stand-ins only the direction of an effect can be compared.

Each table is a DataFrame drawn with pandas' Styler (templates/effects.html.j2 and
templates/effects.tex.j2 around it): indexed by (block, effect) with the effect level hidden, so
a block's rows share one merged label (rowspan / \\multirow); the verdict colours every data cell
of a row (HTML: a class per verdict, styled by report.css; LaTeX: \\cellcolor).
"""
from __future__ import annotations

import html
from collections import Counter
from typing import Callable

import pandas as pd

from .effects import EFFECT_VERDICTS, SIGN_EPS, EffectRow
from .model import LEARNED_MARGIN
from .table_style import Styler, escaped
from .templating import Markup, Tex, css_class, heading, html_env, tex_env

VERDICT_CSS = {v: css_class(v) for v in EFFECT_VERDICTS}
TEX_COLOURS = {"same sign": "green!15", "opposite sign": "red!15", "no sign": "white",
               "within noise": "yellow!25", "not learned": "gray!15", "missing": "gray!8"}
TABLE_ORDER = ("table1", "table2", "table3", "table4", "table5", "fig1")
TITLES = {"table1": "Table 1 (single node)", "table2": "Table 2 (CIFAR-10, decentralized)",
          "table3": "Table 3 (quasi-global momentum)", "table4": "Table 4 (Imagenette)",
          "table5": "Table 5 (NLP)", "fig1": "Figure 1 runs"}
INTRO = ("On stand-in data and models the paper's absolute accuracies cannot be matched, but its "
         "effects can be compared. Each row is one effect in one block: the paper's effect (mean of "
         "the differences of its numbers over the block's pairs of cells that differ in that axis only), "
         "the reproduced one (mean over seeds of the same mean difference; ± its standard deviation over "
         f"seeds, with two or more seeds), and a verdict: same sign (the direction agrees; sizes are set by "
         f"the stand-ins and the short protocol and are not compared), opposite sign, no sign (the paper's or "
         f"the reproduced effect is under {SIGN_EPS:g} points), within noise (the seed spread is at least "
         "as large as the reproduced "
         f"effect), not learned (no pair of cells that learned: a cell within {LEARNED_MARGIN:g} points of "
         "chance is left "
         "out), missing (no results yet). Points are accuracy points.")
COLUMNS = ("Effect", "Paper (points)", "Reproduced (points)", "Pairs", "Seeds", "Verdict")
_COLUMN_CSS = ("effect", "num", "num", "num", "num", "verdict")


def grouped(rows: list[EffectRow]) -> list[tuple[str, list[EffectRow]]]:
    """(table, its rows) in paper order; within a table by block, then in EFFECTS order."""
    order = {t: i for i, t in enumerate(TABLE_ORDER)}
    tables = sorted(dict.fromkeys(r.table for r in rows), key=lambda t: (order.get(t, len(order)), t))
    out = []
    for t in tables:
        mine = [r for r in rows if r.table == t]
        blocks = list(dict.fromkeys(r.block for r in mine))
        out.append((t, sorted(mine, key=lambda r: blocks.index(r.block))))  # stable: effect order kept
    return out


def verdict_counts(rows: list[EffectRow]) -> str:
    """'12 same sign, 3 opposite sign, ...' in EFFECT_VERDICTS order."""
    c = Counter(r.verdict for r in rows)
    return ", ".join(f"{c[v]} {v}" for v in EFFECT_VERDICTS if c[v])


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:+.2f}"


def reproduced_text(r: EffectRow) -> str:
    """'+1.25 ± 0.40' (± only with two or more seeds), '–' without a learned pair."""
    if r.reproduced is None:
        return "–"
    return _num(r.reproduced) + (f" ± {r.spread:.2f}" if r.spread is not None else "")


def table_title(table: str, titles: dict[str, str] | None = None) -> str:
    """The heading of a table's effects: TITLES, else the PaperTable's title, else from the id."""
    return TITLES.get(table) or heading(table, (titles or {}).get(table, ""))


def frame(rows: list[EffectRow]) -> pd.DataFrame:
    """One table's effects: index (block title or id, effect), columns COLUMNS (strings)."""
    index = pd.MultiIndex.from_tuples([(r.title or r.block, r.effect) for r in rows],
                                      names=["Block", "Effect"])
    values = [[r.effect, _num(r.paper), reproduced_text(r), str(r.pairs), str(r.seeds), r.verdict]
              for r in rows]
    return pd.DataFrame(values, index=index, columns=list(COLUMNS), dtype=object)


def _styler(rows: list[EffectRow], esc: Callable[[str], str], uuid: str):
    """The Styler of one table: the effect level hidden (it is a column too), the index names
    hidden and 'Block' shown as the columns' name, so the header is one row."""
    df = escaped(frame(rows), esc)
    df.columns.name = "Block"
    return (Styler(df, uuid=css_class(uuid), cell_ids=False).format(esc)
            .hide(axis="index", level=1).hide(axis="index", names=True))


def _html_table(rows: list[EffectRow], table: str) -> Markup:
    classes = pd.DataFrame([[f"{VERDICT_CSS.get(r.verdict, css_class(r.verdict))} {c}"
                             for c in _COLUMN_CSS] for r in rows])
    styler = _styler(rows, lambda s: html.escape(str(s), quote=True), f"effects-{table}")
    classes.index, classes.columns = styler.data.index, styler.data.columns
    return Markup(styler.set_td_classes(classes).to_html(
        table_attributes='class="paper effects"', sparse_index=True))


def _tex_table(rows: list[EffectRow], escape: Callable[[str], str]) -> Tex:
    styles = [[f"cellcolor:{{{TEX_COLOURS.get(r.verdict, 'white')}}};"] * len(COLUMNS) for r in rows]
    styler = _styler(rows, escape, "effects")
    colour = pd.DataFrame(styles, index=styler.data.index, columns=styler.data.columns)
    return Tex(styler.apply(lambda _: colour, axis=None).to_latex(
        environment="longtable", hrules=True, sparse_index=True, multirow_align="t",
        column_format="llrrrrl"))


def effects_html(rows: list[EffectRow], titles: dict[str, str] | None = None) -> str:
    """The effects section: a summary line, then one table per paper table, rows coloured by
    verdict. titles: table id -> the PaperTable's title (used for tables missing in TITLES)."""
    tables = [dict(id=t, title=table_title(t, titles), counts=verdict_counts(mine),
                   html=_html_table(mine, t)) for t, mine in grouped(rows)]
    return html_env().get_template("effects.html.j2").render(
        intro=INTRO, counts=verdict_counts(rows) or "no effects", tables=tables)


def effects_tex(rows: list[EffectRow], escape, titles: dict[str, str] | None = None) -> str:
    """One longtable per paper table, rows coloured by verdict (escape: latex.tex_escape)."""
    tables = [dict(title=Tex(escape(table_title(t, titles))), counts=Tex(escape(verdict_counts(mine))),
                   tex=_tex_table(mine, escape)) for t, mine in grouped(rows)]
    return tex_env().get_template("effects.tex.j2").render(
        intro=Tex(escape(INTRO)), counts=Tex(escape(verdict_counts(rows) or "no effects")),
        tables=tables)
