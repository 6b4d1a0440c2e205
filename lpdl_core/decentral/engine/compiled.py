r"""One whole training iteration of the batched simulator as a single `torch.compile` graph.

The graph takes the iteration of `Simulator.train_step` (forward and backward of all n nodes,
local optimizer step, gossip round, z = x/u) as a pure function of device tensors:

.. math::
    (x, u, z, b, S, \beta, \text{bytes};\ \xi, y, lr, t) \mapsto (x', u', b', S', \text{losses}, \text{bytes}')

with S the algorithm's state and β the per-node buffers (activation ranges, statistics), which
the forward updates in place. Everything that changes from one iteration to the next enters as
a tensor: the learning rate as a 0-dim tensor, the round counter t as a 0-dim long tensor, and
the mixing matrix as row `t mod P` of the schedule's P matrices stacked once `(P, n, n)`. So one
compilation serves the whole run (and, through the on-disk inductor cache, later cells of the
same shapes), and no step reads a value back to the host. Python ints that only count (the
simulator's t, the optimizer's step count, which Adam's bias correction reads as a tensor) are
advanced outside the graph.

The backward runs as `torch.autograd.grad` of the summed node losses (node i's loss reaches only
row i of the stacked parameters), traced by dynamo (`trace_autograd_ops`), with the 8-bit layers
in their traceable form (lpdl_core.quant.traced). Compression must be deterministic (identity or
top-k): the random kinds draw from the simulator's own generator, which a graph cannot carry.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from torch.utils._pytree import tree_map_only

from ...compile_cache import use_versioned_cache
from ...config import COMPILE_MODES
from ...specs.executors import COMPILABLE_EXECUTORS, executor_spec
from .. import optim

log = logging.getLogger("lpdl.cli")  # the package's one logger


@dataclass(frozen=True, kw_only=True)
class CompileCfg:
    """Whether and how the batched step is compiled.

    enabled: compile the whole iteration (batched executor only).
    mode: torch.compile's mode; "auto" is "reduce-overhead" (CUDA graphs) on CUDA and "default"
        elsewhere (CUDA graphs do not exist on the CPU).
    """

    enabled: bool = False
    mode: str = "auto"    # one of lpdl_core.config.COMPILE_MODES

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise ValueError(f"compile must be true or false, got {self.enabled!r}")
        if self.mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode must be one of {COMPILE_MODES}, got {self.mode!r}")

    def resolved_mode(self, device: torch.device) -> str:
        if self.mode == "auto":
            return "reduce-overhead" if device.type == "cuda" else "default"
        return self.mode


def check_compilable(sim) -> None:
    """One-line errors for the settings a compiled step does not cover (before compiling anything)."""
    if not executor_spec(sim.engine_cfg.executor).compilable:
        raise ValueError(f"compile needs engine.executor {' or '.join(COMPILABLE_EXECUTORS)}, "
                         f"got {sim.engine_cfg.executor!r}")
    if sim.gossip_cfg.compressor.is_random:
        raise ValueError("compile needs a deterministic compressor (identity or topk), "
                         f"got {sim.gossip_cfg.compressor.kind!r}")


class CompiledStep:
    """`sim.train_step` as one compiled graph (see the module docstring). Same state, same meaning."""

    # One graph where dynamo can trace torch.autograd.grad (its `trace_autograd_ops` switch; not in
    # every torch release); else two graphs, the forward (whose backward AOTAutograd compiles and
    # autograd runs) and the update, with the same operations.
    ONE_GRAPH = hasattr(torch._dynamo.config, "trace_autograd_ops")

    def __init__(self, sim, cfg: CompileCfg):
        check_compilable(sim)
        # One compiled step per process at a time: the cells of a job each build one, and dynamo
        # would keep every earlier one's graphs (and CUDA-graph memory) and stop compiling after
        # its recompile limit. The on-disk inductor and AOTAutograd caches keep the compiled code,
        # so a later cell of the same shapes compiles from the cache.
        torch._dynamo.reset()
        self.sim = sim
        P = sim.topology.period
        self.Ws = torch.stack([sim.W(t) for t in range(P)])      # (P, n, n), built once
        self.lr = torch.zeros((), dtype=sim.x.dtype, device=sim.device)
        self.t = torch.zeros((), dtype=torch.long, device=sim.device)
        self.k = torch.zeros((), dtype=sim.x.dtype, device=sim.device)  # optimizer steps done (Adam)
        self.mode = cfg.resolved_mode(sim.device)
        self.cuda_graphs = self.mode == "reduce-overhead" and sim.device.type == "cuda"
        if self.cuda_graphs:  # the tensors the graph updates in place keep their addresses
            for t in (sim.z, *sim.executor.buffers.values()):
                torch._dynamo.mark_static_address(t)
        self.one_graph, self.compiled_once = self.ONE_GRAPH, False
        if self.one_graph:
            self.fn = self._compile(self._iteration)
        else:
            self._two_graphs()

    def _compile(self, f):
        use_versioned_cache()
        return torch.compile(f, fullgraph=True, dynamic=False, mode=self.mode)

    def _two_graphs(self) -> None:
        self.one_graph = False
        self.forward, self.update = self._compile(self.sim.executor._traced_losses), self._compile(self._update)

    def _iteration(self, leaf, x, u, z, buf, buf2, algo_state, bytes_sent, buffers, xb, yb, lr, t, k):
        """leaf: the layers' view of z (param_transform(z)), a leaf that requires grad."""
        losses = self.sim.executor._traced_losses(leaf, z, buffers, xb, yb)
        (g,) = torch.autograd.grad(losses.sum(), leaf)
        return (losses.detach(), *self._update(x, u, z, buf, buf2, algo_state, bytes_sent, g, lr, t, k))

    def _split(self, leaf, x, u, z, buf, buf2, algo_state, bytes_sent, buffers, xb, yb, lr, t, k):
        """_iteration as two compiled graphs and autograd between them (no traced autograd.grad)."""
        losses = self.forward(leaf, z, buffers, xb, yb)
        (g,) = torch.autograd.grad(losses.sum(), leaf)
        return (losses.detach(), *self.update(x, u, z, buf, buf2, algo_state, bytes_sent, g, lr, t, k))

    def _run(self, *args):
        if self.one_graph:
            try:
                with torch._dynamo.config.patch(trace_autograd_ops=True):
                    return self.fn(*args)
            except torch._dynamo.exc.Unsupported as e:  # raised at the first call, before any state changes
                if self.compiled_once:
                    raise
                log.warning("compile: one graph is not supported by this torch (%s); using two graphs",
                            str(e).strip().splitlines()[0])
                self._two_graphs()
            finally:
                self.compiled_once = True
        return self._split(*args)

    def _update(self, x, u, z, buf, buf2, algo_state, bytes_sent, g, lr, t, k):
        """Local step and gossip round from the gradient rows g: the iteration after backward."""
        sim = self.sim
        if sim.frozen is not None:   # x ← z·u on the columns the forward just updated in z
            x = torch.where(sim.frozen, z * u[:, None], x)
        x_tilde, st = optim.local_step(x, g, optim.OptimState(buf=buf, buf2=buf2, step=k), lr, sim.optim_cfg)
        if sim.frozen is not None:
            x_tilde = torch.where(sim.frozen, x, x_tilde)
            st = st._replace(buf=torch.where(sim.frozen, 0.0, st.buf))
        W = self.Ws.index_select(0, (t % self.Ws.shape[0]).reshape(1)).squeeze(0)
        r, sent = sim._algorithm_round(algo_state, x=x, x_tilde=x_tilde, u=u, W=W, t=t, generator=None)
        st = optim.qgm_correct(st, r.x, x_tilde, r.u, lr, sim.optim_cfg)
        if sim.frozen is not None:
            st = st._replace(buf=torch.where(sim.frozen, 0.0, st.buf))
        z.copy_(r.x / r.u[:, None])
        return r.x, r.u, st.buf, st.buf2, r.state, bytes_sent + sent

    def __call__(self, xb: torch.Tensor, yb: torch.Tensor, lr: float) -> torch.Tensor:
        sim, ex = self.sim, self.sim.executor
        self.lr.fill_(lr)
        self.t.fill_(sim.t)   # follows the simulator's counter (a resumed run included)
        self.k.fill_(sim.opt_state.step)
        ex.param_transform.new_step()  # e.g. the 8-bit layers' new stochastic-rounding key
        ex.module.train()
        if self.cuda_graphs:  # each call is a new step: the previous step's outputs are inputs now
            torch.compiler.cudagraph_mark_step_begin()
        leaf = ex.param_transform(sim.z).detach().requires_grad_()  # (eager: a few ops)
        with ex.param_transform.handed_over():
            out = self._run(leaf, sim.x, sim.u, sim.z, sim.opt_state.buf, sim.opt_state.buf2, sim.algo_state,
                            sim.bytes_sent, ex.buffers, xb, yb, self.lr, self.t, self.k)
        if self.cuda_graphs:  # a later replay (of any compiled step in this process) reuses their memory
            out = tree_map_only(torch.Tensor, torch.clone, out)
        losses, sim.x, sim.u, buf, buf2, sim.algo_state, sim.bytes_sent = out
        sim.opt_state = optim.OptimState(buf=buf, buf2=buf2, step=sim.opt_state.step + 1)
        sim.t += 1
        return losses
