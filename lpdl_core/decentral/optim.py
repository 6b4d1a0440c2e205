"""Local optimizers on stacked `(n, d)` node state: SGD with Nesterov momentum and weight decay
(the official code's local step, docs/paper-vs-code.md, 'Optimizer, schedule, batch and seeds') and
Quasi-Global Momentum (QG-DSGDm-N, Lin et al. 2021, as implemented by the official code,
docs/paper-vs-code.md, 'Quasi-Global Momentum').

Both act on the push-sum numerator x with the gradient g taken at the de-biased model z = x/u.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from ..config import MOMENTA


@dataclass(frozen=True, kw_only=True)
class OptimCfg:
    """Local update of every node.

    momentum: "nesterov" (paper/official default), "heavy-ball", "none", "qgm", or "adam" (the
        paper's NLP runs: Adam with β1 = `beta`, β2 = `beta2`, L2 weight decay, as torch.optim.Adam).
    beta: momentum coefficient (0.9 in the paper, used by QGM for both momenta; Adam's β1).
    weight_decay: added to the gradient (acts on x, the numerator), 1e-4 in the paper.
    """

    momentum: str = "nesterov"   # one of lpdl_core.config.MOMENTA
    beta: float = 0.9
    weight_decay: float = 1e-4
    beta2: float = 0.999
    eps: float = 1e-8

    def __post_init__(self) -> None:
        if self.momentum not in MOMENTA:
            raise ValueError(f"optim.momentum must be one of {MOMENTA}, got {self.momentum!r}")
        if not 0.0 <= self.beta < 1.0:
            raise ValueError(f"optim.beta must be in [0, 1), got {self.beta}")
        if not 0.0 <= self.beta2 < 1.0 or not self.eps > 0:
            raise ValueError("optim.beta2 must be in [0, 1) and optim.eps > 0")
        if self.weight_decay < 0:
            raise ValueError(f"optim.weight_decay must be >= 0, got {self.weight_decay}")


class OptimState(NamedTuple):
    buf: torch.Tensor  # (n, d): SGD momentum buffer b, QGM's quasi-global momentum m̂, Adam's m
    buf2: torch.Tensor | None = None  # (n, d): Adam's second moment v
    step: int = 0                     # Adam's step count (bias correction; a tensor in a compiled step)


def init(x: torch.Tensor, cfg: "OptimCfg | None" = None) -> OptimState:
    adam = cfg is not None and cfg.momentum == "adam"
    return OptimState(buf=torch.zeros_like(x), buf2=torch.zeros_like(x) if adam else None)


def local_step(x: torch.Tensor, g: torch.Tensor, state: OptimState, lr: float, cfg: OptimCfg
               ) -> tuple[torch.Tensor, OptimState]:
    r"""One local step for all nodes: returns x̃ = x - lr·d and the new state.

    SGD (== torch.optim.SGD(momentum=β, nesterov=..., weight_decay=wd), dampening 0):

    .. math::
        g' = g + wd\,x,\quad b \leftarrow \beta b + g',\quad
        d = g' + \beta b \;(\text{Nesterov}) \;\text{or}\; b \;(\text{heavy ball}),\quad
        \tilde x = x - lr\,d

    QGM (docs/paper-vs-code.md, 'Quasi-Global Momentum'; the gossip correction is `qgm_correct`):

    .. math::
        g' = g + wd\,x,\quad d = g' + \beta(\beta \hat m + g'),\quad
        \hat m \leftarrow \beta \hat m + (1-\beta) d,\quad \tilde x = x - lr\,d
    """
    gw = g + cfg.weight_decay * x if cfg.weight_decay else g
    beta = cfg.beta
    if cfg.momentum == "adam":
        # torch.optim.Adam (L2 decay, not AdamW): m, v with bias correction at step k
        k = state.step + 1
        m = beta * state.buf + (1.0 - beta) * gw
        v = cfg.beta2 * state.buf2 + (1.0 - cfg.beta2) * gw * gw
        denom = (v / (1.0 - cfg.beta2 ** k)).sqrt() + cfg.eps
        return x - (lr / (1.0 - beta ** k)) * m / denom, OptimState(buf=m, buf2=v, step=k)
    if cfg.momentum == "qgm":
        d = gw + beta * (beta * state.buf + gw)
        buf = beta * state.buf + (1.0 - beta) * d
    elif cfg.momentum == "none":
        d, buf = gw, state.buf
    else:
        # b_0 = 0, so the first step gives b = g' exactly like torch's buffer clone.
        buf = beta * state.buf + gw
        d = gw + beta * buf if cfg.momentum == "nesterov" else buf
    return x - lr * d, OptimState(buf=buf, buf2=state.buf2, step=state.step + 1)


def qgm_correct(state: OptimState, x_next: torch.Tensor, x_tilde: torch.Tensor, u: torch.Tensor,
                lr: float, cfg: OptimCfg) -> OptimState:
    r"""QGM's gossip correction after the consensus step (no-op for other momenta).

    .. math:: \hat m \leftarrow \hat m + \frac{\beta - 1}{lr\,u}\,(x_{t+1} - \tilde x_t)

    so that overall :math:`\hat m_t = \beta \hat m_{t-1} + (1-\beta)(x_t - x_{t+1})/lr`.
    """
    if cfg.momentum != "qgm":
        return state
    if isinstance(lr, torch.Tensor):  # a compiled step's lr: no host branch on its value
        coef = torch.where(lr == 0.0, 0.0, (cfg.beta - 1.0) / (lr * u))
    elif lr == 0.0:
        return state
    else:
        coef = (cfg.beta - 1.0) / (lr * u)  # (n,)
    return state._replace(buf=state.buf + coef[:, None] * (x_next - x_tilde))
