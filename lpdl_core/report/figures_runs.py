"""Figures drawn from the tidy results: accuracy vs skew (tables/*.csv), bytes vs accuracy, consensus
distance per epoch (curves.csv), per-node accuracy spread (runs.csv). Each returns a Figure or None
(no data). Missing and diverged cells are left out, never interpolated: a line has a gap there.
"""
from __future__ import annotations

import contextlib
import itertools
import warnings

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.lines import Line2D

from ..pipeline.cells.shapes import TABLE_TITLES, block_title
from .figures_style import (
    ALGO_COLOR,
    COMP_COLOR,
    PREC_DASHES,
    PREC_MARKERS,
    algorithm_label,
    caption,
    epoch_axis,
    grid,
    hide_unused,
    new_figure,
    palette,
    pct,
    precision_label,
    render,
    theme,
)
from .model import Figure, ReportData

USABLE = ("ok", "partly-diverged", "partly-damaged")
DODGE = 0.25  # total horizontal spread of the series at one skew, as a fraction of the closest skew gap


def _usable(frame: pd.DataFrame) -> pd.Series:
    return frame["status"].isin(USABLE) & frame["reproduced"].notna()


def _status_counts(rows: pd.DataFrame) -> str:
    counts = rows["status"].value_counts()
    parts = [f"{int(counts[s])} {s}"
             for s in ("ok", "partly-diverged", "partly-damaged", "diverged", "damaged", "missing")
             if s in counts]
    return ", ".join(parts) + f" of {len(rows)} cells"


def _series(rows: pd.DataFrame) -> pd.DataFrame:
    """rows + 'algo' (hue) and 'prec' (dash style) display labels."""
    return rows.assign(algo=[algorithm_label(a, m) for a, m in zip(rows["algorithm"], rows["momentum"])],
                       prec=rows["precision"].map(precision_label))


def _coinciding(panel: pd.DataFrame) -> int:
    """How many pairs of series in a panel have identical values at every skew both have."""
    by = {k: g.set_index("skew")["reproduced"].dropna() for k, g in panel.groupby(["algo", "prec"])}
    n = 0
    for a, b in itertools.combinations(by.values(), 2):
        common = a.index.intersection(b.index)
        n += len(common) > 0 and bool(np.allclose(a[common], b[common], rtol=0, atol=1e-9))
    return n


def accuracy_vs_skew(data: ReportData, table: str = "table2") -> Figure | None:
    """Accuracy vs skew for one table: one panel per (block, nodes, compression), one line per
    (algorithm, precision) with bars of the std over seeds; the paper's values faint; the series
    dodged sideways so lines that coincide (DS and CHOCO are the same run at 0 % compression in the
    mini profile) stay visible."""
    rows = data.summary[data.summary["table"] == table]
    if not _usable(rows).any():
        return None
    rows = _series(rows)
    cells = {c.cell_id: c for c in data.cells}
    panels = [(k, g) for k, g in rows.groupby(["block", "nodes", "compression"], sort=False) if _usable(g).any()]
    skews = np.sort(rows["skew"].unique())
    gap = float(np.diff(skews).min()) if len(skews) > 1 else 1.0
    keys = sorted(rows[["algo", "prec"]].drop_duplicates().itertuples(index=False, name=None))
    offset = {k: (i - (len(keys) - 1) / 2) * DODGE * gap / max(1, len(keys) - 1) for i, k in enumerate(keys)}
    colors = palette(sorted({a for a, _ in keys}), ALGO_COLOR)
    nrows, ncols = grid(len(panels))
    coinciding = 0
    with theme():
        fig, axes = new_figure(nrows, ncols, panel=(3.7, 3.0))
        for ax, ((_block, _nodes, comp), g) in zip(axes, panels):
            coinciding += _coinciding(g[_usable(g)])
            for (algo, prec), line in g.groupby(["algo", "prec"]):
                line = line.set_index("skew").reindex(skews)
                ok = _usable(line.reset_index()).to_numpy()
                x = skews + offset[(algo, prec)]
                y = line["reproduced"].where(ok)
                style = dict(color=colors[algo], marker=PREC_MARKERS.get(prec, "o"))
                ax.errorbar(x, y, yerr=line["reproduced_std"].where(ok).fillna(0), capsize=2,
                            linestyle="--" if PREC_DASHES.get(prec) else "-", **style)
                ax.plot(x, line["paper"], linestyle=":", linewidth=1, mfc="none", alpha=0.45, **style)
                div = x[(line["status"] == "diverged").to_numpy()]
                ax.plot(div, [0.04] * len(div), "x", color=colors[algo], transform=ax.get_xaxis_transform())
            ax.set_title(f"{block_title(cells[g['cell_id'].iloc[0]])}\n{comp}% compression", fontsize=9)
            ax.set_xticks(skews, [f"{s:g}" for s in skews])
            ax.set_xlabel("degree of skew")
            ax.set_ylabel("test accuracy (%)")
        hide_unused(axes, len(panels))
        handles = [Line2D([], [], color=colors[a], linestyle="--" if PREC_DASHES.get(p) else "-",
                          marker=PREC_MARKERS.get(p, "o"), label=f"{a}, {p}") for a, p in keys]
        handles += [Line2D([], [], color="gray", linestyle=":", marker="o", mfc="none", alpha=0.5, label="paper"),
                    Line2D([], [], color="gray", marker="x", linestyle="", label="diverged")]
        fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4))
        title = TABLE_TITLES.get(table, table)
        text = (f"{title}: test accuracy (mean per-node accuracy, %, mean over finished seeds; bars: standard "
                f"deviation over seeds) vs degree of skew; one panel per block and compression, one line per "
                f"algorithm and precision (colour: algorithm; FP solid, LP dashed). Faint dotted hollow markers: "
                f"the paper's values; x at the panel bottom: diverged cells. The lines are offset sideways a "
                f"little so none hides another. Missing and diverged cells are left out, never interpolated "
                f"({_status_counts(rows)}).")
        if coinciding:
            text += (f" {coinciding} pair{'s' if coinciding > 1 else ''} of lines have identical values (cells "
                     f"computed by the same run); the offset keeps both visible.")
        return render(fig, f"acc-vs-skew-{table}", f"{title}: accuracy vs skew", caption(data, text))


def bytes_vs_accuracy(data: ReportData) -> Figure | None:
    """MB sent per node vs accuracy over every decentralized cell with a result."""
    s = data.summary
    rows = s[_usable(s) & (s["nodes"] > 1) & s["mb_per_node"].notna()]
    if rows.empty:
        return None
    rows = rows.assign(compression_label=rows["compression"].map(pct), prec=rows["precision"].map(precision_label))
    comps = [pct(c) for c in sorted(rows["compression"].unique())]
    with theme():
        fig, (ax,) = new_figure(panel=(5.6, 3.8))
        sns.scatterplot(rows, x="mb_per_node", y="reproduced", hue="compression_label", hue_order=comps,
                        style="prec", markers=PREC_MARKERS, palette=palette(comps, COMP_COLOR), edgecolor="black",
                        linewidth=0.4, s=32, ax=ax)
        mb = rows["mb_per_node"]
        if mb.min() > 0 and mb.max() / mb.min() > 10:
            ax.set_xscale("log")
        sns.move_legend(ax, "best", title=None)
        ax.set_xlabel("MB sent per node (whole run)")
        ax.set_ylabel("test accuracy (%)")
        tables = ", ".join(TABLE_TITLES.get(t, t) for t in sorted(rows["table"].unique()))
        text = (f"Communication vs accuracy: MB sent per node over the whole run (mean over finished seeds) "
                f"against the mean per-node test accuracy, for the {len(rows)} decentralized cells with a result "
                f"({tables}); colour: compression, marker: precision.")
        return render(fig, "bytes-vs-accuracy", "Bytes sent vs accuracy", caption(data, text))


def consensus_curves(data: ReportData, table: str = "table2") -> Figure | None:
    """Consensus distance per epoch: one panel per compression, one line per (skew, precision),
    median over cells of each cell's mean over seeds."""
    cells = {c.cell_id: c for c in data.cells if c.table == table and c.nodes > 1}
    cur = data.curves[data.curves["cell_id"].isin(cells) & data.curves["consensus_distance"].notna()]
    if cur.empty:
        return None
    per_cell = cur.groupby(["cell_id", "epoch"], as_index=False)["consensus_distance"].mean()
    per_cell["compression"] = [cells[c].compression for c in per_cell["cell_id"]]
    per_cell["skew"] = [f"skew {cells[c].skew:g}" for c in per_cell["cell_id"]]
    per_cell["precision"] = [precision_label(cells[c].precision) for c in per_cell["cell_id"]]
    comps = sorted(per_cell["compression"].unique())
    skews = sorted(per_cell["skew"].unique(), key=lambda s: float(s.split()[1]))
    many_epochs = per_cell["epoch"].nunique() > 20
    with theme():
        fig, axes = new_figure(1, len(comps), panel=(4.0, 3.2))
        for i, (ax, comp) in enumerate(zip(axes, comps)):
            part = per_cell[per_cell["compression"] == comp]
            sns.lineplot(part, x="epoch", y="consensus_distance", hue="skew", hue_order=skews, style="precision",
                         dashes=PREC_DASHES, markers=not many_epochs, estimator="median", errorbar=None,
                         palette="viridis", markersize=4, legend=i == len(comps) - 1, ax=ax)
            v = part["consensus_distance"]
            if v.min() > 0 and v.max() / v.min() >= 100:
                ax.set_yscale("log")
            ax.set_title(f"{comp}% compression")
            epoch_axis(ax)
            ax.set_ylabel("consensus distance")
        sns.move_legend(axes[len(comps) - 1], "center left", bbox_to_anchor=(1.02, 0.5), title=None)
        title = TABLE_TITLES.get(table, table)
        text = (f"Consensus distance sqrt(mean_i ||z_i - z_mean||^2) of the node models per epoch for the "
                f"{len(per_cell['cell_id'].unique())} {title} cells with runs; one panel per compression, one "
                f"line per skew (colour) and precision (FP solid, LP dashed), median over cells (blocks and "
                f"algorithms) of the per-cell mean over seeds. Log scale where a panel spans two decades or more.")
        return render(fig, f"consensus-{table}", f"{title}: consensus distance", caption(data, text))


@contextlib.contextmanager
def _fixed_jitter(seed: int = 0):
    """seaborn's strip jitter draws from numpy's global generator: seed it for the plot (the same
    picture on every build) and give the caller's state back afterwards."""
    state = np.random.get_state()
    np.random.seed(seed)
    try:
        yield
    finally:
        np.random.set_state(state)


def node_spread(data: ReportData) -> Figure | None:
    """Per-node accuracy spread (max - min of the final per-node accuracies) of every finished
    decentralized run, by skew and precision."""
    r = data.runs
    r = r[(r["status"] == "ok") & (r["nodes"] > 1) & r["node_acc_min"].notna() & r["node_acc_max"].notna()]
    if r.empty:
        return None
    df = pd.DataFrame({"spread": r["node_acc_max"] - r["node_acc_min"],
                       "skew": r["skew"].map(lambda s: f"{s:g}"), "prec": r["precision"].map(precision_label)})
    order = sorted(df["skew"].unique(), key=float)
    precs = sorted(df["prec"].unique())
    colors = palette(precs, {"FP (32-bit)": "#009E73", "LP (8-bit)": "#E69F00"})
    with theme():
        fig, (ax,) = new_figure(panel=(5.6, 3.6))
        with warnings.catch_warnings():  # seaborn 0.13 passes matplotlib 3.11's deprecated `vert`
            warnings.simplefilter("ignore", DeprecationWarning)
            sns.boxplot(df, x="skew", y="spread", hue="prec", order=order, hue_order=precs, palette=colors,
                        fill=False, showfliers=False, ax=ax)
        with _fixed_jitter():
            sns.stripplot(df, x="skew", y="spread", hue="prec", order=order, hue_order=precs, palette=colors,
                          dodge=True, size=3, alpha=0.7, jitter=0.15, legend=False, ax=ax)
        sns.move_legend(ax, "upper left", title=None)
        ax.set_xlabel("degree of skew")
        ax.set_ylabel("node accuracy spread (points)")
        text = (f"Per-node accuracy spread: max minus min of the final per-node test accuracies (percentage "
                f"points, after the final gossip rounds) of each of the {len(df)} finished runs of decentralized "
                f"cells, by degree of skew and precision (boxes: quartiles; dots: runs).")
        return render(fig, "node-spread", "Per-node accuracy spread", caption(data, text))
