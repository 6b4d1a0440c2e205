"""`lpdl` command line: the only module that parses argv or prints."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np


def _cmd_topology(a: argparse.Namespace) -> int:
    from .topology import Topology, describe

    topo = Topology(name=a.graph, n=a.nodes, rows=a.rows, seed=a.seed)
    print(describe(topo, t=a.t))
    return 0


def _cmd_partition(a: argparse.Namespace) -> int:
    from .partition import (KNOWN_CLASS_SIZES, histograms, labels_from_class_sizes, partition_table,
                            skew_partition, write_histograms)

    if (a.dataset is None) == (a.class_sizes is None):
        raise SystemExit("lpdl partition: give exactly one of --dataset or --class-sizes")
    if a.dataset is not None:
        sizes = KNOWN_CLASS_SIZES[a.dataset]
    else:
        try:
            sizes = tuple(int(s) for s in a.class_sizes.split(","))
        except ValueError:
            raise SystemExit(f"lpdl partition: --class-sizes must be comma-separated integers, "
                             f"got {a.class_sizes!r}") from None
    labels = labels_from_class_sizes(sizes)
    parts = skew_partition(labels, a.nodes, a.skew, seed=a.seed)
    hist = histograms(parts, labels, num_classes=len(sizes))
    print(f"skew partition: {a.nodes} nodes, skew {a.skew}, seed {a.seed}, "
          f"{len(sizes)} classes, {len(labels)} samples")
    print(partition_table(hist, unused=int(len(labels) - hist.sum())))
    if a.out:
        fmt = a.format or ("json" if a.out.endswith(".json") else "csv")
        write_histograms(hist, a.out, fmt=fmt)
        print(f"wrote {a.out}")
    return 0


def _cmd_demo(a: argparse.Namespace) -> int:
    from tqdm import tqdm

    from .demo import DEFAULT_RUNS, format_table, run_demo

    total = len(DEFAULT_RUNS) * a.epochs
    with tqdm(total=total, unit="epoch", file=sys.stderr, disable=a.quiet) as bar:
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

    from .bench import bench_step

    res = bench_step(model=a.model, nodes=a.nodes, batch=a.batch, steps=a.steps, warmup=a.warmup,
                     executor=a.executor, device=a.device, dataset=a.dataset,
                     precisions=tuple(a.precisions.split(",")))
    text = json.dumps(res, indent=2)
    print(text)
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(text + "\n")
    return 0


def _cmd_models(a: argparse.Namespace) -> int:
    from .models.registry import format_model_table, model_table

    print(format_model_table(model_table()))
    return 0


def _fidelity(pairs: list[str]):
    from dataclasses import fields

    from .runcell import Fidelity

    kw = {}
    names = {f.name: f.type for f in fields(Fidelity)}
    for pair in pairs or []:
        key, _, val = pair.partition("=")
        if key not in names:
            raise ValueError(f"unknown fidelity option {key!r}; valid: {', '.join(names)}")
        kw[key] = val.lower() in ("1", "true", "yes") if names[key] in (bool, "bool") else val
    return Fidelity(**kw)


def _cmd_train(a: argparse.Namespace) -> int:
    import time

    from .cells import cells_by_id, load_cells
    from .runcell import run_cell

    cells = cells_by_id(load_cells(a.paper_dir))
    if a.cell not in cells:
        raise ValueError(f"unknown cell {a.cell!r} (see `lpdl cells`)")
    t0 = time.time()

    # in a terminal: a progress bar over epochs; always: one log line per epoch with an ETA
    bar = None
    if sys.stderr.isatty():
        from tqdm import tqdm
        bar = tqdm(total=None, unit="epoch", desc=a.cell, file=sys.stderr, leave=False)
    say = (lambda line: bar.write(line)) if bar is not None else (lambda line: print(line, flush=True))

    def progress(ev: dict) -> None:
        if ev["event"] == "resumed":
            say(f"[{a.cell}] resuming at epoch {ev['epoch']}/{ev['epochs']}")
            if bar is not None:
                bar.reset(total=ev["epochs"])
                bar.update(ev["epoch"])
        elif ev["event"] == "epoch":
            done = ev["epoch"] + 1
            eta = (time.time() - t0) / max(done, 1) * (ev["epochs"] - done)
            say(f"[{a.cell}] epoch {done}/{ev['epochs']} lr {ev['lr']:.4g} loss {ev['train_loss']:.4f} "
                f"acc {ev['mean_acc']:.2f} avg-model {ev['avg_model_acc']:.2f} "
                f"consensus {ev['consensus_distance']:.3g} eta {eta:.0f}s")
            if bar is not None:
                bar.total = ev["epochs"]
                bar.set_postfix(loss=f"{ev['train_loss']:.3f}", acc=f"{ev['mean_acc']:.1f}")
                bar.update(done - bar.n)

    try:
        m = run_cell(cells[a.cell], a.out, a.profile, seed=a.seed, fidelity=_fidelity(a.fidelity),
                     device=a.device, executor=a.executor, data_root=a.data_root, progress=progress)
    finally:
        if bar is not None:
            bar.close()
    f = m["final"]
    print(f"[{a.cell}] {m['status']}: mean node acc {f['mean_acc']:.2f} avg-model {f['avg_model_acc']:.2f} "
          f"({m['wall_time_s']:.1f}s) -> {a.out}", flush=True)
    return 0


def _cmd_cells(a: argparse.Namespace) -> int:
    from .cells import load_cells

    for c in load_cells(a.paper_dir, tables=a.table or None):
        print(c.cell_id)
    return 0


def _cmd_report(a: argparse.Namespace) -> int:
    from .report.build import build_report, main_json

    results = Path(a.results)
    if not (results / "runs").is_dir():
        raise ValueError(f"{results} has no runs/ folder (expected results/<profile>/runs/<cell>/seed<n>/)")
    r = build_report(results, a.out, paper_dir=a.paper_dir, tables=a.table or None,
                     seeds=a.seed or None, pdf=not a.no_pdf)
    print(main_json(r))
    return 0


def build_parser() -> argparse.ArgumentParser:
    from .engine.executors import EXECUTORS
    from .partition import KNOWN_CLASS_SIZES
    from .topology import GRAPHS

    p = argparse.ArgumentParser(prog="lpdl", description="Low precision decentralized training "
                                "(Aketi, Kodge, Roy 2021): core tools")
    sub = p.add_subparsers(dest="command", required=True)

    t = sub.add_parser("topology", help="print a graph's mixing matrix W, neighbours and SLEM")
    t.add_argument("--graph", choices=GRAPHS, default="directed-ring")
    t.add_argument("--nodes", type=int, default=8)
    t.add_argument("--rows", type=int, default=None, help="torus rows (default: squarest)")
    t.add_argument("--seed", type=int, default=0, help="random-directed graph seed")
    t.add_argument("--t", type=int, default=0, help="iteration (time-varying graphs)")
    t.set_defaults(func=_cmd_topology)

    q = sub.add_parser("partition", help="print the paper's skew partition per node")
    q.add_argument("--dataset", choices=sorted(KNOWN_CLASS_SIZES))
    q.add_argument("--class-sizes", help="comma-separated class sizes, e.g. 5000,5000,...")
    q.add_argument("--nodes", type=int, default=8)
    q.add_argument("--skew", type=float, default=0.8)
    q.add_argument("--seed", type=int, default=1234, help="partition seed (official: 1234)")
    q.add_argument("--out", help="write the histogram table to this .csv or .json file")
    q.add_argument("--format", choices=("csv", "json"))
    q.set_defaults(func=_cmd_partition)

    d = sub.add_parser("demo", help="DS vs CHOCO at 0%% and 99%% compression on embedded digits")
    d.add_argument("--epochs", type=int, default=20)
    d.add_argument("--nodes", type=int, default=8)
    d.add_argument("--skew", type=float, default=0.8)
    d.add_argument("--graph", choices=GRAPHS, default="directed-ring")
    d.add_argument("--executor", choices=EXECUTORS, default="loop")
    d.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    d.add_argument("--quiet", action="store_true", help="no progress bar")
    d.set_defaults(func=_cmd_demo)

    b = sub.add_parser("bench", help="FP vs 8-bit step time of the n-node simulator (JSON)")
    b.add_argument("--model", default="resnet20")
    b.add_argument("--dataset", choices=("cifar", "imagenette"), default="cifar")
    b.add_argument("--nodes", type=int, default=8)
    b.add_argument("--batch", type=int, default=32, help="batch per node")
    b.add_argument("--steps", type=int, default=10)
    b.add_argument("--warmup", type=int, default=2)
    b.add_argument("--executor", choices=EXECUTORS, default="loop")
    b.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    b.add_argument("--precisions", default="fp,lp", help="comma-separated: fp,lp")
    b.add_argument("--out", help="also write the JSON here")
    b.set_defaults(func=_cmd_bench)

    tr = sub.add_parser("train", help="run one paper cell (resumes from its checkpoint; skips if done)")
    tr.add_argument("--cell", required=True, help="cell id, see `lpdl cells`")
    tr.add_argument("--profile", choices=("mini", "paper"), default="mini")
    tr.add_argument("--out", required=True, help="run folder (metrics.json, curve.csv, partition.csv)")
    tr.add_argument("--seed", type=int, default=None, help="default: the cell's seed (1234)")
    tr.add_argument("--paper-dir", default="workflow/paper")
    tr.add_argument("--data-root", default=None, help="default: $LPDL_DATA or ./data")
    tr.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    tr.add_argument("--executor", choices=EXECUTORS, default="loop")
    tr.add_argument("--fidelity", nargs="*", default=[], metavar="KEY=VALUE",
                    help="official-code behaviours, e.g. official_quant=true choco_form=code")
    tr.set_defaults(func=_cmd_train)

    ce = sub.add_parser("cells", help="list the paper's cells (one training run each)")
    ce.add_argument("--paper-dir", default="workflow/paper")
    ce.add_argument("--table", action="append", help="table1..table5, fig1 (repeatable)")
    ce.set_defaults(func=_cmd_cells)

    r = sub.add_parser("report", help="HTML + LaTeX/PDF report of a results folder beside the paper")
    r.add_argument("--results", default="results/mini", help="results/<profile> folder")
    r.add_argument("--out", default="report", help="output folder (report.html, report.tex, ...)")
    r.add_argument("--paper-dir", default="workflow/paper")
    r.add_argument("--table", action="append", help="table1..table5, fig1 (repeatable; default all)")
    r.add_argument("--seed", type=int, action="append", help="only these seeds (repeatable)")
    r.add_argument("--no-pdf", action="store_true", help="do not run latexmk")
    r.set_defaults(func=_cmd_report)

    m = sub.add_parser("models", help="every model with its FP and LP parameter counts (Table 1)")
    m.set_defaults(func=_cmd_models)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # e.g. `lpdl cells | head`
        sys.stderr.close()
        return 0
    except ValueError as e:  # configuration errors from the library: one clear line
        print(f"lpdl {args.command}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
