"""The one look of every report figure: a seaborn theme (whitegrid, "paper" context) applied through
an rc context (no global state), a colour-blind-safe palette (Okabe-Ito) keyed by what a colour
means (algorithm, compression, precision), rendering to PNG (120 dpi) + PDF, and captions.

Display names come from lpdl_core.pipeline.cells.shapes, so a figure says "ResNet-20" and "LP (8-bit)" exactly
as the tables do, never an internal id.
"""
from __future__ import annotations

import io
import math

import matplotlib

matplotlib.use("Agg")  # before any pyplot import anywhere in this process's report code
import seaborn as sns  # noqa: E402
from matplotlib.figure import Figure as MplFigure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from ..pipeline.cells.shapes import ALGO_NAMES, PRECISION_NAMES  # noqa: E402
from .model import Figure, ReportData  # noqa: E402

DPI = 120
OKABE_ITO = ("#0072B2", "#D55E00", "#009E73", "#E69F00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
THEME = {
    **sns.axes_style("whitegrid"), **sns.plotting_context("paper", font_scale=1.15),
    "axes.spines.top": False, "axes.spines.right": False, "grid.alpha": 0.5,
    "axes.prop_cycle": matplotlib.cycler(color=OKABE_ITO), "lines.linewidth": 1.6,
    "lines.markersize": 5, "legend.frameon": False, "pdf.fonttype": 42, "savefig.facecolor": "white",
}
# one meaning per colour across every figure
ALGO_COLOR = {"DS": OKABE_ITO[0], "CHOCO": OKABE_ITO[1], "D-PSGD": OKABE_ITO[2], "Bagua-LP": OKABE_ITO[4],
              "single node": OKABE_ITO[7], "DS + QGM": OKABE_ITO[5], "CHOCO + QGM": OKABE_ITO[3]}
COMP_COLOR = {"0%": OKABE_ITO[2], "90%": OKABE_ITO[3], "99%": OKABE_ITO[4]}
PREC_DASHES = {"FP (32-bit)": "", "LP (8-bit)": (4, 2)}
PREC_MARKERS = {"FP (32-bit)": "o", "LP (8-bit)": "s"}
MINI_NOTE = ("Mini profile: stand-in data and small models, so these are not the paper's numbers "
             "(each run records its mapping).")


def theme():
    """Context manager applying THEME (seaborn's whitegrid + paper context, lpdl's palette)."""
    return matplotlib.rc_context(THEME)


def new_figure(nrows: int = 1, ncols: int = 1, *, panel=(4.0, 3.0), **kw):
    """(figure, flat list of axes) without pyplot (no global figure registry)."""
    fig = MplFigure(figsize=(panel[0] * ncols, panel[1] * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, [ax for row in axes for ax in row]


def grid(n: int, max_cols: int = 4) -> tuple[int, int]:
    """(rows, cols) for n panels."""
    cols = max(1, min(max_cols, n))
    return math.ceil(n / cols), cols


def hide_unused(axes, used: int) -> None:
    for ax in axes[used:]:
        ax.set_visible(False)


def render(fig: MplFigure, name: str, title: str, caption: str) -> Figure:
    """PNG at DPI + PDF, with metadata that does not change between builds."""
    png, pdf = io.BytesIO(), io.BytesIO()
    fig.savefig(png, format="png", dpi=DPI, metadata={"Software": None})
    fig.savefig(pdf, format="pdf", metadata={"CreationDate": None, "Creator": None, "Producer": None})
    return Figure(name=name, title=title, caption=caption, png=png.getvalue(), pdf=pdf.getvalue())


def caption(data: ReportData | None, text: str, *, runs: bool = True) -> str:
    """text + the mini-profile note; figures not built from runs say so instead."""
    if data is None or data.profile != "mini":
        return text
    if runs:
        return f"{text} {MINI_NOTE}"
    return f"{text} This figure does not use the runs, so the mini profile's stand-ins do not apply."


def epoch_axis(ax) -> None:
    """x label "epoch" with integer ticks."""
    ax.set_xlabel("epoch")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def algorithm_label(algorithm: str, momentum: str = "") -> str:
    """'DS', 'CHOCO + QGM', 'single node': the hue of a series."""
    base = ALGO_NAMES.get(algorithm, algorithm) or "single node"
    return f"{base} + QGM" if momentum == "qgm" else base


def precision_label(precision: str) -> str:
    return PRECISION_NAMES.get(precision, precision)


def palette(labels, colors: dict) -> dict:
    """{label: colour} for the labels present, falling back to the palette for unknown labels."""
    spare = iter(c for c in OKABE_ITO if c not in colors.values())
    return {lab: colors.get(lab) or next(spare, "gray") for lab in labels}


def pct(v: float) -> str:
    return f"{v:g}%"
