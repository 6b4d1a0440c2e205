"""The commands that call the library directly, outside the pipeline: topology, partition, demo,
bench and models."""
from __future__ import annotations

import argparse
import logging
import sys
from pathlib import Path

from ..errors import LpdlError
from .args import out_file

log = logging.getLogger("lpdl.cli")  # one logger, shared by the package's modules


def cmd_topology(a: argparse.Namespace) -> int:
    from ..decentral.topology import Topology, describe

    topo = Topology(name=a.graph, n=a.nodes, rows=a.rows, seed=a.seed)
    print(describe(topo, t=a.t))
    return 0


def cmd_partition(a: argparse.Namespace) -> int:
    from ..decentral.partition import (
        KNOWN_CLASS_SIZES,
        histograms,
        labels_from_class_sizes,
        partition_table,
        skew_partition,
        write_histograms,
    )

    if (a.dataset is None) == (a.class_sizes is None):
        raise LpdlError("give exactly one of --dataset or --class-sizes")
    out_file(a.out)
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


def cmd_demo(a: argparse.Namespace) -> int:
    from tqdm import tqdm

    from ..training.demo import DEFAULT_RUNS, format_table, run_demo

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


def cmd_bench(a: argparse.Namespace) -> int:
    import json

    from ..training.bench import bench_step

    out_file(a.out)

    def progress(ev: dict) -> None:
        if ev["event"] == "build":
            log.info("bench: building %d %s %s nodes", a.nodes, ev["precision"], a.model)
        elif ev["event"] == "step":
            times = " ".join(f"{p} {s:.3f}s" for p, s in ev["seconds"].items())
            log.info("bench: step %d/%d%s: %s", ev["step"], ev["total"], " (warm-up)" if ev["warmup"] else "", times)

    res = bench_step(model=a.model, nodes=a.nodes, batch=a.batch, steps=a.steps, warmup=a.warmup,
                     executor=a.executor, device=a.device, dataset=a.dataset,
                     precisions=tuple(a.precisions), compression=a.compression, compile=a.compile,
                     compile_mode=a.compile_mode, pack=a.pack,
                     fused_quant=a.fused_quant, int8_arithmetic=a.int8_arithmetic, standin=a.standin,
                     progress=progress)
    text = json.dumps(res, indent=2)
    print(text)
    if a.out:
        from ..atomic import write_atomic
        write_atomic(a.out, text + "\n")
    return 0


def cmd_models(a: argparse.Namespace) -> int:
    from ..models.registry import format_model_table, model_table

    def progress(ev: dict) -> None:
        log.info("models: building %s (%d/%d)", ev["name"], ev["index"], ev["total"])

    print(format_model_table(model_table(progress=progress)))
    return 0
