"""The executors, as properties rather than names (torch-free): how the n nodes of a run are computed.

Every executor computes the same math (docs/executors.md); they differ in where the nodes live.
Code asks an executor's spec what it can do (`executor_spec(name).per_node_process`, `.compilable`,
`.packable`), never compares its name. The in-process kernels register under these names in
lpdl_core.decentral.engine.executors (a test holds the two together); the one-process-per-node kind
is lpdl_core.decentral.engine.distributed.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError


@dataclass(frozen=True, kw_only=True)
class ExecutorSpec:
    """name: as in the config key `executor` and `--executor`. stacked: the n nodes' state is one
    stacked (n, ...) tensor per parameter, computed with torch.func.vmap (so one torch.compile graph
    can hold the whole step, and the fused 8-bit kernels draw rounding noise per node).
    per_node_process: one process per node over torch.distributed; then node_step is the
    in-process executor each process runs its one node with."""

    name: str
    summary: str
    stacked: bool = False
    per_node_process: bool = False
    node_step: str = ""

    @property
    def compilable(self) -> bool:
        """Each training step as one torch.compile graph (lpdl_core.decentral.engine.compiled)."""
        return self.stacked

    @property
    def packable(self) -> bool:
        """Several cells trained in one process as one stacked state (lpdl_core.training.pack)."""
        return not self.per_node_process

    @property
    def step_executor(self) -> str:
        """The executor whose step time one node's step costs (step-times files have no column for
        a one-process-per-node executor: each of its ranks steps one node)."""
        return self.node_step or self.name


SPECS: dict[str, ExecutorSpec] = {s.name: s for s in (
    ExecutorSpec(name="loop", summary="all n nodes in this process, one after another"),
    ExecutorSpec(name="batched", summary="all n nodes in this process, stacked and vmapped", stacked=True),
    ExecutorSpec(name="distributed", summary="one process per node over torch.distributed",
                 per_node_process=True, node_step="loop"),
)}
DEFAULT_EXECUTOR = "loop"
EXECUTORS = tuple(SPECS)
IN_PROCESS_EXECUTORS = tuple(n for n, s in SPECS.items() if not s.per_node_process)
PER_NODE_EXECUTOR = next(n for n, s in SPECS.items() if s.per_node_process)   # the one that has a launcher
COMPILABLE_EXECUTORS = tuple(n for n, s in SPECS.items() if s.compilable)


def executor_spec(name: str) -> ExecutorSpec:
    """The spec of the executor `name` (ConfigError naming the valid ones)."""
    try:
        return SPECS[name]
    except KeyError:
        raise ConfigError(f"executor must be one of {', '.join(EXECUTORS)}, got {name!r}") from None
