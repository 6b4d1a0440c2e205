"""How long a paper-profile training job runs on one GPU, from measured step times: the SLURM
runtime request of the train rule.

The step-time table (config/step-times.yaml, `StepTimes.from_mapping`) holds `lpdl bench` medians:
seconds per training step of all `ref_nodes` nodes at `ref_batch` images per node, by precision and
executor, for each measured model. A cell's job time is

    T(cell) = steps(cell) * t_step(cell) * (1 + eval_share)
    steps   = epochs * ceil(N_train / (n * b))                  (one step = one batch on every node)
    t_step  = t_ref(model', precision, executor) * n / ref_nodes * max(1, M(model) b / (M(model') ref_batch))

with model' = the model itself when measured, else the reference model; M = forward MACs per
sample (per `model@dataset` where the input size depends on the dataset; counted by
lpdl_core.training.cost on the real model). The loop executor's step grows linearly with the
nodes; the distributed executor, unless measured itself, takes the loop executor's time of one
node (each node has its own process and GPU; the wire time is not in it). Scaling an unmeasured
model by its MACs from a launch-bound small model over-estimates,
which is the safe side for a time limit. A pack of k cells (cells_per_job: pack) runs one
step for all k: its time is the measured column `<kind>@pack<K>` of the smallest K >= k (a step of
K cells of ref_nodes nodes each; fewer cells are not assumed faster), else k solo steps. The request is
`min(max_minutes, startup + margin * sum_cells T)`; a job that needs more than the cap is cut at
the limit and its retry resumes from the cell's checkpoint (saved every epoch), so no attempt asks
more than the partition allows and none starts from zero.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Iterable, Mapping

from ...config import DATASET_SPECS, PRECISIONS
from ...specs.executors import SPECS
from ...errors import ConfigError
from ..cells.cell import Cell

TRAIN_SAMPLES = {n: s.train_samples for n, s in DATASET_SPECS.items() if s.train_samples is not None}



@dataclass(frozen=True, kw_only=True)
class StepTimes:
    """Measured step times (seconds per step of ref_nodes nodes x ref_batch per node) and what is
    needed to scale them: MACs per sample by model, training-set sizes by dataset."""
    ref_model: str
    ref_nodes: int
    ref_batch: int
    measured: Mapping[str, Mapping[str, Mapping[str, float]]]   # model -> precision -> executor -> s
    macs_per_sample: Mapping[str, float]
    # dataset -> training-set size: the datasets' specs (lpdl_core.specs.datasets); a file may add or override
    train_samples: Mapping[str, int] = field(default_factory=lambda: dict(TRAIN_SAMPLES))
    eval_share: float = 0.1
    provenance: Mapping[str, str] = field(default_factory=dict)
    host_mb: Mapping[str, float] = field(default_factory=dict)  # model -> peak host MB (lpdl preflight)

    def __post_init__(self):
        if self.ref_model not in self.measured:
            raise ConfigError(f"step times: the reference model {self.ref_model!r} has no measurement")
        for model, by_prec in self.measured.items():
            for prec, by_exec in by_prec.items():
                if prec not in PRECISIONS:
                    raise ConfigError(f"step times: {model}: unknown precision {prec!r}")
                for ex, s in by_exec.items():
                    if not (isinstance(s, (int, float)) and s > 0 and math.isfinite(s)):
                        raise ConfigError(f"step times: {model}.{prec}.{ex}: {s!r} is not a positive number")
        for what, table in (("macs_per_sample", self.macs_per_sample), ("train_samples", self.train_samples)):
            for k, v in table.items():
                if not (isinstance(v, (int, float)) and v > 0):
                    raise ConfigError(f"step times: {what}.{k}: {v!r} is not a positive number")
        if not 0 <= self.eval_share < 10:
            raise ConfigError(f"step times: eval_share {self.eval_share!r} is not in [0, 10)")

    @classmethod
    def load(cls, path) -> "StepTimes":
        """A step-times YAML file (config/step-times.yaml); ConfigError in one line if unreadable."""
        from ...bounded import load_yaml

        try:
            data = load_yaml(path, "step-times file")
        except ConfigError as e:  # named as the config key that gives the file
            raise ConfigError(f"step_times: {e}") from None
        if not isinstance(data, Mapping):
            raise ConfigError(f"{path}: not a mapping of step times")
        return cls.from_mapping(data)

    @classmethod
    def from_mapping(cls, m: Mapping) -> "StepTimes":
        known = {"ref_model", "ref_nodes", "ref_batch", "measured", "macs_per_sample", "train_samples",
                 "eval_share", "provenance", "host_mb", "preflight"}
        unknown = set(m) - known
        if unknown:
            raise ConfigError(f"step times: unknown keys {sorted(unknown)}; known: {sorted(known)}")
        kw = {k: v for k, v in m.items() if k != "preflight"}
        if isinstance(m.get("train_samples"), Mapping):  # a file's sizes add to (or override) the specs'
            kw["train_samples"] = {**TRAIN_SAMPLES, **m["train_samples"]}
        try:  # preflight: the raw shape measurements of `lpdl preflight`, kept for the reader
            return cls(**kw)
        except TypeError as e:
            raise ConfigError(f"step times: {e}") from None

    def step_seconds(self, cell: Cell, executor: str, pack: int = 1) -> float:
        """Seconds of one step of the cell (all its nodes), from the closest measurement; with pack
        k > 1, of a stack of k such cells."""
        return self.step_basis(cell, executor, pack)[0]

    def step_basis(self, cell: Cell, executor: str, pack: int = 1) -> tuple[float, str]:
        """(seconds of one step of the cell, or of a pack of `pack` such cells, what that rests
        on): "measured" when the table holds the cell's model, precision and executor (and pack),
        else how it was scaled from a measurement."""
        model = cell.model if cell.model in self.measured else self.ref_model
        by_exec = self.measured[model].get(cell.precision, {})
        if pack > 1:
            sizes = sorted(int(k[len(executor) + len(PACKED):]) for k in by_exec
                           if k.startswith(executor + PACKED) and k[len(executor) + len(PACKED):].isdigit())
            fits = [k for k in sizes if k >= pack]
            if fits:
                t, how = self.step_basis(cell, f"{executor}{PACKED}{fits[0]}")
                return t, how if fits[0] == pack else f"{how}; a pack of {fits[0]} for {pack} cells"
            t, how = self.step_basis(cell, executor)
            return pack * t, f"{how}; x {pack} cells (packed step not measured)"
        nodes = cell.nodes
        how = []
        spec = SPECS.get(executor)
        if spec and spec.per_node_process and executor not in by_exec and spec.step_executor in by_exec:
            # one node per process and GPU: one node's step of the executor each process runs (the
            # gossip's wire time is not in it: measure the per-node executor to include it)
            executor, nodes = spec.step_executor, 1
            how.append(f"one node's {executor} step")
        if executor.endswith(COMPILED) and executor not in by_exec and executor[:-len(COMPILED)] in by_exec:
            # a compiled step is not slower than the eager one it compiles: an over-estimate
            executor = executor[:-len(COMPILED)]
            how.append(f"the eager {executor} step (compiled not measured)")
        if executor not in by_exec:
            raise ConfigError(f"step times: no {cell.precision} {executor} measurement for {model}; "
                              f"measured: {sorted(by_exec)}")
        t = by_exec[executor] * nodes / self.ref_nodes
        if nodes != self.ref_nodes:
            how.append(f"x {nodes}/{self.ref_nodes} nodes")
        if model != cell.model:
            macs = self._macs(cell.model, cell.dataset) * cell.batch_per_node
            factor = max(1.0, macs / (self._macs(model) * self.ref_batch))
            t *= factor
            how.append(f"scaled from {model} by MACs x{factor:.2f}")
        return t, ("measured" if not how else "; ".join(how))

    def _macs(self, model: str, dataset: str | None = None) -> float:
        """MACs per sample: the `model@dataset` entry where the input size differs by dataset, else
        the model's."""
        for key in (f"{model}@{dataset}", model):
            if key in self.macs_per_sample:
                return float(self.macs_per_sample[key])
        raise ConfigError(f"step times: no macs_per_sample for {model}")

    def steps(self, cell: Cell) -> int:
        """Training steps of the cell: epochs x batches per node per epoch."""
        if cell.dataset not in self.train_samples:
            raise ConfigError(f"step times: no train_samples for {cell.dataset}")
        per_node = math.ceil(self.train_samples[cell.dataset] / (cell.nodes * cell.batch_per_node))
        return cell.epochs * per_node

    def cell_seconds(self, cell: Cell, executor: str) -> float:
        """Expected wall seconds of the cell's training, evaluation included."""
        return self.stack_seconds([cell], executor)

    def stack_seconds(self, stack: list[Cell], executor: str) -> float:
        """Expected wall seconds of training a stack of cells as one pack (one cell: its solo run)."""
        return self.steps(stack[0]) * self.step_seconds(stack[0], executor, len(stack)) * (1 + self.eval_share)


@dataclass(frozen=True, kw_only=True)
class RuntimeRequest:
    """The runtime of a job (minutes) and how many attempts a job of that length needs at the cap."""
    minutes: int
    estimate_minutes: float
    attempts_needed: int


STARTUP_MINUTES = 10  # a job's start: Python, torch's import, the data loaded
COMPILED = "+compiled"  # a step-time column: the executor's step compiled as one graph
PACKED = "@pack"        # a step-time column: a pack of K cells' step, e.g. "batched+compiled@pack4"
COMPILE_MINUTES = 5     # a compiled job's first step: 84-126 s cold for ResNet-20 on an H200
                        # (docs/measurements.md#compile-h200)


def executor_of(kind: str) -> str:
    """The executor of a step-time column ("batched+compiled@pack4" -> "batched")."""
    return kind.partition("+")[0].partition(PACKED)[0]


def step_kind(executor: str, compile: bool = False) -> str:
    """The step-time column of a job that runs `executor`, compiled or not (e.g. "batched+compiled")."""
    return executor + COMPILED if compile else executor


def startup_minutes(kind: str, compiles: int = 1) -> float:
    """A job's start-up: STARTUP_MINUTES, plus COMPILE_MINUTES for each compiled step it builds
    (one per cell, or per stack of a packed job: a later one may hit the compile cache, but one of
    other shapes or other messages compiles anew, so the request assumes each compiles)."""
    return STARTUP_MINUTES + (COMPILE_MINUTES * compiles if kind.split(PACKED)[0].endswith(COMPILED) else 0)


def job_seconds(cells: Iterable[Cell], times: StepTimes, *, executor: str, pack_size: int = 1) -> float:
    """Expected training seconds of a job's cells: one after another, or with pack_size > 1 as the
    stacks the planner counts (lpdl_core.pipeline.recipe.packing.pack_stacks)."""
    from ..recipe.packing import pack_stacks

    return sum(times.stack_seconds(s, executor) for s in pack_stacks(list(cells), pack_size))


def job_runtime(cells: Iterable[Cell], times: StepTimes, *, executor: str, margin: float = 1.5,
                startup: float | None = None, max_minutes: int = 2880, pack_size: int = 1) -> RuntimeRequest:
    """The SLURM time request of one job running `cells` (see the module docstring).
    executor: the step-time column (`step_kind`); startup: minutes (default `startup_minutes`);
    pack_size > 1: the job packs its cells (`job_seconds`)."""
    if margin < 1:
        raise ConfigError(f"runtime margin {margin} is below 1: jobs would be cut before they end")
    from ..recipe.packing import pack_stacks

    cells = list(cells)
    seconds = job_seconds(cells, times, executor=executor, pack_size=pack_size)
    compiles = len(pack_stacks(cells, pack_size))
    est = (startup_minutes(executor, compiles) if startup is None else startup) + margin * seconds / 60
    minutes = int(min(max_minutes, math.ceil(est)))
    return RuntimeRequest(minutes=minutes, estimate_minutes=est,
                          attempts_needed=max(1, math.ceil(est / max_minutes)))


def retries_warning(attempts: Iterable[int], *, retries: int | None, max_minutes: int) -> str | None:
    """The one line to print when some jobs need more attempts than `retries` (Snakemake's --retries,
    a profile's `retries:`) allows, each attempt resuming from the last one's checkpoint; None when
    every job fits. retries=None: not known, so the line names the retries every job needs."""
    need = list(attempts)
    worst = max(need, default=1)
    if worst <= 1 or (retries is not None and retries >= worst - 1):
        return None
    long = sum(n > 1 for n in need)
    have = "" if retries is None else f" (this run allows {retries})"
    return (f"lpdl: {long} train jobs are estimated longer than max_runtime={max_minutes} min and need "
            f"up to {worst} attempts (each resumes from its checkpoint): run with --retries {worst - 1} "
            f"or more{have}, or raise max_runtime")
