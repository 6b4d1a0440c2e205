"""The communication graphs as a cell, its id and the report see them (torch-free): each one's
name, the short form a cell id uses, and its display name in the report's tables.

The peers of each graph (who sends to whom, and its mixing matrix W) live in
lpdl_core.decentral.topology, registered under the same names (a test holds the two together).
A cell may also name the topology "single": one node, no gossip (the paper's Table 1 baselines).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class GraphSpec:
    """name: as in a cell's topology column. short: what a cell id writes for it, before the node
    count (e.g. dring8). display: its name in the report's tables."""

    name: str
    display: str
    short: str = ""

    def __post_init__(self) -> None:
        if not self.short:
            object.__setattr__(self, "short", self.name)


SPECS: dict[str, GraphSpec] = {s.name: s for s in (
    GraphSpec(name="directed-ring", display="Directed Ring", short="dring"),
    GraphSpec(name="ring", display="Ring"),
    GraphSpec(name="torus", display="Torus"),
    GraphSpec(name="grid-official", display="Grid (official)", short="grid"),
    GraphSpec(name="exponential", display="Exponential", short="exp"),
    GraphSpec(name="complete", display="Complete"),
    GraphSpec(name="time-varying-exponential", display="Time-varying exponential", short="tvexp"),
    GraphSpec(name="random-directed", display="Random directed", short="rdir"),
)}
GRAPHS = tuple(SPECS)
SINGLE = "single"  # a cell's topology for one node, no gossip
