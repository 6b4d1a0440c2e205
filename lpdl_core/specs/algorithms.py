"""The decentralized algorithms as a cell and the report see them (torch-free): each one's name, its
display name, and whether it sends whole models or updates (then no compressor, η = 1).

The update rules live in lpdl_core.decentral.algorithms, one module per algorithm, registered
under the same names (a test holds the two together).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class AlgorithmSpec:
    """name: as in a cell's algorithm column. display: its name in the report's tables and figures.
    uncompressed: it sends whole models (D-PSGD) or whole updates (GUT), so a cell gives it no
    compressor and averaging rate η = 1."""

    name: str
    display: str
    uncompressed: bool = False


SPECS: dict[str, AlgorithmSpec] = {s.name: s for s in (
    AlgorithmSpec(name="dpsgd", display="D-PSGD", uncompressed=True),
    AlgorithmSpec(name="ds", display="DS"),
    AlgorithmSpec(name="choco", display="CHOCO"),
    AlgorithmSpec(name="bagua-lp", display="Bagua-LP"),
    AlgorithmSpec(name="adagossip", display="AdaGossip"),
    AlgorithmSpec(name="gut", display="GUT", uncompressed=True),
)}
ALGORITHMS = tuple(SPECS)
UNCOMPRESSED_ALGORITHMS = tuple(n for n, s in SPECS.items() if s.uncompressed)
