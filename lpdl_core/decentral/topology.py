"""Communication graphs and their mixing matrices W for decentralized training (Aketi, Kodge,
Roy 2021, Sec. 3-4: directed ring by default, torus/undirected ring in the ablations), built with
the official code's uniform mixing so that every W is column-stochastic (push-sum ready).
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .spectral import is_column_stochastic, is_row_stochastic, slem

# Probability of each extra directed edge in "random-directed". 0.3 keeps the graph sparse
# enough that in-degrees differ (so W is not row-stochastic and push-sum weights u drift from 1).
_RANDOM_EDGE_P = 0.3


def _num_exponents(n: int) -> int:
    """Number of powers 2^k with 2^k <= n - 1 (k = 0..floor(log2(n-1)))."""
    return (n - 1).bit_length()


def _default_rows(n: int) -> int:
    """Largest divisor of n that is <= sqrt(n) (the 'squarest' rows x cols factorisation)."""
    return max(r for r in range(1, math.isqrt(n) + 1) if n % r == 0)


@dataclass(frozen=True, kw_only=True)
class Topology:
    """A (possibly time-varying) communication graph over n nodes.

    Args:
        name: one of GRAPHS.
        n: number of nodes (>= 1; n=1 is the single-node baseline with W = [[1]]).
        rows: torus only; number of rows (must divide n). Default: largest divisor <= sqrt(n).
        seed: random-directed only; seed of the extra random edges.
    """

    name: str
    n: int
    rows: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.name not in REGISTRY:  # the registered graphs (config.GRAPHS names them; a test holds both)
            raise ValueError(f"unknown graph {self.name!r}; valid names: {', '.join(REGISTRY)}")
        if isinstance(self.n, bool) or not isinstance(self.n, (int, np.integer)) or self.n < 1:
            raise ValueError(f"n must be an integer >= 1, got {self.n!r}")
        if self.rows is not None:
            if self.name != "torus":
                raise ValueError(f"rows is a torus option, not valid for graph {self.name!r}")
            if not (1 <= self.rows <= self.n) or self.n % self.rows != 0:
                raise ValueError(f"torus rows={self.rows} must be a divisor of n={self.n}")
        # The official GridGraph peers [i+1, i-1, i+4, i-4] collapse onto self for n <= 4.
        if self.name == "grid-official" and 1 < self.n < 5:
            raise ValueError(
                f"grid-official (circulant C_n(1,4), peers i+-1, i+-4) needs n >= 5, got n={self.n}"
            )

    @property
    def time_varying(self) -> bool:
        """True when W(t) actually changes with t."""
        return self.period > 1

    @property
    def period(self) -> int:
        """Number of distinct W(t) in the schedule (1 for static graphs)."""
        return REGISTRY[self.name].period(self.n) if self.n > 1 else 1

    def _peers(self, t: int) -> tuple[tuple[int, ...], ...]:
        """Out-peer list per sender at iteration t, duplicates kept only where the official code keeps them."""
        return _peer_lists(self.name, int(self.n), self.rows, int(self.seed), t % self.period)

    def W(self, t: int = 0) -> np.ndarray:
        """Mixing matrix at iteration t.

        Args:
            t: iteration index; the schedule repeats every `period` iterations.

        Returns:
            (n, n) float64 column-stochastic array, W[i, j] = weight node j sends to node i.
        """
        # Cached builder returns a read-only array; hand out a copy so callers may mutate it.
        return _mixing(self.name, int(self.n), self.rows, int(self.seed), t % self.period).copy()

    def out_neighbours(self, t: int = 0) -> list[list[int]]:
        """Per node, the nodes it sends to at iteration t (self excluded, sorted, unique)."""
        return [sorted(set(p) - {j}) for j, p in enumerate(self._peers(t))]

    def in_neighbours(self, t: int = 0) -> list[list[int]]:
        """Per node, the nodes it receives from at iteration t (self excluded, sorted, unique)."""
        ins: list[set[int]] = [set() for _ in range(self.n)]
        for j, outs in enumerate(self.out_neighbours(t)):
            for i in outs:
                ins[i].add(j)
        return [sorted(s) for s in ins]

    def edges(self) -> list[tuple[int, int]]:
        """Union over the whole schedule of directed edges (sender j, receiver i), j != i, sorted."""
        es = {(j, i) for t in range(self.period) for j, outs in enumerate(self.out_neighbours(t))
              for i in outs}
        return sorted(es)


def _directed_ring(n, rows, seed, t):
    return tuple(((i + 1) % n,) for i in range(n))


def _ring(n, rows, seed, t):
    # n=2: i+1 == i-1, a single peer (the undirected edge is not doubled).
    return tuple(tuple(sorted({(i + 1) % n, (i - 1) % n})) for i in range(n))


def _torus(n, rows, seed, t):
    r = rows if rows is not None else _default_rows(n)
    c = n // r
    out = []
    for i in range(n):
        a, b = divmod(i, c)
        nb = {((a + 1) % r) * c + b, ((a - 1) % r) * c + b, a * c + (b + 1) % c, a * c + (b - 1) % c}
        # Degenerate dimensions (1 or 2 rows/cols) wrap onto self or onto the same peer twice.
        out.append(tuple(sorted(nb - {i})))
    return tuple(out)


def _grid_official(n, rows, seed, t):
    # Official _add_peers never detects duplicates, so for n=8 i+4 == i-4 is sent twice.
    return tuple(((i + 1) % n, (i - 1) % n, (i + 4) % n, (i - 4) % n) for i in range(n))


def _exponential(n, rows, seed, t):
    return tuple(tuple((i + 2**k) % n for k in range(_num_exponents(n))) for i in range(n))


def _complete(n, rows, seed, t):
    return tuple(tuple(j for j in range(n) if j != i) for i in range(n))


def _time_varying_exponential(n, rows, seed, t):
    # SGP's DynamicDirectedExponentialGraph: one peer per iteration, cycling the exponents.
    hop = 2 ** (t % _num_exponents(n))
    return tuple(((i + hop) % n,) for i in range(n))


def _random_directed(n, rows, seed, t):
    rng = np.random.default_rng(seed)
    extra = rng.random((n, n)) < _RANDOM_EDGE_P  # extra[j, i]: edge j -> i
    out = []
    for j in range(n):
        # The directed ring j -> j+1 guarantees strong connectivity.
        peers = {(j + 1) % n} | {i for i in range(n) if i != j and extra[j, i]}
        out.append(tuple(sorted(peers)))
    return tuple(out)


@dataclass(frozen=True)
class Graph:
    """A registered graph: its out-peer lists per sender at iteration t (duplicates kept only where
    the official code keeps them), and its schedule's period for n nodes (1: static)."""
    peers: Callable[[int, int | None, int, int], tuple[tuple[int, ...], ...]]
    period: Callable[[int], int] = lambda n: 1


# name -> Graph, in config.GRAPHS order (a test holds the two equal)
REGISTRY: dict[str, Graph] = {
    "directed-ring": Graph(_directed_ring),
    "ring": Graph(_ring),
    "torus": Graph(_torus),
    "grid-official": Graph(_grid_official),
    "exponential": Graph(_exponential),
    "complete": Graph(_complete),
    "time-varying-exponential": Graph(_time_varying_exponential, period=_num_exponents),
    "random-directed": Graph(_random_directed),
}


@functools.lru_cache(maxsize=256)
def _peer_lists(name: str, n: int, rows: int | None, seed: int, t: int) -> tuple[tuple[int, ...], ...]:
    if n == 1:
        return ((),)
    return REGISTRY[name].peers(n, rows, seed, t)


@functools.lru_cache(maxsize=256)
def _mixing(name: str, n: int, rows: int | None, seed: int, t: int) -> np.ndarray:
    W = np.zeros((n, n), dtype=np.float64)
    for j, peers in enumerate(_peer_lists(name, n, rows, seed, t)):
        # Official UniformMixing: the sender splits its mass equally over itself and each
        # out-edge (parallel edges included), so column j sums to 1.
        w = 1.0 / (len(peers) + 1)
        W[j, j] += w
        for i in peers:
            W[i, j] += w
    W.setflags(write=False)
    return W


def mixing_matrix(name: str, n: int, t: int = 0, **opts) -> np.ndarray:
    """Mixing matrix of a named graph at iteration t.

    Args:
        name: one of GRAPHS.
        n: number of nodes.
        t: iteration index (matters only for time-varying graphs).
        **opts: Topology options (rows=, seed=).

    Returns:
        (n, n) float64 column-stochastic array.
    """
    return Topology(name=name, n=n, **opts).W(t)


def period_product(topo: Topology, start: int = 0) -> np.ndarray:
    """Product W(start+period-1) @ ... @ W(start) over one period of the schedule.

    Args:
        topo: the topology.
        start: first iteration of the period.

    Returns:
        (n, n) float64 array; equals W(start) for static graphs.
    """
    P = np.eye(topo.n)
    for t in range(start, start + topo.period):
        P = topo.W(t) @ P
    return P


def describe(topo: Topology, t: int = 0) -> str:
    """Human-readable summary of a topology, for the `lpdl topology` CLI.

    Args:
        topo: the topology.
        t: iteration whose W is shown.

    Returns:
        Multi-line text: name, n, time variation, W, neighbours, SLEM, spectral gap,
        double stochasticity.
    """
    W = topo.W(t)
    opts = []
    if topo.name == "torus":
        r = topo.rows if topo.rows is not None else _default_rows(topo.n)
        opts.append(f"rows={r} cols={topo.n // r}")
    if topo.name == "random-directed":
        opts.append(f"seed={topo.seed}")
    lines = [f"graph: {topo.name}" + (f" ({', '.join(opts)})" if opts else ""),
             f"nodes: {topo.n}",
             f"time-varying: {'yes, period ' + str(topo.period) if topo.time_varying else 'no'}",
             f"W(t={t}) (W[i, j] = weight node j sends to node i):"]
    width = max(len(f"{topo.n - 1}"), 6)
    lines.append(" " * (width + 2) + " ".join(f"{j:>{width}d}" for j in range(topo.n)))
    for i in range(topo.n):
        lines.append(f"{i:>{width}d}  " + " ".join(f"{v:{width}.4f}" for v in W[i]))
    lines.append("neighbours (in <- node -> out):")
    ins, outs = topo.in_neighbours(t), topo.out_neighbours(t)
    for i in range(topo.n):
        lines.append(f"  node {i}: in {ins[i]}  out {outs[i]}")
    s = slem(W)
    lines.append(f"SLEM: {s:.4f}")
    lines.append(f"spectral gap: {1.0 - s:.4f}")
    if topo.time_varying:
        sp = slem(period_product(topo, t))
        lines.append(f"SLEM of product over one period ({topo.period} steps): {sp:.4f}")
    doubly = all(is_row_stochastic(topo.W(k)) for k in range(topo.period))
    lines.append(f"column-stochastic: {is_column_stochastic(W)}")
    lines.append(f"doubly stochastic: {doubly}"
                 + ("" if doubly else " (push-sum weights u will deviate from 1)"))
    return "\n".join(lines)
