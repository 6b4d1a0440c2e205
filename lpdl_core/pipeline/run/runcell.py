"""A paper cell + a profile -> one concrete, resumable training run (`run_cell`), and a finished
run shared or reused by the cells whose run it is. The cell's plan: lpdl_core.pipeline.recipe.plan.
"""
from __future__ import annotations

import shutil
from dataclasses import asdict
from pathlib import Path
from typing import Callable

from ...config import PROFILES, Fidelity
from ...errors import ConfigError
from ...run_options import RunOptions
from ...training.train import train
from ..cells.cell import Cell
from ..recipe.plan import Plan, plan_cell
from ...training.group import Group
from .runlock import holds_run_folder
from .runstore import check_writable_dir  # noqa: F401  (re-exported)

@holds_run_folder  # one live run per run folder: a second one is refused (lpdl_core.pipeline.run.runlock)
def run_cell(cell: Cell, out_dir: str | Path, profile: str = "mini", *, seed: int | None = None,
             fidelity: Fidelity = Fidelity(), options: RunOptions = RunOptions(),
             progress: Callable[[dict], None] | None = None, group: Group | None = None) -> dict:
    """Run (or resume, or skip if finished) one cell; writes out_dir/{metrics.json, curve.csv,
    partition.csv}. metrics.json is written last, so its presence means the cell is complete.
    options: how it runs (device, executor, compile, data root, offline, ...: lpdl_core.run_options),
    never what it computes, so not part of the run's identity.
    With a one-process-per-node executor (distributed) this process is one of the cell's n ranks
    (`group`, joined if not given: lpdl_core.training.group); rank 0 checks and writes the run folder.

    A finished run in out_dir is returned only if it is this run (same cell, seed, profile,
    defining settings and fidelity); anything else is a RunMismatch or CorruptFile naming the
    file. Before any work, out_dir must be writable and the device available. A finished copy
    of exactly this run by this library code in out_dir/.kept is restored instead of recomputed.
    """
    from ...decentral.engine import resolve_device
    from .runstore import run_data, run_identity

    out = Path(out_dir)
    if profile not in PROFILES:
        raise ConfigError(f"profile must be one of {', '.join(PROFILES)}, got {profile!r}")
    seed = cell.seed if seed is None else seed
    identity = run_identity(cell, profile=profile, seed=seed, fidelity=fidelity,
                            data=run_data(cell, profile, options.data_root))
    group = group or Group.join(options.executor, device=options.device, timeout_s=options.dist_timeout)
    if group.distributed and group.world != cell.nodes:
        raise ConfigError(f"{cell.cell_id} has {cell.nodes} nodes but runs on {group.world} processes")

    done = group.first(lambda: finished_run(out, identity, progress))
    if done is not None:
        return done
    resolve_device(options.device)  # no CUDA: one line now, not after loading the data
    plan = plan_cell(cell, profile, seed=seed, fidelity=fidelity, data_root=options.data_root)
    split = plan.load_data(offline=options.offline)
    engine = plan.engine_cfg(options)
    ckpt = out / "checkpoint.pt"
    result = train(plan.make_model, split, topology=plan.topology, gossip=plan.gossip, optim_cfg=plan.optim,
                   engine=engine, run=plan.run, progress=progress, checkpoint=ckpt, identity=identity)
    config = run_config(cell, plan, split, options)
    if group.distributed:
        config["processes"] = group.world
    group.barrier()  # every rank has finished (and saved its last checkpoint)
    return group.first(lambda: write_run(out, result, config, split, identity))


def finished_run(out: Path, identity: dict, progress: Callable[[dict], None] | None = None) -> dict | None:
    """The finished run of this identity in out (or restored from out/.kept), or None when it
    must be computed; another run's result there is a RunMismatch, a damaged one CorruptFile.
    Checks that out is writable before saying None."""
    from .runstore import read_run_metrics, restore_kept

    if (out / "metrics.json").exists():
        return read_run_metrics(out / "metrics.json", identity)
    check_writable_dir(out, "run folder")
    source = restore_kept(out, identity)
    if source is None:
        return None
    if progress is not None:
        progress({"event": "restored", "source": str(source)})
    return read_run_metrics(out / "metrics.json", identity)


def run_config(cell: Cell, plan: Plan, split, options: RunOptions) -> dict:
    """The `config` record of a run's metrics.json: the cell, its resolved plan and how it ran."""
    return {"cell": asdict(cell), "cell_id": cell.cell_id, "profile": plan.profile, "seed": plan.run.partition_seed,
            "dataset": split.label, "model": plan.model, "mapping": list(plan.mapping),
            "fidelity": plan.fidelity.as_dict(), **options.record(),
            "gossip": asdict(plan.gossip), "optim": asdict(plan.optim), "run": asdict(plan.run)}


def write_run(out: Path, result, config: dict, split, identity: dict) -> dict:
    """Save a finished run into out (metrics.json last), keep a copy, drop its checkpoints; the
    metrics as read back."""
    from .results import save_run
    from .runstore import keep_run, read_run_metrics

    save_run(result, out, config=config, class_names=split.class_names, identity=identity)
    keep_run(out, identity)
    for path in out.glob("checkpoint*.pt*"):  # this run's, every rank's (not the set-aside ones)
        if path.name.endswith((".pt", ".pt.prev")):
            path.unlink(missing_ok=True)
    return read_run_metrics(out / "metrics.json", identity)


def share_run(cell: Cell, primary: Cell, primary_dir: str | Path, out_dir: str | Path, profile: str = "mini", *,
              seed: int | None = None, fidelity: Fidelity = Fidelity()) -> dict:
    """Record in out_dir that `cell`'s run is the finished run of `primary` in primary_dir, whose
    mini run is identical (lpdl_core.pipeline.recipe.mini.same_runs): the primary's curve, partition and metrics,
    relabelled with this cell's identity and `config.same_run_as` = the primary's id. Nothing
    is trained. Like run_cell, a finished out_dir is returned only if it is this run."""
    from ..recipe.mini import run_key
    from ...atomic import write_json
    from .runstore import ARTIFACTS, keep_run, read_run_metrics, run_identity

    out, src = Path(out_dir), Path(primary_dir)
    seed = cell.seed if seed is None else seed
    if profile != "mini" or run_key(cell, seed) != run_key(primary, seed):
        raise ConfigError(f"{cell.cell_id}: its {profile} run is not the run of {primary.cell_id}")
    identity = run_identity(cell, profile=profile, seed=seed, fidelity=fidelity)
    if (out / "metrics.json").exists():
        return read_run_metrics(out / "metrics.json", identity)
    check_writable_dir(out, "run folder")
    m = read_run_metrics(src / "metrics.json", run_identity(primary, profile=profile, seed=seed, fidelity=fidelity))
    config = dict(m["config"], cell=asdict(cell), cell_id=cell.cell_id, same_run_as=primary.cell_id)
    why = ("DS and CHOCO are both D-PSGD/SGP without compression at eta = 1"
           if {cell.algorithm, primary.algorithm} != {cell.algorithm} else "its mini run is defined by the same values")
    config["mapping"] = list(m["config"].get("mapping", [])) + [f"same run as {primary.cell_id} ({why}): computed once"]
    out.mkdir(parents=True, exist_ok=True)
    for name in ARTIFACTS[1:]:
        if (src / name).exists():
            shutil.copyfile(src / name, out / name)
    write_json(out / "metrics.json", dict(m, config=config, identity=identity))
    keep_run(out, identity)
    return read_run_metrics(out / "metrics.json", identity)


def reuse_paper_runs(cells, paper_cells, template: str, out_of, *, seed: int | None = None,
                     fidelity: Fidelity = Fidelity()) -> tuple[dict, list]:
    """Grid cells whose mini run is a paper cell's (mini.twins) and whose twin's finished run is
    in `template` (a run folder holding {cell}), each recorded in out_of(its id) as that run
    (share_run, which checks the twin's files are exactly that paper cell's run for this seed and
    fidelity): ({cell id: (paper id, metrics, source folder)}, [(cell id, why not reused)])."""
    from ...errors import CorruptFile, RunMismatch
    from ..recipe.mini import twins

    by_id = {c.cell_id: c for c in cells}
    reused, refused = {}, []
    for cid, paper in twins(cells, paper_cells).items():
        src = Path(template.replace("{cell}", paper.cell_id))
        if not (src / "metrics.json").is_file():
            continue
        try:
            m = share_run(by_id[cid], paper, src, out_of(cid), "mini", seed=seed, fidelity=fidelity)
        except (RunMismatch, CorruptFile) as e:
            refused.append((cid, f"{src}: {e}"))
            continue
        reused[cid] = (paper.cell_id, m, src)
    return reused, refused
