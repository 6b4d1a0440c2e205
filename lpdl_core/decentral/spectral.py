"""What a mixing matrix does to consensus: the spectral gap and SLEM of W (for a time-varying
schedule, of its product over one period: topology.period_product), and whether W conserves
mass (column-stochastic, as push-sum needs) or also keeps push-sum weights at 1
(row-stochastic). The graphs themselves: lpdl_core.decentral.topology.
"""
from __future__ import annotations

import numpy as np


def slem(W: np.ndarray) -> float:
    """Second-largest eigenvalue modulus of W.

    Args:
        W: (n, n) mixing matrix (may be non-symmetric, so eigenvalues may be complex).

    Returns:
        |lambda_2|, 0.0 for n = 1.
    """
    W = np.asarray(W, dtype=np.float64)
    if W.shape[0] <= 1:
        return 0.0
    mods = np.sort(np.abs(np.linalg.eigvals(W)))[::-1]
    return float(mods[1])


def spectral_gap(W: np.ndarray) -> float:
    """1 - slem(W): larger means faster consensus.

    Args:
        W: (n, n) mixing matrix.

    Returns:
        The spectral gap as a float.
    """
    return 1.0 - slem(W)


def is_column_stochastic(W: np.ndarray, atol: float = 1e-12) -> bool:
    """Whether the (n, n) W is nonnegative and every column sums to 1 within `atol` (mass is
    conserved by x <- W x)."""
    W = np.asarray(W, dtype=np.float64)
    return bool(np.all(W >= -atol) and np.allclose(W.sum(axis=0), 1.0, rtol=0.0, atol=atol))


def is_row_stochastic(W: np.ndarray, atol: float = 1e-12) -> bool:
    """Whether the (n, n) W is nonnegative and every row sums to 1 within `atol` (then push-sum
    weights stay u = 1)."""
    return is_column_stochastic(np.asarray(W, dtype=np.float64).T, atol=atol)
