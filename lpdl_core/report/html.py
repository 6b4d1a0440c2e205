"""One self-contained HTML report: inline CSS, figures as base64 data URIs, no scripts, no
external URLs.

`render_html(header, tables, claims, figures, effects, modes)` renders templates/report.html.j2
(Jinja2, autoescaped: every string from the data is escaped) with templates/report.css inlined.
The paper tables are pandas Styler output (report.table_style), the mini profile's effects view,
the paper text beside the official code and the merge step their own templates (report.effects_view,
report.modes_view, report.merge_view); all come into the page as Markup. Headings show titles ("Table 2"), never
ids; anchors are derived from the ids (table-table2, fig-<name>, effects-table2, modes-table2,
merge-table2).
"""
from __future__ import annotations

import base64

from .effects_view import effects_html
from .merge import MergeView
from .grids_view import grids_html
from .merge_view import merge_html
from .modes_view import ModesView, modes_html
from .model import DELTA_BANDS, LEARNED_MARGIN, Claim, Figure, Header, PaperTable, has_paper_part, verdict_kind
from .table_style import html_table
from .templating import Markup, heading, html_env

KIND_CLASS = {"holds": "v-holds", "fails": "v-fails", "noise": "v-noise", "moving": "v-moving", "partly": "v-partly",
              "na": "v-na"}


def render_html(header: Header, tables: list[PaperTable], claims: list[Claim],
                figures: list[Figure], effects: list | None = None, modes: ModesView | None = None,
                merge: MergeView | None = None, grids: tuple | None = None) -> str:
    """The whole report as one self-contained HTML5 document. effects: the mini profile's
    effects view (report.effects.EffectRow rows), shown before the tables; modes: the paper text
    beside the official code (report.modes_view), shown before the tables when given; merge: the
    merge step (report.merge), shown before the tables when given; grids: (the extension grids'
    sections, the profile note) (report.grids_view), shown before the tables when given."""
    titles = {t.name: heading(t.name, t.title) for t in tables}
    page = html_env().get_template("report.html.j2").render(
        header=header, claims=list(claims),
        verdict_class={c.verdict: KIND_CLASS[verdict_kind(c.verdict)] for c in claims},
        effects=Markup(effects_html(effects, titles)) if effects is not None else None,
        modes=Markup(modes_html(modes)) if modes is not None else None,
        modes_title=modes.title if modes is not None else "",
        merge=Markup(merge_html(merge)) if merge is not None else None,
        merge_title=merge.title if merge is not None else "",
        grids=Markup(grids_html(*grids)) if grids is not None else None,
        tables=[(t, Markup(html_table(t))) for t in tables],
        paper=has_paper_part(tables, grids),
        figures=[(f, base64.b64encode(f.png).decode("ascii")) for f in figures],
        bands=DELTA_BANDS, margin=LEARNED_MARGIN)
    return page if page.endswith("\n") else page + "\n"
