"""Paper cells trained as packs (`cells_per_job: pack`; lpdl_core.training.pack): several cells in
one stacked state, each still with its own run folder, identity and result.

`run_cells_packed` takes a job's cells, returns the finished ones as they are, and trains the rest
in stacks of at most pack_size cells that can share a pack: the same plan but for seed, skew, graph,
compression and η (lpdl_core.pipeline.recipe.packing.pack_key, then the resolved plans), and the same batches
per epoch. A cell that has no partner runs on its own (`run_cell`). A stack holds all its run
folders while it trains and keeps one checkpoint, `checkpoint.pack.pt` in its first cell's folder:
a stack killed halfway resumes every cell (the checkpoint names every cell's identity, so a stack
of other cells or settings starts over). Each result records `packed_with`, the other cells of its
stack; packing is how a run is computed, not what: the run identity is the solo run's.
"""
from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Callable

from ...config import Fidelity
from ...errors import LpdlError
from ...run_options import RunOptions
from ..cells.cell import Cell
from ..recipe.packing import pack_key
from ..recipe.plan import Plan, plan_cell
from .runcell import finished_run, run_cell, run_config, write_run
from .runlock import hold_run_folder

PACK_CHECKPOINT = "checkpoint.pack.pt"


def _plan_key(plan: Plan) -> tuple:
    """What the cells of a stack share beyond their pack_key: the resolved data, model and optimizer."""
    return (plan.dataset, repr(sorted(plan.dataset_kwargs.items())), plan.model, repr(plan.optim),
            repr(plan.fidelity), plan.mapping)


def run_cells_packed(cells: list[Cell], out_of: Callable[[str], str], profile: str = "mini", *,
                     seed: int | None = None, fidelity: Fidelity = Fidelity(),
                     options: RunOptions = RunOptions(executor="batched", pack_size=4),
                     progress: Callable[[str, dict], None] | None = None) -> dict[str, dict | Exception]:
    """Every cell's metrics (or the error that stopped it), by cell id, trained in packs of at
    most options.pack_size. progress(cell_id, event)."""
    from ...decentral.engine import resolve_device
    from ...training.pack import PackedRun, batch_plan
    from .runstore import run_data, run_identity

    if options.pack_size < 1:
        raise ValueError(f"pack_size must be >= 1, got {options.pack_size}")
    report = progress or (lambda cid, ev: None)
    out: dict[str, dict | Exception] = {}
    pending: list[tuple[Cell, Plan, dict]] = []
    for cell in cells:
        ident = run_identity(cell, profile=profile, seed=cell.seed if seed is None else seed, fidelity=fidelity,
                             data=run_data(cell, profile, options.data_root))
        try:
            done = finished_run(Path(out_of(cell.cell_id)), ident, lambda ev, c=cell.cell_id: report(c, ev))
        except (LpdlError, OSError, ValueError) as e:
            out[cell.cell_id] = e
            continue
        if done is not None:
            out[cell.cell_id] = done
            continue
        try:
            pending.append((cell, plan_cell(cell, profile, seed=seed, fidelity=fidelity, data_root=options.data_root),
                            ident))
        except (LpdlError, ValueError) as e:
            out[cell.cell_id] = e
    if not pending:
        return out
    resolve_device(options.device)
    groups: dict[tuple, list] = {}
    for item in pending:
        groups.setdefault((pack_key(item[0]), _plan_key(item[1])), []).append(item)
    splits: dict[tuple, object] = {}
    for items in groups.values():
        plan0 = items[0][1]
        key = (plan0.dataset, repr(sorted(plan0.dataset_kwargs.items())))
        try:
            if key not in splits:
                splits[key] = plan0.load_data(offline=options.offline)
        except (LpdlError, OSError, ValueError) as e:  # e.g. a dataset that is not there (offline)
            out.update({item[0].cell_id: e for item in items})
            continue
        split = splits[key]
        by_batches: dict[tuple, list] = {}
        for item in items:
            by_batches.setdefault(batch_plan(split, item[1].topology, item[1].run), []).append(item)
        for same in by_batches.values():
            for i in range(0, len(same), options.pack_size):
                stack = same[i:i + options.pack_size]
                if len(stack) == 1:
                    cell = stack[0][0]
                    try:
                        out[cell.cell_id] = run_cell(
                            cell, out_of(cell.cell_id), profile, seed=seed, fidelity=fidelity, options=options,
                            progress=lambda ev, c=cell.cell_id: report(c, ev))
                    except (LpdlError, OSError, ValueError) as e:
                        out[cell.cell_id] = e
                    continue
                runs = [PackedRun(topology=p.topology, gossip=p.gossip, run=p.run, identity=ident)
                        for _, p, ident in stack]
                try:
                    out.update(_train_stack(stack, runs, split, out_of, options, report=report))
                except (LpdlError, OSError, ValueError) as e:
                    out.update({c.cell_id: e for c, _, _ in stack})
    return out


def _train_stack(stack, runs, split, out_of, options: RunOptions, *, report) -> dict[str, dict]:
    from ...training.pack import train_pack

    ids = [c.cell_id for c, _, _ in stack]
    dirs = [Path(out_of(c)) for c in ids]
    with ExitStack() as held:
        for d in dirs:  # one live run per run folder (lpdl_core.pipeline.run.runlock)
            held.enter_context(hold_run_folder(d))
            d.mkdir(parents=True, exist_ok=True)
        engine = stack[0][1].engine_cfg(options)

        def progress(ev: dict) -> None:
            if "cell" in ev:
                report(ids[ev["cell"]], ev)
            else:
                for cid in ids:
                    report(cid, dict(ev, pack=ids))

        results = train_pack(stack[0][1].make_model, split, runs, optim_cfg=stack[0][1].optim, engine=engine,
                             progress=progress, checkpoint=dirs[0] / PACK_CHECKPOINT)
        done = {}
        # the first cell's folder last: writing it drops the pack's checkpoint, which resumes the others
        for k in [*range(1, len(stack)), 0]:
            (cell, plan, ident), res, d = stack[k], results[k], dirs[k]
            config = run_config(cell, plan, split, options)
            config["packed_with"] = [c for c in ids if c != cell.cell_id]
            done[cell.cell_id] = write_run(d, res, config, split, ident)
    return done
