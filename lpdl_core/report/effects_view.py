"""The mini profile's effects view, in HTML and LaTeX: one table per paper table, one row per
effect and block (FP - LP, CHOCO - DS, the skew drop, 8 vs 16 nodes, 0 % vs compressed), the
paper's effect beside the reproduced one with its spread over seeds and a verdict
(report.effects). Rows are coloured by verdict, never by the difference to the paper's absolute
accuracy: on stand-ins only the direction of an effect can be compared."""
from __future__ import annotations

import html
from collections import Counter

from .effects import EFFECT_VERDICTS, SIGN_EPS, EffectRow
from .model import LEARNED_MARGIN

VERDICT_CSS = {v: v.replace(" ", "-") for v in EFFECT_VERDICTS}
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
         f"the reproduced effect is under {SIGN_EPS:g} points), within noise (the seed spread is at least as large as the reproduced "
         f"effect), not learned (no pair of cells that learned: a cell within {LEARNED_MARGIN:g} points of "
         "chance is left "
         "out), missing (no results yet). Points are accuracy points.")


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


def effects_html(rows: list[EffectRow]) -> str:
    """The effects section: a summary line, then one table per paper table, rows coloured by verdict."""
    e = lambda t: html.escape(str(t), quote=True)  # noqa: E731
    parts = []
    for table, mine in grouped(rows):
        body = "".join(
            f'<tr class="{VERDICT_CSS[r.verdict]}"><td class="blk">{e(r.block)}</td><td>{e(r.effect)}</td>'
            f'<td class="num">{e(_num(r.paper))}</td><td class="num">{e(reproduced_text(r))}</td>'
            f'<td class="num">{r.pairs}</td><td class="num">{r.seeds}</td>'
            f'<td class="verdict">{e(r.verdict)}</td></tr>' for r in mine)
        parts.append(
            f'<h3 id="effects-{e(table)}">{e(TITLES.get(table, table))}</h3>'
            f'<p class="note">{e(verdict_counts(mine))}</p>'
            '<div class="table-wrap"><table class="paper effects"><thead><tr><th>Block</th>'
            '<th>Effect</th><th>Paper (points)</th><th>Reproduced (points)</th><th>Pairs</th>'
            f'<th>Seeds</th><th>Verdict</th></tr></thead><tbody>{body}</tbody></table></div>')
    tables = "".join(parts) or "<p>No effects: no table has pairs of cells differing in one axis.</p>"
    return ('<section id="effects"><h2>Effects: paper vs reproduction</h2>'
            f'<p class="note">{e(INTRO)}</p><p><strong>{e(verdict_counts(rows) or "no effects")}'
            f'</strong></p>{tables}</section>')


def effects_tex(rows: list[EffectRow], escape) -> str:
    """One longtable per paper table, rows coloured by verdict (escape: latex.tex_escape)."""
    lines = [r"\section*{Effects: paper vs reproduction}", escape(INTRO), "",
             r"\textbf{%s}" % escape(verdict_counts(rows) or "no effects"), ""]
    for table, mine in grouped(rows):
        lines += [r"\subsection*{%s}" % escape(TITLES.get(table, table)),
                  r"{\footnotesize\begin{longtable}{llrrrrl}\toprule",
                  r"Block & Effect & Paper & Reproduced & Pairs & Seeds & Verdict\\\midrule\endhead"]
        for r in mine:
            lines.append(r"\rowcolor{%s}" % TEX_COLOURS[r.verdict] + " & ".join(
                [escape(r.block), escape(r.effect), escape(_num(r.paper)), escape(reproduced_text(r)),
                 str(r.pairs), str(r.seeds), escape(r.verdict)]) + r"\\")
        lines += [r"\bottomrule\end{longtable}}", ""]
    return "\n".join(lines)
