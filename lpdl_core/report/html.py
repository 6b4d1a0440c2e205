"""One self-contained HTML report: inline CSS, figures as base64 data URIs, no scripts.

`render_html(header, tables, claims, figures)` returns the whole document as a string. Every
piece of text that comes from the data is escaped with `html.escape`; numbers use 2 decimals.
"""
from __future__ import annotations

import base64
import html
import re

from .model import DELTA_BANDS, Claim, Entry, Figure, Header, PaperTable, delta_class

_VERDICT_CLASS = {"holds": "v-holds", "does not hold": "v-fails", "within noise": "v-noise",
                  "not enough cells": "v-na"}

_CSS = """
body{font-family:-apple-system,"Segoe UI",Helvetica,Arial,sans-serif;margin:0 auto;
 max-width:1200px;padding:1rem 2rem;color:#222;line-height:1.4;background:#fff}
h1{margin-bottom:.3rem}h2{border-bottom:2px solid #ddd;padding-bottom:.2rem;margin-top:2rem}
.banner{padding:.8rem 1rem;border-radius:6px;font-size:1.1rem;margin:1rem 0;
 border:2px solid #1f5fa8;background:#e6f0fb}
.banner.mini{border-color:#b36b00;background:#fff3dc}
.banner strong{text-transform:uppercase}
dl.facts{display:grid;grid-template-columns:max-content auto;gap:.2rem 1rem;margin:1rem 0}
dl.facts dt{font-weight:600}dl.facts dd{margin:0}
.warnings{border-left:5px solid #c62828;background:#fdecea;padding:.5rem 1rem;margin:1rem 0}
.warnings li{color:#8e1c1c}
nav.toc{background:#f6f6f6;padding:.5rem 1rem;border-radius:6px}
nav.toc ul{margin:.2rem 0}
.claim{border:1px solid #ddd;border-radius:6px;padding:.6rem 1rem;margin:.7rem 0}
.claim .text{font-weight:600}.claim .evidence{margin-top:.3rem;color:#444}
.badge{display:inline-block;padding:.1rem .6rem;border-radius:1rem;color:#fff;
 font-size:.85rem;font-weight:700;margin-right:.5rem;white-space:nowrap}
.v-holds{background:#2e7d32}.v-fails{background:#c62828}.v-na{background:#757575}
.v-noise{background:#b36b00}
.table-wrap{overflow-x:auto;margin:.5rem 0 1.5rem}
table.paper{border-collapse:collapse;font-size:.85rem}
table.paper th,table.paper td{border:1px solid #ccc;padding:.25rem .45rem;vertical-align:top}
table.paper thead th{background:#eee}
table.paper th.axis{text-align:left;font-weight:normal;background:#fafafa;white-space:nowrap}
table.paper th.axis.same{border-top-color:transparent}
table.paper td{text-align:center;min-width:6.5rem}
td.close{background:#d8f0d8}td.near{background:#fff0c2}td.far{background:#f8d3d3}
td .rep{font-weight:700;white-space:nowrap}td .paper,td .delta{font-size:.78rem;color:#444}
td.diverged{background:repeating-linear-gradient(45deg,#f2e6f7,#f2e6f7 6px,#e9d6f2 6px,#e9d6f2 12px)}
td.diverged .div{color:#6a1b9a;font-weight:700;font-style:italic}
td.missing{color:#9e9e9e;font-style:italic;background:#f4f4f4}
td.absent{color:#9e9e9e}
td.mini{background:#fff}td.flat{background:#eceff1;color:#607d8b}
td .flat-note{font-size:.75rem;font-weight:700;color:#607d8b}
td .same{font-size:.7rem;color:#555;font-style:italic}
table.effects tr.same-sign td{background:#d8f0d8}table.effects tr.opposite-sign td{background:#f8d3d3}
table.effects tr.within-noise td{background:#fff0c2}table.effects tr.not-learned td{background:#eceff1}
table.effects tr.missing td{background:#f4f4f4;color:#9e9e9e;font-style:italic}
table.effects td.num{text-align:right;font-variant-numeric:tabular-nums}
table.effects td.blk{text-align:left;white-space:nowrap}table.effects td.verdict{font-weight:700}
.sw.flat{background:#eceff1}.sw.same-sign{background:#d8f0d8}.sw.opposite-sign{background:#f8d3d3}
.sw.noise{background:#fff0c2}
.marker{color:#6a1b9a;font-weight:700}
.caption{font-style:italic;margin:.3rem 0}.note{color:#555;font-size:.9rem}
.legend span.sw{display:inline-block;width:1.1rem;height:.9rem;border:1px solid #aaa;
 vertical-align:middle;margin:0 .3rem 0 1rem}
.sw.close{background:#d8f0d8}.sw.near{background:#fff0c2}.sw.far{background:#f8d3d3}
.sw.diverged{background:#e9d6f2}.sw.missing{background:#f4f4f4}
figure{margin:1.5rem 0;border:1px solid #eee;padding:.5rem}
figure img{max-width:100%;height:auto;display:block}
figcaption{color:#444;margin-top:.4rem}
"""


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _anchor(prefix: str, name: str) -> str:
    return prefix + "-" + re.sub(r"[^A-Za-z0-9_-]+", "-", name)


def _num(x: float) -> str:
    return f"{x:.2f}"


def _epochs(diverged_at: str) -> str:
    """'[3]' -> 'epoch 3'; '[3, 5]' -> 'epochs 3, 5'; '' -> ''."""
    inner = diverged_at.strip().strip("[]()").strip()
    if not inner:
        return ""
    parts = [p.strip() for p in inner.split(",") if p.strip()]
    return ("epochs " if len(parts) > 1 else "epoch ") + ", ".join(parts)


def _paper_delta(e: Entry) -> str:
    out = ""
    if e.paper is not None:
        out += f'<div class="paper">paper {_num(e.paper)}</div>'
    if e.delta is not None:
        out += f'<div class="delta">&Delta; {e.delta:+.2f}</div>'
    return out


def _reproduced(e: Entry) -> str:
    if e.reproduced is None:
        return '<span class="rep">&ndash;</span>'
    text = _num(e.reproduced)
    if e.seeds > 1 and e.std is not None:
        text += f" &plusmn; {_num(e.std)}"
    return f'<span class="rep">{text}</span>'


def _flags(e: Entry) -> tuple[str, str, str]:
    """(extra classes, body markup, title text) for the did-not-learn and same-run flags."""
    cls, body, title = "", "", ""
    if e.learned is False:
        cls = " flat"
        body += f'<div class="flat-note">did not learn (chance {_num(e.chance)})</div>'
        title += f"; within 5 points of chance ({_num(e.chance)})"
    if e.same_run_as:
        body += f'<div class="same" title="same run as {_e(e.same_run_as)}">= same run as {_e(e.same_run_as)}</div>'
        title += f"; computed once: same run as {e.same_run_as}"
    return cls, body, title


def _cell(e: Entry | None, compare: str = "absolute") -> str:
    if e is None:
        return '<td class="absent" title="no such cell in the paper">&mdash;</td>'
    cid = _e(e.cell_id)
    if e.status == "missing":  # the paper's number for reference; the reproduction is never filled
        paper = f'<div class="paper">paper {_num(e.paper)}</div>' if e.paper is not None else ""
        return f'<td class="missing" title="{cid}: no result"><div>missing</div>{paper}</td>'
    if e.status == "diverged":
        when = _epochs(e.diverged_at)
        label = f"diverged ({_e(when)})" if when else "diverged"
        paper = f'<div class="paper">paper {_num(e.paper)}</div>' if e.paper is not None else ""
        return f'<td class="diverged" title="{cid}"><div class="div">{label}</div>{paper}</td>'
    body = _reproduced(e)
    title = cid
    if e.status == "partly-diverged":
        when = _epochs(e.diverged_at)
        note = "some seeds diverged" + (f" ({when})" if when else "")
        title += f": {_e(note)}; mean of {e.seeds} ok seed(s)"
        body += f'<span class="marker" title="{_e(note)}">&dagger;</span>'
    flag_cls, flag_body, flag_title = _flags(e)
    if compare == "effects":  # absolute numbers cannot match: the paper's value for reference only
        paper = f'<div class="paper">paper {_num(e.paper)}</div>' if e.paper is not None else ""
        return (f'<td class="mini {_e(e.status)}{flag_cls}" title="{title}{_e(flag_title)}">{body}'
                f'{flag_body}{paper}</td>')
    cls = delta_class(e.delta)
    return (f'<td class="{cls} {_e(e.status)}{flag_cls}" title="{title}{_e(flag_title)}">{body}{flag_body}'
            f'{_paper_delta(e)}</td>')


def _table(t: PaperTable) -> str:
    head = "".join(f'<th scope="col">{_e(a)}</th>' for a in t.row_axes)
    head += "".join(f'<th scope="col">{_e(c)}</th>' for c in t.columns)
    body, prev = [], None
    for row in t.rows:
        cells = []
        for i, label in enumerate(row.labels):
            # blank a label when it and every label to its left equal the row above
            same = prev is not None and tuple(prev[: i + 1]) == tuple(row.labels[: i + 1])
            cells.append('<th scope="row" class="axis same"></th>' if same
                         else f'<th scope="row" class="axis">{_e(label)}</th>')
        cells += [_cell(e, t.compare) for e in row.entries]
        body.append("<tr>" + "".join(cells) + "</tr>")
        prev = row.labels
    note = f'<p class="note">{_e(t.note)}</p>' if t.note else ""
    return (f'<section id="{_anchor("table", t.name)}"><h3>{_e(t.name)}</h3>'
            f'<p class="caption">{_e(t.caption)}</p>{note}'
            f'<div class="table-wrap"><table class="paper"><thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div></section>')


def _legend(mini: bool = False) -> str:
    lo, hi = DELTA_BANDS
    common = ('<span class="sw diverged"></span>diverged (all seeds)'
              '<span class="sw missing"></span>missing (no result)'
              '<span class="sw flat"></span>did not learn (within 5 points of chance)<br>'
              '<span class="marker">&dagger;</span> some seeds diverged: mean of the others. '
              '&plusmn;: standard deviation over seeds. &mdash;: no such cell in the paper. '
              '"same run as": computed once for both cells.</p>')
    if mini:
        return ('<p class="legend"><strong>Legend</strong> (mini profile: stand-in data and models, so '
                'the reproduced accuracy is not comparable to the paper\'s; the paper\'s value is shown '
                'for reference and cells are not coloured by their difference. Compare effects in the '
                '<a href="#effects">effects view</a>):' + common)
    return ('<p class="legend"><strong>Legend</strong> (&Delta; = reproduced &minus; paper, '
            'accuracy points):'
            f'<span class="sw close"></span>|&Delta;| &lt; {lo:g} (close)'
            f'<span class="sw near"></span>{lo:g} &le; |&Delta;| &lt; {hi:g} (near)'
            f'<span class="sw far"></span>|&Delta;| &ge; {hi:g} (far)' + common)


def _claim(c: Claim) -> str:
    cls = _VERDICT_CLASS.get(c.verdict, "v-na")
    cells = f" ({c.cells} cell pairs)" if c.cells else ""
    return (f'<div class="claim" id="claim-{int(c.number)}"><div class="text">'
            f'<span class="badge {cls}">{_e(c.verdict)}</span>Claim {int(c.number)}: '
            f'{_e(c.text)}</div><div class="evidence">{_e(c.evidence)}{_e(cells)}</div></div>')


def _figure(f: Figure) -> str:
    data = base64.b64encode(f.png).decode("ascii")
    return (f'<figure id="{_anchor("fig", f.name)}"><h3>{_e(f.title)}</h3>'
            f'<img src="data:image/png;base64,{data}" alt="{_e(f.title)}">'
            f'<figcaption>{_e(f.caption)}</figcaption></figure>')


def _header(h: Header) -> str:
    if h.profile == "mini":
        banner = ('<div class="banner mini"><strong>Profile: mini</strong> &mdash; numbers come '
                  'from stand-in data and small models and are <strong>NOT a reproduction of '
                  f'the paper</strong>. {_e(h.profile_note)}</div>')
    else:
        banner = (f'<div class="banner"><strong>Profile: {_e(h.profile)}</strong> &mdash; '
                  f'{_e(h.profile_note)}</div>')
    facts = "".join(f"<dt>{_e(k)}</dt><dd>{_e(v)}</dd>" for k, v in h.facts)
    facts = f'<dl class="facts">{facts}</dl>' if facts else ""
    warns = "".join(f"<li>{_e(w)}</li>" for w in h.warnings)
    warns = (f'<div class="warnings" role="alert"><strong>Warnings</strong><ul>{warns}</ul></div>'
             if warns else "")
    return f"<header><h1>{_e(h.title)}</h1>{banner}{facts}{warns}</header>"


def _toc(tables: list[PaperTable], claims: list[Claim], figures: list[Figure], effects: bool = False) -> str:
    effects_li = '<li><a href="#effects">Effects: paper vs reproduction</a></li>' if effects else ""
    tl = "".join(f'<li><a href="#{_anchor("table", t.name)}">{_e(t.name)}</a></li>'
                 for t in tables)
    fl = "".join(f'<li><a href="#{_anchor("fig", f.name)}">{_e(f.title)}</a></li>'
                 for f in figures)
    return ('<nav class="toc" aria-label="Contents"><strong>Contents</strong><ul>'
            f'<li><a href="#claims">Claims check</a> ({len(claims)})</li>'
            f'{effects_li}'
            f'<li><a href="#tables">Tables</a><ul>{tl}</ul></li>'
            f'<li><a href="#figures">Figures</a><ul>{fl}</ul></li></ul></nav>')


def render_html(header: Header, tables: list[PaperTable], claims: list[Claim],
                figures: list[Figure], effects: list | None = None) -> str:
    """The whole report as one self-contained HTML5 document. effects: the mini profile's
    effects view (report.effects.EffectRow rows), shown before the tables."""
    from .effects_view import effects_html

    claims_html = "".join(_claim(c) for c in claims) or "<p>No claims checked.</p>"
    effects_part = effects_html(effects) if effects is not None else ""
    tables_html = "".join(_table(t) for t in tables) or "<p>No tables.</p>"
    figs_html = "".join(_figure(f) for f in figures) or "<p>No figures.</p>"
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
            '<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<title>{_e(header.title)}</title><style>{_CSS}</style></head><body>"
            f"{_header(header)}{_toc(tables, claims, figures, effects is not None)}"
            f'<main><section id="claims"><h2>Claims check</h2>{claims_html}</section>'
            f"{effects_part}"
            f'<section id="tables"><h2>Tables</h2>{_legend(header.profile == "mini")}{tables_html}</section>'
            f'<section id="figures"><h2>Figures</h2>{figs_html}</section></main>'
            "</body></html>\n")
