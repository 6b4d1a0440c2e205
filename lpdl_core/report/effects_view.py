"""The mini profile's effects view, in HTML and LaTeX: for every block, each of the paper's
effects (FP - LP, CHOCO - DS, the skew drop, 8 vs 16 nodes, 0 % vs compressed) beside the
reproduced one, with its spread over seeds and a verdict (report.effects). Rows are coloured by
verdict, never by the difference to the paper's absolute accuracy."""
from __future__ import annotations

import html

from .effects import EffectRow

VERDICT_CSS = {"agrees": "agrees", "opposite": "opposite", "within noise": "within-noise",
               "not learned": "not-learned", "missing": "missing"}
TEX_COLOURS = {"agrees": "green!15", "opposite": "red!15", "within noise": "yellow!25",
               "not learned": "gray!15", "missing": "gray!15"}
INTRO = ("On stand-in data and models the paper's absolute accuracies cannot be matched, but its "
         "effects can be compared. Each row is one effect in one block: the paper's effect (mean of "
         "the differences of its numbers over the block's pairs of cells that differ in that axis only), "
         "the reproduced one (mean over seeds of the same mean difference; ± its standard deviation over "
         "seeds), and a verdict: agrees (same sign), opposite, within noise (the seed spread is at "
         "least as large as the reproduced effect), not learned (no pair of cells that learned: a cell "
         "within 5 points of chance is left out), missing. Points are accuracy points.")


def _num(x: float | None, signed: bool = True) -> str:
    return "–" if x is None else (f"{x:+.2f}" if signed else f"{x:.2f}")


def _reproduced(r: EffectRow) -> str:
    if r.reproduced is None:
        return "–"
    return _num(r.reproduced) + (f" ± {r.spread:.2f}" if r.spread is not None else "")


def effects_html(rows: list[EffectRow]) -> str:
    e = lambda t: html.escape(str(t), quote=True)  # noqa: E731
    body = "".join(
        f'<tr><td>{e(r.table)}</td><td>{e(r.block)}</td><td>{e(r.effect)}</td>'
        f'<td class="num">{e(_num(r.paper))}</td><td class="num">{e(_reproduced(r))}</td>'
        f'<td class="num">{r.pairs}</td><td class="num">{r.seeds}</td>'
        f'<td class="{VERDICT_CSS[r.verdict]}">{e(r.verdict)}</td></tr>' for r in rows)
    counts = ", ".join(f"{sum(r.verdict == v for r in rows)} {v}" for v in VERDICT_CSS
                       if any(r.verdict == v for r in rows))
    return ('<section id="effects"><h2>Effects: paper vs reproduction</h2>'
            f'<p class="note">{e(INTRO)}</p><p><strong>{e(counts)}</strong></p>'
            '<div class="table-wrap"><table class="paper effects"><thead><tr><th>Table</th><th>Block</th>'
            '<th>Effect</th><th>Paper (points)</th><th>Reproduced (points)</th><th>Pairs</th>'
            f'<th>Seeds</th><th>Verdict</th></tr></thead><tbody>{body}</tbody></table></div></section>')


def effects_tex(rows: list[EffectRow], escape) -> str:
    """A longtable of the effects (escape: latex.tex_escape)."""
    lines = [r"\section*{Effects: paper vs reproduction}", escape(INTRO), "",
             r"{\footnotesize\begin{longtable}{llllrrrl}\toprule",
             r"Table & Block & Effect & Paper & Reproduced & Pairs & Seeds & Verdict\\\midrule\endhead"]
    for r in rows:
        colour = TEX_COLOURS[r.verdict]
        lines.append(" & ".join([escape(r.table), escape(r.block), escape(r.effect), escape(_num(r.paper)),
                                 escape(_reproduced(r)), str(r.pairs), str(r.seeds),
                                 rf"\cellcolor{{{colour}}}{escape(r.verdict)}"]) + r"\\")
    lines += [r"\bottomrule\end{longtable}}", ""]
    return "\n".join(lines)
