"""Which ways of running a cell cannot go together: one table, read by the workflow's config check
(and so its dry run), by `lpdl train`'s argument check and by the engine's own config, so that a
combination a job would refuse is refused before any work starts. Torch-free.

A combination is a run's `RunOptions` (how the runs are computed, never what: the executor,
compile, fused_quant, whether cells are packed) with the fidelity's rng_streams (the official
mode's "shared"). `incompatible` gives the first rule it breaks, as one sentence that names the
options both as config keys and as `lpdl train` flags.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .run_options import RunOptions
from .specs.executors import COMPILABLE_EXECUTORS, IN_PROCESS_EXECUTORS, executor_spec


@dataclass(frozen=True)
class Rule:
    """A combination the rule refuses, given the options and the fidelity's rng_streams."""

    broken: Callable[[RunOptions, str], bool]
    why: Callable[[RunOptions], str]


RULES = (
    Rule(lambda o, _: o.compile and not executor_spec(o.executor).compilable,
         lambda o: f"compile (--compile) needs executor {' or '.join(COMPILABLE_EXECUTORS)}, "
                   f"got executor {o.executor}"),
    Rule(lambda o, _: o.compile and o.fused_quant,
         lambda o: "fused_quant (--fused-quant) and compile (--compile) are alternatives: compile fuses "
                   "the whole step"),
    Rule(lambda o, _: o.packed and not executor_spec(o.executor).packable,
         lambda o: f"packed cells (cells_per_job: pack, --pack-size above 1) need executor "
                   f"{' or '.join(IN_PROCESS_EXECUTORS)}: a pack runs in one process, got executor {o.executor}"),
    Rule(lambda o, streams: o.fused_quant and executor_spec(o.executor).stacked and streams == "shared",
         lambda o: f"fused_quant (--fused-quant) with executor {o.executor} draws the 8-bit rounding noise per node, "
                   "and fidelity rng_streams shared (the official mode's) draws one stream for all nodes: "
                   "use executor loop, or leave fused_quant off"),
)


def incompatible(options: RunOptions, *, rng_streams: str = "per-node") -> str | None:
    """Why these options cannot run together with these random streams (the first rule they
    break), or None."""
    return next((r.why(options) for r in RULES if r.broken(options, rng_streams)), None)
