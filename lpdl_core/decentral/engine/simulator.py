"""The n-node simulator: n replicas of one model on one device, all state stacked (n, d).

One training iteration at every node i (docs/paper-vs-code.md, 'One iteration at node i', made
synchronous):
  1. forward/backward at the de-biased model z_i = x_i / u_i on node i's minibatch -> g_i;
  2. local step x̃_i = x_i - lr·d_i (SGD-Nesterov with weight decay, or QGM);
  3. gossip round of the configured algorithm -> x_{t+1}, u_{t+1} (and QGM's correction);
  4. z = x / u, written in place into the buffer the executor's modules read.

Frozen tensors (Layout.frozen: the official code's activation ranges kept as parameters) are
node state too: the forward pass of step 1 updates them in z, after which x ← z·u on their
columns (the official end-of-backward x ← z·u); the optimizer never moves them and keeps no
momentum for them; gossip mixes, compresses and counts them with the weights.
"""
from __future__ import annotations

import contextlib
import hashlib
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from .. import algorithms, optim
from ..algorithms.base import GossipCfg, Round
from ..compress import message_bytes
from ..layout import Layout, node_parameters
from ..optim import OptimCfg
from ..topology import Topology
from .compiled import CompileCfg, CompiledStep
from .engine_cfg import EngineCfg, resolve_device
from .executors import REGISTRY as IN_PROCESS
from .executors import make_executor


class Simulator:
    """Holds x (numerators), u (push-sum weights), z = x/u, optimizer and algorithm state."""

    def __init__(self, make_model: Callable[[], nn.Module], *, topology: Topology,
                 gossip: GossipCfg = GossipCfg(), optim_cfg: OptimCfg = OptimCfg(),
                 engine: EngineCfg = EngineCfg(),
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] = F.cross_entropy,
                 param_transform=None):
        """param_transform: the model's stacked-parameter transform factory (executors.ParamTransform;
        for 8-bit models lpdl_core.quant.params.ParamQuant), which the batched executor runs once
        for all nodes instead of per layer. Same numbers with or without it."""
        self.topology, self.gossip_cfg, self.optim_cfg, self.engine_cfg = topology, gossip, optim_cfg, engine
        if engine.executor not in IN_PROCESS:
            raise ValueError(f"engine.executor {engine.executor!r} runs one node per process: build a "
                             "NodeProcess (lpdl_core.decentral.engine.distributed), not a Simulator")
        self.device = resolve_device(engine.device)
        self.n = topology.n
        n = self._rows()  # the node rows this process holds
        torch.manual_seed(engine.seed)  # every node starts from the same x_0
        model0 = make_model()
        self.layout = Layout.from_module(model0)
        # the model's module tree (classes and their settings), hashed: part of what a checkpoint must match
        self.architecture = hashlib.sha256(str(model0).encode()).hexdigest()[:16]
        x0 = self.layout.flatten([p.detach() for _, p in node_parameters(model0)])
        self.x = x0.to(self.device).unsqueeze(0).repeat(n, 1)
        self.u = torch.ones(n, device=self.device, dtype=self.x.dtype)
        self.z = self.x.clone()
        self.frozen = self.layout.frozen_mask(self.device)  # None: every tensor is trainable
        self.executor = make_executor(engine.executor, make_model, n, self.layout, self.z, loss_fn,
                                      param_transform, shared_rng=engine.rng_streams == "shared")
        self.algorithm = algorithms.get(gossip.algorithm)
        self.algo_state = self._init_algorithm()
        self.opt_state = optim.init(self.x, optim_cfg)
        self.generator = torch.Generator(device=self.device).manual_seed(engine.seed + 1)
        self.t = 0  # gossip rounds done
        self.bytes_sent = torch.zeros(n, dtype=torch.float64, device=self.device)
        # Per message: the compressed payload, plus u_j if the algorithm sends its push-sum weight.
        self.message_bytes = message_bytes(self.layout, gossip.compressor,
                                           push_sum_weight=self.algorithm.MESSAGE.push_sum_weight)
        self._W: dict[int, torch.Tensor] = {}
        self.compiled = (CompiledStep(self, CompileCfg(enabled=True, mode=engine.compile_mode))
                         if engine.compile else None)

    def _rows(self) -> int:
        """Node rows held here: all n (a distributed rank holds one)."""
        return self.n

    def _init_algorithm(self):
        return self.algorithm.init(self.x, topology=self.topology, cfg=self.gossip_cfg)

    def W(self, t: int) -> torch.Tensor:
        key = t % self.topology.period
        if key not in self._W:
            self._W[key] = torch.as_tensor(self.topology.W(t), dtype=self.x.dtype, device=self.device)
        return self._W[key]

    def _loss_and_grad(self, xb: torch.Tensor, yb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.executor.loss_and_grad(xb, yb)

    # Set by the trainer for the one step whose models it tests before their gossip round (the
    # official trainer tests each epoch before its last transfer is applied): the step keeps
    # (x̃, u) for `premix_view`. Such a step runs eagerly even when the step is compiled.
    keep_premix = False
    premix: tuple[torch.Tensor, torch.Tensor] | None = None

    def train_step(self, xb: torch.Tensor, yb: torch.Tensor, lr: float) -> torch.Tensor:
        """One iteration on node-stacked batches xb (n, B, ...), yb (n, B). Returns losses (n,)."""
        if self.compiled is not None and not self.keep_premix:
            return self.compiled(xb, yb, lr)
        losses, g = self._loss_and_grad(xb, yb)
        self._sync_frozen()
        x_tilde, self.opt_state = optim.local_step(self.x, g, self.opt_state, lr, self.optim_cfg)
        if self.frozen is not None:  # the optimizer never moves frozen tensors
            x_tilde = torch.where(self.frozen, self.x, x_tilde)
            self._no_frozen_momentum()
        self.premix = (x_tilde.clone(), self.u) if self.keep_premix else None
        self._gossip(x_tilde, lr)
        return losses

    @contextlib.contextmanager
    def premix_view(self):
        """While active, the models read z = x̃/u of the last step run with keep_premix: each node's
        model after its local step, before that step's gossip round (evaluation reads only z)."""
        if self.premix is None:
            raise RuntimeError("premix_view needs a step run with keep_premix = True")
        x_tilde, u = self.premix
        self.z.copy_(x_tilde / u[:, None])
        try:
            yield
        finally:
            self.z.copy_(self.x / self.u[:, None])
            self.premix = None

    def gossip_round(self) -> None:
        """A gossip-only round (no optimizer step): the official protocol's final R rounds."""
        self._gossip(self.x, None)

    def forward_round(self, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        """A final round as the official code runs it: a train-mode forward and backward on each
        node's batch (which updates activation ranges and normalization statistics; gradients
        are dropped, no optimizer step), then a gossip-only round. Returns the losses (n,)."""
        losses = self.forward_only(xb, yb)
        self.gossip_round()
        return losses

    def allreduce_round(self) -> None:
        """One exact average in place of the final gossip rounds (an all-reduce of the trained
        models): every node's de-biased model becomes z̄ = (1/m) Σ_i z_i over its group of m nodes
        (all nodes; a pack: each cell's), keeping its push-sum weight (x_i = z̄ u_i), and its
        floating buffers become their node average. Counted on the wire as a ring all-reduce:
        2(m − 1)/m · d float32 values sent per node."""
        stacked, x = self.executor.stacked_buffers(), self.x.clone()
        for rows in self._merge_groups():
            zbar, buffers, m = self._group_means(rows)
            x[rows] = zbar * self.u[rows, None]
            for k, b in buffers.items():
                if stacked[k].is_floating_point():
                    stacked[k][rows] = b
            self.bytes_sent[rows] += 2 * (m - 1) / m * self.layout.d * 4
        self.x = x
        self.z.copy_(self.x / self.u[:, None])
        self.executor.load_buffers(stacked)

    def _merge_groups(self) -> list[slice]:
        """The row groups an all-reduce averages over (a pack overrides it: one per cell)."""
        return [slice(None)]

    def _group_means(self, rows: slice) -> tuple[torch.Tensor, dict[str, torch.Tensor], int]:
        """(z̄, averaged buffers, node count) of a row group (a NodeProcess: by collectives)."""
        return self.z[rows].mean(0), self.average_buffers(rows), self.z[rows].shape[0]

    def forward_only(self, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        """A train-mode forward and backward with no optimizer step and no gossip: what the
        official final rounds' last forward amounts to, as its transfer is never applied."""
        losses, _ = self._loss_and_grad(xb, yb)
        self._sync_frozen()
        return losses

    def _no_frozen_momentum(self) -> None:
        """Optimizer state stays zero on frozen columns (the official optimizer skips tensors
        without a gradient, so it keeps no momentum for them)."""
        st = self.opt_state
        self.opt_state = st._replace(**{k: torch.where(self.frozen, 0.0, b)
                                        for k, b in (("buf", st.buf), ("buf2", st.buf2)) if b is not None})

    def _sync_frozen(self) -> None:
        """x ← z·u on the frozen columns, which the forward pass has just updated in z."""
        if self.frozen is not None:
            self.x = torch.where(self.frozen, self.z * self.u[:, None], self.x)

    def _round(self, x_tilde: torch.Tensor) -> tuple[Round, torch.Tensor]:
        """The algorithm's gossip round t for every node held, and the bytes each one sent."""
        return self._algorithm_round(self.algo_state, x=self.x, x_tilde=x_tilde, u=self.u, W=self.W(self.t),
                                     t=self.t, generator=self.generator)

    def _algorithm_round(self, state, *, x, x_tilde, u, W, t, generator) -> tuple[Round, torch.Tensor]:
        """One round of the algorithm on the given state (the compiled step calls it with traced
        tensors): the Round and the bytes each row sent. A pack of cells overrides it
        (engine/packed.py: one round per cell, each on its own block of W)."""
        r = self.algorithm.step(state, x=x, x_tilde=x_tilde, u=u, W=W, t=t, cfg=self.gossip_cfg,
                                layout=self.layout, generator=generator)
        return r, r.sent.to(torch.float64) * self.message_bytes

    def _gossip(self, x_tilde: torch.Tensor, lr: float | None) -> None:
        r, sent_bytes = self._round(x_tilde)
        if lr is not None:
            self.opt_state = optim.qgm_correct(self.opt_state, r.x, x_tilde, r.u, lr, self.optim_cfg)
            if self.frozen is not None:
                self._no_frozen_momentum()
        self.x, self.u, self.algo_state = r.x, r.u, r.state
        self.bytes_sent += sent_bytes
        self.t += 1
        self.z.copy_(self.x / self.u[:, None])

    def state_dict(self) -> dict:
        """Everything needed to continue bit-exactly: node state, optimizer and algorithm state,
        per-node buffers, round counter, bytes sent and the compressor RNG. Plain tensors, dicts
        and numbers only, so torch.load(weights_only=True) can read it."""
        algo = self._algo_state_dict()
        return {"x": self.x, "u": self.u, "opt_buf": self.opt_state.buf, "opt_buf2": self.opt_state.buf2,
                "opt_step": self.opt_state.step, "algo": algo, "t": self.t,
                "bytes_sent": self.bytes_sent, "buffers": self.executor.stacked_buffers(),
                "generator": self.generator.get_state(), "layout_d": self.layout.d,
                "algorithm": self.gossip_cfg.algorithm}

    def load_state_dict(self, sd: dict) -> None:
        if sd["layout_d"] != self.layout.d or sd["algorithm"] != self.gossip_cfg.algorithm:
            raise ValueError("checkpoint was written by a different model or algorithm")
        dev = self.device
        own = lambda t: t.to(dev).clone()  # noqa: E731  (never alias the caller's tensors)
        self.x, self.u = own(sd["x"]), own(sd["u"])
        buf2 = sd.get("opt_buf2")
        self.opt_state = optim.OptimState(buf=own(sd["opt_buf"]), step=int(sd.get("opt_step", 0)),
                                          buf2=own(buf2) if buf2 is not None else None)
        self.algo_state = self._load_algo_state(sd["algo"], own)
        self.t = int(sd["t"])
        self.bytes_sent = own(sd["bytes_sent"])
        self.executor.load_buffers({k: v.to(dev) for k, v in sd["buffers"].items()})
        self.generator.set_state(sd["generator"])
        self.z.copy_(self.x / self.u[:, None])

    def _algo_state_dict(self) -> dict:
        return dict(self.algo_state._asdict())

    def _load_algo_state(self, algo: dict, own: Callable):
        return restored(self.algo_state, algo, own)

    # ---- across the nodes: this process holds all n rows; a NodeProcess (one row) overrides
    # these with collectives, so training and evaluation code is the same for both
    rows = slice(None)  # the rows of a node-stacked batch (n, B, ...) this process trains on

    def all_finite(self, t: torch.Tensor) -> bool:
        """Whether every node's t (rows, ...) is finite."""
        return bool(torch.isfinite(t).all())

    def node_mean(self, t: torch.Tensor) -> float:
        """(1/n) Σ_i t_i of a per-node quantity t (rows,)."""
        return float(t.mean())

    def gather_rows(self, t: torch.Tensor) -> torch.Tensor:
        """Every node's row of t (rows, ...): (n, ...)."""
        return t

    def shard(self, size: int) -> slice:
        """The part of `size` items (test samples) this process evaluates; `node_total` adds them."""
        return slice(0, size)

    def node_total(self, t: torch.Tensor) -> torch.Tensor:
        """The sum over processes of t (each process's count over its shard)."""
        return t

    def step_splits(self) -> list[dict] | None:
        """Each process's seconds per step by phase; None here (nothing crosses a wire)."""
        return None

    def average_buffers(self, rows: slice = slice(None)) -> dict[str, torch.Tensor]:
        """The averaged model's buffers over `rows` (default all): the node average of floating
        buffers (activation ranges, running statistics); integer counters from the first row."""
        return {k: b[rows].mean(0) if b.is_floating_point() else b[rows][0]
                for k, b in self.executor.stacked_buffers().items()}

    @property
    def average(self) -> torch.Tensor:
        """The parameter-averaged de-biased model z̄ = (1/n) Σ_i z_i, shape (d,)."""
        return self.z.mean(0)

    def consensus_distance(self, rows: slice = slice(None)) -> float:
        """Ξ = sqrt((1/n) Σ_i ||z_i − z̄||²) over `rows` (default all) (Kong et al. 2021)."""
        z = self.z[rows]
        return float(((z - z.mean(0)) ** 2).sum(1).mean().sqrt())


def restored(template, fields: dict, own: Callable):
    """An algorithm state of template's type from a checkpoint's fields (tensors through own)."""
    return type(template)(**{k: (own(v) if isinstance(v, torch.Tensor) else v) for k, v in fields.items()})
