"""Which cells run together in one training job (one process). Torch-free: Snakemake plans with it.

A job's fixed cost (starting Python, importing torch, loading the data: about 3 s here) is larger
than a whole mini cell's training, so the mini profile runs a block's cells of one precision in
one process (`cells_per_job: block`). Each cell still has its own run folder, checkpoint, resume
and identity check; a cell whose mini run is another cell's (lpdl_core.pipeline.recipe.mini.same_runs) joins that
cell's job and is recorded as the same run, not trained twice. The paper profile runs one cell
per job (`cells_per_job: cell`): its cells take hours, and a cluster schedules each on its own.
`cells_per_job: pack` trains the cells of a job that can share one stacked state together,
`pack_size` at a time (lpdl_core.training.pack; lpdl_core.pipeline.recipe.packing.pack_stacks is
how the planner counts those stacks). In the paper profile its jobs are the block jobs (fewer,
longer SLURM jobs); in the mini profile, which runs on one machine, each block job is split into
one job per pack group (cells of one `pack_key`: their stacks never mix with another group's), so
that the groups run side by side on its cores.
"""
from __future__ import annotations

import itertools
import re
from pathlib import Path
from dataclasses import dataclass

from ...config import CELLS_PER_JOB
from ..recipe.packing import pack_key


@dataclass(frozen=True)
class Job:
    name: str                   # the job's log and benchmark folder, e.g. "table2-resnet20-dring8-fp32"
    cells: tuple[str, ...]      # cell ids, primaries before the cells that share their run
    shares: tuple[tuple[str, str], ...] = ()  # (cell, primary): cells recorded as a primary's run

    @property
    def rule(self) -> str:
        """The Snakemake rule name: "train_" + the name as an identifier."""
        return "train_" + re.sub(r"[^0-9a-zA-Z]+", "_", self.name).strip("_")


def default_cells_per_job(profile: str) -> str:
    return "block" if profile == "mini" else "cell"


def _pack_job_name(block_job: str, cell, taken: set[str]) -> str:
    """A readable name for a pack group's job: the block job's, its algorithm (and -qgm); for a grid
    (whose one block mixes node counts and lengths) also its nodes and length; then a number where
    two groups would share it."""
    name = f"{block_job}-{cell.algorithm}" + ("-qgm" if cell.momentum == "qgm" else "")
    if cell.block == cell.table:  # a grid's cells (the block job's name holds the length)
        name += f"-n{cell.nodes}"
    return name if name not in taken else next(f"{name}-{i}" for i in itertools.count(2) if f"{name}-{i}" not in taken)


def plan_jobs(cells, profile: str, cells_per_job: str | None = None) -> list[Job]:
    """The training jobs for `cells` (lpdl_core.pipeline.cells.cell.Cell, in paper order)."""
    from ..recipe.mini import same_runs

    per = cells_per_job or default_cells_per_job(profile)
    if per not in CELLS_PER_JOB:
        raise ValueError(f"cells_per_job must be one of {', '.join(CELLS_PER_JOB)}, got {per!r}")
    if per == "cell":  # ("pack" makes the block jobs)
        return [Job(name=c.cell_id, cells=(c.cell_id,)) for c in cells]
    shared = same_runs(cells) if profile == "mini" else {}
    by_id = {c.cell_id: c for c in cells}
    split = per == "pack" and profile == "mini"  # one machine: a block's pack groups run side by side
    groups: dict[str, list[str]] = {}
    pack_names: dict[tuple, str] = {}
    for c in cells:
        home = by_id[shared.get(c.cell_id, c.cell_id)]
        # a grid's cells are one block named as the grid: a job per precision and length instead
        name = f"{home.table}-{home.block}-{home.precision}" if home.block != home.table else \
            f"{home.table}-{home.precision}" + (f"-len{home.mini_epochs}" if home.mini_epochs else "")
        if split:
            key = (name, pack_key(home))
            if key not in pack_names:
                pack_names[key] = _pack_job_name(name, home, set(pack_names.values()))
            name = pack_names[key]
        groups.setdefault(name, []).append(c.cell_id)
    jobs = []
    for name, ids in groups.items():
        primaries = [i for i in ids if i not in shared]
        followers = [i for i in ids if i in shared]
        jobs.append(Job(name=name, cells=tuple(primaries + followers),
                        shares=tuple((i, shared[i]) for i in followers)))
    return jobs


def run_plan(results: Path, cells, profile: str, cells_per_job: str | None = None) -> list:
    """The jobs the run of `cells` into `results` had: planned with `cells_per_job`, or, not given,
    with the grouping (the profile's default first, then each of CELLS_PER_JOB) whose job
    names the most benchmark folders under results/benchmarks/train/ carry, since a config may
    have set any of them."""
    if cells_per_job:
        return plan_jobs(cells, profile, cells_per_job)
    plans = [plan_jobs(cells, profile, c) for c in (None, *CELLS_PER_JOB)]
    folder = Path(results) / "benchmarks" / "train"
    return max(plans, key=lambda jobs: sum((folder / j.name).is_dir() for j in jobs))
