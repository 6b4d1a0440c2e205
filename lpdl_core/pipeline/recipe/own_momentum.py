"""Algorithms whose own momentum replaces the optimizer's, and what a cell's momentum column
selects for them. Torch-free: the run identity (runstore) holds these settings, so a change of
them makes the runs of the earlier settings other runs, recomputed.

The official GUT code steps plain SGD (no weight decay) with heavy-ball momentum on the tracked
update (docs/paper-vs-code.md, "Global Update Tracking"): a cell's momentum column picks GUT
(nesterov: μ 0.9, β 0) or QG-GUTm (qgm: β 0.9 with the official README's μ 0.06; at μ 0.9 with
β 0.9 the update diverges within two epochs).
"""
from __future__ import annotations

OWN_MOMENTUM = {
    "gut": {"gossip": {"nesterov": {"gut_momentum": 0.0, "gut_scaling": 0.9},
                       "qgm": {"gut_momentum": 0.9, "gut_scaling": 0.06}},
            "optim": {"momentum": "none", "weight_decay": 0.0},
            "says": {"nesterov": "GUT (local SGD without momentum or weight decay, as the official code)",
                     "qgm": "QG-GUTm (momentum 0.9 on the tracked update, scaling 0.06; local SGD without "
                            "momentum or weight decay, as the official code)"}},
}


def identity_part(algorithm: str, momentum: str) -> dict | None:
    """The settings a cell's algorithm and momentum select (gossip and optimizer), or None for an
    algorithm that uses the optimizer's own momentum."""
    own = OWN_MOMENTUM.get(algorithm)
    if own is None or momentum not in own["gossip"]:
        return None
    return {"gossip": dict(own["gossip"][momentum]), "optim": dict(own["optim"])}
