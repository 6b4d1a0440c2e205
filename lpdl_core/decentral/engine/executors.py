"""Two ways to run forward/backward for all n node models; the same math, checked by a test.

`loop`: n ordinary module replicas whose parameters are *views* into the stacked (n, d) buffer Z
(and whose .grad are views into G), run one after another. Fastest on CPU (measured: vmap turns
convolutions into grouped convolutions, which are slower there).
`batched`: one stateless module driven by torch.func.vmap(grad) over the stacked parameters;
expected to win on GPUs where n small models underfill the device.
"""
from __future__ import annotations

import contextlib
from typing import Callable, Literal, Protocol

import torch
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

from ..layout import Layout, node_parameters

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class ParamTransform(Protocol):
    """A model's own transform of its stacked parameters before each batched training forward,
    built as `factory(module, layout.names, layout.numels, device)`: `transform(Z)` returns the
    (n, d) values the layers are to read (a new tensor), and inside `transform.handed_over()` the
    layers read them as given. The transform must be straight-through (dL/dZ = dL/dtransform(Z)).
    The 8-bit layers' own-range weight quantization is one (lpdl_core.quant.params.ParamQuant)."""

    def __call__(self, Z: torch.Tensor) -> torch.Tensor: ...

    def handed_over(self) -> contextlib.AbstractContextManager: ...

    def new_step(self) -> None:
        """Called before each compiled step (engine/compiled.py): whatever the model's traced
        operators must draw afresh per step, outside the graph."""


class _Identity:
    def __call__(self, Z: torch.Tensor) -> torch.Tensor:
        return Z

    def handed_over(self) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()

    def new_step(self) -> None:
        pass


def _state(module: nn.Module) -> list[nn.Parameter]:
    """The parameters that are node state (layout.node_parameters), in layout order."""
    return [p for _, p in node_parameters(module)]


def _rng_state(device: torch.device):
    """The global generators' state: the CPU one, and the device's own on CUDA."""
    return torch.get_rng_state(), (torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def _set_rng_state(state, device: torch.device) -> None:
    cpu, cuda = state
    torch.set_rng_state(cpu)
    if cuda is not None:
        torch.cuda.set_rng_state(cuda, device)


class LoopExecutor:
    name: Literal["loop"] = "loop"

    def __init__(self, make_model: Callable[[], nn.Module], n: int, layout: Layout,
                 Z: torch.Tensor, loss_fn: LossFn, shared_rng: bool = False):
        self.layout, self.Z, self.loss_fn = layout, Z, loss_fn
        # shared_rng: every node's forward/backward starts from the same global RNG state (the
        # official ranks, seeded alike), so they draw the same dropout masks and rounding noise
        self.shared_rng = shared_rng
        self.G = torch.zeros_like(Z)
        self.models = [make_model().to(Z.device) for _ in range(n)]
        for i, m in enumerate(self.models):
            params = _state(m)
            if len(params) != len(layout.shapes):
                raise ValueError("model parameters do not match the layout")
            for p, z, g in zip(params, layout.views(Z[i]), layout.views(self.G[i])):
                p.data = z  # the module reads (and its forward updates frozen tensors in) node i's row of Z
                if p.requires_grad:
                    p.grad = g  # autograd accumulates in place into node i's row of G

    def loss_and_grad(self, xb: torch.Tensor, yb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-node mean loss (n,) and gradient rows G (n, d) on node-stacked batches."""
        self.G.zero_()
        losses = []
        start = _rng_state(self.Z.device) if self.shared_rng else None
        for i, m in enumerate(self.models):
            if start is not None:
                _set_rng_state(start, self.Z.device)
            m.train()
            loss = self.loss_fn(m(xb[i]), yb[i])
            loss.backward()
            losses.append(loss.detach())
        return torch.stack(losses), self.G

    @torch.no_grad()
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """Every node's model on the same inputs x: (n, N, classes), eval mode."""
        outs = []
        for m in self.models:
            m.eval()
            outs.append(m(x))
        return torch.stack(outs)

    def reference_module(self) -> nn.Module:
        return self.models[0]

    def stacked_buffers(self) -> dict[str, torch.Tensor]:
        """Every node's buffers (e.g. activation ranges), stacked (n, ...)."""
        per_node = [dict(m.named_buffers()) for m in self.models]
        return {k: torch.stack([b[k] for b in per_node]) for k in per_node[0]}

    @torch.no_grad()
    def load_buffers(self, stacked: dict[str, torch.Tensor]) -> None:
        for i, m in enumerate(self.models):
            for k, b in m.named_buffers():
                b.copy_(stacked[k][i])


class BatchedExecutor:
    name: Literal["batched"] = "batched"

    def __init__(self, make_model: Callable[[], nn.Module], n: int, layout: Layout,
                 Z: torch.Tensor, loss_fn: LossFn, param_transform=None, shared_rng: bool = False):
        self.layout, self.Z, self.loss_fn = layout, Z, loss_fn
        self.module = make_model().to(Z.device)
        if len(_state(self.module)) != len(layout.shapes):
            raise ValueError("model parameters do not match the layout")
        # e.g. the 8-bit layers' own-range weight quantizers, run once over all nodes and tensors
        self.param_transform: ParamTransform = (_Identity() if param_transform is None else
                                                param_transform(self.module, layout.names, layout.numels, Z.device))
        # Buffers are stacked per node; a train-mode forward updates its node's row in place.
        self.buffers = {k: b.unsqueeze(0).expand(n, *b.shape).clone()
                        for k, b in self.module.named_buffers()}

        # frozen: the node's frozen tensors (views of Z, not differentiated): the forward
        # updates them in place, as the loop executor's modules update their rows of Z.
        def node_loss(params, frozen, buffers, x, y):
            out = functional_call(self.module, (params, frozen, buffers), (x,))
            return self.loss_fn(out, y)

        # randomness="different": dropout masks and rounding noise differ per node, as with n
        # separate modules; "same" (shared_rng): every node draws the same, as the official ranks.
        randomness = "same" if shared_rng else "different"
        self._grad = vmap(grad_and_value(node_loss), randomness=randomness)
        self._losses = vmap(node_loss, randomness=randomness)
        self._traced_step = self._traced  # replaced by its compiled form (compile())

    def _params(self) -> dict[str, torch.Tensor]:
        return dict(zip(self.layout.names, self.layout.views(self.Z)))

    def loss_and_grad(self, xb: torch.Tensor, yb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """As the loop executor's. The layers read param_transform(Z) (for the 8-bit layers: their
        weights already quantized, bitwise as they would; straight-through, so the same gradient)."""
        self.module.train()
        params = dict(zip(self.layout.names, self.layout.views(self.param_transform(self.Z))))
        if self.layout.frozen:  # views of Z itself: the forward updates them in place
            z = self._params()
            frozen = {k: z[k] for k in self.layout.frozen}
            for k in frozen:
                del params[k]
        else:
            frozen = {}
        with self.param_transform.handed_over():
            grads, losses = self._grad(params, frozen, self.buffers, xb, yb)
        G = self.layout.flatten([grads[k] if k in grads else torch.zeros_like(frozen[k])
                                 for k in self.layout.names], lead=1)
        return losses.detach(), G

    def _traced(self, Z: torch.Tensor, buffers: dict, xb: torch.Tensor, yb: torch.Tensor):
        """loss_and_grad in the form torch.compile traces whole: vmap of the per-node loss, then
        one torch.autograd.grad of their sum outside vmap (node i's loss reaches only row i), with
        the 8-bit layers' traceable operators (lpdl_core.quant.traced). G comes out (n, d)."""
        leaf = self.param_transform(Z).detach().requires_grad_()
        losses = self._traced_losses(leaf, Z, buffers, xb, yb)
        (G,) = torch.autograd.grad(losses.sum(), leaf)
        return losses.detach(), G

    def _traced_losses(self, leaf: torch.Tensor, Z: torch.Tensor, buffers: dict, xb: torch.Tensor,
                       yb: torch.Tensor) -> torch.Tensor:
        """The per-node losses (n,) of the layers reading `leaf` (the transformed Z), differentiable in it."""
        params = dict(zip(self.layout.names, self.layout.views(leaf)))
        frozen = {k: v for k, v in zip(self.layout.names, self.layout.views(Z)) if k in self.layout.frozen}
        for k in frozen:
            del params[k]
        return self._losses(params, frozen, buffers, xb, yb)

    def traced_loss_and_grad(self, xb: torch.Tensor, yb: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """As loss_and_grad, through `_traced` (compiled once compile() has run)."""
        self.module.train()
        with self.param_transform.handed_over(), torch._dynamo.config.patch(trace_autograd_ops=True):
            return self._traced_step(self.Z, self.buffers, xb, yb)

    @torch.no_grad()
    def logits(self, x: torch.Tensor) -> torch.Tensor:
        # Evaluation runs node by node: with one shared input batch, vmap buys nothing and its
        # grouped convolutions are slower (measured 3x for LP nets on CPU).
        self.module.eval()
        params = self._params()
        return torch.stack([functional_call(self.module, ({k: v[i] for k, v in params.items()},
                                                          {k: v[i] for k, v in self.buffers.items()}), (x,))
                            for i in range(self.Z.shape[0])])

    def reference_module(self) -> nn.Module:
        return self.module

    def stacked_buffers(self) -> dict[str, torch.Tensor]:
        return dict(self.buffers)

    @torch.no_grad()
    def load_buffers(self, stacked: dict[str, torch.Tensor]) -> None:
        for k, b in self.buffers.items():
            b.copy_(stacked[k])


REGISTRY: dict[str, type[LoopExecutor] | type[BatchedExecutor]] = {
    LoopExecutor.name: LoopExecutor,
    BatchedExecutor.name: BatchedExecutor,
}


def make_executor(kind: str, make_model, n: int, layout: Layout, Z: torch.Tensor, loss_fn: LossFn,
                  param_transform=None, shared_rng: bool = False):
    """The executor registered as `kind`, running n replicas of `make_model()` over Z.
    param_transform: a ParamTransform factory, used where it saves work (the batched executor).
    shared_rng: every node draws the same random values (EngineCfg.rng_streams "shared")."""
    try:
        cls = REGISTRY[kind]
    except KeyError:
        raise ValueError(f"engine.executor must be one of {tuple(REGISTRY)}, got {kind!r}") from None
    if cls is BatchedExecutor:
        return cls(make_model, n, layout, Z, loss_fn, param_transform, shared_rng=shared_rng)
    return cls(make_model, n, layout, Z, loss_fn, shared_rng=shared_rng)
