"""The report's figures: the paper's Figures 1, 2, 3, 5, 6, 7 and run-based extras.

Every function returns a `Figure` (PNG + PDF + caption) or None when it has no data; nothing is
ever plotted from invented values. Style and rendering: figures_style; run-based figures
(accuracy vs skew, bytes, consensus, per-node spread): figures_runs.
"""
from __future__ import annotations

import numpy as np

from ..partition import KNOWN_CLASS_SIZES, histograms, labels_from_class_sizes, skew_partition
from .figures_runs import accuracy_vs_skew, bytes_vs_accuracy, consensus_curves, node_spread
from .figures_style import (NORM_NAME, OKABE_ITO, PREC_STYLE, caption, epoch_axis, grid, new_figure,
                            render, seed_mean, style)
from .model import Figure, ReportData
from .tables import DATASET_NAMES

__all__ = ["fig1_norm_curves", "class_sizes", "partition_histograms", "partition_figures",
           "fig3_cost", "accuracy_vs_skew", "bytes_vs_accuracy", "consensus_curves", "node_spread",
           "all_figures", "PARTITION_FIGURES"]

PARTITION_SEED = 1234  # the official --seed
# (name, paper figure, dataset, ((nodes, skew), ...)): node counts as the paper's captions
# (Fig. 5: 4 and 8 nodes; Figs. 6-7: 4-node ring), plus the IID (skew 0) panel for reference.
PARTITION_FIGURES = (
    ("fig2-partition-cifar10", "Figure 2", "cifar10", ((8, 0.0), (8, 0.4), (8, 0.8), (8, 0.9))),
    ("fig5-partition-imagenette", "Figure 5", "imagenette", ((4, 0.0), (4, 0.6), (8, 0.0), (8, 0.6))),
    ("fig6-partition-agnews", "Figure 6", "agnews", ((4, 0.0), (4, 0.5), (4, 0.9))),
    ("fig7-partition-sentlen", "Figure 7", "sentlen", ((4, 0.0), (4, 0.5), (4, 0.9))),
)
SENTLEN_TRAIN, SENTLEN_CLASSES = 100_000, 6  # paper Sec. 4.2: 100,000 train samples, 6 bins
# Paul Tol's "muted" palette (colour-blind safe), one colour per class
CLASS_COLORS = ("#332288", "#88CCEE", "#44AA99", "#117733", "#999933", "#DDCC77", "#CC6677",
                "#882255", "#AA4499", "#DDDDDD")


def fig1_norm_curves(data: ReportData) -> Figure | None:
    """Validation error (100 - mean per-node accuracy) vs epoch, one line per normalization layer
    of the fig1 runs (mean over seeds)."""
    cells = [c for c in data.cells if c.table == "fig1" and data.runs.get(c.cell_id)]
    series = []
    for c in cells:
        runs = data.runs[c.cell_id]
        cfg = runs[0].metrics.get("config", {}).get("cell", {})
        norm, prec = cfg.get("norm", c.norm), cfg.get("precision", c.precision)
        xs, ys = seed_mean([[(r["epoch"], 100.0 - r["mean_acc"]) for r in run.curve
                             if r.get("mean_acc") is not None] for run in runs])
        if xs:
            series.append((norm, prec, xs, ys, len(runs), sum(r.status == "diverged" for r in runs)))
    if not series:
        return None
    ref = cells[0]
    missing = [c.norm for c in data.cells if c.table == "fig1" and not data.runs.get(c.cell_id)]
    with style():
        fig, (ax,) = new_figure(panel=(5.5, 3.6))
        for i, (norm, prec, xs, ys, n, div) in enumerate(series):
            label = NORM_NAME.get(norm, norm) + (f" ({n} seeds)" if n > 1 else "") + \
                (f", {div} diverged" if div else "")
            ax.plot(xs, ys, PREC_STYLE.get(prec, "-"), color=OKABE_ITO[i % len(OKABE_ITO)],
                    marker="o" if len(xs) <= 20 else None, label=label)
        epoch_axis(ax)
        ax.set_ylabel("validation error (%)")
        ax.set_title(f"{ref.model}, {ref.nodes}-node {ref.topology}, skew {ref.skew:g}")
        ax.legend()
        text = (f"Figure 1: validation error (100 minus the mean per-node test accuracy, %) per epoch, "
                f"one line per normalization layer ({ref.model}, {ref.nodes}-node {ref.topology}, "
                f"skew {ref.skew:g}, {ref.algorithm} at {ref.compression}% compression); mean over "
                f"seeds where several.")
        if missing:
            text += f" No runs for: {', '.join(NORM_NAME.get(m, m) for m in missing)}."
        return render(fig, "fig1-norm-curves", "Figure 1: normalization layers", caption(data, text))


def class_sizes(dataset: str) -> tuple[tuple[int, ...], bool]:
    """(train class sizes, assumed?) for a partition figure. Sentlen has no official sizes: 6
    equal classes (up to 1) summing to 100,000, assumed."""
    if dataset in KNOWN_CLASS_SIZES:
        return KNOWN_CLASS_SIZES[dataset], False
    if dataset == "sentlen":
        q, r = divmod(SENTLEN_TRAIN, SENTLEN_CLASSES)
        return tuple(q + (i < r) for i in range(SENTLEN_CLASSES)), True
    raise ValueError(f"no class sizes for {dataset!r}")


def partition_histograms(dataset: str, skews, nodes: int = 8,
                         seed: int = PARTITION_SEED) -> dict[float, np.ndarray]:
    """{skew: (nodes, classes) counts} of skew_partition on the dataset's class-sorted labels."""
    labels = labels_from_class_sizes(class_sizes(dataset)[0])
    return {float(s): histograms(skew_partition(labels, nodes, float(s), seed=seed), labels)
            for s in skews}


def _partition_figure(data, name, paper_fig, dataset, panels) -> Figure:
    sizes, assumed = class_sizes(dataset)
    hists = {(n, s): partition_histograms(dataset, [s], nodes=n)[s] for n, s in panels}
    nrows, ncols = grid(len(panels))
    with style():
        fig, axes = new_figure(nrows, ncols, panel=(3.4, 2.8))
        for ax, ((n, s), h) in zip(axes, hists.items()):
            bottom = np.zeros(n)
            for k in range(h.shape[1]):
                ax.bar(np.arange(n), h[:, k], bottom=bottom, width=0.8, label=f"class {k}",
                       color=CLASS_COLORS[k % len(CLASS_COLORS)], linewidth=0)
                bottom += h[:, k]
            ax.set_title(f"{n} nodes, skew {s:g}")
            ax.set_xticks(np.arange(n))
            ax.set_xlabel("node")
            ax.set_ylabel("training samples")
        for ax in axes[len(panels):]:
            ax.set_visible(False)
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside right center")
        unused = {f"{n} nodes, skew {s:g}": sum(sizes) - int(h.sum()) for (n, s), h in hists.items()}
        unused_txt = "; ".join(f"{k}: {v}" for k, v in unused.items() if v)
        text = (f"{paper_fig}: class distribution of {DATASET_NAMES[dataset]}'s training set across nodes "
                f"(stacked bars: samples of each class on each node), computed exactly with "
                f"lpdl_core.partition.skew_partition (the official skew scheme, seed {PARTITION_SEED}) "
                f"on class-sorted labels with {len(sizes)} classes, {sum(sizes):,} samples.")
        if assumed:
            text += (" Class sizes assumed equal (the paper says 'nearly equally'; no official sizes"
                     " exist), so the counts are illustrative.")
        if unused_txt:
            text += f" Samples left unused by the official integer truncation: {unused_txt}."
        title = f"{paper_fig}: {DATASET_NAMES[dataset]} partition"
        return render(fig, name, title, caption(data, text, runs=False))


def partition_figures(data: ReportData | None = None) -> list[Figure]:
    """Figures 2, 5, 6, 7: per-node class histograms of the paper's partitions (no runs needed)."""
    return [_partition_figure(data, *spec) for spec in PARTITION_FIGURES]


def fig3_cost(data: ReportData | None = None, cost: dict | None = None) -> Figure:
    """Figure 3: memory (stacked weights/activations/gradients) and compute (forward,
    backward-data, backward-weight) per node per iteration, FP vs LP, from training_cost()."""
    from .cost import training_cost  # imports torch and the models; only needed here

    cost = cost or training_cost()
    precs = [("fp", "FP 32-bit"), ("lp", "LP (32-bit\nweight grads)"), ("lp_all8", "LP all 8-bit")]
    parts = {"memory_mb": ("weights", "activations", "gradients"),
             "compute_gmacs": ("forward", "backward_data", "backward_weight")}
    c, r = cost["counts"], cost["ratios"]
    with style():
        fig, axes = new_figure(1, 2, panel=(4.2, 3.6))
        for ax, (key, comps), ylab in zip(axes, parts.items(),
                                          ("memory per iteration (MB)", "compute (32-bit-equiv. GMACs)")):
            x = np.arange(len(precs))
            bottom = np.zeros(len(precs))
            for j, comp in enumerate(comps):
                vals = np.array([cost["precisions"][p][key][comp] for p, _ in precs])
                bars = ax.bar(x, vals, bottom=bottom, width=0.6, color=OKABE_ITO[j], edgecolor="black",
                              linewidth=0.8, label=comp.replace("_", "-"))
                for b, (p, _) in zip(bars, precs):
                    b.set_linestyle("-" if p == "fp" else "--")
                bottom += vals
            for xi, tot in zip(x, bottom):
                ax.annotate(f"{tot:.2f}", (xi, tot), ha="center", va="bottom", fontsize=8)
            ax.set_xticks(x, [lab for _, lab in precs], fontsize=8)
            ax.set_ylabel(ylab)
            ax.legend(loc="upper right")
        axes[0].set_title("memory")
        axes[1].set_title("compute")
        lp = cost["precisions"]["lp"]["bits"]
        text = (f"Figure 3: memory and compute per node per training iteration of {c['model']} on "
                f"{c['input_size']}x{c['input_size']} inputs, batch {c['batch']}, counted on the real model "
                f"({c['forward_macs_per_image'] / 1e6:.2f}M forward MACs per image, {c['params']:,} "
                f"parameters, {c['activation_elems']:,} stored activation elements: inputs of every "
                f"conv/linear and normalization layer). Memory = weights + stored activations + weight "
                f"gradients at the given bits (optimizer state not counted). Compute = forward + "
                f"backward-data + backward-weight, each one forward's MACs, with a b-bit MAC costing "
                f"b/32 of a 32-bit one (the wider operand sets b). LP as implemented ({lp['weights']}-bit "
                f"weights, {lp['activations']}-bit activations and layer gradients, "
                f"{lp['weight_grads']}-bit weight gradients): compute {r['compute']:.2f}x and memory "
                f"{r['memory']:.2f}x lower than FP; with everything 8-bit (the assumption behind the "
                f"paper's ~4x) {r['compute_all8']:.2f}x and {r['memory_all8']:.2f}x. The paper reports ~4x "
                f"compute and 3.5x memory.")
        text += _measured_memory_note(c)
        return render(fig, "fig3-cost", "Figure 3: memory and compute, FP vs LP",
                      caption(data, text, runs=False))


def _measured_memory_note(counts: dict) -> str:
    """Measured peak CUDA memory of one forward + backward, where a GPU exists (else nothing)."""
    from .cost import measured_peak_memory_mb
    fp = measured_peak_memory_mb(counts["model"], "fp32", counts["batch"], dataset=counts["dataset"])
    if fp is None:
        return " No GPU was present when this report was built, so no peak memory was measured."
    lp = measured_peak_memory_mb(counts["model"], "int8", counts["batch"], dataset=counts["dataset"])
    return (f" Measured peak CUDA memory of one forward + backward on this machine: FP {fp:.1f} MB, "
            f"LP {lp:.1f} MB (8-bit is simulated in float32, so this compares which tensors the "
            f"layers keep, not 8-bit storage).")


def all_figures(data: ReportData, cost: dict | None = None,
                errors: list[str] | None = None) -> list[Figure]:
    """Every figure with data, in a fixed order. cost: a training_cost() result to reuse.

    errors: when given, a figure that raises is left out and "<figure>: <error>" is appended, so
    one broken plot cannot cost the user the whole report (the report lists the failures);
    without it, exceptions propagate.
    """
    builders = [("Figure 1", lambda: [fig1_norm_curves(data)]),
                ("Figures 2, 5-7", lambda: partition_figures(data)),
                ("Figure 3", lambda: [fig3_cost(data, cost)])]
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
