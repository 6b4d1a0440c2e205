"""The pipeline's commands besides train: prefetch, cells, report, aggregate, cost,
partition-figures, timing, targets and unlock."""
from __future__ import annotations

import argparse
import logging
from pathlib import Path

from ..errors import ConfigError, LpdlError
from .args import out_file
from .train import fidelity_of

log = logging.getLogger("lpdl.cli")  # one logger, shared by the package's modules


def cmd_prefetch(a: argparse.Namespace) -> int:
    """Fetch and verify what the cells' runs load (lpdl_core.pipeline.workflow.prefetch); the manifest on stdout."""
    import json

    from ..config import Fidelity
    from ..pipeline.cells.tables import load_cells
    from ..pipeline.workflow.prefetch import prefetch, prefetch_request, write_manifest

    out_file(a.out, "manifest")
    fidelities = [fidelity_of(argparse.Namespace(fidelity_json=text, fidelity=[])) for text in a.fidelity_json or ()]
    fidelities = fidelities or [Fidelity()]
    manifest = prefetch(load_cells(a.paper_dir, tables=a.table or None), a.profile,
                        fidelities=fidelities, data_root=a.data_root)
    # what was asked (the workflow verifies again only when this changes)
    manifest["request"] = prefetch_request(profile=a.profile, tables=a.table, paper_dir=a.paper_dir,
                                           data_root=a.data_root, fidelities=[f.as_dict() for f in fidelities])
    log.info("prefetch: %s", manifest["summary"])
    if a.out:
        write_manifest(manifest, a.out)
    print(json.dumps(manifest, indent=2, sort_keys=True))
    return 0


def cmd_cells(a: argparse.Namespace) -> int:
    from ..pipeline.cells.tables import load_cells

    if a.grid:
        from ..pipeline.cells.grids import load_grid

        if a.table:
            raise ConfigError("--grid lists a grid's cells; --table selects the paper's: give one of them")
        cells = load_grid(a.grid).cells
    else:
        cells = load_cells(a.paper_dir, tables=a.table or None)
    for c in cells:
        print(c.cell_id)
    return 0


def cmd_report(a: argparse.Namespace) -> int:
    """The report from what the aggregate, cost and partitions steps wrote under --results."""
    from ..pipeline.run.runstore import check_writable_dir
    from ..pipeline.aggregation.tidy import RUNS_FILE
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


def cmd_aggregate(a: argparse.Namespace) -> int:
    """runs/ -> runs.csv, curves.csv, tables/{table}.csv and tables/{table}-paper.csv."""
    from ..config import TABLES
    from ..pipeline.aggregation.aggregate import write_aggregate
    from ..pipeline.cells.tables import load_cells
    from ..pipeline.run.runstore import check_writable_dir

    results = Path(a.results)
    if not (results / "runs").is_dir():
        raise LpdlError(f"{results} has no runs/ folder (expected results/<profile>/runs/<cell>/seed<n>/)")
    check_writable_dir(results / "tables", "tables folder")
    tables = a.table or list(TABLES)
    written = write_aggregate(results, load_cells(a.paper_dir, tables=tables), profile=a.profile or results.name,
                              tables=tables, seeds=a.seed or None,
                              warn=lambda line: log.warning("aggregate: damaged run, shown as such: %s", line))
    for path in written.values():
        print(path)
    return 0


def cmd_cost(a: argparse.Namespace) -> int:
    """Figure 3's cost model (and measured peak CUDA memory on a GPU) as JSON."""
    import json

    from ..training.cost import figure3_cost

    out_file(a.out)
    text = json.dumps(figure3_cost(device=a.device), indent=1)
    if a.out:
        from ..atomic import write_atomic
        write_atomic(a.out, text + "\n")
    print(text)
    return 0


def cmd_partition_figures(a: argparse.Namespace) -> int:
    """Figures 2, 5-7's per-node class counts as CSV."""
    from ..pipeline.aggregation.paper_partitions import partition_figures_frame
    from ..pipeline.aggregation.tidy import write_frame

    out_file(a.out)
    df = partition_figures_frame()
    if a.out:
        write_frame(df, a.out)
        print(a.out)
    else:
        print(df.to_csv(index=False), end="")
    return 0


def cmd_timing(a: argparse.Namespace) -> int:
    import json

    from ..pipeline.aggregation.timing import pipeline_timing
    from ..pipeline.cells.grids import available, grid_of_folder, load_grid
    from ..pipeline.cells.tables import load_cells
    from ..pipeline.workflow.jobs import run_plan

    results = Path(a.results)
    # results/<profile>[-official][-<grid>]: an extension grid's folder times the grid's jobs
    profile = a.profile or results.name.split("-")[0]
    out_file(a.out)
    grid = grid_of_folder(results.name, profile, available())
    cells = load_grid(grid).cells if grid else load_cells(a.paper_dir)
    t = pipeline_timing(results, run_plan(results, cells, profile, a.cells_per_job), cells, seeds=a.seed)
    text = json.dumps(t, indent=2)
    if a.out:
        from ..atomic import write_atomic
        write_atomic(a.out, text + "\n")
    print(text)
    return 0


def cmd_targets(a: argparse.Namespace) -> int:
    import json
    from dataclasses import asdict

    from ..config import LEARNED_MARGIN
    from ..pipeline.cells.tables import load_cells
    from ..pipeline.aggregation.targets import check_targets, format_checks, not_learned
    from ..pipeline.aggregation.tidy import seeds_present

    results = Path(a.results)
    out_file(a.out)
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
        from ..atomic import write_atomic
        write_atomic(a.out, json.dumps({"seeds": seeds, "checks": [asdict(c) for c in checks],
                                        "did_not_learn": flat}, indent=2) + "\n")
    return 0 if all(c.ok for c in checks) else 1


def cmd_unlock(a: argparse.Namespace) -> int:
    from ..pipeline.workflow.snakelock import unlock_if_stale

    print(f"lpdl unlock: {unlock_if_stale(a.directory)}")
    return 0


def workflow_config(a: argparse.Namespace):
    """(config, working directory, cells) of `snakemake [--directory D] [--configfile F] [--config K=V]`:
    the config resolved as Snakemake resolves it; its relative paths start in the working directory."""
    from ..pipeline.cells.tables import load_cells
    from ..pipeline.workflow.wfconfig import load

    cfg = load(a.directory, a.configfile or (), [pair for group in a.config or () for pair in group])
    root = Path(a.directory)
    return cfg, root, load_cells(root / cfg["paper_dir"] if cfg["paper_dir"] else None, tables=cfg["tables"])


def cmd_plan(a: argparse.Namespace) -> int:
    """The paper profile's GPU-hour bill for the workflow's config (read as Snakemake reads it)."""
    import json

    from ..pipeline.workflow.bill import price
    from ..atomic import write_atomic
    from ..pipeline.workflow.runtime import StepTimes, step_kind
    from ..pipeline.workflow.wfconfig import modes

    out_file(a.out)
    cfg, root, cells = workflow_config(a)
    copies = len(cfg["seeds"]) * len(modes(cfg))
    if cfg["profile"] != "paper":
        print(f"lpdl plan: the {cfg['profile']} profile trains on this machine's CPUs and asks for no GPU "
              f"({len(cells)} cells x {copies} seed/mode copies); "
              "give --configfile config/paper.yaml for the cluster bill")
        return 0
    times = StepTimes.load(root / cfg["step_times"])
    kind = step_kind(cfg["executor"], cfg.get("compile", False))
    bill = price(cells, times, executor=kind, cells_per_job=cfg.get("cells_per_job"),
                 margin=cfg["runtime_margin"], max_minutes=cfg["max_runtime"], copies=copies,
                 pack_size=cfg.get("pack_size", 4))
    per = cfg.get("cells_per_job") or "cell"
    packing = f" (pack_size {cfg.get('pack_size', 4)})" if per == "pack" else ""
    print(f"lpdl plan: {len(cells)} cells x {len(cfg['seeds'])} seed(s) x {len(modes(cfg))} results folder(s), "
          f"executor {kind}, cells_per_job {per}{packing}, margin "
          f"{cfg['runtime_margin']}, max_runtime {cfg['max_runtime']} min; step times from {cfg['step_times']}")
    for line in bill.lines():
        print(line)
    for k, v in (times.provenance or {}).items():
        print(f"  {k}: {v}")
    out = bill.as_dict()
    if cfg.get("extensions"):  # each extension grid's bill, apart (one results folder, the config's mode)
        from ..pipeline.cells.grids import grid_folder, load_grid

        out["grids"], main_folder = {}, next(iter(modes(cfg)))
        for name in dict.fromkeys(cfg["extensions"]):
            grid = load_grid(name, root)
            gb = price(grid.cells, times, executor=kind, cells_per_job=cfg.get("cells_per_job"),
                       margin=cfg["runtime_margin"], max_minutes=cfg["max_runtime"], copies=len(cfg["seeds"]),
                       pack_size=cfg.get("pack_size", 4))
            print(f"lpdl plan: extension grid {name}: {len(grid.cells)} cells x {len(cfg['seeds'])} seed(s), "
                  f"into results/{grid_folder(main_folder, name)}/")
            for line in gb.lines():
                print(line)
            out["grids"][name] = gb.as_dict()
    if a.out:
        write_atomic(a.out, json.dumps(out, indent=1, sort_keys=True) + "\n")
    return 0


def cmd_status(a: argparse.Namespace) -> int:
    """Whether the run folders, runs.csv and the report match the workflow's config (read as
    Snakemake reads it); exit 0 when everything the config names is current, 1 otherwise."""
    from ..pipeline.cells.grids import load_grid
    from ..pipeline.workflow.status import config_status

    cfg, root, cells = workflow_config(a)
    grids = {name: load_grid(name, root).cells for name in dict.fromkeys(cfg.get("extensions") or ())}
    current = True
    for st in config_status(cfg, cells, grids, root):
        for line in st.lines(limit=None if a.all else 20):
            print(line)
        current &= st.current
    if not current:
        log.info("status: not everything is current; `snakemake` (with the same --configfile/--config) "
                 "brings it up to date")
    return 0 if current else 1
