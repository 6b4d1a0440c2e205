"""What one training step dispatches (lpdl_core.training.opcount), and the fused 8-bit weight
quantizers (lpdl_core.quant.params) that cut it.

On a GPU the paper's small models are launch-bound: the operator count, not the arithmetic, sets
the step time, and a host synchronisation stalls the queue. Both are properties of the code, not
of the device, so they are counted here on the CPU.
"""
import itertools

import pytest
import torch

from lpdl_core.config import UNCOMPRESSED_ALGORITHMS
from lpdl_core.decentral.algorithms import REGISTRY as ALGORITHMS
from lpdl_core.decentral.algorithms.base import GossipCfg
from lpdl_core.decentral.compress import CompressorCfg
from lpdl_core.decentral.engine import EngineCfg, Simulator
from lpdl_core.decentral.topology import Topology
from lpdl_core.models.mini import build_standin
from lpdl_core.models.registry import build_model
from lpdl_core.quant.params import OwnRangeParams, ParamQuant
from lpdl_core.quant.quantizer import QuantCfg, quantize
from lpdl_core.training.opcount import HOST_SYNC_OPS, count_ops, step_op_counts


def _sim(precision, *, n=4, executor="batched", algorithm="ds", topology="directed-ring", compression=0,
         qcfg=None, param_transform=ParamQuant, build=build_model):
    q = (qcfg or QuantCfg()) if precision == "int8" else None
    gossip = GossipCfg(algorithm=algorithm) if compression == 0 else GossipCfg(
        algorithm=algorithm, eta=0.01, compressor=CompressorCfg(kind="topk", ratio=compression / 100))
    return Simulator(lambda: build("resnet20", precision=precision, qcfg=q),
                     topology=Topology(name=topology, n=n), gossip=gossip,
                     engine=EngineCfg(executor=executor, device="cpu"), param_transform=param_transform)


def _batch(n, b=2, seed=0, side=32):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, b, 3, side, side, generator=g), torch.randint(0, 10, (n, b), generator=g)


def test_the_counter_sees_a_host_sync_and_tells_views_apart():
    """The counter can fail: .item() and nonzero are host synchronisations, a view is a view."""
    t = torch.arange(6.0)
    c = count_ops(lambda: (t.view(2, 3), t.sum().item(), torch.nonzero(t)))
    assert c.host_syncs == {"aten._local_scalar_dense": 1, "aten.nonzero": 1}
    assert c.views == 1 and c.non_view == c.total - 1
    assert "aten._local_scalar_dense" in HOST_SYNC_OPS


CASES = [(a, t, c, p) for a, t, c, p in itertools.product(
    ALGORITHMS, ("ring", "time-varying-exponential"), (0, 99), ("fp32", "int8"))
    if not (a in UNCOMPRESSED_ALGORITHMS and c) and not (a in ("bagua-lp", "gut") and t == "time-varying-exponential")]


@pytest.mark.parametrize("algorithm,topology,compression,precision", CASES)
def test_a_batched_training_step_never_waits_for_the_device(algorithm, topology, compression, precision):
    """Forward, backward, local step, gossip (every algorithm; static and time-varying graph; 0 %
    and 99 % top-k) and the 8-bit quantizers with stochastic rounding: no host synchronisation.
    (ResNet-20's mini stand-in: the same layer classes, fewer of them.)"""
    sim = _sim(precision, algorithm=algorithm, topology=topology, compression=compression,
               qcfg=QuantCfg(act_rounding="stochastic"), build=build_standin)
    x, y = _batch(4, side=8)
    for _ in range(sim.topology.period):  # every mixing matrix of the schedule built once
        sim.train_step(x, y, 0.01)
    ops = step_op_counts(sim, x, y)
    assert ops["host_syncs"] == 0, ops


def test_param_quant_is_each_layers_own_weight_quantizer_bitwise():
    """Q over the stacked buffer equals, tensor by tensor and node by node, what each 8-bit layer
    computes for its own weight (`quantize(W, bits)`): the minima and maxima are exact, and each
    element then goes through the same float operations on the same operands."""
    torch.manual_seed(0)
    model = build_model("resnet20", precision="int8", qcfg=QuantCfg())
    sim = _sim("int8", n=3)
    Z = sim.x + 0.05 * torch.randn_like(sim.x)   # nodes differ
    pq = ParamQuant(model, sim.layout.names, sim.layout.numels)
    Zq = pq(Z)
    quantized = {f"{p}.{k}" if p else k for p, m in model.named_modules() if isinstance(m, OwnRangeParams)
                 for k in m.quantized_params}
    seen = 0
    for name, z, zq in zip(sim.layout.names, sim.layout.views(Z), sim.layout.views(Zq)):
        for i in range(Z.shape[0]):
            want = quantize(z[i], 8) if name in quantized else z[i]
            assert torch.equal(zq[i], want), name
        seen += name in quantized
    assert seen == pq.tensors == 86  # 21 convs + fc weight and bias + 3 per Range EvoNorm (19)


@pytest.mark.parametrize("ranges_as_parameters", [False, True], ids=["ranges-buffers", "ranges-gossiped"])
def test_fused_weight_quantizers_leave_the_8bit_step_bitwise_unchanged(ranges_as_parameters):
    """The batched 8-bit step with the weights quantized once for all nodes equals the step with
    each layer quantizing its own, bit for bit: the same operations on the same values, in the same
    order, and no draw from any random stream (stochastic rounding on, 99 % top-k gossip). Also
    with the official code's activation ranges as gossiped node state, which the forward updates
    in place in Z."""
    runs = []
    q = QuantCfg(act_rounding="stochastic", measure_as_parameters=ranges_as_parameters)
    for pt in (None, ParamQuant):
        torch.manual_seed(0)
        sim = _sim("int8", compression=99, qcfg=q, param_transform=pt, build=build_standin)
        for s in range(3):
            losses = sim.train_step(*_batch(4, seed=s, side=8), 0.1)
        runs.append((sim.x, losses, sim.executor.stacked_buffers()))
    (x0, l0, b0), (x1, l1, b1) = runs
    assert torch.equal(x0, x1) and torch.equal(l0, l1)
    assert all(torch.equal(b0[k], b1[k]) for k in b0)


# Operators of one batched ResNet-20 step (independent of node count and batch size: vmap runs each
# operator once for all nodes). 8-bit / FP: 4.48 before the weight quantizers were fused and the
# ranges pre-shaped, 2.98 after, 2.84 with the activation ranges kept at the input's rank. This
# holds the eager chain's gain; the fused quantizers bring the step under 2.0 (test_fused_quant.py).
LP_OVER_FP_OPS_CEILING = 2.9


def test_the_eager_8bit_step_dispatches_at_most_2_9x_the_fp_steps_operators():
    x, y = _batch(8)
    fp, lp = (step_op_counts(_sim(p, n=8), x, y) for p in ("fp32", "int8"))
    assert lp["aten_ops"] <= LP_OVER_FP_OPS_CEILING * fp["aten_ops"], (lp, fp)


def test_a_layer_whose_weight_is_not_its_own_node_state_keeps_its_own_quantizer():
    """A weight tied to another module's (named there in the layout) is not handed over: that
    layer goes on quantizing it itself, so no layer ever reads an unquantized weight."""
    from torch import nn

    from lpdl_core.decentral.layout import Layout
    from lpdl_core.quant.layers import QLinear

    class Tied(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = QLinear(4, 4, bias=False, qcfg=QuantCfg())
            self.b = QLinear(4, 4, bias=False, qcfg=QuantCfg())
            self.b.weight = self.a.weight  # named_parameters() lists it once, as a.weight

    m = Tied()
    layout = Layout.from_module(m)
    pq = ParamQuant(m, layout.names, layout.numels)
    assert layout.names == ("a.weight",) and pq.layers == [m.a] and pq.tensors == 1
    with pq.handed_over():
        assert not m.b.params_handed_over and torch.equal(m.b.own_range(m.b.weight), quantize(m.b.weight, 8))
