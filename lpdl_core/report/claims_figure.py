"""The claims figure: each claim's effect against the length of training (epochs on a log2 axis),
one line per claim with its seed spread as error bars and its bound as a dotted line of the same
colour. Drawn only where some claim has been measured at two lengths or more (`make
reproduce-claims`); it reads the claims the report judged, nothing else."""
from __future__ import annotations

from .figures_style import OKABE_ITO, new_figure, render, theme
from .model import Claim, Figure


def claims_figure(claims: list[Claim], mini_note: str = "") -> Figure | None:
    """The figure, or None where no claim has points at two lengths."""
    shown = [c for c in claims if len({p.length for p in c.points}) > 1]
    if not shown:
        return None
    with theme():
        fig, (ax,) = new_figure(panel=(6.4, 4.0))
        lengths = sorted({p.length for c in shown for p in c.points})
        for k, c in enumerate(shown):
            colour = OKABE_ITO[k % len(OKABE_ITO)]
            pts = sorted(c.points, key=lambda p: p.length)
            ax.errorbar([p.length for p in pts], [p.mean for p in pts], yerr=[p.spread or 0.0 for p in pts],
                        color=colour, marker="o", capsize=3, label=f"Claim {c.number}: {c.what} ({c.verdict})")
            bound = _bound(c.what)
            if bound is not None:
                ax.hlines(bound, lengths[0], lengths[-1], colors=colour, linestyles=":", linewidth=1.2)
        ax.set_xscale("log", base=2)
        ax.set_xticks(lengths, [str(L) for L in lengths])
        ax.minorticks_off()
        ax.set_xlabel("epochs of training (each length its own run and schedule)")
        ax.set_ylabel("effect (accuracy points)")
        ax.legend(fontsize=7, loc="best")
        seeds = max(p.seeds for c in shown for p in c.points)
        text = (f"Each claim's effect at every length (mean over up to {seeds} seeds; bars: seed spread), "
                f"over the pairs present at every length; dotted: the claim's bound, on whose side the paper "
                f"puts it. {mini_note}").strip()
        return render(fig, "claims-by-length", "The claims' effects against training length", text)


def _bound(what: str) -> float | None:
    """The bound of 'FP − LP < 1' and the like."""
    try:
        return float(what.rsplit(" ", 1)[1])
    except (IndexError, ValueError):
        return None
