"""`lpdl train`: one or several paper cells in one process, each in its own run folder; with
--executor distributed, one process per node (started under torchrun when run by hand)."""
from __future__ import annotations

import argparse
import logging
import sys

from ..errors import LpdlError
from ..specs.executors import executor_spec

log = logging.getLogger("lpdl.cli")  # one logger, shared by the package's modules


def fidelity_of(a: argparse.Namespace):
    """The run's Fidelity: from --fidelity-json (typed JSON values, as the workflow passes them) or
    from --fidelity KEY=VALUE strings (each value spelled exactly as one of the allowed ones)."""
    import json

    from ..config import Fidelity

    if a.fidelity_json is None:
        return Fidelity.from_pairs(a.fidelity)
    try:
        values = json.loads(a.fidelity_json)
    except json.JSONDecodeError as e:
        raise LpdlError(f"--fidelity-json: not JSON ({e.msg} at character {e.pos})") from None
    if not isinstance(values, (dict, str)):
        raise LpdlError(f"--fidelity-json: expected a JSON object or a preset name, got {type(values).__name__}")
    return Fidelity.from_mapping(values)


def run_options(a: argparse.Namespace):
    """How the runs are computed, from `lpdl train`'s flags (lpdl_core.run_options)."""
    from ..run_options import RunOptions

    return RunOptions(device=a.device, executor=a.executor, compile=a.compile, compile_mode=a.compile_mode,
                      fused_quant=a.fused_quant, pack_size=a.pack_size, data_root=a.data_root, offline=a.offline,
                      dist_timeout=a.dist_timeout)


def cmd_train(a: argparse.Namespace) -> int:
    """One cell, or several in one process (a Snakemake bundle: the torch import and data load
    are paid once). Each cell keeps its own run folder, checkpoint and resume. In the mini
    profile a cell whose run is identical to an earlier listed cell's is not trained again
    (lpdl_core.pipeline.recipe.mini.same_runs). A failing cell does not stop the others; the exit status is 1
    if any failed."""
    import os

    from ..pipeline.cells.tables import cells_by_id, load_cells
    from ..pipeline.recipe.mini import same_runs

    if a.offline:  # before anything imports huggingface_hub (it reads these once, at import)
        from ..pipeline.workflow.prefetch import OFFLINE_ENV
        os.environ.update(OFFLINE_ENV)
    if a.grid:
        from ..pipeline.cells.grids import load_grid

        cells = cells_by_id(load_grid(a.grid).cells)
    else:
        cells = cells_by_id(load_cells(a.paper_dir))
    unknown = [c for c in a.cell if c not in cells]
    if unknown:
        where = f"grid {a.grid}" if a.grid else "the paper"
        raise LpdlError(f"unknown cell {unknown[0]!r} of {where} "
                        f"(see `lpdl cells{' --grid ' + a.grid if a.grid else ''}`)")
    if len(set(a.cell)) > 1 and "{cell}" not in a.out:
        raise LpdlError("--out must contain {cell} when several --cell are given "
                        "(e.g. results/mini/runs/{cell}/seed1234)")
    from ..compat import incompatible

    fidelity, options = fidelity_of(a), run_options(a)
    why = incompatible(options, rng_streams=fidelity.rng_streams)
    if why:  # before any process starts or anything is written
        raise LpdlError(why)
    todo = [cells[c] for c in dict.fromkeys(a.cell)]
    shared = same_runs(todo) if a.profile == "mini" else {}
    out_of = lambda cid: a.out.replace("{cell}", cid)  # noqa: E731
    from ..training.group import in_group

    if a.reuse_runs and not in_group():  # this process, or the launcher: the ranks find them finished
        reused = _reuse_paper_runs(a, [c for c in todo if c.cell_id not in shared], out_of, fidelity)
        todo = [c for c in todo if c.cell_id not in reused]
        if not todo:
            return 0
    group = None
    if executor_spec(options.executor).per_node_process:
        from ..training.group import Group
        from .launch import die_with_torchrun

        if not in_group():
            from .launch import launch_ranks

            return launch_ranks(a, todo)
        die_with_torchrun()  # no rank outlives its torchrun (nor, so, the `lpdl train` that started it)
        group = Group.join(options.executor, device=options.device, timeout_s=options.dist_timeout)
        if group.rank != 0:  # rank 0 speaks for the run
            log.setLevel(max(log.level, logging.WARNING))
    failed, total = [], len(todo)
    if options.packed:  # (not distributed: lpdl_core.compat refused that above)
        failed = _train_packed(a, [c for c in todo if c.cell_id not in shared], out_of, fidelity, options)
        todo = [c for c in todo if c.cell_id in shared]
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
                _train_one(a, cell, out_of(cell.cell_id), fidelity, options, group)
        except (LpdlError, ValueError, OSError) as e:
            if total == 1 or group is not None:  # a rank cannot go on alone: the job fails
                raise
            failed.append(cell.cell_id)
            print(f"lpdl train: error: [{cell.cell_id}] {e}", file=sys.stderr, flush=True)
    if group is not None:
        group.leave()
    if failed:
        print(f"lpdl train: error: {len(failed)} of {total} cells failed: {', '.join(failed)}",
              file=sys.stderr, flush=True)
        return 1
    return 0


def _train_packed(a: argparse.Namespace, cells, out_of, fidelity, options) -> list[str]:
    """The cells in packs of at most --pack-size (lpdl_core.pipeline.run.runpack); the ids that failed."""
    import time

    from ..pipeline.run.runpack import run_cells_packed

    t0 = time.time()

    def progress(cid: str, ev: dict) -> None:
        if ev["event"] == "restored":
            log.info(f"[{cid}] restored the finished result of exactly these settings and this code "
                     f"from {ev['source']}")
        elif ev["event"] == "checkpoint-set-aside":
            log.warning(f"[{cid}] {ev['path']} cannot be used ({ev['reason']}); moved it to {ev['moved_to']}")
        elif ev["event"] == "diverged":
            log.warning(f"[{cid}] diverged at epoch {ev['epoch']} iteration {ev['iteration']} (its pack goes on)")
        elif "pack" in ev and cid == ev["pack"][0]:  # a pack's own events: once per pack
            if ev["event"] == "resumed":
                log.info(f"[pack of {len(ev['pack'])}: {', '.join(ev['pack'])}] "
                         f"resuming at epoch {ev['epoch']}/{ev['epochs']}")
            elif ev["event"] == "epoch":
                accs = " ".join("-" if x is None else f"{x:.2f}" for x in ev["mean_acc"])
                log.info(f"[pack of {len(ev['pack'])}: {ev['pack'][0]}, ...] epoch {ev['epoch'] + 1}/{ev['epochs']} "
                         f"acc {accs} ({time.time() - t0:.0f}s)")

    results = run_cells_packed(cells, out_of, a.profile, seed=a.seed, fidelity=fidelity, options=options,
                               progress=progress)
    failed = []
    for cell in cells:
        m, out = results[cell.cell_id], out_of(cell.cell_id)
        if isinstance(m, Exception):
            failed.append(cell.cell_id)
            print(f"lpdl train: error: [{cell.cell_id}] {m}", file=sys.stderr, flush=True)
            continue
        packed = m["config"].get("packed_with")
        how = f", packed with {len(packed)} other cell{'s' if len(packed) > 1 else ''}" if packed else ""
        if m["status"] == "ok":
            print(f"[{cell.cell_id}] ok: mean node acc {m['final']['mean_acc']:.2f} "
                  f"avg-model {m['final']['avg_model_acc']:.2f} ({m['wall_time_s']:.1f}s{how}) -> {out}", flush=True)
        else:
            print(f"[{cell.cell_id}] {m['status']} at {m.get('diverged_at')} ({m['wall_time_s']:.1f}s{how}) -> {out}",
                  flush=True)
    return failed


def _reuse_paper_runs(a: argparse.Namespace, cells, out_of, fidelity) -> set[str]:
    """The grid cells (--grid) recorded as their paper twin's finished run from --reuse-runs
    (lpdl_core.pipeline.run.runcell.reuse_paper_runs); the others are left to be trained."""
    from ..pipeline.cells.tables import load_cells
    from ..pipeline.run.runcell import reuse_paper_runs

    if not a.grid or a.profile != "mini":
        raise LpdlError("--reuse-runs: only grid cells (--grid) of the mini profile reuse the paper's runs")
    if "{cell}" not in a.reuse_runs:
        raise LpdlError("--reuse-runs must contain {cell} (e.g. results/mini/runs/{cell}/seed1234)")
    reused, refused = reuse_paper_runs(cells, load_cells(a.paper_dir), a.reuse_runs, out_of, seed=a.seed,
                                       fidelity=fidelity)
    for cid, why in refused:
        log.warning(f"[{cid}] not reusing {why}; training the cell")
    for cid, (paper, m, src) in reused.items():
        print(f"[{cid}] same run as the paper's {paper}: mean node acc {m['final']['mean_acc']:.2f} "
              f"(reused from {src}) -> {out_of(cid)}", flush=True)
    return set(reused)


def _share_one(a: argparse.Namespace, cell, primary, out_of, fidelity) -> None:
    from ..pipeline.run.runcell import share_run

    m = share_run(cell, primary, out_of(primary.cell_id), out_of(cell.cell_id), a.profile, seed=a.seed,
                  fidelity=fidelity)
    print(f"[{cell.cell_id}] same run as {primary.cell_id}: mean node acc {m['final']['mean_acc']:.2f} "
          f"(computed once) -> {out_of(cell.cell_id)}", flush=True)


def _train_one(a: argparse.Namespace, cell, out: str, fidelity, options, group=None) -> None:
    import time
    from contextlib import nullcontext

    from ..pipeline.run.runcell import run_cell

    t0 = time.time()
    name = cell.cell_id
    log.debug("[%s] profile %s, seed %s, %s, fidelity %s -> %s", name, a.profile,
              a.seed if a.seed is not None else "the cell's", options, fidelity, out)
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
            m = run_cell(cell, out, a.profile, seed=a.seed, fidelity=fidelity, options=options, progress=progress,
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
