"""Tests for lpdl_core.decentral.topology and .spectral against docs/paper-vs-code.md, 'Graphs and mixing weights'
and 'Push-sum weight'."""
from __future__ import annotations

import numpy as np
import pytest

from lpdl_core.decentral.spectral import (
    is_column_stochastic,
    is_row_stochastic,
    slem,
    spectral_gap,
)
from lpdl_core.config import GRAPHS
from lpdl_core.decentral.topology import Topology, describe, mixing_matrix, period_product

SIZES = (1, 2, 3, 4, 8, 16)


def _valid(name: str, n: int) -> bool:
    return not (name == "grid-official" and 1 < n < 5)


def _strongly_connected(W: np.ndarray) -> bool:
    A = (W > 0).astype(int)
    n = len(A)
    reach = np.linalg.matrix_power(A + np.eye(n, dtype=int), n) > 0
    return bool(reach.all())


# --- official numbers (the SLEM table of 'Graphs and mixing weights') ------------------------

@pytest.mark.parametrize("n,expected", [(4, 0.7071), (8, 0.9239), (16, 0.9808)])
def test_slem_directed_ring(n, expected):
    assert round(slem(mixing_matrix("directed-ring", n)), 4) == expected


@pytest.mark.parametrize("n,expected", [(8, 0.8047), (16, 0.9493), (32, 0.9872)])
def test_slem_undirected_ring(n, expected):
    assert round(slem(mixing_matrix("ring", n)), 4) == expected


@pytest.mark.parametrize("n", [8, 16])
def test_slem_grid_official(n):
    assert round(slem(mixing_matrix("grid-official", n)), 3) == 0.600


def test_slem_true_torus_4x4():
    topo = Topology(name="torus", n=16)
    W = topo.W()
    assert round(slem(W), 3) == 0.600
    assert np.allclose(W[W > 0], 1 / 5)


def test_slem_power_50_directed_ring():
    assert round(slem(mixing_matrix("directed-ring", 8)) ** 50, 4) == 0.0191
    assert round(slem(mixing_matrix("directed-ring", 16)) ** 50, 3) == 0.379


# --- structure ('Graphs and mixing weights') -------------------------------------------------

@pytest.mark.parametrize("n", [4, 8, 16])
def test_directed_ring_structure(n):
    topo = Topology(name="directed-ring", n=n)
    W = topo.W()
    for i in range(n):
        assert W[i, i] == 0.5
        assert W[(i + 1) % n, i] == 0.5
    assert np.count_nonzero(W) == 2 * n
    assert is_row_stochastic(W)  # regular graph: doubly stochastic
    assert topo.in_neighbours() == [[(i - 1) % n] for i in range(n)]
    assert topo.out_neighbours() == [[(i + 1) % n] for i in range(n)]


def test_ring_weights():
    W = mixing_matrix("ring", 8)
    for i in range(8):
        assert W[i, i] == pytest.approx(1 / 3)
        assert W[(i + 1) % 8, i] == pytest.approx(1 / 3)
        assert W[(i - 1) % 8, i] == pytest.approx(1 / 3)
    assert np.allclose(W, W.T)
    # n=2: the two "peers" i+1 and i-1 are the same node, merged into one.
    assert np.allclose(mixing_matrix("ring", 2), [[0.5, 0.5], [0.5, 0.5]])


def test_grid_official_duplicate_edge_n8():
    W = mixing_matrix("grid-official", 8)
    for i in range(8):
        assert W[(i + 4) % 8, i] == pytest.approx(2 / 5)
        assert W[i, i] == pytest.approx(1 / 5)
        assert W[(i + 1) % 8, i] == pytest.approx(1 / 5)
    assert np.allclose(W, W.T)
    W16 = mixing_matrix("grid-official", 16)
    assert np.allclose(W16, W16.T)
    assert np.allclose(W16[W16 > 0], 1 / 5)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_grid_official_too_small(n):
    with pytest.raises(ValueError, match="n >= 5"):
        Topology(name="grid-official", n=n)


def test_torus_2x4_unique_neighbours():
    topo = Topology(name="torus", n=8)
    W = topo.W()
    assert all(len(o) == 3 for o in topo.out_neighbours())
    assert np.allclose(W[W > 0], 1 / 4)
    assert np.allclose(W, W.T)
    # Explicit rows: 4x2 is the same graph shape transposed, still 3 distinct peers.
    assert all(len(o) == 3 for o in Topology(name="torus", n=8, rows=4).out_neighbours())


def test_exponential_and_complete():
    topo = Topology(name="exponential", n=8)
    assert topo.out_neighbours()[0] == [1, 2, 4]
    assert np.allclose(topo.W()[topo.W() > 0], 1 / 4)
    assert Topology(name="exponential", n=6).out_neighbours()[0] == [1, 2, 4]
    assert np.allclose(mixing_matrix("complete", 5), np.full((5, 5), 1 / 5))
    assert slem(mixing_matrix("complete", 5)) == pytest.approx(0.0, abs=1e-12)


# --- every graph, every size ---------------------------------------------------------------

@pytest.mark.parametrize("name", GRAPHS)
@pytest.mark.parametrize("n", SIZES)
def test_all_graphs_column_stochastic(name, n):
    if not _valid(name, n):
        pytest.skip("graph undefined at this size")
    topo = Topology(name=name, n=n)
    for t in range(topo.period + 1):
        W = topo.W(t)
        assert W.shape == (n, n) and W.dtype == np.float64
        assert (W >= 0).all()
        assert is_column_stochastic(W)
        assert np.all(np.diag(W) > 0)  # self loop always kept
    if n == 1:
        assert np.array_equal(topo.W(), [[1.0]])
        assert slem(topo.W()) == 0.0
    assert _strongly_connected(period_product(topo))
    assert 0.0 <= slem(topo.W()) <= 1.0 + 1e-12


@pytest.mark.parametrize("name", GRAPHS)
@pytest.mark.parametrize("n", SIZES)
def test_edges_match_nonzeros(name, n):
    if not _valid(name, n):
        pytest.skip("graph undefined at this size")
    topo = Topology(name=name, n=n)
    nz = set()
    for t in range(topo.period):
        W = topo.W(t)
        nz |= {(j, i) for i in range(n) for j in range(n) if i != j and W[i, j] != 0}
        outs, ins = topo.out_neighbours(t), topo.in_neighbours(t)
        for j in range(n):
            assert outs[j] == sorted({i for i in range(n) if i != j and W[i, j] != 0})
            assert ins[j] == sorted({i for i in range(n) if i != j and W[j, i] != 0})
    assert topo.edges() == sorted(nz)


def test_w_is_a_safe_copy():
    topo = Topology(name="ring", n=4)
    W = topo.W()
    W[0, 0] = 99.0
    assert topo.W()[0, 0] == pytest.approx(1 / 3)


# --- time-varying and irregular graphs -----------------------------------------------------

def test_time_varying_exponential():
    topo = Topology(name="time-varying-exponential", n=8)
    assert topo.time_varying and topo.period == 3
    for t, hop in enumerate([1, 2, 4, 1, 2, 4]):
        W = topo.W(t)
        assert topo.out_neighbours(t) == [[(i + hop) % 8] for i in range(8)]
        assert W[(0 + hop) % 8, 0] == 0.5 and W[0, 0] == 0.5
    assert not np.array_equal(topo.W(0), topo.W(1))
    assert np.array_equal(topo.W(0), topo.W(3))
    # One period on a power-of-two n is exact averaging.
    assert np.allclose(period_product(topo), np.full((8, 8), 1 / 8))
    assert Topology(name="time-varying-exponential", n=6).period == 3
    assert Topology(name="time-varying-exponential", n=16).period == 4
    assert not Topology(name="directed-ring", n=8).time_varying
    assert Topology(name="directed-ring", n=8).period == 1


def test_random_directed_irregular_and_connected():
    topo = Topology(name="random-directed", n=8, seed=0)
    W = topo.W()
    assert is_column_stochastic(W)
    assert not is_row_stochastic(W)  # irregular: push-sum weights u drift from 1
    assert _strongly_connected(W)
    assert np.array_equal(W, Topology(name="random-directed", n=8, seed=0).W())
    assert not np.array_equal(W, Topology(name="random-directed", n=8, seed=1).W())


def test_mass_conservation_random_directed():
    W = mixing_matrix("random-directed", 16, seed=3)
    x = np.random.default_rng(0).normal(size=(16, 5))
    assert np.allclose((W @ x).sum(axis=0), x.sum(axis=0))
    u = np.ones(16)
    for _ in range(10):
        u = W @ u
    assert u.sum() == pytest.approx(16.0)


# --- helpers and validation ----------------------------------------------------------------

def test_spectral_gap_and_stochastic_checks():
    W = mixing_matrix("directed-ring", 8)
    assert spectral_gap(W) == pytest.approx(1 - slem(W))
    assert not is_column_stochastic(np.array([[0.5, 0.5], [0.6, 0.5]]))
    assert not is_column_stochastic(np.array([[1.5, 0.5], [-0.5, 0.5]]))


def test_describe():
    text = describe(Topology(name="directed-ring", n=8))
    assert "directed-ring" in text and "0.9239" in text and "0.5000" in text
    assert "doubly stochastic: True" in text
    tv = describe(Topology(name="time-varying-exponential", n=8))
    assert "period" in tv and "product" in tv
    rd = describe(Topology(name="random-directed", n=8))
    assert "doubly stochastic: False" in rd


@pytest.mark.parametrize("kwargs", [
    dict(name="hypercube", n=8),
    dict(name="ring", n=0),
    dict(name="ring", n=-3),
    dict(name="ring", n=2.5),
    dict(name="torus", n=8, rows=3),
    dict(name="ring", n=8, rows=2),
])
def test_invalid(kwargs):
    with pytest.raises(ValueError):
        Topology(**kwargs)


def test_invalid_name_lists_valid_names():
    with pytest.raises(ValueError, match="directed-ring"):
        mixing_matrix("nope", 4)


def test_graphs_are_a_registry_of_the_vocabulary():
    from lpdl_core.config import GRAPHS
    from lpdl_core.decentral.topology import REGISTRY
    assert tuple(REGISTRY) == GRAPHS
    for name in GRAPHS:
        for n in (1, 2, 5, 8, 16):
            if name == "grid-official" and 1 < n < 5:
                continue
            topo = Topology(name=name, n=n)
            assert topo.period == (REGISTRY[name].period(n) if n > 1 else 1)
            for t in range(topo.period):
                assert is_column_stochastic(topo.W(t))
