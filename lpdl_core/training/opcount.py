"""What one training step dispatches: aten operators counted below autograd and vmap, and the
operators among them that synchronise the host with the device.

On a GPU an eager step costs about one kernel launch (and its Python and dispatcher overhead) per
operator, so for the paper's small models the operator count, not the arithmetic, sets the step
time; a host synchronisation stalls the launch queue until the device catches up. Both are counted
on any device (a CPU run dispatches the same operators as a GPU run of the same code), which is
how the tests hold them without a GPU.

The counter is a `TorchDispatchMode`: it sees each operator after autograd, vmap's batching rules
and decompositions have run, i.e. the operators that execute. The operators an operator calls
internally (e.g. a CPU kernel's own helpers) are not counted. lpdl's fused quantizers
(`lpdl.measure_quant`, `lpdl.own_range_quant`: lpdl_core.quant.fused) count once per call and are
also reported apart (`fused_ops`): each is one compiled kernel on a CPU (a test reads the generated
code), and a few on a GPU, where a reduction and the pointwise chain that uses it are separate
Triton kernels.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable

import torch
from torch.utils._python_dispatch import TorchDispatchMode

# Operators that copy a value to the host (`.item()`, `bool(t)`, `float(t)` end in
# _local_scalar_dense) or whose output shape depends on the data (the host must wait for it).
HOST_SYNC_OPS = frozenset({"aten._local_scalar_dense", "aten.item", "aten.nonzero", "aten.nonzero_static",
                           "aten.masked_select", "aten.unique", "aten._unique", "aten._unique2",
                           "aten.unique_consecutive", "aten.unique_dim", "aten.repeat_interleave",
                           "aten.equal", "aten.is_nonzero"})

FUSED_NAMESPACE = "lpdl"  # the custom-operator namespace of lpdl_core.quant.fused


class OpCounter(TorchDispatchMode):
    """Counts every aten operator dispatched while active, by name (`aten.mul`, `aten.add_`, ...),
    and apart the view operators (`view`, `select`, `permute`, `detach`, ...: new metadata over the
    same memory, no kernel on any device)."""

    def __init__(self):
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.views = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        self.views += func.is_view
        return func(*args, **(kwargs or {}))

    @property
    def total(self) -> int:
        return sum(self.ops.values())

    @property
    def non_view(self) -> int:
        """Operators that compute or allocate: about one kernel launch each on a GPU."""
        return self.total - self.views

    @property
    def fused(self) -> int:
        """Calls of lpdl's fused custom operators (FUSED_NAMESPACE)."""
        return sum(v for k, v in self.ops.items() if k.startswith(FUSED_NAMESPACE + "."))

    @property
    def host_syncs(self) -> Counter[str]:
        return Counter({k: v for k, v in self.ops.items() if k in HOST_SYNC_OPS})


def count_ops(fn: Callable[[], object]) -> OpCounter:
    """Run fn() once under an OpCounter and return the counter."""
    with OpCounter() as counter:
        fn()
    return counter


def step_op_counts(sim, x: torch.Tensor, y: torch.Tensor, lr: float = 0.01) -> dict:
    """Operators of one `sim.train_step(x, y, lr)` (after one uncounted step, so lazily built
    state such as cached mixing matrices is not counted): {"aten_ops", "non_view_ops",
    "fused_ops", "host_syncs", "top"} (aten_ops and non_view_ops count a fused operator once)."""
    sim.train_step(x, y, lr)
    c = count_ops(lambda: sim.train_step(x, y, lr))
    return {"aten_ops": c.total, "non_view_ops": c.non_view, "fused_ops": c.fused,
            "host_syncs": sum(c.host_syncs.values()),
            "top": dict(c.ops.most_common(8))}
