"""Gossip algorithms as pure (init, step) pairs over stacked (n, d) node state.

Each module documents its update rule with the paper's equation and declares `MESSAGE` (a
`Message`): what its gossip messages carry besides C(·), which the simulator's byte count reads.
QGM is a local momentum (`lpdl_core.decentral.optim`), not a gossip rule, so it combines with any algorithm
here.
"""
from types import ModuleType

from . import adagossip, bagua_lp, choco, deepsqueeze, dpsgd, gut
from .base import ALGORITHMS, GossipCfg, Message, Round, out_degree, push_sum_weights, residual

REGISTRY: dict[str, ModuleType] = {
    "dpsgd": dpsgd,
    "ds": deepsqueeze,
    "choco": choco,
    "bagua-lp": bagua_lp,
    "adagossip": adagossip,
    "gut": gut,
}


def get(name: str) -> ModuleType:
    try:
        return REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown algorithm {name!r}; valid: {', '.join(REGISTRY)}") from None


__all__ = ["ALGORITHMS", "GossipCfg", "Message", "REGISTRY", "Round", "get", "out_degree",
           "push_sum_weights", "residual"]
