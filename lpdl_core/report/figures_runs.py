"""Figures drawn from the runs and aggregate rows: accuracy vs skew, bytes vs accuracy, consensus
distance over epochs, per-node accuracy spread. Each returns a Figure or None (no data)."""
from __future__ import annotations

import math
import statistics

import matplotlib
import numpy as np
from matplotlib.lines import Line2D

from .figures_style import (ALGO_COLOR, ALGO_NAME, COMP_COLOR, OKABE_ITO, PREC_MARKER, PREC_NAME,
                            PREC_STYLE, caption, epoch_axis, grid, new_figure, render, seed_mean, style)
from .model import Figure, ReportData

USABLE = ("ok", "partly-diverged")


def _usable(row: dict) -> bool:
    return row.get("status") in USABLE and row.get("reproduced") is not None


def _status_counts(rows: list[dict]) -> str:
    counts = {s: sum(r.get("status") == s for r in rows)
              for s in ("ok", "partly-diverged", "diverged", "missing")}
    return ", ".join(f"{v} {k}" for k, v in counts.items() if v) + f" of {len(rows)} cells"


def _nan(v) -> float:
    return float("nan") if v is None else float(v)


def accuracy_vs_skew(data: ReportData, table: str = "table2") -> Figure | None:
    """Accuracy vs skew for one table's aggregate rows: one panel per (block, nodes, compression),
    one line per (algorithm, precision), paper values faint; missing points left out."""
    rows = data.rows.get(table, [])
    if not any(_usable(r) for r in rows):
        return None
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["block"], r["nodes"], r["compression"]), []).append(r)
    groups = {k: g for k, g in groups.items() if any(_usable(r) for r in g)}
    nrows, ncols = grid(len(groups))
    with style():
        fig, axes = new_figure(nrows, ncols, panel=(3.6, 2.9))
        for ax, ((block, nodes, comp), g) in zip(axes, groups.items()):
            skews = sorted({r["skew"] for r in g})
            lines: dict[tuple, dict] = {}
            for r in g:
                lines.setdefault((r["algorithm"], r["precision"]), {})[r["skew"]] = r
            for (algo, prec), by_skew in lines.items():
                col = ALGO_COLOR.get(algo, "gray")
                ls, mk = PREC_STYLE.get(prec, "-"), PREC_MARKER.get(prec, "o")
                pts = [by_skew.get(s) for s in skews]
                ys = [_nan(p["reproduced"]) if p and _usable(p) else math.nan for p in pts]
                err = [_nan(p.get("reproduced_std")) if p and _usable(p) else math.nan for p in pts]
                ax.errorbar(skews, ys, yerr=np.nan_to_num(err), color=col, linestyle=ls, marker=mk,
                            capsize=2)
                ax.plot(skews, [_nan(p.get("paper")) if p else math.nan for p in pts], color=col,
                        linestyle=":", linewidth=1, marker=mk, mfc="none", alpha=0.4)
                div = [s for s, p in zip(skews, pts) if p and p.get("status") == "diverged"]
                ax.plot(div, [0.04] * len(div), "x", color=col, transform=ax.get_xaxis_transform())
            ax.set_title(f"{block}, {nodes} nodes, {comp}% compr.")
            ax.set_xticks(skews, [f"{s:g}" for s in skews])
            ax.set_xlabel("degree of skew")
            ax.set_ylabel("test accuracy (%)")
        for ax in axes[len(groups):]:
            ax.set_visible(False)
        combos = sorted({(r["algorithm"], r["precision"]) for r in rows})
        handles = [Line2D([], [], color=ALGO_COLOR.get(a, "gray"), linestyle=PREC_STYLE.get(p, "-"),
                          marker=PREC_MARKER.get(p, "o"),
                          label=f"{ALGO_NAME.get(a, a)} {PREC_NAME.get(p, p)}") for a, p in combos]
        handles += [Line2D([], [], color="gray", linestyle=":", marker="o", mfc="none", alpha=0.5,
                           label="paper"),
                    Line2D([], [], color="gray", marker="x", linestyle="", label="diverged")]
        fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4))
        text = (f"{table}: test accuracy (mean per-node accuracy, %, mean over finished seeds; bars: std "
                f"over seeds) vs degree of skew; one panel per block, nodes and compression, one line per "
                f"algorithm and precision (colour: algorithm; FP solid, LP dashed). Faint dotted hollow "
                f"markers: the paper's values; x at the panel bottom: diverged cells. Missing and diverged "
                f"cells are left out, never interpolated ({_status_counts(rows)}).")
        return render(fig, f"acc-vs-skew-{table}", f"{table}: accuracy vs skew", caption(data, text))


def bytes_vs_accuracy(data: ReportData) -> Figure | None:
    """MB sent per node vs accuracy over every decentralized cell with a result."""
    rows = [r for t in data.rows.values() for r in t
            if _usable(r) and (r.get("nodes") or 0) > 1 and r.get("mb_per_node") is not None]
    if not rows:
        return None
    with style():
        fig, (ax,) = new_figure(panel=(5.5, 3.8))
        for r in rows:
            ax.scatter(r["mb_per_node"], r["reproduced"], color=COMP_COLOR.get(r["compression"], "gray"),
                       marker=PREC_MARKER.get(r["precision"], "o"), edgecolors="black", linewidths=0.4, s=30)
        mb = [r["mb_per_node"] for r in rows]
        if min(mb) > 0 and max(mb) / min(mb) > 10:
            ax.set_xscale("log")
        comps = sorted({r["compression"] for r in rows})
        precs = sorted({r["precision"] for r in rows})
        handles = [Line2D([], [], color=COMP_COLOR.get(c, "gray"), marker="o", linestyle="",
                          label=f"{c}% compression") for c in comps]
        handles += [Line2D([], [], color="gray", marker=PREC_MARKER.get(p, "o"), linestyle="",
                           label=PREC_NAME.get(p, p)) for p in precs]
        ax.legend(handles=handles)
        ax.set_xlabel("MB sent per node (whole run)")
        ax.set_ylabel("test accuracy (%)")
        tables = sorted({r["table"] for r in rows})
        text = (f"Communication vs accuracy: MB sent per node over the whole run (mean over finished "
                f"seeds) against the mean per-node test accuracy, for the {len(rows)} decentralized cells "
                f"with a result ({', '.join(tables)}); colour: compression, marker: precision.")
        return render(fig, "bytes-vs-accuracy", "Bytes sent vs accuracy", caption(data, text))


def consensus_curves(data: ReportData, table: str = "table2") -> Figure | None:
    """Consensus distance per epoch: one panel per compression, one line per (skew, precision),
    median over cells (after averaging seeds)."""
    per: dict[int, dict[tuple, list[tuple[list, list]]]] = {}
    for c in data.cells:
        runs = data.runs.get(c.cell_id)
        if c.table != table or c.nodes < 2 or not runs:
            continue
        xs, ys = seed_mean([[(r["epoch"], r.get("consensus_distance")) for r in run.curve] for run in runs])
        if xs:
            per.setdefault(c.compression, {}).setdefault((c.skew, c.precision), []).append((xs, ys))
    if not per:
        return None
    skews = sorted({s for g in per.values() for s, _ in g})
    cmap = matplotlib.colormaps["viridis"]
    skew_col = {s: cmap(0.85 * i / max(1, len(skews) - 1)) for i, s in enumerate(skews)}
    with style():
        fig, axes = new_figure(1, len(per), panel=(4.0, 3.2))
        for ax, comp in zip(axes, sorted(per)):
            allv = []
            for (skew, prec), cells in sorted(per[comp].items()):
                by_epoch: dict[float, list[float]] = {}
                for xs, ys in cells:
                    for x, y in zip(xs, ys):
                        by_epoch.setdefault(x, []).append(y)
                ex = sorted(by_epoch)
                med = [statistics.median(by_epoch[e]) for e in ex]
                allv += med
                ax.plot(ex, med, color=skew_col[skew], linestyle=PREC_STYLE.get(prec, "-"),
                        marker="o" if len(ex) <= 20 else None, markersize=3)
            if allv and min(allv) > 0 and max(allv) / min(allv) >= 100:
                ax.set_yscale("log")
            ax.set_title(f"{comp}% compression")
            epoch_axis(ax)
            ax.set_ylabel("consensus distance")
        handles = [Line2D([], [], color=skew_col[s], label=f"skew {s:g}") for s in skews]
        precs = sorted({p for g in per.values() for _, p in g})
        handles += [Line2D([], [], color="gray", linestyle=PREC_STYLE.get(p, "-"), label=PREC_NAME.get(p, p))
                    for p in precs]
        fig.legend(handles=handles, loc="outside right center")
        n = sum(len(v) for g in per.values() for v in g.values())
        text = (f"Consensus distance sqrt(mean_i ||z_i - z_mean||^2) of the node models per epoch for "
                f"the {n} {table} cells with runs; one panel per compression, one line per skew "
                f"(colour) and precision (FP solid, LP dashed), median over cells (blocks and algorithms) "
                f"of the per-cell mean over seeds. Log scale where a panel spans two decades or more.")
        return render(fig, f"consensus-{table}", f"{table}: consensus distance", caption(data, text))


def node_spread(data: ReportData) -> Figure | None:
    """Per-node accuracy spread (max - min of final node_acc) of every finished decentralized run,
    by skew and precision."""
    groups: dict[tuple[float, str], list[float]] = {}
    for c in data.cells:
        if c.nodes < 2:
            continue
        for run in data.runs.get(c.cell_id, ()):
            acc = [a for a in run.metrics.get("final", {}).get("node_acc") or () if a is not None]
            if run.status == "ok" and len(acc) >= 2:
                groups.setdefault((c.skew, c.precision), []).append(max(acc) - min(acc))
    if not groups:
        return None
    skews = sorted({s for s, _ in groups})
    precs = sorted({p for _, p in groups})
    width = 0.8 / len(precs)
    rng = np.random.default_rng(0)  # jitter of the strip points only
    with style():
        fig, (ax,) = new_figure(panel=(5.5, 3.6))
        for j, p in enumerate(precs):
            col = OKABE_ITO[2 + j]
            for i, s in enumerate(skews):
                vals = groups.get((s, p))
                if not vals:
                    continue
                pos = i + (j - (len(precs) - 1) / 2) * width
                bp = ax.boxplot([vals], positions=[pos], widths=width * 0.8, showfliers=False,
                                patch_artist=True, manage_ticks=False)
                ls = PREC_STYLE.get(p, "-")
                for box in bp["boxes"]:
                    box.set(facecolor="none", edgecolor=col, linestyle=ls)
                for part in ("medians", "whiskers", "caps"):
                    for line in bp[part]:
                        line.set(color=col, linestyle=ls if part == "whiskers" else "-")
                ax.scatter(pos + rng.uniform(-width / 4, width / 4, len(vals)), vals, color=col, s=10,
                           marker=PREC_MARKER.get(p, "o"), alpha=0.7)
        ax.set_xticks(range(len(skews)), [f"{s:g}" for s in skews])
        ax.set_xlabel("degree of skew")
        ax.set_ylabel("node accuracy spread (points)")
        ax.legend(handles=[Line2D([], [], color=OKABE_ITO[2 + j], linestyle=PREC_STYLE.get(p, "-"),
                                  marker=PREC_MARKER.get(p, "o"), label=PREC_NAME.get(p, p))
                           for j, p in enumerate(precs)])
        n = sum(len(v) for v in groups.values())
        text = (f"Per-node accuracy spread: max minus min of the final per-node test accuracies "
                f"(percentage points, after the final gossip rounds) of each of the {n} finished runs of "
                f"decentralized cells, by degree of skew and precision (boxes: quartiles; dots: runs).")
        return render(fig, "node-spread", "Per-node accuracy spread", caption(data, text))
