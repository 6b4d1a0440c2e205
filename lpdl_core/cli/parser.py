"""`build_parser`: the `lpdl` parser with every command, its options and their help; the version
that `lpdl --version` prints."""
from __future__ import annotations

import argparse
import logging

from .args import (
    DEFAULT_TIMEOUT_S,
    MAX_BATCH,
    MAX_DEMO_EPOCHS,
    MAX_NODES,
    OneLineParser,
    choice_list,
    count_arg,
    path_arg,
    percent_arg,
    seed_arg,
    timeout_seconds,
    unit_arg,
)
from ..config import FIDELITY_CHOICES
from .data_commands import add_data_commands
from .library_commands import cmd_bench, cmd_demo, cmd_models, cmd_partition, cmd_topology
from .pipeline_commands import (cmd_aggregate, cmd_cells, cmd_cost, cmd_partition_figures, cmd_plan, cmd_prefetch,
                                cmd_report, cmd_status, cmd_targets, cmd_timing, cmd_unlock)
from .train import cmd_train


def lpdl_version() -> str:
    """The installed distribution's version, else the package's own."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lpdl_core")
    except PackageNotFoundError:
        import lpdl_core
        return getattr(lpdl_core, "__version__", "unknown")


def _workflow_config_args(p: argparse.ArgumentParser, read_there: str) -> None:
    """--configfile, --config and --directory, as snakemake's (lpdl_core.pipeline.workflow.wfconfig.load)."""
    p.add_argument("--configfile", action="append", metavar="FILE",
                   help="as snakemake's: applied over config/config.yaml (repeatable), e.g. config/paper.yaml; "
                        "relative to where you run the command, as snakemake reads it, even with --directory")
    p.add_argument("--config", action="append", metavar="KEY=VALUE", nargs="+",
                   help="as snakemake's --config (YAML values, e.g. seeds=[1,2] 'fidelity={act_rounding: stochastic}')")
    p.add_argument("--directory", default=".",
                   help=f"the working directory, as snakemake --directory: {read_there} (default: here)")


def build_parser() -> argparse.ArgumentParser:
    from ..config import (
        CELLS_PER_JOB,
        DEFAULT_SEED,
        MAX_PACK_SIZE,
        CNN_MODELS,
        COMPILE_MODES,
        DEVICES,
        DEFAULT_EXECUTOR,
        EXECUTORS,
        GRAPHS,
        IN_PROCESS_EXECUTORS,
        IMAGE_DATASETS,
        PRECISIONS,
        PROFILES,
        TABLES,
    )
    from ..decentral.partition import KNOWN_CLASS_SIZES

    device = "where to compute: auto (CUDA when available), cpu or cuda"
    executor = ("how the n nodes run: loop (one node after another) or batched (vmap), both in this process, "
                "or distributed (one process per node over torch.distributed); the same math")
    paper_dir = ("folder of cell tables (table1.csv, ..., fig1.csv); default: the paper's cells packaged "
                 "with lpdl")
    profile = "protocol: mini (embedded stand-ins, a laptop) or paper (the paper's); default: the folder's name"
    seeds = "only this seed (repeatable; default: every seed found)"
    skew = "fraction of each node's data drawn from its own classes, in [0, 1]"
    also_json = "also write the JSON to this file (not given: stdout only)"

    p = OneLineParser(prog="lpdl", description="Low precision decentralized training "
                                "(Aketi, Kodge, Roy 2021): core tools")
    p.add_argument("--version", action="version", version=f"lpdl {lpdl_version()}")
    loud = p.add_mutually_exclusive_group()
    loud.add_argument("-v", "--verbose", dest="log_level", action="store_const", const=logging.DEBUG,
                      default=logging.INFO, help="also print debug messages on stderr "
                      "(default: progress lines and notices)")
    loud.add_argument("-q", "--quiet", dest="log_level", action="store_const", const=logging.WARNING,
                      help="print only warnings and errors on stderr: no progress lines or bars")
    sub = p.add_subparsers(dest="command", required=True, parser_class=OneLineParser, metavar="COMMAND")

    def command(name: str, text: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=text, description=text.replace("%%", "%"))

    t = command("topology", "print a graph's mixing matrix W, neighbours and SLEM")
    t.add_argument("--graph", choices=GRAPHS, default="directed-ring", help="the communication graph")
    t.add_argument("--nodes", type=count_arg(1, MAX_NODES["topology"]), default=8, help="number of nodes")
    t.add_argument("--rows", type=int, default=None, help="torus rows, a divisor of --nodes (default: squarest)")
    t.add_argument("--seed", type=int, default=0, help="random-directed graph seed")
    t.add_argument("--t", type=count_arg(0), default=0, help="iteration whose W is shown (time-varying graphs)")
    t.set_defaults(func=cmd_topology)

    q = command("partition", "print the paper's skew partition per node")
    q.add_argument("--dataset", choices=sorted(KNOWN_CLASS_SIZES),
                   help="take the class sizes of this dataset (give this or --class-sizes)")
    q.add_argument("--class-sizes", help="comma-separated class sizes, e.g. 5000,5000,... (give this or --dataset)")
    q.add_argument("--nodes", type=count_arg(1, MAX_NODES["partition"]), default=8, help="number of nodes")
    q.add_argument("--skew", type=unit_arg, default=0.8, help=skew)
    q.add_argument("--seed", type=int, default=DEFAULT_SEED, help=f"partition seed (official: {DEFAULT_SEED})")
    q.add_argument("--out", type=path_arg, help="also write the histogram table to this .csv or .json file")
    q.add_argument("--format", choices=("csv", "json"),
                   help="format of --out (default: json for a .json file, else csv)")
    q.set_defaults(func=cmd_partition)

    d = command("demo", "DS vs CHOCO at 0%% and 99%% compression on embedded digits")
    d.add_argument("--epochs", type=count_arg(1, MAX_DEMO_EPOCHS), default=20, help="training epochs of each run")
    d.add_argument("--nodes", type=count_arg(1, MAX_NODES["demo"]), default=8, help="number of nodes")
    d.add_argument("--skew", type=unit_arg, default=0.8, help=skew)
    d.add_argument("--graph", choices=GRAPHS, default="directed-ring", help="the communication graph")
    d.add_argument("--executor", choices=IN_PROCESS_EXECUTORS, default=DEFAULT_EXECUTOR,
                   help="how the n nodes run in this process: loop (one node after another) or batched (vmap)")
    d.add_argument("--device", choices=DEVICES, default="auto", help=device)
    d.add_argument("--quiet", action="store_true", help="no progress bar (as lpdl -q)")
    d.set_defaults(func=cmd_demo)

    b = command("bench", "FP vs 8-bit step time of the n-node simulator, or of n processes with "
                "--executor distributed (split into compute, compression and communication) (JSON)")
    b.add_argument("--model", choices=CNN_MODELS, default="resnet20", help="the model to time")
    b.add_argument("--dataset", choices=IMAGE_DATASETS, default=None,
                   help="the input size to build for (default: the model's own dataset)")
    b.add_argument("--nodes", type=count_arg(1, MAX_NODES["bench"]), default=8, help="number of nodes")
    b.add_argument("--batch", type=count_arg(1, MAX_BATCH), default=32, help="batch per node")
    b.add_argument("--steps", type=count_arg(1, 100000), default=10, help="timed steps")
    b.add_argument("--warmup", type=count_arg(0, 100000), default=2, help="untimed steps before them")
    b.add_argument("--executor", choices=EXECUTORS, default=DEFAULT_EXECUTOR, help=executor)
    b.add_argument("--device", choices=DEVICES, default="auto", help=device)
    b.add_argument("--precisions", type=choice_list(PRECISIONS), default=PRECISIONS, metavar="P[,P]",
                   help="comma-separated, of: " + ", ".join(PRECISIONS))
    b.add_argument("--compression", type=percent_arg, default=0.0, metavar="PERCENT",
                   help="gossip messages: 0 = uncompressed (eta 1), else layer-wise top-k dropping this "
                        "percentage (eta 0.01), e.g. 99")
    b.add_argument("--compile", action="store_true",
                   help="also time each step compiled as one torch.compile graph (needs --executor batched "
                        "and --warmup >= 1: the first step compiles)")
    b.add_argument("--compile-mode", choices=COMPILE_MODES, default="auto",
                   help="torch.compile mode of the compiled steps (auto: reduce-overhead, i.e. CUDA graphs, on CUDA; "
                        "default elsewhere)")
    b.add_argument("--fused-quant", action="store_true",
                   help="the eager steps with the 8-bit quantizer chains as fused compiled kernels "
                        "(needs --warmup >= 1: the first step compiles them)")
    b.add_argument("--int8-arithmetic", choices=FIDELITY_CHOICES["int8_arithmetic"], default="fake",
                   help="8-bit layers' arithmetic (integer: exact int8 products where an exact kernel exists)")
    b.add_argument("--pack", type=count_arg(1, MAX_PACK_SIZE), default=1, metavar="K",
                   help="time a pack of K cells of --nodes nodes each (one stacked state; executor loop or batched)")
    b.add_argument("--standin", action="store_true",
                   help="time the model's mini-profile stand-in on its 8x8 input (the step make reproduce trains) "
                        "instead of the paper model")
    b.add_argument("--out", type=path_arg, help=also_json)
    b.set_defaults(func=cmd_bench)

    tr = command("train", "run paper cells (each resumes from its checkpoint; skips if done)")
    tr.add_argument("--cell", required=True, action="append",
                    help="cell id, see `lpdl cells`; repeat to run several in one process")
    tr.add_argument("--profile", choices=PROFILES, default="mini",
                    help="protocol: mini (embedded stand-ins, a laptop) or paper (the paper's)")
    tr.add_argument("--out", type=path_arg, required=True, help="run folder (metrics.json, curve.csv, partition.csv); "
                    "with several cells a template holding {cell}")
    tr.add_argument("--seed", type=seed_arg, default=None,
                    help=f"random seed (default: the cell's own, {DEFAULT_SEED})")
    tr.add_argument("--grid", default=None, metavar="NAME",
                    help="the --cell ids are of the grid config/extensions/NAME.yaml, not the paper's")
    tr.add_argument("--paper-dir", default=None, help=paper_dir)
    tr.add_argument("--reuse-runs", default=None, metavar="TEMPLATE",
                    help="with --grid (mini profile): a grid cell whose mini run is a paper cell's (same settings "
                         "and length) reuses that cell's finished run from TEMPLATE (a run folder holding {cell}, "
                         "e.g. results/mini/runs/{cell}/seed1234) instead of training; absent there, it trains")
    tr.add_argument("--data-root", default=None, help="dataset folder (default: $LPDL_DATA or ./data)")
    tr.add_argument("--device", choices=DEVICES, default="auto", help=device)
    tr.add_argument("--executor", choices=EXECUTORS, default=DEFAULT_EXECUTOR, help=executor)
    tr.add_argument("--compile", action="store_true",
                    help="run each training iteration as one torch.compile graph (needs --executor batched; "
                         "the first step compiles, minutes on a CPU)")
    tr.add_argument("--compile-mode", choices=COMPILE_MODES, default="auto",
                    help="torch.compile mode (auto: reduce-overhead, i.e. CUDA graphs, on CUDA; default elsewhere)")
    tr.add_argument("--fused-quant", action="store_true",
                    help="eager steps with the 8-bit quantizer chains as fused compiled kernels (not with --compile; "
                         "the first steps compile them, about a minute on a CPU)")
    tr.add_argument("--pack-size", type=count_arg(1, MAX_PACK_SIZE), default=1, metavar="K",
                    help="train cells that can share one stacked state together, K at a time (executor loop or "
                         "batched; they may differ in seed, skew, graph, compression and eta; default 1: one by one)")
    tr.add_argument("--dist-timeout", type=timeout_seconds, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                    help="distributed executor: bound on the rendezvous and on every wait for another rank "
                         "(a dead or stuck rank fails the job after it; default %(default)g)")
    fid = tr.add_mutually_exclusive_group()
    fid.add_argument("--fidelity", nargs="*", default=[], metavar="KEY=VALUE",
                     help="official-code behaviours: one preset (paper | official) or options, e.g. "
                          "quant_ranges=gossiped choco_form=code (not given: the paper's)")
    fid.add_argument("--fidelity-json", default=None, metavar="JSON",
                     help='the same as one JSON object with typed values, e.g. {"quant_ranges": "gossiped"} '
                          'or "official" '
                          "(how the workflow passes them)")
    tr.add_argument("--offline", action="store_true",
                    help="download nothing (as every workflow train job): datasets are read as they are, "
                         "HF_HUB_OFFLINE=1; a missing one is an error naming `lpdl prefetch`")
    tr.set_defaults(func=cmd_train)

    pr = command("prefetch", "fetch and verify the datasets and pretrained models the cells load (JSON manifest)")
    pr.add_argument("--profile", choices=PROFILES, default="paper",
                    help="protocol whose runs' data is fetched (mini: embedded stand-ins, nothing to fetch)")
    pr.add_argument("--table", action="append", choices=TABLES,
                    help="only these tables' cells (repeatable; default all)")
    pr.add_argument("--paper-dir", default=None, help=paper_dir)
    pr.add_argument("--data-root", default=None, help="dataset folder (default: $LPDL_DATA or ./data)")
    pr.add_argument("--fidelity-json", action="append", metavar="JSON",
                    help="a fidelity mode whose runs' data is fetched, as `lpdl train --fidelity-json` "
                         "(repeatable; default: the paper's)")
    pr.add_argument("--out", type=path_arg, help="also write the manifest to this file (not given: stdout only)")
    pr.set_defaults(func=cmd_prefetch)
    add_data_commands(command, _workflow_config_args)

    ce = command("cells", "list the paper's cells, or a grid's (one training run each)")
    ce.add_argument("--paper-dir", default=None, help=paper_dir)
    ce.add_argument("--table", action="append", choices=TABLES, help="repeatable; default: all")
    ce.add_argument("--grid", default=None, metavar="NAME",
                    help="a grid of config/extensions/NAME.yaml (run from the repository root)")
    ce.set_defaults(func=cmd_cells)

    r = command("report", "HTML + LaTeX/PDF report of a results folder beside the paper")
    r.add_argument("--results", default="results/mini", help="results/<profile> folder")
    r.add_argument("--out", type=path_arg, default="report", help="output folder (report.html, report.tex, ...)")
    r.add_argument("--paper-dir", default=None, help=paper_dir)
    r.add_argument("--table", action="append", choices=TABLES, help="repeatable; default all")
    r.add_argument("--no-pdf", action="store_true", help="do not run latexmk")
    r.add_argument("--compare", metavar="DIR", default=None,
                   help="another results folder of the same profile in the other fidelity mode, shown side by "
                        "side (not given: no comparison)")
    r.set_defaults(func=cmd_report)

    ag = command("aggregate", "a results folder's runs -> runs.csv, curves.csv, tables/*.csv")
    ag.add_argument("results", help="results/<profile> holding runs/")
    ag.add_argument("--profile", choices=PROFILES, default=None, help=profile)
    ag.add_argument("--paper-dir", default=None, help=paper_dir)
    ag.add_argument("--table", action="append", choices=TABLES, help="repeatable; default all")
    ag.add_argument("--seed", type=seed_arg, action="append", help=seeds)
    ag.set_defaults(func=cmd_aggregate)

    co = command("cost", "Figure 3's compute and memory cost model (JSON)")
    co.add_argument("--device", choices=DEVICES, default="auto", help=device + "; measures peak memory on CUDA")
    co.add_argument("--out", type=path_arg, help=also_json + " (e.g. results/mini/cost.json)")
    co.set_defaults(func=cmd_cost)

    pf = command("partition-figures", "Figures 2, 5-7: per-node class counts of the paper's partitions (CSV)")
    pf.add_argument("--out", type=path_arg,
                    help="write the CSV here (e.g. results/mini/partitions.csv); default: print it")
    pf.set_defaults(func=cmd_partition_figures)

    m = command("models", "every model with its FP and LP parameter counts (Table 1)")
    m.set_defaults(func=cmd_models)

    ti = command("timing", "where a pipeline run's time went (JSON): job start-up vs training")
    ti.add_argument("results", help="results/<profile> of a finished run, or an extension grid's "
                                    "results/<profile>-<grid> (its cells from config/extensions/<grid>.yaml)")
    ti.add_argument("--profile", choices=PROFILES, default=None, help=profile)
    ti.add_argument("--cells-per-job", choices=CELLS_PER_JOB, default=None,
                    help="how the run grouped cells into jobs (default: the grouping whose job names "
                         "the benchmark folders carry)")
    ti.add_argument("--seed", type=int, action="append", help=seeds)
    ti.add_argument("--paper-dir", default=None, help=paper_dir)
    ti.add_argument("--out", type=path_arg, help=also_json)
    ti.set_defaults(func=cmd_timing)

    tg = command("targets", "check the mini profile's learning targets on finished runs")
    tg.add_argument("results", help="results/<profile> of a finished run")
    tg.add_argument("--seed", type=int, action="append", help=seeds)
    tg.add_argument("--paper-dir", default=None, help=paper_dir)
    tg.add_argument("--out", type=path_arg,
                    help="also write the checks as JSON to this file (not given: only the table)")
    tg.set_defaults(func=cmd_targets)

    st = command("status", "which results the config names are missing, damaged or stale, and whether the "
                           "report matches them (exit 1 if anything is not current)")
    _workflow_config_args(st, "config/config.yaml, results/ and the report are read there")
    st.add_argument("--all", action="store_true", help="list every run that is not current (default: the first 20)")
    st.set_defaults(func=cmd_status)

    pl = command("plan", "the GPU-hours a paper-profile grid asks SLURM for, per table and in total, and which "
                         "step times are measured and which scaled (before any job runs)")
    _workflow_config_args(pl, "config/config.yaml and the step-time table are read there")
    pl.add_argument("--out", type=path_arg, help="also write the bill as JSON to this file")
    pl.set_defaults(func=cmd_plan)

    u = command("unlock", "clear Snakemake's lock if no live Snakemake works in the folder")
    u.add_argument("--directory", default=".", help="the workflow folder (default: here)")
    u.set_defaults(func=cmd_unlock)
    return p
