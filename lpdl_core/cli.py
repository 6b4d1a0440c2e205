"""`lpdl` command line: the only module that parses argv or prints.

Command results (tables, JSON, written paths) go to stdout; progress and notices go to stderr
through stdlib logging (logger "lpdl", one `lpdl: ...` line each; -v adds debug lines, -q keeps
only warnings); errors are one `lpdl <cmd>: error: ...` line on stderr."""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

import numpy as np

from .errors import LpdlError

log = logging.getLogger("lpdl.cli")

# Upper bounds that stop absurd sizes before anything is allocated.
MAX_NODES = {"topology": 1024, "partition": 1024, "demo": 64, "bench": 256}
MAX_BATCH = 4096
DEFAULT_TIMEOUT_S = 300.0  # == lpdl_core.pipeline.ranks.DEFAULT_TIMEOUT_S (torch-free copy; a test checks)


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Each option's help ends with `(default: X)` where X says something: not for flags, nor for
    None (not given; the help says what that means), nor where the help already names its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        d, text = action.default, action.help or ""
        if d is None or d is False or d == [] or d == argparse.SUPPRESS or "default" in text:
            return text
        return super()._get_help_string(action)


class OneLineParser(argparse.ArgumentParser):
    """argparse with its usage errors as one line: `lpdl <cmd>: error: <why>`, exit 2, and help
    that shows defaults."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message}\n")


def _count(lo: int, hi: int | None = None):
    """An argparse type: an integer in [lo, hi]."""
    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if v < lo or (hi is not None and v > hi):
            raise argparse.ArgumentTypeError(f"{v} is outside [{lo}, {hi if hi is not None else '...'}]")
        return v
    parse.__name__ = "integer"
    return parse


def _real(lo: float, hi: float, *, lo_open: bool = False, hi_open: bool = False):
    """An argparse type: a number in the interval from lo to hi (each end closed unless open);
    NaN is never in it."""
    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not ((lo < v if lo_open else lo <= v) and (v < hi if hi_open else v <= hi)):
            raise argparse.ArgumentTypeError(f"{v} is outside {'(' if lo_open else '['}{lo}, {hi}"
                                             f"{')' if hi_open else ']'}")
        return v
    parse.__name__ = "number"
    return parse


_unit = _real(0, 1)                                          # a fraction, e.g. the skew
_percent = _real(0, 100, hi_open=True)                       # a percentage dropped
_positive_seconds = _real(0, float("inf"), lo_open=True, hi_open=True)  # a finite timeout


def _out_file(path: str | None, what: str = "output file") -> None:
    """ConfigError before any work unless `path`'s folder is writable (or creatable)."""
    if path:
        from .pipeline.runstore import check_writable_dir
        if Path(path).is_dir():
            raise LpdlError(f"{what} {path}: is a folder, not a file")
        check_writable_dir(Path(path).parent if Path(path).parent != Path("") else Path("."), what)


def _cmd_topology(a: argparse.Namespace) -> int:
    from .decentral.topology import Topology, describe

    topo = Topology(name=a.graph, n=a.nodes, rows=a.rows, seed=a.seed)
    print(describe(topo, t=a.t))
    return 0


def _cmd_partition(a: argparse.Namespace) -> int:
    from .decentral.partition import (
        KNOWN_CLASS_SIZES,
        histograms,
        labels_from_class_sizes,
        partition_table,
        skew_partition,
        write_histograms,
    )

    if (a.dataset is None) == (a.class_sizes is None):
        raise LpdlError("give exactly one of --dataset or --class-sizes")
    _out_file(a.out)
    if a.dataset is not None:
        sizes = KNOWN_CLASS_SIZES[a.dataset]
    else:
        try:
            sizes = tuple(int(s) for s in a.class_sizes.split(","))
        except ValueError:
            raise LpdlError(f"--class-sizes must be comma-separated integers, got {a.class_sizes!r}") from None
        if not sizes or any(v < 0 for v in sizes) or sum(sizes) > 10**8:
            raise LpdlError(f"--class-sizes must be non-negative counts summing to at most 1e8, got {a.class_sizes!r}")
    labels = labels_from_class_sizes(sizes)
    parts = skew_partition(labels, a.nodes, a.skew, seed=a.seed)
    hist = histograms(parts, labels, num_classes=len(sizes))
    print(f"skew partition: {a.nodes} nodes, skew {a.skew}, seed {a.seed}, "
          f"{len(sizes)} classes, {len(labels)} samples")
    print(partition_table(hist, unused=int(len(labels) - hist.sum())))
    if a.out:
        fmt = a.format or ("json" if a.out.endswith(".json") else "csv")
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        write_histograms(hist, a.out, fmt=fmt)
        log.info("wrote %s", a.out)
    return 0


def _cmd_demo(a: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .training.demo import DEFAULT_RUNS, format_table, run_demo

    total = len(DEFAULT_RUNS) * a.epochs
    quiet = a.quiet or not log.isEnabledFor(logging.INFO)
    with tqdm(total=total, unit="epoch", file=sys.stderr, disable=quiet) as bar:
        def progress(run, ev):
            if ev["event"] == "epoch":
                bar.set_description(f"{run.algorithm} {run.compression:.0%}")
                bar.set_postfix(acc=f"{ev['mean_acc']:.1f}", loss=f"{ev['train_loss']:.3f}")
                bar.update(1)
        results = run_demo(epochs=a.epochs, nodes=a.nodes, skew=a.skew, graph=a.graph,
                           executor=a.executor, device=a.device, progress=progress)
    print(f"\nlpdl demo: {a.nodes}-node {a.graph}, skew {a.skew}, {a.epochs} epochs, "
          f"executor {results[0][1].executor} on {results[0][1].device}; data: the embedded "
          f"digits stand-in (NOT a paper dataset); accuracies after 50 final gossip rounds")
    print(format_table(results))
    return 0 if all(r.status == "ok" for _, r in results) else 1


def _cmd_bench(a: argparse.Namespace) -> int:
    import json
    from pathlib import Path

    from .training.bench import bench_step

    _out_file(a.out)

    def progress(ev: dict) -> None:
        if ev["event"] == "build":
            log.info("bench: building %d %s %s nodes", a.nodes, ev["precision"], a.model)
        elif ev["event"] == "step":
            times = " ".join(f"{p} {s:.3f}s" for p, s in ev["seconds"].items())
            log.info("bench: step %d/%d%s: %s", ev["step"], ev["total"], " (warm-up)" if ev["warmup"] else "", times)

    res = bench_step(model=a.model, nodes=a.nodes, batch=a.batch, steps=a.steps, warmup=a.warmup,
                     executor=a.executor, device=a.device, dataset=a.dataset,
                     precisions=tuple(a.precisions.split(",")), compression=a.compression, progress=progress)
    text = json.dumps(res, indent=2)
    print(text)
    if a.out:
        from .pipeline.results import write_atomic
        write_atomic(a.out, text + "\n")
    return 0


def _cmd_models(a: argparse.Namespace) -> int:
    from .models.registry import format_model_table, model_table

    def progress(ev: dict) -> None:
        log.info("models: building %s (%d/%d)", ev["name"], ev["index"], ev["total"])

    print(format_model_table(model_table(progress=progress)))
    return 0


def _fidelity(a: argparse.Namespace):
    """The run's Fidelity: from --fidelity-json (typed JSON values, as the workflow passes them) or
    from --fidelity KEY=VALUE strings (each value spelled exactly as one of the allowed ones)."""
    import json

    from .config import Fidelity

    if a.fidelity_json is None:
        return Fidelity.from_pairs(a.fidelity)
    try:
        values = json.loads(a.fidelity_json)
    except json.JSONDecodeError as e:
        raise LpdlError(f"--fidelity-json: not JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(values, (dict, str)):
        raise LpdlError(f"--fidelity-json: expected a JSON object or a preset name, got {type(values).__name__}")
    return Fidelity.from_mapping(values)


def _cmd_train(a: argparse.Namespace) -> int:
    """One cell, or several in one process (a Snakemake bundle: the torch import and data load
    are paid once). Each cell keeps its own run folder, checkpoint and resume. In the mini
    profile a cell whose run is identical to an earlier listed cell's is not trained again
    (lpdl_core.pipeline.mini.same_runs). A failing cell does not stop the others; the exit status is 1
    if any failed."""
    import os

    from .pipeline.cells import cells_by_id, load_cells
    from .pipeline.mini import same_runs

    if a.offline:  # before anything imports huggingface_hub (it reads these once, at import)
        from .pipeline.prefetch import OFFLINE_ENV
        os.environ.update(OFFLINE_ENV)
    cells = cells_by_id(load_cells(a.paper_dir))
    unknown = [c for c in a.cell if c not in cells]
    if unknown:
        raise LpdlError(f"unknown cell {unknown[0]!r} (see `lpdl cells`)")
    if len(set(a.cell)) > 1 and "{cell}" not in a.out:
        raise LpdlError("--out must contain {cell} when several --cell are given "
                        "(e.g. results/mini/runs/{cell}/seed1234)")
    fidelity = _fidelity(a)
    todo = [cells[c] for c in dict.fromkeys(a.cell)]
    group = None
    if a.executor == "distributed":
        from .pipeline.ranks import Group, in_group

        if not in_group():
            return _launch_ranks(a, todo)
        group = Group.join(a.executor, device=a.device, timeout_s=a.dist_timeout)
        if group.rank != 0:  # rank 0 speaks for the run
            log.setLevel(max(log.level, logging.WARNING))
    shared = same_runs(todo) if a.profile == "mini" else {}
    out_of = lambda cid: a.out.replace("{cell}", cid)  # noqa: E731
    failed = []
    for i, cell in enumerate(todo, 1):
        if len(todo) > 1:
            log.info("[%d/%d] %s", i, len(todo), cell.cell_id)
        try:
            if cell.cell_id in shared:
                if group is None or group.rank == 0:
                    _share_one(a, cell, cells[shared[cell.cell_id]], out_of, fidelity)
                if group is not None:
                    group.barrier()
            else:
                _train_one(a, cell, out_of(cell.cell_id), fidelity, group)
        except (LpdlError, ValueError, OSError) as e:
            if len(todo) == 1 or group is not None:  # a rank cannot go on alone: the job fails
                raise
            failed.append(cell.cell_id)
            print(f"lpdl train: error: [{cell.cell_id}] {e}", file=sys.stderr, flush=True)
    if group is not None:
        group.leave()
    if failed:
        print(f"lpdl train: error: {len(failed)} of {len(todo)} cells failed: {', '.join(failed)}",
              file=sys.stderr, flush=True)
        return 1
    return 0


def _launch_ranks(a: argparse.Namespace, todo) -> int:
    """`lpdl train --executor distributed` started by hand: the same command in n processes, one
    per node, under torchrun (lpdl_core.pipeline.ranks); its exit status."""
    from .pipeline.ranks import child_env, run_children, torchrun_argv

    nodes = {c.nodes for c in todo}
    if len(nodes) > 1:
        raise LpdlError("the cells of one distributed launch must have the same number of nodes, got "
                        + ", ".join(f"{c.cell_id} ({c.nodes})" for c in todo))
    n = nodes.pop()
    log.info("train: starting %d processes (one per node) with torchrun", n)
    return run_children(torchrun_argv(n, a.argv), child_env(n))


def _share_one(a: argparse.Namespace, cell, primary, out_of, fidelity) -> None:
    from .pipeline.runcell import share_run

    m = share_run(cell, primary, out_of(primary.cell_id), out_of(cell.cell_id), a.profile, seed=a.seed,
                  fidelity=fidelity)
    print(f"[{cell.cell_id}] same run as {primary.cell_id}: mean node acc {m['final']['mean_acc']:.2f} "
          f"(computed once) -> {out_of(cell.cell_id)}", flush=True)


def _train_one(a: argparse.Namespace, cell, out: str, fidelity, group=None) -> None:
    import time
    from contextlib import nullcontext

    from .pipeline.runcell import run_cell

    t0 = time.time()
    name = cell.cell_id
    log.debug("[%s] profile %s, seed %s, device %s, executor %s, data root %s, fidelity %s -> %s", name,
              a.profile, a.seed if a.seed is not None else "the cell's", a.device, a.executor,
              a.data_root or "$LPDL_DATA or ./data", fidelity, out)
    # in a terminal: a progress bar over epochs (log lines printed above it); always: one INFO
    # log line per epoch with an ETA (on stderr; the cell's outcome goes to stdout)
    bar, above_bar = None, nullcontext()
    if sys.stderr.isatty() and log.isEnabledFor(logging.INFO):
        from tqdm import tqdm
        from tqdm.contrib.logging import logging_redirect_tqdm
        bar = tqdm(total=None, unit="epoch", desc=name, file=sys.stderr, leave=False)
        above_bar = logging_redirect_tqdm([logging.getLogger("lpdl")])

    def progress(ev: dict) -> None:
        if ev["event"] == "restored":
            log.info(f"[{name}] restored the finished result of exactly these settings and this code "
                     f"from {ev['source']} (nothing to recompute)")
        elif ev["event"] == "checkpoint-set-aside":
            log.warning(f"[{name}] {ev['path']} cannot be used ({ev['reason']}); moved it to "
                        f"{ev['moved_to']} and started the cell from scratch")
        elif ev["event"] == "resumed":
            log.info(f"[{name}] resuming at epoch {ev['epoch']}/{ev['epochs']}")
            if bar is not None:
                bar.reset(total=ev["epochs"])
                bar.update(ev["epoch"])
        elif ev["event"] == "epoch":
            done = ev["epoch"] + 1
            eta = (time.time() - t0) / max(done, 1) * (ev["epochs"] - done)
            log.info(f"[{name}] epoch {done}/{ev['epochs']} lr {ev['lr']:.4g} loss {ev['train_loss']:.4f} "
                     f"acc {ev['mean_acc']:.2f} avg-model {ev['avg_model_acc']:.2f} "
                     f"consensus {ev['consensus_distance']:.3g} eta {eta:.0f}s")
            if bar is not None:
                bar.total = ev["epochs"]
                bar.set_postfix(loss=f"{ev['train_loss']:.3f}", acc=f"{ev['mean_acc']:.1f}")
                bar.update(done - bar.n)

    try:
        with above_bar:
            m = run_cell(cell, out, a.profile, seed=a.seed, fidelity=fidelity, device=a.device,
                         executor=a.executor, data_root=a.data_root, progress=progress, offline=a.offline,
                         group=group)
    finally:
        if bar is not None:
            bar.close()
    if group is not None and group.rank != 0:
        return
    f = m["final"]  # the cell's outcome: a result, on stdout
    if m["status"] == "ok":
        print(f"[{name}] ok: mean node acc {f['mean_acc']:.2f} avg-model {f['avg_model_acc']:.2f} "
              f"({m['wall_time_s']:.1f}s) -> {out}", flush=True)
    else:
        print(f"[{name}] {m['status']} at {m.get('diverged_at')} ({m['wall_time_s']:.1f}s) -> {out}", flush=True)


def _cmd_prefetch(a: argparse.Namespace) -> int:
    """Fetch and verify what the cells' runs load (lpdl_core.pipeline.prefetch); the manifest on stdout."""
    import json

    from .config import Fidelity
    from .pipeline.prefetch import prefetch, write_manifest
    from .pipeline.cells import load_cells

    _out_file(a.out, "manifest")
    fidelities = [_fidelity(argparse.Namespace(fidelity_json=text, fidelity=[])) for text in a.fidelity_json or ()]
    manifest = prefetch(load_cells(a.paper_dir, tables=a.table or None), a.profile,
                        fidelities=fidelities or [Fidelity()], data_root=a.data_root)
    log.info("prefetch: %s", manifest["summary"])
    if a.out:
        write_manifest(manifest, a.out)
    print(json.dumps(manifest, indent=2, sort_keys=True))
    return 0


def _cmd_cells(a: argparse.Namespace) -> int:
    from .pipeline.cells import load_cells

    for c in load_cells(a.paper_dir, tables=a.table or None):
        print(c.cell_id)
    return 0


def _cmd_report(a: argparse.Namespace) -> int:
    """The report from what the aggregate, cost and partitions steps wrote under --results."""
    from .pipeline.runstore import check_writable_dir
    from .pipeline.tidy import RUNS_FILE
    from .report.build import build_report, main_json

    results = Path(a.results)
    if not (results / RUNS_FILE).is_file():
        raise LpdlError(f"{results} has no {RUNS_FILE}: run the pipeline, or `lpdl aggregate {results}` "
                        f"(and `lpdl cost`, `lpdl partition-figures` for Figures 2-3, 5-7) first")
    check_writable_dir(a.out, "report folder")
    r = build_report(results, a.out, paper_dir=a.paper_dir, tables=a.table or None, pdf=not a.no_pdf,
                     compare_dir=a.compare)
    print(main_json(r))
    return 0


def _cmd_aggregate(a: argparse.Namespace) -> int:
    """runs/ -> runs.csv, curves.csv, tables/{table}.csv and tables/{table}-paper.csv."""
    from .config import TABLES
    from .pipeline.aggregate import write_aggregate
    from .pipeline.cells import load_cells
    from .pipeline.runstore import check_writable_dir

    results = Path(a.results)
    if not (results / "runs").is_dir():
        raise LpdlError(f"{results} has no runs/ folder (expected results/<profile>/runs/<cell>/seed<n>/)")
    check_writable_dir(results / "tables", "tables folder")
    tables = a.table or list(TABLES)
    written = write_aggregate(results, load_cells(a.paper_dir, tables=tables), profile=a.profile or results.name,
                              tables=tables, seeds=a.seed or None)
    for path in written.values():
        print(path)
    return 0


def _cmd_cost(a: argparse.Namespace) -> int:
    """Figure 3's cost model (and measured peak CUDA memory on a GPU) as JSON."""
    import json

    from .training.cost import figure3_cost

    _out_file(a.out)
    text = json.dumps(figure3_cost(device=a.device), indent=1)
    if a.out:
        from .pipeline.results import write_atomic
        write_atomic(a.out, text + "\n")
    print(text)
    return 0


def _cmd_partition_figures(a: argparse.Namespace) -> int:
    """Figures 2, 5-7's per-node class counts as CSV."""
    from .pipeline.paper_partitions import partition_figures_frame
    from .pipeline.tidy import write_frame

    _out_file(a.out)
    df = partition_figures_frame()
    if a.out:
        write_frame(df, a.out)
        print(a.out)
    else:
        print(df.to_csv(index=False), end="")
    return 0


def _cmd_timing(a: argparse.Namespace) -> int:
    import json

    from .pipeline.cells import load_cells
    from .pipeline.jobs import plan_jobs
    from .pipeline.timing import pipeline_timing

    results = Path(a.results)
    profile = a.profile or results.name
    _out_file(a.out)
    cells = load_cells(a.paper_dir)
    t = pipeline_timing(results, plan_jobs(cells, profile, a.cells_per_job), cells, seeds=a.seed)
    text = json.dumps(t, indent=2)
    if a.out:
        Path(a.out).write_text(text + "\n")
    print(text)
    return 0


def _cmd_targets(a: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict

    from .config import LEARNED_MARGIN
    from .pipeline.cells import load_cells
    from .pipeline.targets import check_targets, format_checks, not_learned
    from .pipeline.tidy import seeds_present

    results = Path(a.results)
    cells = load_cells(a.paper_dir)
    seeds = a.seed or sorted({s for c in cells for s in seeds_present(results, c.cell_id)})
    if not seeds:
        raise LpdlError(f"{results}: no finished runs under runs/ (run the pipeline first)")
    checks = check_targets(results, cells, seeds)
    flat = not_learned(results, cells, seeds)
    print(format_checks(checks))
    print(f"did not learn (within {LEARNED_MARGIN:g} points of chance): {len(flat)} runs"
          + "".join(f"\n    {c} seed {s}: {v:.2f}" for c, s, v in flat))
    if a.out:
        Path(a.out).write_text(json.dumps({"seeds": seeds, "checks": [asdict(c) for c in checks],
                                           "did_not_learn": flat}, indent=2) + "\n")
    return 0 if all(c.ok for c in checks) else 1


def _cmd_unlock(a: argparse.Namespace) -> int:
    from .pipeline.snakelock import unlock_if_stale

    print(f"lpdl unlock: {unlock_if_stale(a.directory)}")
    return 0


def _version() -> str:
    """The installed distribution's version, else the package's own."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("lpdl_core")
    except PackageNotFoundError:
        import lpdl_core
        return getattr(lpdl_core, "__version__", "unknown")


def build_parser() -> argparse.ArgumentParser:
    from .config import (
        CELLS_PER_JOB,
        CNN_MODELS,
        DEVICES,
        EXECUTORS,
        GRAPHS,
        IN_PROCESS_EXECUTORS,
        IMAGE_DATASETS,
        PRECISIONS,
        PROFILES,
        TABLES,
    )
    from .decentral.partition import KNOWN_CLASS_SIZES

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
    p.add_argument("--version", action="version", version=f"lpdl {_version()}")
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
    t.add_argument("--nodes", type=_count(1, MAX_NODES["topology"]), default=8, help="number of nodes")
    t.add_argument("--rows", type=int, default=None, help="torus rows, a divisor of --nodes (default: squarest)")
    t.add_argument("--seed", type=int, default=0, help="random-directed graph seed")
    t.add_argument("--t", type=_count(0), default=0, help="iteration whose W is shown (time-varying graphs)")
    t.set_defaults(func=_cmd_topology)

    q = command("partition", "print the paper's skew partition per node")
    q.add_argument("--dataset", choices=sorted(KNOWN_CLASS_SIZES),
                   help="take the class sizes of this dataset (give this or --class-sizes)")
    q.add_argument("--class-sizes", help="comma-separated class sizes, e.g. 5000,5000,... (give this or --dataset)")
    q.add_argument("--nodes", type=_count(1, MAX_NODES["partition"]), default=8, help="number of nodes")
    q.add_argument("--skew", type=_unit, default=0.8, help=skew)
    q.add_argument("--seed", type=int, default=1234, help="partition seed (official: 1234)")
    q.add_argument("--out", help="also write the histogram table to this .csv or .json file")
    q.add_argument("--format", choices=("csv", "json"), help="format of --out (default: json for a .json file, else csv)")
    q.set_defaults(func=_cmd_partition)

    d = command("demo", "DS vs CHOCO at 0%% and 99%% compression on embedded digits")
    d.add_argument("--epochs", type=_count(1, 10000), default=20, help="training epochs of each run")
    d.add_argument("--nodes", type=_count(1, MAX_NODES["demo"]), default=8, help="number of nodes")
    d.add_argument("--skew", type=_unit, default=0.8, help=skew)
    d.add_argument("--graph", choices=GRAPHS, default="directed-ring", help="the communication graph")
    d.add_argument("--executor", choices=IN_PROCESS_EXECUTORS, default="loop",
                   help="how the n nodes run in this process: loop (one node after another) or batched (vmap)")
    d.add_argument("--device", choices=DEVICES, default="auto", help=device)
    d.add_argument("--quiet", action="store_true", help="no progress bar (as lpdl -q)")
    d.set_defaults(func=_cmd_demo)

    b = command("bench", "FP vs 8-bit step time of the n-node simulator, or of n processes with "
                "--executor distributed (split into compute, compression and communication) (JSON)")
    b.add_argument("--model", choices=CNN_MODELS, default="resnet20", help="the model to time")
    b.add_argument("--dataset", choices=IMAGE_DATASETS, default=None,
                   help="the input size to build for (default: the model's own dataset)")
    b.add_argument("--nodes", type=_count(1, MAX_NODES["bench"]), default=8, help="number of nodes")
    b.add_argument("--batch", type=_count(1, MAX_BATCH), default=32, help="batch per node")
    b.add_argument("--steps", type=_count(1, 100000), default=10, help="timed steps")
    b.add_argument("--warmup", type=_count(0, 100000), default=2, help="untimed steps before them")
    b.add_argument("--executor", choices=EXECUTORS, default="loop", help=executor)
    b.add_argument("--device", choices=DEVICES, default="auto", help=device)
    b.add_argument("--precisions", default=",".join(PRECISIONS), help="comma-separated, of: " + ", ".join(PRECISIONS))
    b.add_argument("--compression", type=_percent, default=0.0, metavar="PERCENT",
                   help="gossip messages: 0 = uncompressed (eta 1), else layer-wise top-k dropping this "
                        "percentage (eta 0.01), e.g. 99")
    b.add_argument("--out", help=also_json)
    b.set_defaults(func=_cmd_bench)

    tr = command("train", "run paper cells (each resumes from its checkpoint; skips if done)")
    tr.add_argument("--cell", required=True, action="append",
                    help="cell id, see `lpdl cells`; repeat to run several in one process")
    tr.add_argument("--profile", choices=PROFILES, default="mini",
                    help="protocol: mini (embedded stand-ins, a laptop) or paper (the paper's)")
    tr.add_argument("--out", required=True, help="run folder (metrics.json, curve.csv, partition.csv); "
                    "with several cells a template holding {cell}")
    tr.add_argument("--seed", type=_count(0), default=None, help="random seed (default: the cell's own, 1234)")
    tr.add_argument("--paper-dir", default=None, help=paper_dir)
    tr.add_argument("--data-root", default=None, help="dataset folder (default: $LPDL_DATA or ./data)")
    tr.add_argument("--device", choices=DEVICES, default="auto", help=device)
    tr.add_argument("--executor", choices=EXECUTORS, default="loop", help=executor)
    tr.add_argument("--dist-timeout", type=_positive_seconds, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                    help="distributed executor: bound on the rendezvous and on every wait for another rank "
                         "(a dead or stuck rank fails the job after it; default %(default)g)")
    fid = tr.add_mutually_exclusive_group()
    fid.add_argument("--fidelity", nargs="*", default=[], metavar="KEY=VALUE",
                     help="official-code behaviours: one preset (paper | official) or options, e.g. "
                          "quant_ranges=gossiped choco_form=code (not given: the paper's)")
    fid.add_argument("--fidelity-json", default=None, metavar="JSON",
                     help='the same as one JSON object with typed values, e.g. {"quant_ranges": "gossiped"} or "official" '
                          "(how the workflow passes them)")
    tr.add_argument("--offline", action="store_true",
                    help="download nothing (as every workflow train job): datasets are read as they are, "
                         "HF_HUB_OFFLINE=1; a missing one is an error naming `lpdl prefetch`")
    tr.set_defaults(func=_cmd_train)

    pr = command("prefetch", "fetch and verify the datasets and pretrained models the cells load (JSON manifest)")
    pr.add_argument("--profile", choices=PROFILES, default="paper",
                    help="protocol whose runs' data is fetched (mini: embedded stand-ins, nothing to fetch)")
    pr.add_argument("--table", action="append", choices=TABLES, help="only these tables' cells (repeatable; default all)")
    pr.add_argument("--paper-dir", default=None, help=paper_dir)
    pr.add_argument("--data-root", default=None, help="dataset folder (default: $LPDL_DATA or ./data)")
    pr.add_argument("--fidelity-json", action="append", metavar="JSON",
                    help="a fidelity mode whose runs' data is fetched, as `lpdl train --fidelity-json` "
                         "(repeatable; default: the paper's)")
    pr.add_argument("--out", help="also write the manifest to this file (not given: stdout only)")
    pr.set_defaults(func=_cmd_prefetch)

    ce = command("cells", "list the paper's cells (one training run each)")
    ce.add_argument("--paper-dir", default=None, help=paper_dir)
    ce.add_argument("--table", action="append", help="table1..table5, fig1 (repeatable; default: all)")
    ce.set_defaults(func=_cmd_cells)

    r = command("report", "HTML + LaTeX/PDF report of a results folder beside the paper")
    r.add_argument("--results", default="results/mini", help="results/<profile> folder")
    r.add_argument("--out", default="report", help="output folder (report.html, report.tex, ...)")
    r.add_argument("--paper-dir", default=None, help=paper_dir)
    r.add_argument("--table", action="append", choices=TABLES, help="repeatable; default all")
    r.add_argument("--no-pdf", action="store_true", help="do not run latexmk")
    r.add_argument("--compare", metavar="DIR", default=None,
                   help="another results folder of the same profile in the other fidelity mode, shown side by "
                        "side (not given: no comparison)")
    r.set_defaults(func=_cmd_report)

    ag = command("aggregate", "a results folder's runs -> runs.csv, curves.csv, tables/*.csv")
    ag.add_argument("results", help="results/<profile> holding runs/")
    ag.add_argument("--profile", choices=PROFILES, default=None, help=profile)
    ag.add_argument("--paper-dir", default=None, help=paper_dir)
    ag.add_argument("--table", action="append", choices=TABLES, help="repeatable; default all")
    ag.add_argument("--seed", type=_count(0), action="append", help=seeds)
    ag.set_defaults(func=_cmd_aggregate)

    co = command("cost", "Figure 3's compute and memory cost model (JSON)")
    co.add_argument("--device", choices=DEVICES, default="auto", help=device + "; measures peak memory on CUDA")
    co.add_argument("--out", help=also_json + " (e.g. results/mini/cost.json)")
    co.set_defaults(func=_cmd_cost)

    pf = command("partition-figures", "Figures 2, 5-7: per-node class counts of the paper's partitions (CSV)")
    pf.add_argument("--out", help="write the CSV here (e.g. results/mini/partitions.csv); default: print it")
    pf.set_defaults(func=_cmd_partition_figures)

    m = command("models", "every model with its FP and LP parameter counts (Table 1)")
    m.set_defaults(func=_cmd_models)

    ti = command("timing", "where a pipeline run's time went (JSON): job start-up vs training")
    ti.add_argument("results", help="results/<profile> of a finished run")
    ti.add_argument("--profile", choices=PROFILES, default=None, help=profile)
    ti.add_argument("--cells-per-job", choices=CELLS_PER_JOB, default=None,
                    help="how the run grouped cells into jobs (default: block for mini, cell for paper)")
    ti.add_argument("--seed", type=int, action="append", help=seeds)
    ti.add_argument("--paper-dir", default=None, help=paper_dir)
    ti.add_argument("--out", help=also_json)
    ti.set_defaults(func=_cmd_timing)

    tg = command("targets", "check the mini profile's learning targets on finished runs")
    tg.add_argument("results", help="results/<profile> of a finished run")
    tg.add_argument("--seed", type=int, action="append", help=seeds)
    tg.add_argument("--paper-dir", default=None, help=paper_dir)
    tg.add_argument("--out", help="also write the checks as JSON to this file (not given: only the table)")
    tg.set_defaults(func=_cmd_targets)

    u = command("unlock", "clear Snakemake's lock if no live Snakemake works in the folder")
    u.add_argument("--directory", default=".", help="the workflow folder (default: here)")
    u.set_defaults(func=_cmd_unlock)
    return p


def _setup_logging(level: int = logging.INFO) -> None:
    """Progress and notices (the CLI's and the library's: a rebuilt cache, ...) as one `lpdl: ...`
    line each on stderr, from `level` up."""

    class CurrentStderr(logging.StreamHandler):
        """Writes to whatever sys.stderr is at the time of the record (tests swap it)."""

        @property
        def stream(self):
            return sys.stderr

        @stream.setter
        def stream(self, _value):
            pass

    logger = logging.getLogger("lpdl")
    if not logger.handlers:
        handler = CurrentStderr()
        handler.setFormatter(logging.Formatter("lpdl: %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # as given (a launcher passes them on)
    _setup_logging(args.log_level)
    options = {k: v for k, v in vars(args).items() if k not in ("func", "command", "log_level", "argv")}
    log.debug("lpdl %s (python %s), command %s, options: %s", _version(), sys.version.split()[0], args.command,
              ", ".join(f"{k}={v!r}" for k, v in options.items()) or "none")
    try:
        return args.func(args)
    except BrokenPipeError:  # e.g. `lpdl cells | head`
        sys.stderr.close()
        return 0
    except KeyboardInterrupt:
        print(f"lpdl {args.command}: interrupted", file=sys.stderr)
        return 130
    except (LpdlError, ValueError, OSError) as e:  # expected failures: one clear line
        print(f"lpdl {args.command}: error: {_one_line(e)}", file=sys.stderr)
        return 2


def _one_line(e: BaseException) -> str:
    """An exception as one line: OSErrors name their file; line breaks become spaces."""
    if isinstance(e, OSError) and not isinstance(e, LpdlError) and e.filename is not None:
        text = f"{e.strerror or type(e).__name__}: {e.filename}"
    else:
        text = str(e) or type(e).__name__
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())
