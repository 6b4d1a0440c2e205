"""The report's figures: the paper's Figures 1, 2, 3, 5, 6, 7 and run-based extras.

Each figure reads only the tidy files the DAG gives the report (ReportData: curves.csv, runs.csv,
tables/*.csv, cost.json, partitions.csv) and draws with seaborn on one theme (figures_style). Each
returns a `Figure` (PNG + PDF + caption) or None when it has no data; nothing is ever plotted from
invented values. Run-based figures (accuracy vs skew, bytes, consensus, per-node spread):
figures_runs.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import seaborn as sns
from matplotlib.patches import Patch

from ..pipeline.cells.shapes import ALGO_NAMES, DATASET_NAMES, MODEL_NAMES, NORM_NAMES, block_title
from .figures_runs import accuracy_vs_skew, bytes_vs_accuracy, consensus_curves, node_spread
from .figures_style import (
    OKABE_ITO,
    PREC_DASHES,
    caption,
    epoch_axis,
    grid,
    hide_unused,
    new_figure,
    precision_label,
    render,
    theme,
)
from .model import Figure, ReportData

__all__ = ["fig1_norm_curves", "partition_figures", "fig3_cost", "accuracy_vs_skew", "bytes_vs_accuracy",
           "consensus_curves", "node_spread", "all_figures"]

# Paul Tol's "muted" palette (colour-blind safe), one colour per class
CLASS_COLORS = ("#332288", "#88CCEE", "#44AA99", "#117733", "#999933", "#DDCC77", "#CC6677",
                "#882255", "#AA4499", "#DDDDDD")


def fig1_norm_curves(data: ReportData) -> Figure | None:
    """Validation error (100 - mean per-node accuracy) per epoch, one line per normalization layer
    of the Figure 1 runs (mean over seeds, band: std over seeds where several)."""
    cells = [c for c in data.cells if c.table == "fig1"]
    ids = {c.cell_id: c for c in cells}
    curves = data.curves[data.curves["cell_id"].isin(ids) & data.curves["mean_acc"].notna()]
    if curves.empty:
        return None
    df = curves.assign(error=100.0 - curves["mean_acc"],
                       norm=[NORM_NAMES.get(ids[c].norm, ids[c].norm) for c in curves["cell_id"]],
                       precision=[precision_label(ids[c].precision) for c in curves["cell_id"]])
    runs = data.runs[data.runs["cell_id"].isin(ids)]
    seeds = runs.groupby("cell_id")["seed"].nunique()
    diverged = runs[runs["status"] == "diverged"].groupby("cell_id").size()
    labels = {}
    for cid in df["cell_id"].unique():
        n, d = int(seeds.get(cid, 1)), int(diverged.get(cid, 0))
        labels[cid] = (NORM_NAMES.get(ids[cid].norm, ids[cid].norm) + (f" ({n} seeds)" if n > 1 else "")
                       + (f", {d} diverged" if d else ""))
    df["series"] = df["cell_id"].map(labels)
    ref = cells[0]
    missing = [NORM_NAMES.get(c.norm, c.norm) for c in cells if c.cell_id not in set(runs["cell_id"])]
    many_epochs = df["epoch"].nunique() > 20
    with theme():
        fig, (ax,) = new_figure(panel=(5.6, 3.6))
        mixed = df["precision"].nunique() > 1  # a dash style only when there is something to tell apart
        marks = dict(style="precision", dashes=PREC_DASHES, markers=not many_epochs) if mixed else \
            dict(marker=None if many_epochs else "o")
        sns.lineplot(df, x="epoch", y="error", hue="series", errorbar="sd",
                     palette=list(OKABE_ITO[:df["series"].nunique()]), ax=ax, **marks)
        epoch_axis(ax)
        ax.set_ylabel("validation error (%)")
        ax.set_title(block_title(ref))
        sns.move_legend(ax, "upper right", title=None)
        text = (f"Figure 1: validation error (100 minus the mean per-node test accuracy, %) per epoch, "
                f"one line per normalization layer ({block_title(ref)}, "
                f"{ALGO_NAMES.get(ref.algorithm, ref.algorithm)} at {ref.compression}% compression); mean over "
                f"seeds, band: standard deviation where several.")
        if missing:
            text += f" No runs for: {', '.join(missing)}."
        return render(fig, "fig1-norm-curves", "Figure 1: normalization layers", caption(data, text))


def _partition_figure(data: ReportData, name: str, df: pd.DataFrame) -> Figure:
    first = df.iloc[0]
    dataset, paper_fig = first["dataset"], first["paper_figure"]
    dname = DATASET_NAMES.get(dataset, dataset)
    classes = int(df["class"].max()) + 1
    colors = [CLASS_COLORS[k % len(CLASS_COLORS)] for k in range(classes)]
    panels = list(df.groupby(["nodes", "skew"], sort=False))
    nrows, ncols = grid(len(panels))
    with theme():
        fig, axes = new_figure(nrows, ncols, panel=(3.4, 2.8))
        for ax, ((n, s), p) in zip(axes, panels):
            sns.histplot(p, x="node", weights="count", hue="class", multiple="stack", discrete=True, shrink=0.8,
                         palette=colors, linewidth=0, legend=False, ax=ax)
            ax.set_title(f"{n} nodes, skew {s:g}")
            ax.set_xticks(np.arange(n))
            ax.set_xlabel("node")
            ax.set_ylabel("training samples")
        hide_unused(axes, len(panels))
        fig.legend(handles=[Patch(color=colors[k], label=f"class {k}") for k in range(classes)],
                   loc="outside right center")
        total = int(first["dataset_samples"])
        unused = {f"{n} nodes, skew {s:g}": total - int(p["count"].sum()) for (n, s), p in panels}
        unused_txt = "; ".join(f"{k}: {v}" for k, v in unused.items() if v)
        text = (f"{paper_fig}: class distribution of {dname}'s training set across nodes (stacked bars: "
                f"samples of each class on each node), computed exactly with the official skew scheme "
                f"(lpdl_core.decentral.partition.skew_partition, seed {int(first['seed'])}) on class-sorted "
                "labels with "
                f"{classes} classes, {total:,} samples.")
        if bool(first["sizes_assumed"]):
            text += (" Class sizes assumed equal (the paper says 'nearly equally'; no official sizes"
                     " exist), so the counts are illustrative.")
        if unused_txt:
            text += f" Samples left unused by the official integer truncation: {unused_txt}."
        return render(fig, name, f"{paper_fig}: {dname} partition", caption(data, text, runs=False))


def partition_figures(data: ReportData) -> list[Figure]:
    """Figures 2, 5, 6, 7: per-node class histograms from partitions.csv (none when not given)."""
    if data.partitions is None or data.partitions.empty:
        return []
    return [_partition_figure(data, name, df) for name, df in data.partitions.groupby("figure", sort=False)]


PRECISIONS_FIG3 = (("fp", "FP 32-bit"), ("lp", "LP (32-bit\nweight grads)"), ("lp_all8", "LP all 8-bit"))
PARTS_FIG3 = {"memory_mb": ("weights", "activations", "gradients"),
              "compute_gmacs": ("forward", "backward_data", "backward_weight")}


def fig3_cost(data: ReportData) -> Figure | None:
    """Figure 3: memory (weights/activations/gradients) and compute (forward, backward-data,
    backward-weight) per node per iteration, FP vs LP, from cost.json (None when not given)."""
    cost = data.cost
    if not cost:
        return None
    c, r = cost["counts"], cost["ratios"]
    with theme():
        fig, axes = new_figure(1, 2, panel=(4.2, 3.6))
        for ax, (key, comps), ylab in zip(axes, PARTS_FIG3.items(),
                                          ("memory per iteration (MB)", "compute (32-bit-equiv. GMACs)")):
            frame = pd.DataFrame({comp.replace("_", "-"): [cost["precisions"][p][key][comp] for p, _ in PRECISIONS_FIG3]
                                  for comp in comps}, index=[lab for _, lab in PRECISIONS_FIG3])
            frame.plot.bar(stacked=True, ax=ax, width=0.6, color=OKABE_ITO[:len(comps)], edgecolor="black",
                           linewidth=0.8, rot=0)
            for xi, tot in enumerate(frame.sum(axis=1)):
                ax.annotate(f"{tot:.2f}", (xi, tot), ha="center", va="bottom", fontsize=8)
            ax.tick_params(axis="x", labelsize=8)
            ax.set_ylabel(ylab)
            ax.legend(loc="upper right")
        axes[0].set_title("memory")
        axes[1].set_title("compute")
        lp = cost["precisions"]["lp"]["bits"]
        text = (f"Figure 3: memory and compute per node per training iteration of "
                f"{MODEL_NAMES.get(c['model'], c['model'])} on {c['input_size']}x{c['input_size']} inputs, batch "
                f"{c['batch']}, counted on the real model ({c['forward_macs_per_image'] / 1e6:.2f}M forward MACs "
                f"per image, {c['params']:,} parameters, {c['activation_elems']:,} stored activation elements: "
                f"inputs of every conv/linear and normalization layer). Memory = weights + stored activations "
                f"+ weight gradients at the given bits (optimizer state not counted). Compute = forward + "
                f"backward-data + backward-weight, each one forward's MACs, with a b-bit MAC costing b/32 of a "
                f"32-bit one (the wider operand sets b). LP as implemented ({lp['weights']}-bit weights, "
                f"{lp['activations']}-bit activations and layer gradients, {lp['weight_grads']}-bit weight "
                f"gradients): compute {r['compute']:.2f}x and memory {r['memory']:.2f}x lower than FP; with "
                f"everything 8-bit (the assumption behind the paper's ~4x) {r['compute_all8']:.2f}x and "
                f"{r['memory_all8']:.2f}x. The paper reports ~4x compute and 3.5x memory.")
        text += measured_memory_note(cost)
        return render(fig, "fig3-cost", "Figure 3: memory and compute, FP vs LP", caption(data, text, runs=False))


def measured_memory_note(cost: dict) -> str:
    """The cost rule's measured peak CUDA memory, where it ran on a GPU (else says none was measured)."""
    peak = cost.get("measured_peak_mb")
    if not peak:
        return " The cost rule ran without a GPU, so no peak memory was measured."
    return (f" Measured peak CUDA memory of one forward + backward ({peak.get('device', 'GPU')}): FP "
            f"{peak['fp32']:.1f} MB, LP {peak['int8']:.1f} MB (8-bit is simulated in float32, so this compares "
            f"which tensors the layers keep, not 8-bit storage).")


def all_figures(data: ReportData, errors: list[str] | None = None) -> list[Figure]:
    """Every figure with data, in a fixed order.

    errors: when given, a figure that raises is left out and "<figure>: <error>" is appended, so
    one broken plot cannot cost the user the whole report (the report lists the failures);
    without it, exceptions propagate.
    """
    builders = [("Figure 1", lambda: [fig1_norm_curves(data)]),
                ("Figures 2, 5-7", lambda: partition_figures(data)),
                ("Figure 3", lambda: [fig3_cost(data)])]
    builders += [(f"accuracy vs skew ({t})", lambda t=t: [accuracy_vs_skew(data, t)])
                 for t in ("table2", "table3", "table4", "table5")]
    builders += [("bytes vs accuracy", lambda: [bytes_vs_accuracy(data)]),
                 ("consensus distance", lambda: [consensus_curves(data)]),
                 ("per-node spread", lambda: [node_spread(data)])]
    figs: list[Figure | None] = []
    for name, build in builders:
        if errors is None:
            figs += build()
            continue
        try:
            figs += build()
        except Exception as e:  # noqa: BLE001  (reported in the report, not swallowed)
            errors.append(f"{name}: {type(e).__name__}: {e}")
    return [f for f in figs if f is not None]

