"""The report's extension-grid sections, in HTML and LaTeX (report.grids gives their contents):
per grid, its description, how many cells finished, and one effects table (axis, comparison,
pairs, effect ± spread over seeds, verdict). The grid's accuracy-versus-bytes figure joins the
report's figures (report.build)."""
from __future__ import annotations

from .grids import GridSection
from .templating import anchor, html_env, tex_env

INTRO = ("Each extension grid (config/extensions/<name>.yaml) in its own results folder. For every axis the grid "
         "varies, each of its values against the axis's first (the baseline): the mean over seeds of the mean "
         "final accuracy difference over pairs of cells that agree on every other axis, in points, ± its "
         "standard deviation over seeds. Only learned runs count; the verdict is the direction, or why there "
         "is none. A grid with a length ladder gives each effect at every length (mini epochs, each length its "
         "own runs and schedule), its verdict at the longest, and its trend between the two longest: settled "
         "(moved within the seed spread), shrinking or growing (with the factor per doubling of epochs), or "
         "crossing zero.")


def _num(x: float | None) -> str:
    return "–" if x is None else f"{x:+.2f}"


def _rows(section: GridSection) -> list[dict]:
    lengths = section.spec.lengths
    out = []
    for r in section.effects:
        at = {p.length: _num(p.mean) + ("" if p.spread is None else f" ± {p.spread:.2f}") for p in r.by_length}
        out.append(dict(axis=r.axis, compared=r.compared, pairs=r.pairs,
                        effect=_num(r.effect) + ("" if r.spread is None else f" ± {r.spread:.2f}"),
                        seeds=r.seeds, verdict=r.verdict, by_length=[at.get(n, "–") for n in lengths],
                        trend=(f"{r.trend}: {r.trend_words}" if r.trend_words else r.trend) or "–"))
    return out


def _context(sections: list[GridSection], profile_note: str) -> dict:
    return dict(intro=INTRO, profile_note=profile_note,
                grids=[dict(name=s.spec.name, id=anchor("grid", s.spec.name), description=s.spec.description,
                            cells=s.cells, finished=s.finished, rows=_rows(s), lengths=list(s.spec.lengths),
                            figure=anchor("fig", s.figure.name) if s.figure is not None else None)
                       for s in sections])


def grids_html(sections: list[GridSection], profile_note: str = "") -> str:
    return html_env().get_template("grids.html.j2").render(**_context(sections, profile_note))


def grids_tex(sections: list[GridSection], profile_note: str = "") -> str:
    return tex_env().get_template("grids.tex.j2").render(**_context(sections, profile_note))
