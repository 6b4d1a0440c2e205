"""What a training job asks its scheduler for: memory, runtime, GPUs, tasks and a priority.

Torch-free: Snakemake's train rules (workflow/rules/train.smk) call `Resources.of(job)` and keep
only the wiring; `lpdl plan` (bill.py) prices the same jobs with the same GPU count.

- **mini profile:** tiny requests, no GPU; a job's runtime is a start-up plus `MINI_CELL_MINUTES`
  per cell (1–25 s per cell measured on a 2-core machine, plus the job's start-up).
- **paper profile:** the runtime comes from measured GPU step times (`runtime.job_runtime`) with
  a margin, capped at `max_runtime` (the partition's MaxTime): a longer job is cut there and its
  retry resumes from the checkpoint, so the request never grows. Memory is by model: the dataset in
  memory plus the model's state.
- **distributed executor:** one process per node, so the job is n tasks (`srun -n n`), one GPU
  per task in the paper profile, and memory for each further process.
- **priority:** the longest jobs start first, so that the last job to finish is a short one.
"""
from __future__ import annotations

import math

from dataclasses import dataclass
from typing import Iterable, Mapping

from ...config import GPU_REQUESTS
from ...errors import ConfigError
from ...specs.executors import DEFAULT_EXECUTOR
from ...specs.models import SPECS as MODEL_SPECS
from ..cells.cell import Cell
from .jobs import Job
from .runtime import StepTimes, job_runtime

MINI_CELL_MINUTES = 2
MINI_JOB_MINUTES = 10  # a mini job's start-up and slack
MINI_MEM_MB = 3000
# host memory (MB) of a paper job by model: the dataset in memory plus the model's state
# (its spec's; not measured on a cluster)
PAPER_MEM_MB = {n: s.mem_mb for n, s in MODEL_SPECS.items()}
# each further process of a distributed job (its own torch, CUDA context and copy of the dataset);
# an estimate, not measured
EXTRA_PROCESS_MB = {"mini": 1000, "paper": 4000}
HOST_MARGIN = 1.25   # a measured peak's headroom in the request
# relative cost of one node's step by model (its spec's: the mini stand-ins' measured step times),
# and of an 8-bit step against an FP one: only the order of the jobs depends on it
STEP_COST = {n: s.step_cost for n, s in MODEL_SPECS.items()}
INT8_COST = 2.3


def job_nodes(cells: Iterable[Cell], name: str = "job") -> int:
    """The node count of a job's cells (a job's cells share one: a block's)."""
    nodes = {c.nodes for c in cells}
    if len(nodes) != 1:
        raise ConfigError(f"job {name} mixes cells of {sorted(nodes)} nodes")
    return nodes.pop()


def job_processes(cells: Iterable[Cell], *, distributed: bool, name: str = "job") -> int:
    """Processes of a job: one per node with the distributed executor, else one."""
    return job_nodes(cells, name) if distributed else 1


def job_priority(cells: Iterable[Cell]) -> int:
    """Relative cost of the cells a job trains (pass only those it trains, not those that share a
    run): the scheduler starts the largest first."""
    return int(sum(STEP_COST.get(c.model, 1.0) * max(c.nodes, 1) * (INT8_COST if c.precision == "int8" else 1.0)
                   for c in cells))


@dataclass(frozen=True, kw_only=True)
class Planner:
    """The workflow config's say in resources (validated by the schema before it gets here)."""
    profile: str
    distributed: bool = False
    gpu_request: str = "gpus"
    step_times: StepTimes | None = None   # the paper profile's
    step_kind: str = DEFAULT_EXECUTOR     # runtime.step_kind(executor, compile)
    margin: float = 1.5
    max_minutes: int = 2880
    pack_size: int = 1

    def __post_init__(self):
        if self.gpu_request not in GPU_REQUESTS:
            raise ConfigError(f"gpu_request {self.gpu_request!r} is not one of {', '.join(GPU_REQUESTS)}")
        if self.profile == "paper" and self.step_times is None:
            raise ConfigError("the paper profile's resources need step times (config step_times)")

    def runtime(self, cells: list[Cell]):
        """The paper job's runtime request (runtime.RuntimeRequest)."""
        return job_runtime(cells, self.step_times, executor=self.step_kind, margin=self.margin,
                           max_minutes=self.max_minutes, pack_size=self.pack_size)

    def resources(self, cells: list[Cell], name: str = "job") -> dict:
        """Snakemake resources of a job training `cells`: mem_mb, runtime (minutes), gpu and gres
        (as gpu_request asks: sbatch --gpus=N, or --gres=gpu:N with gpu 0; no gres otherwise), and for a distributed
        job the SLURM tasks (mpi, tasks, tasks_per_gpu)."""
        n = job_processes(cells, distributed=self.distributed, name=name)
        if self.profile == "mini":
            out = {"mem_mb": MINI_MEM_MB + EXTRA_PROCESS_MB["mini"] * (n - 1),
                   "runtime": MINI_JOB_MINUTES + MINI_CELL_MINUTES * len(cells), "gpus": 0}
        else:
            out = {"mem_mb": max(self.host_request_mb(c.model) for c in cells) + EXTRA_PROCESS_MB["paper"] * (n - 1),
                   "runtime": self.runtime(cells).minutes, "gpus": n}
        out.update(self.gpu_resources(out.pop("gpus")))
        if n > 1:
            out.update(mpi="srun", tasks=n, **({"tasks_per_gpu": 1} if self.profile == "paper" else {}))
        return out

    def gpu_resources(self, gpus: int) -> dict:
        """How a job asks for `gpus` GPUs: gpu (sbatch --gpus=N), or gres gpu:N with gpu 0."""
        if self.gpu_request == "gres":
            return {"gpu": 0, **({"gres": f"gpu:{gpus}"} if gpus else {})}
        return {"gpu": gpus}

    def host_request_mb(self, model: str) -> int:
        """A paper job's host memory by model: PAPER_MEM_MB, or HOST_MARGIN x the peak `lpdl
        preflight` measured (step times' host_mb) where that is more."""
        measured = (self.step_times.host_mb if self.step_times else {}).get(model)
        return max(PAPER_MEM_MB[model], math.ceil(HOST_MARGIN * measured) if measured else 0)

    def attempts(self, jobs: Iterable[Job], by_id: Mapping[str, Cell]) -> list[int]:
        """Attempts each paper job needs at max_runtime (1 for every mini job)."""
        if self.profile != "paper":
            return [1 for _ in jobs]
        return [self.runtime([by_id[c] for c in j.cells]).attempts_needed for j in jobs]
