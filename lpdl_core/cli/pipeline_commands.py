"""The pipeline's commands besides train: prefetch, cells, report, aggregate, cost,
partition-figures, timing, targets and unlock."""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

from ..errors import LpdlError
from .args import _out_file
from .train import _fidelity

log = logging.getLogger("lpdl.cli")  # one logger, shared by the package's modules


def _cmd_prefetch(a: argparse.Namespace) -> int:
    """Fetch and verify what the cells' runs load (lpdl_core.pipeline.prefetch); the manifest on stdout."""
    import json

    from ..config import Fidelity
    from ..pipeline.prefetch import prefetch, write_manifest
    from ..pipeline.cells import load_cells

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
    from ..pipeline.cells import load_cells

    for c in load_cells(a.paper_dir, tables=a.table or None):
        print(c.cell_id)
    return 0


def _cmd_report(a: argparse.Namespace) -> int:
    """The report from what the aggregate, cost and partitions steps wrote under --results."""
    from ..pipeline.runstore import check_writable_dir
    from ..pipeline.tidy import RUNS_FILE
    from ..report.build import build_report, main_json

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
    from ..config import TABLES
    from ..pipeline.aggregate import write_aggregate
    from ..pipeline.cells import load_cells
    from ..pipeline.runstore import check_writable_dir

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

    from ..training.cost import figure3_cost

    _out_file(a.out)
    text = json.dumps(figure3_cost(device=a.device), indent=1)
    if a.out:
        from ..pipeline.results import write_atomic
        write_atomic(a.out, text + "\n")
    print(text)
    return 0


def _cmd_partition_figures(a: argparse.Namespace) -> int:
    """Figures 2, 5-7's per-node class counts as CSV."""
    from ..pipeline.paper_partitions import partition_figures_frame
    from ..pipeline.tidy import write_frame

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

    from ..pipeline.cells import load_cells
    from ..pipeline.jobs import plan_jobs
    from ..pipeline.timing import pipeline_timing

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

    from ..config import LEARNED_MARGIN
    from ..pipeline.cells import load_cells
    from ..pipeline.targets import check_targets, format_checks, not_learned
    from ..pipeline.tidy import seeds_present

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
    from ..pipeline.snakelock import unlock_if_stale

    print(f"lpdl unlock: {unlock_if_stale(a.directory)}")
    return 0
