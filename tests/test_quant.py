"""8-bit fake quantizer, QuantMeasure and the bifurcated QConv2d/QLinear/QAdd
(official-code.md sections 5.1-5.3 and 12.17)."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad, vmap

from lpdl_core.quant.layers import QAdd, QConv2d, QLinear, QuantMeasure, make_add, make_conv, make_linear
from lpdl_core.quant.quantizer import QuantCfg, fake_quant, quantize, quantize_grad

NEAREST = QuantCfg(act_rounding="nearest", grad_rounding="nearest")


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.mark.parametrize("bits", [2, 4, 8])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_at_most_2_pow_bits_levels(bits, rounding):
    x = torch.randn(20000)
    assert torch.unique(fake_quant(x, bits, rounding)).numel() <= 2 ** bits


def test_nearest_error_at_most_half_step_and_range_kept():
    x = torch.randn(5000) * 3
    q = fake_quant(x, 8)
    step = (x.max() - x.min()) / 255
    assert (q - x).abs().max() <= step / 2 + 1e-5
    assert torch.isclose(q.min(), x.min()) and torch.isclose(q.max(), x.max(), atol=1e-5)


def test_stochastic_unbiased_and_within_one_step():
    x = torch.linspace(-1, 1, 101)  # inside the range
    step = 2.0 / 255
    samples = torch.stack([fake_quant(x, 8, "stochastic", torch.tensor(-1.0), torch.tensor(1.0))
                           for _ in range(4000)])
    assert (samples - x).abs().max() < step + 1e-6
    bias = (samples.mean(0) - x).abs().max()
    assert bias < 0.1 * step  # standard error of the mean is ~0.0045 step
    assert not torch.equal(samples[0], samples[1])  # it is random


def test_stochastic_noise_scratch_grows_and_slices():
    """The CPU noise buffers are reused across sizes (grown, then sliced): every size still gets
    fresh, in-range, unbiased noise, including a small tensor right after a large one."""
    from lpdl_core.quant import quantizer

    torch.manual_seed(1)
    lo, hi = torch.tensor(-1.0), torch.tensor(1.0)
    step = 2.0 / 255
    for n in (5000, 7, 101, 20001):
        x = torch.rand(n) * 2 - 1
        samples = torch.stack([fake_quant(x, 8, "stochastic", lo, hi) for _ in range(300)])
        assert (samples - x).abs().max() < step + 1e-6
        assert not torch.equal(samples[0], samples[1])
        assert (samples.mean(0) - x).mean().abs() < 0.02 * step  # mean over elements and draws
    words, lanes = quantizer._NOISE_SCRATCH[torch.float32]
    assert lanes.numel() >= 20001 and words.numel() * 4 >= lanes.numel()


def test_nearest_matches_banner_in_place_sequence():
    """Bit for bit the official (Banner et al.) quantize-dequantize: add(-min).div(s).clamp(0, 255)
    .round(), then mul(s).add(min) (two roundings, no fused multiply-add)."""
    x = torch.randn(4, 3, 9, 9) * 5
    mn, mx = x.min(), x.max()
    s = ((mx - mn) / 255).clamp(min=1e-8)
    ref = x.clone().add_(-mn).div_(s).clamp_(0, 255).round_().mul_(s).add_(mn)
    assert torch.equal(fake_quant(x, 8), ref)


def test_constant_tensor_is_exact_and_no_nan():
    x = torch.full((10,), 0.37)
    assert torch.allclose(fake_quant(x), x)


def test_ste_passes_gradient_unchanged():
    x = torch.randn(50, requires_grad=True)
    g = torch.randn(50)
    quantize(x, 8, "stochastic").backward(g)
    assert torch.equal(x.grad, g)


def test_quantize_grad_quantizes_only_the_backward():
    x = torch.randn(64, requires_grad=True)
    y = quantize_grad(x * 1.0, 8, "nearest")
    assert torch.equal(y, x)
    g = torch.randn(64)
    y.backward(g)
    assert torch.equal(x.grad, fake_quant(g, 8, "nearest"))


def test_quant_cfg_validation():
    for bad in (dict(bits=1), dict(grad_bits=17), dict(eval_rounding="floor"), dict(momentum=1.0),
                dict(bits=True)):
        with pytest.raises(ValueError):
            QuantCfg(**bad)


def test_quant_measure_train_eval_and_storage():
    qm = QuantMeasure(NEAREST)
    x = torch.randn(8, 3, 4, 4)
    qm.train()
    y = qm(x)
    lo, hi = x.flatten(1).amin(1).mean(), x.flatten(1).amax(1).mean()
    assert torch.allclose(y, fake_quant(x, 8, "nearest", lo, hi))
    assert torch.allclose(qm.running_min, 0.9 * lo.view(1)) and torch.allclose(qm.running_max, 0.9 * hi.view(1))
    qm.eval()
    assert torch.allclose(qm(x), fake_quant(x, 8, "nearest", qm.running_min[0], qm.running_max[0]))
    assert [k for k, _ in qm.named_buffers()] == ["running_min", "running_max"]
    assert list(qm.parameters()) == []
    official = QuantMeasure(QuantCfg(measure_as_parameters=True))
    assert [p.numel() for p in official.parameters()] == [1, 1]
    assert not any(p.requires_grad for p in official.parameters())


def test_eval_rounding_default_deterministic_official_stochastic():
    x = torch.randn(16, 32)
    for cfg, same in ((QuantCfg(), True), (QuantCfg(eval_rounding="stochastic"), False)):
        qm = QuantMeasure(cfg)
        qm.train(); qm(x)
        qm.eval()
        assert torch.equal(qm(x), qm(x)) is same


def _manual_conv(conv: QConv2d, x: torch.Tensor, gy: torch.Tensor):
    """Reference: quantize input/weight the same way, then split the two gradients by hand."""
    qx = fake_quant(x, 8, "nearest", x.flatten(1).amin(1).mean(), x.flatten(1).amax(1).mean())
    qw, qb = fake_quant(conv.weight.detach(), 8), fake_quant(conv.bias.detach(), 8)
    xi = qx.clone().requires_grad_()
    F.conv2d(xi, qw, qb, conv.stride, conv.padding).backward(fake_quant(gy, 8, "nearest"))
    wi, bi = qw.clone().requires_grad_(), qb.clone().requires_grad_()
    F.conv2d(qx, wi, bi, conv.stride, conv.padding).backward(gy)
    return xi.grad, wi.grad, bi.grad


def test_qconv_bifurcation_matches_manual_autograd():
    conv = QConv2d(3, 6, 3, stride=2, padding=1, bias=True, qcfg=NEAREST)
    x = torch.randn(4, 3, 9, 9, requires_grad=True)
    y = conv(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    gx, gw, gb = _manual_conv(conv, x.detach(), gy)
    assert torch.allclose(x.grad, gx, atol=1e-5)        # layer gradient from 8-bit g_y
    assert torch.allclose(conv.weight.grad, gw, atol=1e-4)  # weight gradient from float g_y
    assert torch.allclose(conv.bias.grad, gb, atol=1e-4)
    # and the split is real: the float-g_y input gradient differs
    xi = x.detach().clone().requires_grad_()
    F.conv2d(xi, conv.weight.detach(), conv.bias.detach(), 2, 1).backward(gy)
    assert not torch.allclose(x.grad, xi.grad, atol=1e-6)


def test_qconv_grouped_and_forward_value():
    conv = QConv2d(8, 8, 3, padding=1, groups=8, bias=False, qcfg=NEAREST)
    x = torch.randn(2, 8, 5, 5, requires_grad=True)
    y = conv(x)
    qx = fake_quant(x.detach(), 8, "nearest", x.flatten(1).amin(1).mean(), x.flatten(1).amax(1).mean())
    assert torch.allclose(y, F.conv2d(qx, fake_quant(conv.weight.detach()), None, 1, 1, 1, 8), atol=1e-6)
    y.sum().backward()
    assert x.grad.shape == x.shape


def test_qlinear_bifurcation_on_3d_input():
    lin = QLinear(6, 5, qcfg=NEAREST)
    x = torch.randn(3, 7, 6, requires_grad=True)
    y = lin(x)
    gy = torch.randn_like(y)
    y.backward(gy)
    qx = fake_quant(x.detach(), 8, "nearest", x.flatten(1).amin(1).mean(), x.flatten(1).amax(1).mean())
    qw, qb = fake_quant(lin.weight.detach()), fake_quant(lin.bias.detach())
    assert torch.allclose(y, F.linear(qx, qw, qb), atol=1e-6)
    assert torch.allclose(x.grad, fake_quant(gy, 8, "nearest") @ qw, atol=1e-5)
    assert torch.allclose(lin.weight.grad, gy.reshape(-1, 5).T @ qx.reshape(-1, 6), atol=1e-4)
    assert torch.allclose(lin.bias.grad, gy.reshape(-1, 5).sum(0), atol=1e-5)


def test_qadd_quantizes_both_inputs_and_gradient():
    add = QAdd(NEAREST)
    a, b = torch.randn(4, 8, requires_grad=True), torch.randn(4, 8, requires_grad=True)
    y = add(a, b)
    rng = lambda t: (t.flatten(1).amin(1).mean(), t.flatten(1).amax(1).mean())
    assert torch.allclose(y, fake_quant(a.detach(), 8, "nearest", *rng(a.detach()))
                          + fake_quant(b.detach(), 8, "nearest", *rng(b.detach())))
    gy = torch.randn(4, 8)
    y.backward(gy)
    assert torch.allclose(a.grad, fake_quant(gy, 8, "nearest")) and torch.equal(a.grad, b.grad)


def test_factories_fp_and_lp_share_parameters():
    for fp, lp in ((make_conv(3, 4, 3, bias=True), make_conv(3, 4, 3, bias=True, qcfg=NEAREST)),
                   (make_linear(4, 2), make_linear(4, 2, qcfg=NEAREST))):
        assert [k for k, _ in fp.named_parameters()] == [k for k, _ in lp.named_parameters()]
        assert type(lp) in (QConv2d, QLinear) and type(fp) in (nn.Conv2d, nn.Linear)
    assert isinstance(make_add(NEAREST), QAdd)
    torch.testing.assert_close(make_add()(torch.ones(2), torch.ones(2)), torch.full((2,), 2.0))


def test_layers_under_vmap_equal_loop():
    """Both executors: vmap over stacked per-node parameters == a loop over node modules."""
    net = nn.Sequential(QConv2d(2, 4, 3, padding=1, qcfg=NEAREST), nn.Flatten(), QLinear(64, 3, qcfg=NEAREST))
    n = 3
    params = {k: torch.randn(n, *p.shape) * 0.3 for k, p in net.named_parameters()}
    buffers = {k: b.unsqueeze(0).repeat(n, *[1] * b.dim()) for k, b in net.named_buffers()}
    x = torch.randn(n, 5, 2, 4, 4)
    y = torch.randint(0, 3, (n, 5))

    def loss(p, b, xi, yi):
        return F.cross_entropy(functional_call(net, (p, b), (xi,)), yi)

    g_vmap = vmap(grad(loss))(params, buffers, x, y)
    for i in range(n):
        p_i = {k: v[i].clone().requires_grad_() for k, v in params.items()}
        b_i = {k: torch.zeros_like(v[i]) for k, v in buffers.items()}
        loss(p_i, b_i, x[i], y[i]).backward()
        for k in params:
            assert torch.allclose(g_vmap[k][i], p_i[k].grad, atol=1e-5), k
    # running ranges were updated per node in place under vmap
    assert buffers["0.quantize_input.running_min"].ne(0).all()


def test_eager_apply_equals_function_apply():
    """eager_apply (no per-call argument binding) == the setup_context Function it wraps, in
    outputs and gradients; under vmap it defers to the Function (its generated vmap rule)."""
    from lpdl_core.quant.layers import _BifurcatedConv
    from lpdl_core.quant.quantizer import eager_apply

    torch.manual_seed(0)
    x = torch.randn(2, 3, 6, 6)
    w = torch.randn(4, 3, 3, 3)
    args = ((1, 1), (1, 1), (1, 1), 1, 8, "nearest")
    grads = []
    for apply in (_BifurcatedConv.apply, eager_apply(_BifurcatedConv)):
        xi, wi = x.clone().requires_grad_(), w.clone().requires_grad_()
        y = apply(xi, wi, None, *args)
        y.square().sum().backward()
        grads.append((y.detach(), xi.grad, wi.grad))
    for a, b in zip(*grads):
        assert torch.equal(a, b)
    fast = eager_apply(_BifurcatedConv)
    ys = torch.func.vmap(lambda xb: fast(xb, w, None, *args))(x.unsqueeze(1))
    assert torch.equal(ys.squeeze(1), grads[0][0])
