"""Every paper model x {FP, LP} runs in the n-node simulator under both executors, and the two
executors agree (LP with nearest rounding everywhere, so the run is deterministic).

The executors compute the same function and differ only in float summation order (vmap turns the
n node convolutions into one grouped convolution and the n matmuls into a batched one), an order
that depends on the CPU's kernels (SIMD width, oneDNN/MKL code path, thread count). No check here
may depend on it:

- LP runs at 16 bits, through the identical LP code path (QConv2d, Range EvoNorm, QAdd, gradient
  bifurcation). A summation-order difference can flip a nearest-rounding decision, which moves a
  value by one step, 2^-b of its tensor's range: at 8 bits (1/255) that is as large as what this
  test must catch, and a deep net amplifies it (seen: loss 2.3e-3 apart on one CPU, 0 on another);
  at 16 bits a flip is 2^-16. The 8-bit arithmetic under vmap is checked bit for bit, layer by
  layer, in test_quant.py and test_norms.py, on data for which no rounding decision depends on
  summation order.
- Every step starts both executors from the same state (the batched simulator is reloaded from the
  loop one after each step), so each comparison covers one forward/backward pass, not a trajectory
  along which differences compound.
"""
import copy

import pytest
import torch

from lpdl_core.decentral.algorithms.base import GossipCfg
from lpdl_core.decentral.engine import EngineCfg, Simulator
from lpdl_core.decentral.topology import Topology
from lpdl_core.models.registry import build_model, input_size
from lpdl_core.quant.quantizer import QuantCfg

FINE = QuantCfg(bits=16, grad_bits=16, act_rounding="nearest", grad_rounding="nearest")
CASES = [("resnet20", "cifar10"), ("resnet54", "cifar10"), ("vgg11", "cifar10"), ("mobilenetv2", "cifar10"),
         ("vgg11", "imagenette"), ("resnet18", "imagenette")]
STEPS, LR = 2, 0.05

# Loss of one forward pass from identical parameters and inputs. The forward has no discontinuity
# but rounding, so each layer's outputs differ by at most one flipped 16-bit step (2^-16 of the
# range) plus the summation-order error (about sqrt(K)·2^-24 <= 4e-6 relative for K <= 4608 terms
# per output). Every layer is re-normalized (EvoNorm / Range EvoNorm), so these relative
# perturbations add over the <= 56 layers of the deepest net (ResNet-54) instead of compounding:
# 56·(2^-16 + 4e-6) < 2^-9. A plumbing error (another node's parameters or batch, stale parameters
# at the second step, another loss) moves the loss by a whole update's effect, far more.
LOSS_RTOL = 2.0 ** -9
# Parameters after one step, measured against the update x_{t+1} - x_t itself (both executors
# start the step from the same x_t). The gradients differ by float order, by flipped 16-bit
# decisions in the layer-gradient quantizers (2^-16 of a gradient tensor's range each) and, at the
# rare near-tie of a chunk max/min (Range EvoNorm) or a max-pool window, by one element's gradient
# share going to its tied neighbour; each touches a vanishing fraction of the update. A plumbing
# error (another node's gradient or data, a layout mismatch, a missing term) changes the update
# by the order of its own size: 1/8 of it separates the two.
UPDATE_RTOL = 2.0 ** -3
# Activation ranges (running min/max) after one step from the same old values: the batch extreme
# moves by at most the largest change of that activation, bounded like the loss (2^-9 of its
# scale). They must agree within one 8-bit step of the range they define, (max - min)·2^-8; a
# missing or stale update under vmap, or another node's batch, moves them by a sizeable fraction
# of the range. The absolute 2^-20 covers zero-initialized residual branches at the first step,
# whose range is 0 in both executors.
RANGE_RTOL, RANGE_ATOL = 2.0 ** -8, 2.0 ** -20


def _sim(name, dataset, precision, executor):
    make = lambda: build_model(name, precision=precision, dataset=dataset,
                               qcfg=FINE if precision == "int8" else None)
    sim = Simulator(make, topology=Topology(name="directed-ring", n=2),
                    gossip=GossipCfg(algorithm="choco", eta=0.5),
                    engine=EngineCfg(executor=executor, device="cpu"))
    for m in getattr(sim.executor, "models", [sim.executor.reference_module()]):
        for mod in m.modules():  # dropout would draw different masks in the two executors
            if isinstance(mod, torch.nn.Dropout):
                mod.p = 0.0
    return sim


def _check_ranges(buf_l, buf_b):
    for k, v in buf_l.items():
        if not k.endswith("running_min"):
            continue
        k_max = k.replace("running_min", "running_max")
        tol = RANGE_RTOL * (buf_l[k_max] - v).abs() + RANGE_ATOL
        for key in (k, k_max):
            assert ((buf_l[key] - buf_b[key]).abs() <= tol).all(), key


@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize("name,dataset", CASES)
def test_loop_equals_batched(name, dataset, precision):
    if dataset == "imagenette" and precision == "fp32":
        pytest.skip("224-px FP nets are covered by the LP case (same code path, fewer layers)")
    size = input_size(name, dataset)
    g = torch.Generator().manual_seed(0)
    sim_l, sim_b = _sim(name, dataset, precision, "loop"), _sim(name, dataset, precision, "batched")
    assert torch.equal(sim_l.x, sim_b.x)
    for t in range(STEPS):
        x = torch.randn(2, 2, 3, size, size, generator=g)
        y = torch.randint(0, 10, (2, 2), generator=g)
        x_before = sim_l.x.clone()
        loss_l, loss_b = sim_l.train_step(x, y, LR), sim_b.train_step(x, y, LR)
        assert torch.isfinite(loss_l).all()
        torch.testing.assert_close(loss_b, loss_l, rtol=LOSS_RTOL, atol=0)
        update = (sim_l.x - x_before).norm()
        assert update > 0
        assert (sim_b.x - sim_l.x).norm() <= UPDATE_RTOL * update, t
        _check_ranges(sim_l.executor.stacked_buffers(), sim_b.executor.stacked_buffers())
        sim_b.load_state_dict(copy.deepcopy(sim_l.state_dict()))  # same state for the next step
