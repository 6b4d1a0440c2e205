"""int8_arithmetic "integer": exact integer products equal to fake quantization up to float rounding.

Every check compares against float64 arithmetic on the same 8-bit operands, with a bound derived
from the operands' magnitudes (`_bound`): float32 accumulates each term with a relative error of
at most a few ulps per operation, and the fake path's float32 convolution of K products at most
K ulps of the sum of their magnitudes. An offset or border term computed wrong is off by the size
of that term, orders of magnitude above the bound (test_the_bound_sees_a_missing_border_term).

The integer kernels run here through `int_mm` (torch._int_mm, the CUDA path's code, exact on any
CPU), and through `onednn` where this CPU has VNNI (skipped elsewhere, where `test_kernels_are_exact`
checks it on operands every x86 ISA computes exactly: weights within 7 bits, since without VNNI
oneDNN adds u8·s8 pairs in saturating int16).
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from lpdl_core.config import Fidelity, fidelity_mode, identity_fidelity, recorded_fidelity
from lpdl_core.quant import arithmetic, int8_kernels, integer
from lpdl_core.quant.layers import QConv2d, QLinear
from lpdl_core.quant.quantizer import QuantCfg, fake_quant

EPS = torch.finfo(torch.float32).eps
CUDA = torch.cuda.is_available()
# (backend, device): each backend on the CPU, and on a GPU the CUDA path (int_mm: torch._int_mm, cuBLASLt)
KERNEL_DEVICES = [pytest.param("int_mm", "cpu", id="int_mm"), pytest.param("onednn", "cpu", id="onednn"),
                  pytest.param("int_mm", "cuda", id="int_mm-cuda",
                               marks=[pytest.mark.gpu, pytest.mark.skipif(not CUDA, reason="needs CUDA")])]


def _q(t: torch.Tensor) -> torch.Tensor:
    """t on its own 8-bit grid (a quantized weight, bias or gradient)."""
    return fake_quant(t, 8, "nearest")


def _force(monkeypatch, name, why) -> None:
    """Every device's kernel choice is `name` (int_mm: the exact kernel of any CPU)."""
    monkeypatch.setattr(int8_kernels, "backend_for", lambda device: (name, why))
    monkeypatch.setattr(int8_kernels, "chosen", lambda device: (name, why))


def _bound(terms: list[torch.Tensor], k: int, products: torch.Tensor) -> torch.Tensor:
    """|integer − float64| and |fake − float64| ≤ 8 ε Σ|term| + 2 K ε Σ|a·b|.

    The integer path: an exact product, then three float32 terms (each a few roundings) that
    cancel to the result, so its error is a few ulps of the largest term. With v = s·q + m on each
    grid, |s q| ≤ |v| + |m|, and |m| ≤ max|v| for an own-range tensor, so every term is at most
    op(|a| + |m_a|, |b| + max|b|) (`_spread`), passed in `terms` with the result. The fake path:
    float32 sums of K products, at most K ulps of Σ|a·b|."""
    return 8 * EPS * sum(t.abs() for t in terms) + 2 * k * EPS * products


CONVS = [  # (B, C, O, H, kernel, stride, padding, dilation, groups)
    pytest.param(4, 8, 8, 9, 3, 1, 1, 1, 1, id="3x3-pad1"),
    pytest.param(4, 8, 16, 9, 3, 2, 1, 1, 1, id="3x3-stride2"),
    pytest.param(3, 8, 8, 8, 1, 2, 0, 1, 1, id="1x1-stride2-nopad"),
    pytest.param(2, 4, 8, 10, 3, 1, 0, 1, 1, id="3x3-nopad"),
    pytest.param(2, 8, 8, 7, 3, 1, 1, 1, 4, id="grouped"),
    pytest.param(2, 6, 6, 7, 3, 2, 2, 2, 6, id="depthwise-dilated"),
    pytest.param(2, 16, 16, 8, 3, 1, 1, 1, 2, id="grouped-as-batched"),  # 2 nodes' convs as one
]


def _operands(b, c, o, h, k, groups, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, c, h, h, generator=g) + 0.5  # an offset range: m_x far from 0
    lo, hi = x.min(), x.max()
    return fake_quant(x, 8, "nearest", lo, hi), lo, (hi - lo) / 255, _q(torch.randn(o, c // groups, k, k,
                                                                                       generator=g))


@pytest.mark.parametrize("backend,device", KERNEL_DEVICES)
def test_kernels_are_exact(backend, device):
    g = torch.Generator().manual_seed(1)
    w_hi = 128 if backend == "int_mm" else 64  # onednn: the range exact on every x86 ISA
    kern = int8_kernels.KERNELS[backend]
    a = torch.randint(0, 256, (3, 8, 9, 9), dtype=torch.uint8, generator=g)
    for stride, pad, dil, groups in [((1, 1), (1, 1), (1, 1), 1), ((2, 2), (1, 1), (1, 1), 1),
                                     ((2, 1), (2, 1), (2, 1), 4), ((1, 1), (0, 0), (1, 1), 8)]:
        w = torch.randint(-w_hi, w_hi, (8, 8 // groups, 3, 3), dtype=torch.int8, generator=g)
        got = kern.conv(a.to(device), w.to(device), stride, pad, dil, groups).cpu().double()
        assert torch.equal(got, F.conv2d(a.double(), w.double(), None, stride, pad, dil, groups))
    a2 = torch.randint(0, 256, (5, 40), dtype=torch.uint8, generator=g)
    b2 = torch.randint(-w_hi, w_hi, (40, 6), dtype=torch.int8, generator=g)
    assert torch.equal(kern.mm(a2.to(device), b2.to(device)).cpu().double(), a2.double() @ b2.double())


def test_the_probe_rejects_a_saturating_kernel(monkeypatch):
    """oneDNN without VNNI sums u8·s8 pairs in saturating int16: the worst-case probe must see it."""
    def saturating_mm(a, b):
        pairs = (a.double().view(a.shape[0], -1, 2, 1) * b.double().view(1, -1, 2, b.shape[1])).sum(2)
        return pairs.clamp(-32768, 32767).sum(1).float()

    exact_conv = int8_kernels.KERNELS["int_mm"].conv
    monkeypatch.setitem(int8_kernels.KERNELS, "saturating", int8_kernels.Kernel(saturating_mm, exact_conv))
    assert int8_kernels.exact("int_mm") and not int8_kernels.exact("saturating")


def test_backend_for_picks_only_an_exact_kernel():
    name, why = int8_kernels.backend_for("cpu")
    assert (name == "onednn") == int8_kernels.exact("onednn", "cpu")
    assert name is not None or "VNNI" in why


def _within(got: torch.Tensor, fake: torch.Tensor, ref: torch.Tensor, bound: torch.Tensor) -> float:
    """The larger of |integer − ref| / bound and |fake − ref| / bound (≤ 1: both within the bound;
    where the bound is 0, an output no product reaches, both must be exactly 0)."""
    bound = bound.clamp_min(1e-300)
    return max(float(((got.double() - ref).abs() / bound).max()), float(((fake.double() - ref).abs() / bound).max()))


def _check_conv(y, x, m_x, w, b, conf) -> float:
    """A forward result against float64 on the same 8-bit operands (and the fake float32 one)."""
    ref = F.conv2d(x.double(), w.double(), None if b is None else b.double(), *conf)
    k = w.shape[1] * w.shape[2] * w.shape[3]
    spread = F.conv2d(x.double().abs() + float(m_x.abs().max()), w.double().abs() + float(w.abs().max()), None, *conf)
    terms = [ref, 3 * spread] + ([] if b is None else [b.double().abs().view(1, -1, 1, 1)])
    bound = _bound(terms, k, F.conv2d(x.double().abs(), w.double().abs(), None, *conf))
    return _within(y, F.conv2d(x, w, b, *conf), ref, bound)


def _check_conv_grad(gx, g, w, in_shape, conf) -> float:
    """A layer gradient against float64 on the same 8-bit g and W (and the fake float32 one)."""
    ref = torch.nn.grad.conv2d_input(in_shape, w.double(), g.double(), *conf)
    prod = torch.nn.grad.conv2d_input(in_shape, w.double().abs(), g.double().abs(), *conf)
    spread = torch.nn.grad.conv2d_input(in_shape, w.double().abs() + float(w.abs().max()),
                                        g.double().abs() + float(g.abs().max()), *conf)
    bound = _bound([ref, 3 * spread], w.shape[0] // conf[3] * w.shape[2] * w.shape[3], prod)
    return _within(gx, torch.nn.grad.conv2d_input(in_shape, w, g, *conf), ref, bound)


def _check_linear(y, x, m_x, w, b) -> float:
    ref = F.linear(x.double(), w.double(), None if b is None else b.double())
    prod = F.linear(x.double().abs(), w.double().abs())
    spread = F.linear(x.double().abs() + float(m_x.abs().max()), w.double().abs() + float(w.abs().max()))
    terms = [ref, 3 * spread] + ([] if b is None else [b.double().abs()])
    return _within(y, F.linear(x, w, b), ref, _bound(terms, w.shape[1], prod))


def _check_linear_grad(gx, g, w) -> float:
    ref, prod = g.double() @ w.double(), g.double().abs() @ w.double().abs()
    spread = (g.double().abs() + float(g.abs().max())) @ (w.double().abs() + float(w.abs().max()))
    return _within(gx, g @ w, ref, _bound([ref, 3 * spread], w.shape[0], prod))


def _skip_unless_exact(backend: str, device: str = "cpu") -> None:
    """Skip where `backend`'s kernels are not exact on this device (onednn: exact on VNNI CPUs only)."""
    if not int8_kernels.exact(backend, device):
        pytest.skip(f"{backend} is not exact on this {device} (CPU ISA {int8_kernels.cpu_isa()})")


def _on(device: str, *tensors):
    return [t if t is None else t.to(device) for t in tensors]


@pytest.mark.parametrize("backend,device", KERNEL_DEVICES)
@pytest.mark.parametrize("b,c,o,h,k,stride,pad,dil,groups", CONVS)
def test_conv_forward_and_layer_gradient_equal_fake(b, c, o, h, k, stride, pad, dil, groups, backend, device):
    """Checked in float64 on the CPU; on a GPU the product runs there (the float32 terms too)."""
    _skip_unless_exact(backend, device)
    qx, m_x, s_x, qw = _operands(b, c, o, h, k, groups)
    qb = _q(torch.randn(o))
    conf = ((stride,) * 2, (pad,) * 2, (dil,) * 2, groups)
    y = integer.conv2d(backend, *_on(device, qx, m_x, s_x, qw, qb), *conf).cpu()
    assert _check_conv(y, qx, m_x, qw, qb, conf) <= 1
    gy = _q(torch.randn_like(y))
    gx = integer.conv2d_input_grad(backend, *_on(device, gy, qw), qx.shape, *conf).cpu()
    assert gx.shape == qx.shape and _check_conv_grad(gx, gy, qw, qx.shape, conf) <= 1


@pytest.mark.parametrize("backend", ["int_mm", "onednn"])
@pytest.mark.parametrize("b,c,o,h,k,stride,pad,dil,groups", CONVS)
def test_nodes_as_one_grouped_convolution_each_on_its_own_grids(b, c, o, h, k, stride, pad, dil, groups, backend):
    """Three nodes' convolutions as one grouped convolution (the vmap rule's form): each node's block
    of the output, forward and layer gradient, within the bound of that node's own operands, on its
    own grids (x's range, W's and g's own ranges: the seeds give each node different extremes)."""
    _skip_unless_exact(backend)
    n, conf = 3, ((stride,) * 2, (pad,) * 2, (dil,) * 2, groups)
    nodes = [_operands(b, c, o, h, k, groups, seed=i) for i in range(n)]
    biases = [_q(torch.randn(o, generator=torch.Generator().manual_seed(10 + i))) for i in range(n)]
    assert len({float(m) for _, m, _, _ in nodes}) == n
    x, w = torch.cat([v[0] for v in nodes], 1), torch.cat([v[3] for v in nodes])
    m, s = torch.stack([v[1] for v in nodes]), torch.stack([v[2] for v in nodes])
    y = integer.conv2d(backend, x, m, s, w, torch.cat(biases), *conf[:3], groups * n, n)
    for i, (qx, m_x, _, qw) in enumerate(nodes):
        assert _check_conv(y[:, i * o:(i + 1) * o], qx, m_x, qw, biases[i], conf) <= 1
    gys = [_q(torch.randn(b, o, *y.shape[2:], generator=torch.Generator().manual_seed(20 + i)) * (i + 1))
           for i in range(n)]
    gx = integer.conv2d_input_grad(backend, torch.cat(gys, 1), w, list(x.shape), *conf[:3], groups * n, n)
    for i, (qx, _, _, qw) in enumerate(nodes):
        assert _check_conv_grad(gx[:, i * c:(i + 1) * c], gys[i], qw, qx.shape, conf) <= 1


@pytest.mark.parametrize("h", [8, 16, 17, 32])
@pytest.mark.parametrize("k, stride, pad, dil", [(3, 1, 1, 1), (3, 2, 1, 1), (1, 2, 0, 1), (5, 1, 2, 1), (3, 1, 2, 1),
                                                 (3, 1, 0, 1), (3, 1, 2, 2)])
def test_window_sums_are_a_convolution_with_ones(h, k, stride, pad, dil):
    """conv(t, 1) channel by channel, exactly: the sums are of integers below 2^24, exact in any
    order, whether running sums of slices (16×16 planes and more), pooling or a convolution."""
    t = torch.randint(0, 256 * 64, (3, 4, h, h + 1)).float()
    want = F.conv2d(t, torch.ones(4, 1, k, k), None, stride, pad, dil, 4)
    assert torch.equal(integer._window_sums(t, (k, k), (stride, stride), (pad, pad), (dil, dil)), want)


def test_the_bound_sees_a_missing_border_term():
    """Taking the padded zeros as grid zeros (q = 0, i.e. value m_x) is off by m_x·W at the border."""
    qx, m_x, _, qw = _operands(2, 8, 8, 9, 3, 1)
    conf = ((1, 1), (1, 1), (1, 1), 1)
    wrong = F.conv2d(F.pad(qx, (1, 1, 1, 1), value=float(m_x)), qw)
    assert _check_conv(wrong, qx, m_x, qw, None, conf) > 1


@pytest.mark.parametrize("backend,device", KERNEL_DEVICES)
@pytest.mark.parametrize("shape", [(6, 40), (3, 5, 48)], ids=["linear", "distilbert-like-3d"])
def test_linear_forward_and_layer_gradient_equal_fake(shape, backend, device):
    _skip_unless_exact(backend, device)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(*shape, generator=g) - 0.3
    lo, hi = x.min(), x.max()
    qx = fake_quant(x, 8, "nearest", lo, hi)
    qw, qb = _q(torch.randn(12, shape[-1], generator=g)), _q(torch.randn(12, generator=g))
    y = integer.linear(backend, *_on(device, qx, lo, (hi - lo) / 255, qw, qb)).cpu()
    assert _check_linear(y, qx, lo, qw, qb) <= 1
    gy = _q(torch.randn(*shape[:-1], 12, generator=g))
    assert _check_linear_grad(integer.linear_input_grad(backend, *_on(device, gy, qw)).cpu(), gy, qw) <= 1


def test_a_3d_linear_in_training_takes_its_range_as_quantmeasure_keeps_it(monkeypatch):
    """QuantMeasure keeps a training range at x's rank ((1, 1, 1) for a (B, T, K) input)."""
    _force(monkeypatch, "int_mm", "test")
    out = {}
    for kind in ("integer", "fake"):
        torch.manual_seed(0)
        lin = QLinear(16, 6, qcfg=QuantCfg(int8_arithmetic=kind, grad_rounding="nearest"))
        x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(5), requires_grad=True)
        y = lin(x)
        y.square().sum().backward()
        out[kind] = (y.detach(), x.grad)
    for a, b in zip(out["integer"], out["fake"]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))


def test_the_tiny_distilbert_takes_the_integer_path_and_matches_fake(monkeypatch):
    """Every Linear of the (tiny, random) DistilBERT as a QLinear in integers: one training step's
    loss and gradients as fake's (nearest rounding, no dropout)."""
    from lpdl_core.models.transformer import distilbert_classifier, tiny_distilbert_config

    _force(monkeypatch, "int_mm", "test")
    out = {}
    for kind in ("integer", "fake"):
        torch.manual_seed(0)
        m = distilbert_classifier(4, precision="int8", pretrained=None, config_overrides=tiny_distilbert_config(),
                                  qcfg=QuantCfg(int8_arithmetic=kind, grad_rounding="nearest"))
        for mod in m.modules():
            if isinstance(mod, torch.nn.Dropout):
                mod.p = 0.0
        ids = torch.randint(0, 1000, (2, 12), generator=torch.Generator().manual_seed(1))
        arithmetic.reset()
        out_ = m(ids)
        loss = F.cross_entropy(getattr(out_, "logits", out_), torch.tensor([0, 1]))
        loss.backward()
        out[kind] = (loss.detach(), torch.cat([p.grad.flatten() for p in m.parameters() if p.grad is not None]),
                     arithmetic.taken())
    assert out["integer"][2] == "integer (int_mm)"
    torch.testing.assert_close(out["integer"][0], out["fake"][0], rtol=2.0 ** -9, atol=0)
    assert (out["integer"][1] - out["fake"][1]).norm() <= 2.0 ** -3 * out["fake"][1].norm()


def _two_layer(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    q = QuantCfg(int8_arithmetic=kind, grad_rounding="nearest")
    return QConv2d(8, 16, 3, padding=1, stride=2, bias=True, qcfg=q), QLinear(16, 5, qcfg=q)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
    not CUDA, reason="needs CUDA")])])
def test_layers_take_the_integer_path_and_match_fake(monkeypatch, device):
    """Forward, input gradient and weight gradient as fake's. On the CPU int_mm is forced (exact on
    any CPU); on a GPU the device's own probe must pick it (torch._int_mm on int8 tensor cores,
    cuBLASLt), where it computes the worst-case products exactly."""
    if device == "cpu":
        _force(monkeypatch, "int_mm", "test")
    else:
        assert int8_kernels.backend_for(device)[0] == "int_mm"
    out = {}
    for kind in ("integer", "fake"):
        conv, lin = (m.to(device) for m in _two_layer(kind))
        x = torch.randn(4, 8, 9, 9, generator=torch.Generator().manual_seed(3)).to(device).requires_grad_()
        arithmetic.reset(device)
        y = lin(conv(x).mean((2, 3)))
        y.square().sum().backward()
        out[kind] = (y.detach(), x.grad, conv.weight.grad, arithmetic.taken())
    assert out["integer"][3] == "integer (int_mm)" and out["fake"][3] == "fake"
    for a, b in zip(out["integer"][:3], out["fake"][:3]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * float(b.abs().max()))


def test_the_eager_layers_call_the_ops_bodies_directly_and_grid_each_weight_once(monkeypatch):
    """Outside torch.func transforms the Functions skip the custom-op dispatch (`eager_forward`):
    the same code as the ops' bodies on the same operands, so the same values bit for bit on any
    CPU; W's grid is computed in the forward and reused by the backward."""
    from lpdl_core.quant import int8_ops

    _force(monkeypatch, "int_mm", "test")
    grids, real = [], integer.weight_grid
    monkeypatch.setattr(integer, "weight_grid", lambda w, *a: grids.append(w.shape) or real(w, *a))
    conv, lin = _two_layer("integer")
    x = torch.randn(4, 8, 9, 9, generator=torch.Generator().manual_seed(3), requires_grad=True)
    q_x, m_x, s_x = conv.quantize_input.levels(x)
    y = conv(x)
    g = torch.randn(y.shape, generator=torch.Generator().manual_seed(5))
    y.backward(g)
    assert grids == [conv.weight.shape]  # once, by the forward (the backward reused it)
    grids.clear()
    qw, qb = conv.own_range(conv.weight), conv.own_range(conv.bias)
    conf = (list(conv.stride), list(conv.padding), list(conv.dilation), conv.groups)
    assert torch.equal(y, int8_ops.int8_conv2d("int_mm", q_x, m_x, s_x, qw.detach(), qb.detach(), *conf, 1))
    gx = int8_ops.int8_conv2d_input_grad("int_mm", *int8_ops._grad_grid(g, 8, "nearest"), qw.detach(),
                                         list(x.shape), *conf, 1)
    assert torch.equal(x.grad, gx)
    h = torch.randn(3, 16, generator=torch.Generator().manual_seed(6), requires_grad=True)
    q_h, m_h, s_h = lin.quantize_input.levels(h)
    z = lin(h)
    z.backward(torch.ones_like(z))
    assert grids[2:] == [lin.weight.shape]  # after the two reference ops' own
    qw, qb = lin.own_range(lin.weight).detach(), lin.own_range(lin.bias).detach()
    assert torch.equal(z, int8_ops.int8_linear("int_mm", q_h, m_h, s_h, qw, qb))
    assert torch.equal(h.grad, int8_ops.int8_linear_input_grad("int_mm", *int8_ops._grad_grid(torch.ones_like(z), 8,
                                                                                              "nearest"), qw))


def test_without_a_kernel_integer_is_fake_bitwise_with_one_notice(monkeypatch, capsys):
    _force(monkeypatch, None, "no exact int8 kernel (test)")
    monkeypatch.setattr(arithmetic, "_said", set())
    ys = {}
    for kind in ("integer", "fake"):
        conv, lin = _two_layer(kind)
        x = torch.randn(4, 8, 9, 9, generator=torch.Generator().manual_seed(3))
        arithmetic.reset()
        ys[kind] = lin(conv(x).mean((2, 3))) + lin(conv(x).mean((2, 3)))
        taken = arithmetic.taken()
    assert torch.equal(ys["integer"], ys["fake"])
    err = capsys.readouterr().err
    assert err.count("no exact int8 kernel (test)") == 1 and taken == "fake"


class _Tiny(torch.nn.Module):
    def __init__(self, kind: str):
        super().__init__()
        q = QuantCfg(int8_arithmetic=kind, grad_rounding="nearest")
        self.conv, self.fc = QConv2d(3, 8, 3, padding=1, stride=2, bias=True, qcfg=q), QLinear(8, 10, qcfg=q)

    def forward(self, x):
        return self.fc(self.conv(x).mean((2, 3)))


def test_the_batched_executor_runs_integer_under_vmap_as_the_loop_does(monkeypatch):
    """The custom ops' vmap rule: vmap(grad) over the nodes takes the integer path, and one step
    equals the loop executor's up to float order (the weight gradients' grouped convolution)."""
    from lpdl_core.decentral.algorithms.base import GossipCfg
    from lpdl_core.decentral.engine import EngineCfg, Simulator
    from lpdl_core.decentral.topology import Topology

    _force(monkeypatch, "int_mm", "test")
    sims, losses, taken, befores = {}, {}, {}, {}
    g = torch.Generator().manual_seed(4)
    x, y = torch.randn(2, 4, 3, 8, 8, generator=g), torch.randint(0, 10, (2, 4), generator=g)
    for ex in ("loop", "batched"):
        torch.manual_seed(0)
        sims[ex] = Simulator(lambda: _Tiny("integer"), topology=Topology(name="directed-ring", n=2),
                             gossip=GossipCfg(algorithm="choco", eta=0.5), engine=EngineCfg(executor=ex, device="cpu"))
        before = befores[ex] = sims[ex].x.clone()
        arithmetic.reset()
        losses[ex] = sims[ex].train_step(x, y, 0.05)
        taken[ex] = arithmetic.taken()
    assert taken == {"loop": "integer (int_mm)", "batched": "integer (int_mm)"}
    torch.testing.assert_close(losses["batched"], losses["loop"], rtol=2.0 ** -9, atol=0)
    assert torch.equal(befores["loop"], befores["batched"])  # the same seeded state
    update = (sims["loop"].x - before).norm()
    assert update > 0 and (sims["batched"].x - sims["loop"].x).norm() <= 2.0 ** -3 * update


def _tiny_sim(compile: bool = False):
    from lpdl_core.decentral.algorithms.base import GossipCfg
    from lpdl_core.decentral.engine import EngineCfg, Simulator
    from lpdl_core.decentral.topology import Topology

    torch.manual_seed(0)
    return Simulator(lambda: _Tiny("integer"), topology=Topology(name="directed-ring", n=2),
                     gossip=GossipCfg(algorithm="choco", eta=0.5),
                     engine=EngineCfg(executor="batched", device="cpu", compile=compile))


def test_the_compiled_steps_form_runs_in_integers(monkeypatch):
    """The traceable form (run eagerly, as tests/test_compiled.py does): the convolution and the
    linear layer are each one custom op with its backward registered (the layer gradient in
    integers from Q(g) with one range per node, the weight gradient float32). Same forward as the
    eager integer step; gradients from another autograd graph (float order, rounding flips)."""
    from lpdl_core.quant import traced

    _force(monkeypatch, "int_mm", "test")
    x, y = torch.randn(2, 4, 3, 8, 8), torch.randint(0, 10, (2, 4))
    l0, g0 = _tiny_sim().executor.loss_and_grad(x, y)
    arithmetic.reset()
    with traced.traced_ops():
        l1, g1 = _tiny_sim().executor.traced_loss_and_grad(x, y)
    assert arithmetic.taken() == "integer (int_mm)"
    torch.testing.assert_close(l1, l0, rtol=2.0 ** -9, atol=0)
    assert (g1 - g0).norm() <= 2.0 ** -3 * g0.norm()


@pytest.mark.slow
def test_a_compiled_integer_step_follows_the_eager_one(monkeypatch):
    """fullgraph compile of the batched step with the integer ops (their fake kernels' shapes and
    layouts are what the graph asserts): 3 steps, losses as the eager integer step's."""
    _force(monkeypatch, "int_mm", "test")
    torch._dynamo.reset()
    eager, comp = _tiny_sim(), _tiny_sim(compile=True)
    x, y = torch.randn(2, 4, 3, 8, 8), torch.randint(0, 10, (2, 4))
    for _ in range(3):
        la, lb = eager.train_step(x, y, 0.05), comp.train_step(x, y, 0.05)
        torch.testing.assert_close(lb, la, rtol=2.0 ** -9, atol=0)
    assert (eager.x - comp.x).norm() <= 1e-3 * eager.x.norm()


def test_a_trace_reads_the_probe_and_records_nothing(monkeypatch):
    """reset(device) probes eagerly; a compiled trace only reads the answer (a probe inside a trace
    would break the graph) and records nothing (dynamo would guard on the record and recompile
    every step): unprobed, the trace computes fake."""
    monkeypatch.setattr(int8_kernels, "_CHOSEN", {})
    monkeypatch.setattr(int8_kernels, "exact", lambda name, device: True)
    monkeypatch.setattr(arithmetic, "_calls", arithmetic.Counter())
    with monkeypatch.context() as m:
        m.setattr(torch.compiler, "is_compiling", lambda: True)
        assert arithmetic.backend("integer", 8, 8, torch.zeros(1)) is None
        assert arithmetic.taken() == ""
        arithmetic.reset("cpu")
        assert arithmetic.backend("integer", 8, 8, torch.zeros(1)) == "onednn" and arithmetic.taken() == ""
    assert arithmetic.backend("integer", 8, 8, torch.zeros(1)) == "onednn"
    assert arithmetic.taken() == "integer (onednn)"


def test_fidelity_defaults_and_identity():
    assert Fidelity().int8_arithmetic == "integer" and Fidelity.preset("official").int8_arithmetic == "fake"
    # a rounding-only option: not in a run's identity, not in its mode
    assert "int8_arithmetic" not in identity_fidelity({"int8_arithmetic": "fake"})
    assert fidelity_mode({**Fidelity().as_dict(), "int8_arithmetic": "fake"}) == "paper"
    assert fidelity_mode({**Fidelity.preset("official").as_dict(), "int8_arithmetic": "integer"}) == "official"
    # a run recorded before the option existed computed fake
    assert recorded_fidelity({})["int8_arithmetic"] == "fake"


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet20", "vgg11"])
def test_twenty_training_steps_every_layer_call_equals_fake(name, monkeypatch):
    """20 SGD steps of the full 8-bit network (nearest rounding) on the integer path: every
    quantized layer call, forward and layer gradient, within the bound of its own operands.

    The layers are checked call by call because over a whole network a last-bit difference can
    flip an 8-bit rounding decision downstream (one grid step), so two whole runs drift apart as
    two CPUs' runs do; the loss of each step is checked against the fake model's from the same
    state, within 2^-6 (flipped decisions move a few values by 1/255 of their range each)."""
    from lpdl_core.models.registry import build_model

    _force(monkeypatch, "int_mm", "test")
    worst = {"conv": 0.0, "conv_grad": 0.0, "linear": 0.0, "linear_grad": 0.0}

    def checked(kind, real, check):
        def call(backend, *args, **kw):  # kw: the weight's grid an eager layer hands over (wq)
            out = real(backend, *args, **kw)
            worst[kind] = max(worst[kind], check(out, *args))
            return out
        return call

    def on_grid(q, m, s):  # the 8-bit operand, s·q + m, as the fake quantizer computes it
        return q.float().mul_(s.reshape(())).add_(m.reshape(()))

    # the eager layers' integer products read their operands' grids (one node each here)
    monkeypatch.setattr(integer, "conv2d_on_grid", checked(
        "conv", integer.conv2d_on_grid,
        lambda y, q, m, s, w, b, *conf: _check_conv(y, on_grid(q, m, s), m, w, b, conf[:4])))
    monkeypatch.setattr(integer, "conv2d_input_grad_on_grid", checked(
        "conv_grad", integer.conv2d_input_grad_on_grid,
        lambda gx, q, m, s, w, in_shape, *conf: _check_conv_grad(gx, on_grid(q, m, s), w, in_shape, conf[:4])))
    monkeypatch.setattr(integer, "linear_on_grid", checked(
        "linear", integer.linear_on_grid, lambda y, q, m, s, w, b: _check_linear(y, on_grid(q, m, s), m, w, b)))
    monkeypatch.setattr(integer, "linear_input_grad_on_grid", checked(
        "linear_grad", integer.linear_input_grad_on_grid,
        lambda gx, q, m, s, w: _check_linear_grad(gx, on_grid(q, m, s), w)))
    torch.manual_seed(0)
    models = {k: build_model(name, precision="int8", qcfg=QuantCfg(int8_arithmetic=k, grad_rounding="nearest"))
              for k in ("fake", "integer")}
    for m in models.values():  # the two models would draw different dropout masks
        for mod in m.modules():
            if isinstance(mod, torch.nn.Dropout):
                mod.p = 0.0
    opt = torch.optim.SGD(models["integer"].parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(1)
    arithmetic.reset()
    for _ in range(20):
        x, y = torch.randn(2, 3, 32, 32, generator=g), torch.randint(0, 10, (2,), generator=g)
        models["fake"].load_state_dict(models["integer"].state_dict())
        losses = {k: F.cross_entropy(m(x), y) for k, m in models.items()}
        opt.zero_grad()
        losses["integer"].backward()
        opt.step()
        torch.testing.assert_close(losses["integer"], losses["fake"], rtol=2.0 ** -6, atol=0)
    assert "integer (int_mm): 50% of calls" in arithmetic.taken()  # the fake model's calls are the rest
    assert all(0 < v <= 1 for v in worst.values()), worst


def test_the_train_jobs_params_leave_out_rounding_only_options():
    """A job's params define its runs: int8_arithmetic is not among them (changing it, or lpdl
    gaining it, reruns no finished job); the job takes it from its folder's mode in the config."""
    import json

    from lpdl_core.pipeline.workflow.wfconfig import defining_fidelity_json, job_fidelity_json

    params = defining_fidelity_json(Fidelity())
    assert json.loads(params) == {k: v for k, v in Fidelity().as_dict().items() if k != "int8_arithmetic"}
    paper = {"profile": "mini", "fidelity": "paper", "compare_modes": True}
    official = {"profile": "mini", "fidelity": "official"}
    chosen = {"profile": "mini", "fidelity": {"int8_arithmetic": "fake"}}
    for config, results, want in [(paper, "mini", "integer"), (paper, "mini-official", "fake"),
                                  (paper, "mini-heterogeneity", "integer"), (official, "mini-official", "fake"),
                                  (official, "mini-official-heterogeneity", "fake"), (chosen, "mini", "fake")]:
        assert json.loads(job_fidelity_json(params, config, results))["int8_arithmetic"] == want, (config, results)
