"""8-bit fake quantizer, QuantMeasure and the bifurcated QConv2d/QLinear/QAdd
(docs/paper-vs-code.md, '8-bit training')."""
import math

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
    from lpdl_core.quant import noise

    torch.manual_seed(1)
    lo, hi = torch.tensor(-1.0), torch.tensor(1.0)
    step = 2.0 / 255
    for n in (5000, 7, 101, 20001):
        x = torch.rand(n) * 2 - 1
        samples = torch.stack([fake_quant(x, 8, "stochastic", lo, hi) for _ in range(300)])
        assert (samples - x).abs().max() < step + 1e-6
        assert not torch.equal(samples[0], samples[1])
        assert (samples.mean(0) - x).mean().abs() < 0.02 * step  # mean over elements and draws
    words, lanes = noise._SCRATCH[torch.int64], noise._SCRATCH[torch.float32]
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
    # bitwise: min and max are exact, and the batch mean reduces the same 8 values in the same order
    assert torch.equal(y, fake_quant(x, 8, "nearest", lo, hi))
    assert torch.equal(qm.running_min, 0.9 * lo.view(1)) and torch.equal(qm.running_max, 0.9 * hi.view(1))
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
        qm.train()
        qm(x)
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


def _grid(shape, step, lo, hi, g, jitter=0.0):
    """Random multiples of `step` (a power of two) in float32, row r (first dim) spanning exactly
    [lo + d_r, hi - d_r] with d_r = +jitter, -jitter, ... (an even number of rows, so the row
    mean of the mins is exactly lo and of the maxes exactly hi)."""
    rows, m = shape[0], math.prod(shape[1:])
    k = round((hi - lo - 2 * jitter) / step)
    t = lo + jitter + step * torch.randint(0, k + 1, (rows, m), generator=g, dtype=torch.float64)
    d = torch.tensor([jitter if r % 2 == 0 else -jitter for r in range(rows)], dtype=torch.float64)
    t[:, 0], t[:, 1] = lo + d, hi - d
    return t.float().reshape(shape)


def _node_data(i, g, x_shape, named_shapes, g_shape):
    """Node i's input, parameters and output gradient, all dyadic and scaled by 2^-i (every node
    has its own quantization ranges): with power-of-two 8-bit steps every quantized value stays
    on a coarse power-of-two grid, so each product and sum below is exact in float32."""
    c = 2.0 ** -i
    x = _grid(x_shape, 2.0 ** -6, -16.0, 127 / 8, g, jitter=1.0) * c  # batch range [-16, 127/8]: step 1/8
    ranges = {"weight": (2.0 ** -8, -4.0, 127 / 32), "bias": (2.0 ** -12, -0.5, 127 / 256)}  # 1/32, 1/256
    params = {k: _grid((1, *s), *ranges[k.split(".")[-1]], g)[0] * c for k, s in named_shapes}
    gy = _grid((1, *g_shape), 2.0 ** -10, -1.0, 127 / 128, g)[0] * c  # its own range: step 1/128
    return x, params, gy


@pytest.mark.parametrize("layer", ["conv", "linear", "add"])
def test_layers_under_vmap_equal_loop(layer):
    """Both executors, bit for bit: vmap over stacked per-node parameters, inputs and buffers ==
    a loop over the nodes, for each 8-bit layer (forward, per-node activation ranges updated in
    place, the weight gradient from the float g_y and the input gradient from the 8-bit g_y).

    vmap runs another float summation order (one grouped convolution / batched matmul for the n
    nodes), so bit-equality holds only where every sum is exact: inputs, parameters and output
    gradients are multiples of powers of two whose min-max ranges give power-of-two 8-bit steps
    (range 255·2^-k), finer than those steps so that rounding really happens (ties included,
    exactly), and small enough that every product and partial sum fits float32's 24 bits. The
    loss is linear in the output (sum y·g_y), so the backward starts from the exact g_y."""
    n, B = 3, 4
    g = torch.Generator().manual_seed(0)
    if layer == "conv":
        net = QConv2d(2, 4, 3, stride=1, padding=1, bias=True, qcfg=NEAREST)
        x_shape, g_shape = (B, 2, 4, 4), (B, 4, 4, 4)
    elif layer == "linear":
        net = QLinear(6, 5, qcfg=NEAREST)
        x_shape, g_shape = (B, 3, 6), (B, 3, 5)
    else:
        net = QAdd(NEAREST)
        x_shape, g_shape = (B, 8), (B, 8)
    shapes = [(k, p.shape) for k, p in net.named_parameters()]
    nodes = [_node_data(i, g, x_shape, shapes, g_shape) for i in range(n)]
    if layer == "add":  # a second input, on the grid of the first, scaled by 2^-(i + 1)
        second = [_grid(x_shape, 2.0 ** -6, -16.0, 127 / 8, g, jitter=1.0) * 2.0 ** -(i + 1)
                  for i in range(n)]
        nodes = [(torch.stack([x, x2]), p, gy) for (x, p, gy), x2 in zip(nodes, second)]
    xs = torch.stack([x for x, _, _ in nodes])
    params = {k: torch.stack([p[k] for _, p, _ in nodes]) for k, _ in shapes}
    gys = torch.stack([gy for _, _, gy in nodes])
    buffers = {k: b.unsqueeze(0).repeat(n, *[1] * b.dim()) for k, b in net.named_buffers()}

    def run(p, b, x):
        return functional_call(net, (p, b), tuple(x) if layer == "add" else (x,))

    def loss(p, b, x, gy):
        return (run(p, b, x) * gy).sum()

    y_vmap = vmap(run)({k: v.clone() for k, v in params.items()},
                       {k: v.clone() for k, v in buffers.items()}, xs)
    g_params, g_x = vmap(grad(loss, argnums=(0, 2)))(params, buffers, xs, gys)
    for i in range(n):
        p_i = {k: v[i].clone().requires_grad_() for k, v in params.items()}
        b_i = {k: torch.zeros_like(v[i]) for k, v in buffers.items()}
        x_i = xs[i].clone().requires_grad_()
        assert torch.equal(y_vmap[i], run(p_i, {k: v.clone() for k, v in b_i.items()}, x_i))
        grads = torch.autograd.grad(loss(p_i, b_i, x_i, gys[i]), [*p_i.values(), x_i])
        for k, gr in zip(p_i, grads):
            assert torch.equal(g_params[k][i], gr), k
        assert torch.equal(g_x[i], grads[-1])
        for k in buffers:  # running ranges updated per node, in place, under vmap
            assert torch.equal(buffers[k][i], b_i[k]), k
    assert all(b.ne(0).all() for b in buffers.values())
    # the data exercise the rounding: inputs, parameters and g_y all lie off their 8-bit grids
    x0 = xs[0][0] if layer == "add" else xs[0]
    assert not torch.equal(fake_quant(x0, 8, "nearest", torch.tensor(-16.0), torch.tensor(127 / 8)), x0)
    assert not torch.equal(fake_quant(gys[0], 8), gys[0])
    assert all(not torch.equal(fake_quant(v[0], 8), v[0]) for v in params.values())


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
