"""The bill before the run: the GPU-hours a paper-profile grid asks SLURM for, per table and in
total, and what each step time rests on. Torch-free; `lpdl plan` prints it.

It prices the jobs the workflow plans (lpdl_core.pipeline.workflow.jobs.plan_jobs, once per seed and
results folder) with the runtime model the train rule's SLURM request comes from
(lpdl_core.pipeline.workflow.runtime):

    expected GPU-h(job) = GPUs x (startup + sum_cells T(cell)) / 60 h      what the job should use
    asked GPU-h(job)    = GPUs x attempts x request / 60 h                   what SLURM is asked to hold

with request = min(max_runtime, startup + margin x sum_cells T(cell)) minutes and attempts the
number of such requests the estimate needs (a longer job resumes from its checkpoint on retry).
A job's GPUs are one, or one per node with the distributed executor. A job's table is its cells'
(a paper job holds one cell).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import Iterable, Mapping

from ..cells.cell import Cell
from .jobs import plan_jobs
from ...specs.executors import executor_spec
from .runtime import StepTimes, executor_of, job_runtime, startup_minutes


@dataclass(frozen=True, kw_only=True)
class JobPrice:
    name: str
    table: str
    cells: int
    gpus: int
    expected_h: float       # GPU-hours the job should use (no margin)
    asked_h: float          # GPU-hours its SLURM requests hold, over all attempts
    request_minutes: int    # the runtime of each attempt's request
    attempts: int


@dataclass(frozen=True, kw_only=True)
class Bill:
    jobs: tuple[JobPrice, ...]
    copies: int                             # seeds x results folders: each job runs this many times
    bases: Mapping[str, str]                # "model precision executor" -> what its step time rests on
    step_s: Mapping[str, float]             # the same keys -> seconds per step of the cell's nodes

    def by_table(self) -> dict[str, dict]:
        out: dict[str, dict] = defaultdict(lambda: {"jobs": 0, "cells": 0, "expected_gpu_h": 0.0, "asked_gpu_h": 0.0,
                                                    "longest_job_h": 0.0})
        for j in self.jobs:
            row = out[j.table]
            row["jobs"] += self.copies
            row["cells"] += j.cells * self.copies
            row["expected_gpu_h"] += j.expected_h * self.copies
            row["asked_gpu_h"] += j.asked_h * self.copies
            row["longest_job_h"] = max(row["longest_job_h"], j.expected_h / j.gpus)
        return dict(out)

    def total(self) -> dict:
        rows = self.by_table().values()
        return {k: sum(r[k] for r in rows) for k in ("jobs", "cells", "expected_gpu_h", "asked_gpu_h")}

    def as_dict(self) -> dict:
        return {"tables": self.by_table(), "total": self.total(), "copies": self.copies,
                "step_times": {k: {"seconds": self.step_s[k], "basis": self.bases[k]} for k in sorted(self.bases)}}

    def lines(self) -> list[str]:
        head = f"{'table':<8} {'jobs':>5} {'cells':>6} {'expected GPU-h':>15} {'asked GPU-h':>12} {'longest job h':>14}"
        out = [head]
        for t, r in sorted(self.by_table().items()):
            out.append(f"{t:<8} {r['jobs']:>5} {r['cells']:>6} {r['expected_gpu_h']:>15,.1f} "
                       f"{r['asked_gpu_h']:>12,.1f} {r['longest_job_h']:>14,.1f}")
        tot = self.total()
        out.append(f"{'total':<8} {tot['jobs']:>5} {tot['cells']:>6} {tot['expected_gpu_h']:>15,.1f} "
                   f"{tot['asked_gpu_h']:>12,.1f}")
        out.append("step times (seconds per step of a cell's nodes):")
        for k in sorted(self.bases):
            out.append(f"  {k:<42} {self.step_s[k]:>8.3f} s  {self.bases[k]}")
        return out


def price(cells: Iterable[Cell], times: StepTimes, *, executor: str, cells_per_job: str | None = None,
          margin: float = 1.5, max_minutes: int = 2880, copies: int = 1, pack_size: int = 4) -> Bill:
    """The bill of training `cells` in the paper profile's jobs, each run `copies` times
    (pack_size: the stacks of cells_per_job pack)."""
    from ..recipe.packing import pack_stacks
    from .resources import job_processes
    from .runtime import job_seconds

    pack = pack_size if cells_per_job == "pack" else 1
    cells = list(cells)
    by_id = {c.cell_id: c for c in cells}
    prices, bases, step_s = [], {}, {}
    for job in plan_jobs(cells, "paper", cells_per_job):
        job_cells = [by_id[c] for c in job.cells]
        req = job_runtime(job_cells, times, executor=executor, margin=margin,
                          max_minutes=max_minutes, pack_size=pack)
        per_node = executor_spec(executor_of(executor)).per_node_process
        gpus = job_processes(job_cells, distributed=per_node, name=job.name)
        seconds = job_seconds(job_cells, times, executor=executor, pack_size=pack)
        stacks = pack_stacks(job_cells, pack)
        for stack in stacks:
            c, k = stack[0], len(stack)
            key = (f"{c.model}@{c.dataset} {c.precision} {executor} n={c.nodes} b={c.batch_per_node}"
                   + (f" pack of {k}" if k > 1 else ""))
            step_s[key], bases[key] = times.step_basis(c, executor, k)
        prices.append(JobPrice(name=job.name, table=job_cells[0].table, cells=len(job_cells), gpus=gpus,
                               expected_h=gpus * (startup_minutes(executor, len(stacks)) + seconds / 60) / 60,
                               asked_h=gpus * req.attempts_needed * req.minutes / 60,
                               request_minutes=req.minutes, attempts=req.attempts_needed))
    return Bill(jobs=tuple(prices), copies=copies, bases=bases, step_s=step_s)
