"""Local optimizers on stacked `(n, d)` node state: SGD with Nesterov momentum and weight decay
(the official code's local step, official-code.md section 4) and Quasi-Global Momentum (QG-DSGDm-N,
Lin et al. 2021, as implemented by the official code, section 3).

Both act on the push-sum numerator x with the gradient g taken at the de-biased model z = x/u.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch

MOMENTA = ("nesterov", "heavy-ball", "none", "qgm")


@dataclass(frozen=True, kw_only=True)
class OptimCfg:
    """Local update of every node.

    momentum: "nesterov" (paper/official default), "heavy-ball", "none", or "qgm".
    beta: momentum coefficient (0.9 in the paper, used by QGM for both momenta).
    weight_decay: added to the gradient (acts on x, the numerator), 1e-4 in the paper.
    """

    momentum: Literal["nesterov", "heavy-ball", "none", "qgm"] = "nesterov"
    beta: float = 0.9
    weight_decay: float = 1e-4

    def __post_init__(self) -> None:
        if self.momentum not in MOMENTA:
            raise ValueError(f"optim.momentum must be one of {MOMENTA}, got {self.momentum!r}")
        if not 0.0 <= self.beta < 1.0:
            raise ValueError(f"optim.beta must be in [0, 1), got {self.beta}")
        if self.weight_decay < 0:
            raise ValueError(f"optim.weight_decay must be >= 0, got {self.weight_decay}")


class OptimState(NamedTuple):
    buf: torch.Tensor  # (n, d): SGD momentum buffer b, or QGM's quasi-global momentum m̂


def init(x: torch.Tensor) -> OptimState:
    return OptimState(buf=torch.zeros_like(x))


def local_step(x: torch.Tensor, g: torch.Tensor, state: OptimState, lr: float, cfg: OptimCfg
               ) -> tuple[torch.Tensor, OptimState]:
    r"""One local step for all nodes: returns x̃ = x - lr·d and the new state.

    SGD (== torch.optim.SGD(momentum=β, nesterov=..., weight_decay=wd), dampening 0):

    .. math::
        g' = g + wd\,x,\quad b \leftarrow \beta b + g',\quad
        d = g' + \beta b \;(\text{Nesterov}) \;\text{or}\; b \;(\text{heavy ball}),\quad
        \tilde x = x - lr\,d

    QGM (official-code.md section 3; the gossip correction is `qgm_correct`):

    .. math::
        g' = g + wd\,x,\quad d = g' + \beta(\beta \hat m + g'),\quad
        \hat m \leftarrow \beta \hat m + (1-\beta) d,\quad \tilde x = x - lr\,d
    """
    gw = g + cfg.weight_decay * x if cfg.weight_decay else g
    beta = cfg.beta
    if cfg.momentum == "qgm":
        d = gw + beta * (beta * state.buf + gw)
        buf = beta * state.buf + (1.0 - beta) * d
    elif cfg.momentum == "none":
        d, buf = gw, state.buf
    else:
        # b_0 = 0, so the first step gives b = g' exactly like torch's buffer clone.
        buf = beta * state.buf + gw
        d = gw + beta * buf if cfg.momentum == "nesterov" else buf
    return x - lr * d, OptimState(buf=buf)


def qgm_correct(state: OptimState, x_next: torch.Tensor, x_tilde: torch.Tensor, u: torch.Tensor,
                lr: float, cfg: OptimCfg) -> OptimState:
    r"""QGM's gossip correction after the consensus step (no-op for other momenta).

    .. math:: \hat m \leftarrow \hat m + \frac{\beta - 1}{lr\,u}\,(x_{t+1} - \tilde x_t)

    so that overall :math:`\hat m_t = \beta \hat m_{t-1} + (1-\beta)(x_t - x_{t+1})/lr`.
    """
    if cfg.momentum != "qgm" or lr == 0.0:
        return state
    coef = (cfg.beta - 1.0) / (lr * u)  # (n,)
    return OptimState(buf=state.buf + coef[:, None] * (x_next - x_tilde))
