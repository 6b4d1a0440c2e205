"""Shared look of the report figures: one rcParams dict, a colour-blind-safe palette (Okabe-Ito),
FP solid vs LP dashed, DS vs CHOCO by colour; rendering to PNG (120 dpi) + PDF; captions."""
from __future__ import annotations

import io
import math

import matplotlib

matplotlib.use("Agg")  # before any pyplot import anywhere in this process's report code
from matplotlib.figure import Figure as MplFigure  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from .model import Figure, ReportData  # noqa: E402
from .tables import NORM_NAMES  # noqa: E402

DPI = 120
OKABE_ITO = ("#0072B2", "#D55E00", "#009E73", "#E69F00", "#CC79A7", "#56B4E9", "#F0E442", "#000000")
STYLE = {
    "font.size": 10, "axes.titlesize": 10, "axes.labelsize": 10, "legend.fontsize": 8,
    "xtick.labelsize": 9, "ytick.labelsize": 9, "axes.grid": True, "grid.alpha": 0.3,
    "grid.linestyle": "-", "axes.spines.top": False, "axes.spines.right": False,
    "axes.prop_cycle": matplotlib.cycler(color=OKABE_ITO), "lines.linewidth": 1.6,
    "lines.markersize": 5, "legend.frameon": False, "pdf.fonttype": 42,
}
ALGO_COLOR = {"ds": OKABE_ITO[0], "choco": OKABE_ITO[1], "dpsgd": OKABE_ITO[2], "none": OKABE_ITO[7]}
ALGO_NAME = {"ds": "DS", "choco": "CHOCO", "dpsgd": "D-PSGD", "none": "single node"}
PREC_STYLE = {"fp32": "-", "int8": "--"}
PREC_MARKER = {"fp32": "o", "int8": "s"}
PREC_NAME = {"fp32": "FP (32-bit)", "int8": "LP (8-bit)"}
COMP_COLOR = {0: OKABE_ITO[2], 90: OKABE_ITO[3], 99: OKABE_ITO[4]}
NORM_NAME = NORM_NAMES  # one set of display names for tables and figures
MINI_NOTE = ("Mini profile: stand-in data and small models, so these are not the paper's numbers "
             "(each run records its mapping).")


def style():
    """Context manager applying STYLE."""
    return matplotlib.rc_context(STYLE)


def new_figure(nrows: int = 1, ncols: int = 1, *, panel=(4.0, 3.0), **kw):
    """(figure, flat list of axes) without pyplot (no global state)."""
    fig = MplFigure(figsize=(panel[0] * ncols, panel[1] * nrows), layout="constrained")
    axes = fig.subplots(nrows, ncols, squeeze=False, **kw)
    return fig, [ax for row in axes for ax in row]


def grid(n: int, max_cols: int = 4) -> tuple[int, int]:
    """(rows, cols) for n panels."""
    cols = min(max_cols, n)
    return math.ceil(n / cols), cols


def render(fig: MplFigure, name: str, title: str, caption: str) -> Figure:
    """PNG at DPI + PDF, deterministic metadata."""
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


def seed_mean(values: list[list[tuple[float, float]]]) -> tuple[list[float], list[float]]:
    """Mean over seeds of (x, y) series, per x present in any seed (non-finite y dropped)."""
    acc: dict[float, list[float]] = {}
    for series in values:
        for x, y in series:
            if y is not None and math.isfinite(y):
                acc.setdefault(x, []).append(y)
    xs = sorted(acc)
    return xs, [sum(acc[x]) / len(acc[x]) for x in xs]
