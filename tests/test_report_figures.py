"""Report figures (lpdl_core.report.figures*), drawn from the tidy files the DAG writes, and the data
behind Figures 2, 3, 5-7 (lpdl_core.pipeline.aggregation.paper_partitions, lpdl_core.training.cost)."""
from dataclasses import replace

import pandas as pd
import pytest
from report_inputs import CELLS, empty_data, report_data, write_run

from lpdl_core.pipeline.aggregation.paper_partitions import class_sizes, partition_figures_frame
from lpdl_core.report import figures as F
from lpdl_core.report.figures_runs import _coinciding
from lpdl_core.training.cost import FP_BITS, LP_BITS, measured_peak_memory_mb, training_cost

pytestmark = pytest.mark.usefixtures("one_thread")


def _results(root, profile="mini"):
    """A results folder with: Figure 1 runs for every norm but GroupNorm (BatchNorm with 2 seeds);
    Table 2's ResNet-20 / 8-node directed ring block without the DS cells at skew 0.4 and one
    diverged LP-DS cell; AG News at 0 %; ResNet-20 in Table 1."""
    root = root / profile
    for c in CELLS.values():
        if c.table == "fig1" and c.norm != "gn":
            for s in ((1234, 1235) if c.norm == "bn" else (1234,)):
                write_run(root, c.cell_id, s, 80.0 + s % 3)
        elif c.table == "table2" and c.block == "resnet20-dring8":
            if c.skew == 0.4 and c.algorithm == "ds":
                continue
            bad = (c.skew, c.compression, c.algorithm, c.precision) == (0.9, 99, "ds", "int8")
            # at 0 % compression DS and CHOCO give the same number (one run in the mini profile)
            algo_gap = 0 if c.compression == 0 else (1 if c.algorithm == "choco" else 0)
            acc = 88.0 - 5 * c.skew - (1 if c.precision == "int8" else 0) + algo_gap
            write_run(root, c.cell_id, 1234, None if bad else acc)
        elif (c.table == "table5" and c.dataset == "agnews" and c.compression == 0) or \
                (c.table == "table1" and c.model == "resnet20"):
            write_run(root, c.cell_id, 1234, 90.0 - 3 * c.skew)
    return report_data(root)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return _results(tmp_path_factory.mktemp("figs"))


@pytest.fixture(scope="module")
def figs(data):
    return {f.name: f for f in F.all_figures(data)}


def test_training_cost_counts_and_ratios():
    cost = training_cost()
    c = cost["counts"]
    assert c["params"] == 273_258
    assert abs(c["forward_macs_per_image"] - 40.8e6) / 40.8e6 < 0.05  # ResNet-20 ~40.8M MACs/image
    r = cost["ratios"]
    assert all(v > 1 for v in r.values())
    # linear-in-bits: all three GEMMs 32 -> 8 bits => 32/8; as implemented the weight-gradient
    # GEMM stays 32-bit => 3 / (8/32 + 8/32 + 32/32)
    assert r["compute_all8"] == pytest.approx(32 / 8)
    assert r["compute"] == pytest.approx(3 / (LP_BITS["weights"] / 32 + LP_BITS["layer_grads"] / 32 + 1))
    p, a = c["params"], c["activation_elems"]
    fp_bytes = (2 * p * FP_BITS["weights"] + a * FP_BITS["activations"]) / 8
    lp_bytes = (p * LP_BITS["weights"] + a * LP_BITS["activations"] + p * LP_BITS["weight_grads"]) / 8
    assert r["memory"] == pytest.approx(fp_bytes / lp_bytes)
    assert (cost["compute_ratio"], cost["memory_ratio"]) == (r["compute"], r["memory"])  # report.claims
    assert cost["model"] == "resnet20" and "b/32" in cost["assumption"]
    fp = cost["precisions"]["fp"]
    assert fp["memory_total_mb"] == pytest.approx(sum(fp["memory_mb"].values()))
    assert fp["compute_total_gmacs"] == pytest.approx(3 * c["forward_macs"] / 1e9)


def test_training_cost_bits_are_arguments():
    out = training_cost(batch=2, lp_bits=dict(weights=8, activations=8, layer_grads=8, weight_grads=16))
    assert out["ratios"]["compute"] == pytest.approx(3 / (0.25 + 0.25 + 0.5))
    assert out["counts"]["forward_macs"] == 2 * out["counts"]["forward_macs_per_image"]


def test_measured_peak_memory_is_none_without_cuda():
    assert measured_peak_memory_mb(device="cpu") is None


def test_partition_frame_holds_the_papers_panels():
    df = partition_figures_frame()
    assert list(df["figure"].unique()) == ["fig2-partition-cifar10", "fig5-partition-imagenette",
                                           "fig6-partition-agnews", "fig7-partition-sentlen"]
    cifar = df[df["figure"] == "fig2-partition-cifar10"]
    iid = cifar[cifar["skew"] == 0.0].pivot(index="node", columns="class", values="count")
    skewed = cifar[cifar["skew"] == 0.9].pivot(index="node", columns="class", values="count")
    assert iid.shape == (8, 10) and (iid.sum(axis=1) == 6250).all()
    assert ((iid - 625).abs() < 0.15 * 625).all().all()  # every node ~equal class counts
    assert (skewed.max(axis=1) / skewed.sum(axis=1)).min() > 0.4  # dominated by 1-2 classes
    sizes, assumed = class_sizes("sentlen")
    assert assumed and len(sizes) == 6 and sum(sizes) == 100_000 and max(sizes) - min(sizes) <= 1
    assert class_sizes("cifar10") == ((5000,) * 10, False)


def test_all_figures_render(figs):
    expected = {"fig1-norm-curves", "fig2-partition-cifar10", "fig5-partition-imagenette",
                "fig6-partition-agnews", "fig7-partition-sentlen", "fig3-cost", "acc-vs-skew-table2",
                "acc-vs-skew-table5", "bytes-vs-accuracy", "consensus-table2", "node-spread"}
    assert set(figs) == expected  # table3/table4 have no runs -> no figure
    for f in figs.values():
        assert f.png.startswith(b"\x89PNG") and f.pdf.startswith(b"%PDF")
        assert f.title and len(f.caption) > 50


def test_captions_name_what_is_missing_or_assumed(figs):
    assert "No runs for: GroupNorm" in figs["fig1-norm-curves"].caption
    assert "BatchNorm (2 seeds)" not in figs["fig1-norm-curves"].caption  # legend, not caption
    assert "assumed equal" in figs["fig7-partition-sentlen"].caption
    assert "1 diverged" in figs["acc-vs-skew-table2"].caption
    assert "no peak memory was measured" in figs["fig3-cost"].caption


def test_titles_and_captions_show_display_names_never_ids(figs):
    for f in figs.values():
        text = f.title + " " + f.caption
        for internal in ("table2", "table5", "resnet20", "dring8", "int8", "fp32", "cifar10"):
            assert internal not in text.replace("lpdl_core", ""), (f.name, internal)
    assert figs["acc-vs-skew-table2"].title == "Table 2: accuracy vs skew"


def test_coinciding_lines_are_dodged_and_said(figs, data):
    t2 = data.summary[data.summary["table"] == "table2"]
    panel = t2[(t2["block"] == "resnet20-dring8") & (t2["compression"] == 0)]
    from lpdl_core.report.figures_runs import _series
    assert _coinciding(_series(panel)) == 2  # DS = CHOCO, FP and LP
    assert "identical values" in figs["acc-vs-skew-table2"].caption
    assert "offset sideways" in figs["acc-vs-skew-table2"].caption


def test_mini_captions_say_mini(figs):
    for f in figs.values():
        assert "mini" in f.caption.lower(), f.name


def test_paper_profile_caption_has_no_mini_note(data):
    f = F.bytes_vs_accuracy(replace(data, profile="paper"))
    assert f is not None and "mini" not in f.caption.lower()


def test_none_without_runs():
    data = empty_data()
    assert F.fig1_norm_curves(data) is None
    assert all(F.accuracy_vs_skew(data, t) is None for t in ("table2", "table3", "table5"))
    assert F.bytes_vs_accuracy(data) is None
    assert F.consensus_curves(data) is None
    assert F.node_spread(data) is None
    assert F.fig3_cost(data) is None and F.partition_figures(data) == []  # no cost.json / partitions.csv


def test_a_broken_figure_is_reported_not_fatal(data):
    broken = replace(data, curves=pd.DataFrame({"cell_id": ["x"]}))  # no epoch / mean_acc columns
    errors: list[str] = []
    figs = F.all_figures(broken, errors=errors)
    assert errors and all(": " in e for e in errors)
    assert "fig3-cost" in {f.name for f in figs}  # the others are still drawn
    with pytest.raises(KeyError):  # no errors list: the first figure's own error
        F.all_figures(broken)


def test_figures_are_the_same_on_every_build(data):
    a, b = F.node_spread(data), F.node_spread(data)
    assert a.png == b.png and a.pdf == b.pdf


def test_fig3_caption_says_what_the_gpu_measured(data):
    cost = {**data.cost, "measured_peak_mb": {"fp32": 198.7, "int8": 132.5, "device": "NVIDIA H100"}}
    note = F.measured_memory_note(cost)
    assert "FP 198.7 MB" in note and "LP 132.5 MB" in note and "H100" in note
