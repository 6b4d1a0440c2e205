"""Tests for lpdl_core.quant.norms: EvoNorm-S0, Range EvoNorm (8-bit and FP), Range BN and
make_norm, each against a formula recomputed here (docs/paper-vs-code.md, 'EvoNorm-S0 and Range
EvoNorm'), plus the gradient bifurcation at Range EvoNorm's output and vmap(functional_call) ==
loop over copies."""
import copy
import math

import pytest
import torch
import torch.nn.functional as F
from torch.func import functional_call, stack_module_state, vmap

from lpdl_core.config import FIDELITY_CHOICES
from lpdl_core.quant.norms import (ACTIVATIONS, GATES, NORMS, BatchNormAct, EvoNormS0, GroupNormAct, NormSpec,
                                   RangeBatchNorm2d, RangeBNAct, RangeEvoNorm, group_variance, hardsigmoid,
                                   make_norm, range_scale_fix)
from lpdl_core.quant import norms as norms_mod
from lpdl_core.quant import range_fused
from lpdl_core.quant.layers import QuantMeasure
from lpdl_core.quant.quantizer import QuantCfg, fake_quant
from lpdl_core.quant.range_fused import first_extremes, level_dtype

QC = QuantCfg(act_rounding="nearest", grad_rounding="nearest")


def randomize(layer: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            if p.requires_grad:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5 + (1.0 if name in ("weight", "v") else 0.0))
    return layer


def ste(x, x_min=None, x_max=None):
    """8-bit nearest quantization with a straight-through gradient, written here independently."""
    x_min = x.detach().min() if x_min is None else x_min
    x_max = x.detach().max() if x_max is None else x_max
    step = ((x_max - x_min) / 255).clamp(min=1e-8)
    q = ((x.detach() - x_min) / step).clamp(0, 255).round() * step + x_min
    return x + (q - x).detach()


def range_en_ref(x, layer, *, quant, act="hard", x_range=None):
    """Range EvoNorm from the formula in docs/paper-vs-code.md, 'EvoNorm-S0 and Range EvoNorm',
    without the output grad quantizer."""
    B, C, H, W = x.shape
    v, w, b = layer.v, layer.weight, layer.bias
    if quant:
        x = ste(x, *x_range)
        v, w, b = ste(v), ste(w), ste(b)
    gate = torch.clamp(x * v / 6 + 0.5, 0, 1) if act == "hard" else torch.sigmoid(x * v)
    n = x * gate
    m = C * H * W // 128
    y = x.reshape(B, 8, 16, m)
    rbar = y.max(-1).values.mean(-1) - y.min(-1).values.mean(-1)
    # One float factor range_scale_fix(m) (checked against 0.175·(1 + sqrt(pi ln 4)) / sqrt(2 ln m)
    # in test_range_constant), as the layer applies it: the 8-bit rounding of s below must see
    # the layer's exact value, not one a few ulps away (which can round to the next level).
    sigma = rbar * range_scale_fix(m)
    s = 1 / (sigma + 1e-5)
    if quant:
        s = ste(s)
    return (n.reshape(B, 8, -1) * s[..., None]).reshape(B, C, H, W) * w + b


def batch_range(x):
    flat = x.flatten(1)
    return flat.min(1).values.mean(), flat.max(1).values.mean()


# ---------------------------------------------------------------- EvoNorm-S0

def test_evonorm_v0_reduces_to_half_x_over_std():
    layer = randomize(EvoNormS0(16))
    with torch.no_grad():
        layer.v.zero_()
    x = torch.randn(3, 16, 4, 4)
    std = (x.reshape(3, 8, -1).var(-1, unbiased=False, keepdim=True) + 1e-5).sqrt()
    expect = (x.reshape(3, 8, -1) / (2 * std)).reshape_as(x) * layer.weight + layer.bias
    torch.testing.assert_close(layer(x), expect)


def evonorm_formula(layer: EvoNormS0, x: torch.Tensor) -> torch.Tensor:
    """EvoNorm-S0 written out with torch.var over each group (8 groups: group g = channels
    g·C/8 .. (g+1)·C/8 − 1), in x's dtype."""
    xs = x.reshape(x.shape[0], 8, -1, *x.shape[2:])
    var = xs.var(dim=(2, 3, 4), unbiased=False, keepdim=True)
    v, w, b = (p.to(x.dtype) for p in (layer.v, layer.weight, layer.bias))
    n = (x * torch.sigmoid(x * v)).reshape_as(xs)
    return (n / torch.sqrt(var + 1e-5)).reshape_as(x) * w + b


def test_evonorm_matches_formula_and_init():
    layer = EvoNormS0(32)
    assert all(p.shape == (1, 32, 1, 1) for p in (layer.weight, layer.bias, layer.v))
    assert layer.weight.eq(1).all() and layer.bias.eq(0).all() and layer.v.eq(1).all()
    randomize(layer)
    x = torch.randn(2, 32, 5, 5)
    torch.testing.assert_close(layer(x), evonorm_formula(layer, x))


@pytest.mark.parametrize("offset", [0.0, 100.0])
def test_group_variance_two_passes_within_float32_rounding_of_the_exact_variance(offset):
    """ResNet-20's first stage (N = 2^16 per group), against the float64 variance of the same
    float32 values. Bound: the two sums (cascaded, error ≤ log2 N · ε each relative to their sum of
    magnitudes) and the rounding of each deviation and its square (3ε) give (log2 N + 3)·ε·var; the
    mean's own error δ ≤ log2 N · ε · max|t| adds δ² (second order, visible only far from 0)."""
    g = torch.Generator().manual_seed(0)
    t = torch.randn(4, 8, 2 ** 16, generator=g) * 2 + offset
    exact = t.double().var(dim=-1, unbiased=False, keepdim=True)
    eps, log_n = torch.finfo(torch.float32).eps, math.log2(t.shape[-1])
    bound = (log_n + 3) * eps * exact + (log_n * eps * t.abs().max().double()) ** 2
    assert ((group_variance(t).double() - exact).abs() <= bound).all()


def test_evonorm_gradient_matches_torch_var():
    """The two-pass variance has torch.var's gradient (2(x − x̄)/N per element) up to float rounding."""
    layer = randomize(EvoNormS0(16))
    x = torch.randn(4, 16, 8, 8, requires_grad=True)
    (gx,) = torch.autograd.grad(layer(x).square().sum(), x)
    x64 = x.detach().double().requires_grad_()
    (g64,) = torch.autograd.grad(evonorm_formula(layer, x64).square().sum(), x64)
    torch.testing.assert_close(gx.double(), g64, rtol=1e-4, atol=1e-4)


def test_group_variance_saves_only_its_input_and_the_mean():
    """For the backward it keeps t itself (which EvoNorm-S0 saves anyway, for its gate) and the
    means, not the deviations t − t̄: no activation-sized tensor torch.var would not keep."""
    t = torch.randn(4, 8, 1024, requires_grad=True)
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda s: saved.append(s) or s, lambda s: s):
        group_variance(t)
    assert saved
    big = [s for s in saved if s.numel() == t.numel()]
    assert all(s.untyped_storage().data_ptr() == t.untyped_storage().data_ptr() for s in big)
    assert sum(s.numel() for s in saved if s.numel() != t.numel()) <= 4 * 8


@pytest.mark.parametrize("c", [4, 12])
def test_evonorm_rejects_bad_channels(c):
    with pytest.raises(ValueError, match="groups"):
        EvoNormS0(c)


def test_evonorm_rejects_non_4d():
    with pytest.raises(ValueError, match="4-D"):
        EvoNormS0(16)(torch.randn(2, 16))


# ---------------------------------------------------------------- Range EvoNorm

def test_range_constant():
    assert round(0.175 * (1 + math.sqrt(math.pi * math.log(4))), 4) == 0.5402
    assert range_scale_fix(128) == pytest.approx(0.5402084 / math.sqrt(2 * math.log(128)))


def test_hardsigmoid_values():
    t = torch.tensor([-10.0, -3.0, -1.5, 0.0, 1.5, 3.0, 10.0])
    torch.testing.assert_close(hardsigmoid(t), torch.tensor([0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.0]))
    torch.testing.assert_close(hardsigmoid(t), F.hardsigmoid(t))


@pytest.mark.parametrize("activation", ["hardsigmoid", "sigmoid"])
def test_range_evonorm_fp_matches_formula(activation):
    layer = randomize(RangeEvoNorm(16, qcfg=None, activation=activation))
    assert not any("quantize" in n for n, _ in layer.named_modules())
    x = torch.randn(3, 16, 8, 8)
    expect = range_en_ref(x, layer, quant=False, act="hard" if activation == "hardsigmoid" else "sig")
    torch.testing.assert_close(layer(x), expect)


def test_range_evonorm_fp_default_is_hardsigmoid():
    layer = RangeEvoNorm(16, qcfg=None)
    assert layer.activation == "hardsigmoid"
    x = torch.randn(2, 16, 8, 8) * 4
    torch.testing.assert_close(layer(x), range_en_ref(x, layer, quant=False, act="hard"))
    assert not torch.allclose(layer(x), range_en_ref(x, layer, quant=False, act="sig"))


def test_range_evonorm_lp_matches_formula_eval_and_train():
    layer = randomize(RangeEvoNorm(32, qcfg=QC), seed=1)
    x = torch.randn(4, 32, 8, 8)
    # train: the range is the batch mean of per-sample min/max; running range updated 0.1/0.9
    layer.train()
    out = layer(x)
    lo, hi = batch_range(x)
    torch.testing.assert_close(out, range_en_ref(x, layer, quant=True, x_range=(lo, hi)))
    torch.testing.assert_close(layer.quantize_input.running_min, (0.9 * lo).reshape(1))
    # eval: the running range, here deliberately narrower than the data (clamping matters)
    layer.eval()
    with torch.no_grad():
        layer.quantize_input.running_min.fill_(-1.5)
        layer.quantize_input.running_max.fill_(2.0)
    out = layer(x)
    expect = range_en_ref(x, layer, quant=True, x_range=(torch.tensor(-1.5), torch.tensor(2.0)))
    torch.testing.assert_close(out, expect)
    # 8-bit really applied: differs from the FP formula
    assert not torch.allclose(out, range_en_ref(x, layer, quant=False), atol=1e-4)


def test_range_evonorm_params_and_buffers():
    layer = RangeEvoNorm(16, qcfg=QC)
    names = dict(layer.named_parameters())
    assert set(names) == {"weight", "bias", "v"}  # QuantMeasure range is buffers by default
    assert all(p.shape == (1, 16, 1, 1) for p in names.values())
    assert ((layer.weight >= 0) & (layer.weight <= 1)).all()  # U(0, 1), as the official class
    assert layer.bias.eq(0).all() and layer.v.eq(1).all()
    buffers = {n for n, _ in layer.named_buffers()}
    assert buffers == {"quantize_input.running_min", "quantize_input.running_max"}
    layer_p = RangeEvoNorm(16, qcfg=QuantCfg(measure_as_parameters=True))
    assert "quantize_input.running_min" in dict(layer_p.named_parameters())


@pytest.mark.parametrize("shape", [(4, 16, 32, 32), (4, 32, 16, 16), (4, 64, 8, 8), (4, 512, 1, 1)])
@pytest.mark.parametrize("qcfg", [None, QC])
def test_range_evonorm_shapes(shape, qcfg):
    x = torch.randn(shape, requires_grad=True)
    out = RangeEvoNorm(shape[1], qcfg=qcfg)(x)
    assert out.shape == x.shape and torch.isfinite(out).all()
    out.square().sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("shape, match", [((2, 8, 3, 3), "divisible"), ((2, 128, 1, 1), "m=1"),
                                          ((2, 16, 8), "4-D")])
def test_range_evonorm_rejects_bad_shapes(shape, match):
    with pytest.raises(ValueError, match=match):
        RangeEvoNorm(shape[1], qcfg=None)(torch.randn(shape))


def test_range_evonorm_rejects_bad_args():
    with pytest.raises(ValueError, match="groups"):
        RangeEvoNorm(12, qcfg=None)
    with pytest.raises(ValueError, match="activation"):
        RangeEvoNorm(16, qcfg=None, activation="relu")


def test_range_evonorm_output_gradient_is_quantized():
    """Bifurcation: the gradient below Range EvoNorm comes from an 8-bit quantized g_y."""
    layer = randomize(RangeEvoNorm(16, qcfg=QC), seed=2).eval()
    with torch.no_grad():
        layer.quantize_input.running_min.fill_(-2.5)
        layer.quantize_input.running_max.fill_(2.5)
    x = torch.randn(3, 16, 8, 8, requires_grad=True)
    g = torch.randn(3, 16, 8, 8)
    params = [x, layer.weight, layer.bias, layer.v]
    got = torch.autograd.grad(layer(x), params, g)
    ref = range_en_ref(x, layer, quant=True, x_range=(torch.tensor(-2.5), torch.tensor(2.5)))
    want = torch.autograd.grad(ref, params, fake_quant(g, 8, "nearest"), retain_graph=True)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    unquantized = torch.autograd.grad(ref, x, g)[0]
    assert not torch.allclose(got[0], unquantized, atol=1e-6)


# ---------------------------------------------------------------- Range BN

def test_range_bn_normalizes_gaussian_and_eval_uses_running_stats():
    torch.manual_seed(0)
    layer = RangeBatchNorm2d(8, momentum=0.0)  # momentum 0: running = last batch
    x = torch.randn(32, 8, 8, 8) * torch.linspace(0.5, 4, 8).view(1, 8, 1, 1) + 3.0
    out = layer(x)
    std = out.transpose(0, 1).reshape(8, -1).std(-1)
    assert torch.allclose(std, torch.ones(8), rtol=0.2), std
    assert out.mean(dim=(0, 2, 3)).abs().max() < 1e-4
    torch.testing.assert_close(layer.running_mean, x.mean(dim=(0, 2, 3)))
    layer.eval()
    torch.testing.assert_close(layer(x), out)  # same stats, now from the buffers
    x2 = x[:4] * 2.0
    expect = (x2 - layer.running_mean.view(1, 8, 1, 1)) * layer.running_scale.view(1, 8, 1, 1)
    torch.testing.assert_close(layer(x2), expect)


def test_range_bn_matches_formula_and_momentum():
    layer = randomize(RangeBatchNorm2d(4, chunks=16))
    assert layer.running_scale.eq(1).all() and layer.running_mean.eq(0).all()
    x = torch.randn(8, 4, 4, 4)
    y = x.transpose(0, 1).reshape(4, 16, 8)  # 8*4*4 = 128 values per channel -> 16 chunks of 8
    mean = x.mean(dim=(0, 2, 3))
    rng = y.max(-1).values.mean(-1) - y.min(-1).values.mean(-1)
    scale_fix = 0.5 * 0.35 * (1 + (math.pi * math.log(4)) ** 0.5) / (2 * math.log(8)) ** 0.5
    scale = 1 / (rng * scale_fix + 1e-5)
    expect = (x - mean.view(1, 4, 1, 1)) * scale.view(1, 4, 1, 1) * layer.weight.view(1, 4, 1, 1) \
        + layer.bias.view(1, 4, 1, 1)
    torch.testing.assert_close(layer(x), expect)
    torch.testing.assert_close(layer.running_mean, 0.9 * mean)  # running = 0.1·old + 0.9·batch
    torch.testing.assert_close(layer.running_scale, 0.1 + 0.9 * scale)


def test_range_bn_lp_close_to_fp_and_grad_runs():
    fp, lp = RangeBatchNorm2d(16), RangeBatchNorm2d(16, qcfg=QC)
    x = torch.randn(8, 16, 8, 8, requires_grad=True)
    out = lp(x)
    # not max: QuantMeasure's range (batch mean of per-sample min/max) clamps the outliers
    assert (out - fp(x)).abs().mean() < 0.02
    out.sum().backward()
    assert torch.isfinite(x.grad).all() and lp.weight.grad is not None
    with pytest.raises(ValueError, match="divisible"):
        RangeBatchNorm2d(16)(torch.randn(3, 16, 1, 1))


# ---------------------------------------------------------------- make_norm

EXPECTED = {"evonorm": EvoNormS0, "range-evonorm": RangeEvoNorm, "range-evonorm-fp": RangeEvoNorm,
            "range-bn": RangeBNAct, "bn": BatchNormAct, "gn": GroupNormAct}


@pytest.mark.parametrize("kind", NORMS)
def test_make_norm_every_kind(kind):
    qcfg = QC if kind == "range-evonorm" else None
    layer = make_norm(kind, 32, qcfg=qcfg)
    assert type(layer) is EXPECTED[kind]
    assert layer.weight.numel() == 32 and layer.weight.shape in {(32,), (1, 32, 1, 1)}
    assert layer.bias.numel() == 32
    x = torch.randn(4, 32, 8, 8, requires_grad=True)
    out = layer(x)
    assert out.shape == x.shape
    out.sum().backward()
    assert torch.isfinite(x.grad).all() and layer.weight.grad is not None
    if kind in ("bn", "gn", "range-bn"):
        assert out.min() >= 0  # the activation is inside
    with torch.no_grad():
        layer.weight.zero_()  # how models zero-init a residual branch
        layer.bias.zero_()
    assert layer(x).abs().max() == 0


def test_make_norm_precision_and_validation():
    assert make_norm("range-evonorm", 16, qcfg=QC).qcfg is QC
    assert make_norm("range-evonorm-fp", 16).qcfg is None
    assert make_norm("range-bn", 16, qcfg=QC).qcfg is QC
    assert isinstance(make_norm("gn", 16), torch.nn.GroupNorm) and make_norm("gn", 16).num_groups == 2
    with pytest.raises(ValueError, match="range-evonorm"):
        make_norm("evonorm", 16, qcfg=QC)
    with pytest.raises(ValueError, match="range-evonorm-fp"):
        make_norm("range-evonorm", 16)
    for kind in ("bn", "gn", "range-evonorm-fp"):
        with pytest.raises(ValueError, match="full precision only"):
            make_norm(kind, 16, qcfg=QC)
    with pytest.raises(ValueError, match="evonorm, range-evonorm"):
        make_norm("layernorm", 16)


# ---------------------------------------------------------------- vmap(functional_call) == loop

def _copies(make, k=3):
    copies = []
    for i in range(k):
        layer = randomize(make(), seed=10 + i)
        for name, buf in layer.named_buffers():
            with torch.no_grad():
                leaf = name.split(".")[-1]
                buf.fill_({"running_min": -2.0 - i, "running_max": 2.0 + 0.5 * i,
                           "running_mean": 0.1 * i, "running_scale": 1.0 + 0.2 * i}[leaf])
        copies.append(layer)
    return copies


@pytest.mark.parametrize("case", ["evonorm", "range-fp", "range-fp-sigmoid", "range-lp-eval",
                                  "range-lp-train", "range-bn-train", "range-bn-lp-eval"])
def test_vmap_functional_call_equals_loop(case):
    make = {"evonorm": lambda: EvoNormS0(16),
            "range-fp": lambda: RangeEvoNorm(16, qcfg=None),
            "range-fp-sigmoid": lambda: RangeEvoNorm(16, qcfg=None, activation="sigmoid"),
            "range-lp-eval": lambda: RangeEvoNorm(16, qcfg=QC),
            "range-lp-train": lambda: RangeEvoNorm(16, qcfg=QC),
            "range-bn-train": lambda: RangeBatchNorm2d(16),
            "range-bn-lp-eval": lambda: RangeBatchNorm2d(16, qcfg=QC)}[case]
    train = "eval" not in case
    copies = [c.train(train) for c in _copies(make)]
    loop_copies = copy.deepcopy(copies)
    xs = torch.randn(3, 4, 16, 8, 8)
    params, buffers = stack_module_state(copies)

    def f(p, b, x):
        return functional_call(copies[0], (p, b), (x,))

    got = vmap(f)(params, buffers, xs)
    want = torch.stack([c(x) for c, x in zip(loop_copies, xs)])
    torch.testing.assert_close(got, want)
    # in-place running-stat updates work under vmap when the buffers are passed stacked
    for name, stacked in buffers.items():
        torch.testing.assert_close(stacked, torch.stack([dict(c.named_buffers())[name] for c in loop_copies]))


@pytest.mark.parametrize("make", [lambda: RangeEvoNorm(16, qcfg=QC), lambda: EvoNormS0(16)],
                         ids=["range-lp-eval", "evonorm"])
def test_vmap_grad_equals_loop(make):
    """Gradients under vmap(grad) == the loop's, for the layers whose backward is hand-written
    (Range EvoNorm's; EvoNorm-S0's group variance on a CPU)."""
    copies = [c.eval() for c in _copies(make)]
    params, buffers = stack_module_state(copies)
    xs = torch.randn(3, 4, 16, 8, 8)
    gs = torch.randn(3, 4, 16, 8, 8)

    def loss(p, b, x, g):
        return (functional_call(copies[0], (p, b), (x,)) * g).sum()

    got_p, got_x = vmap(torch.func.grad(loss, argnums=(0, 2)))(params, buffers, xs, gs)
    for i, c in enumerate(copies):
        x = xs[i].clone().requires_grad_(True)
        ps = [c.weight, c.bias, c.v, x]
        grads = torch.autograd.grad((c(x) * gs[i]).sum(), ps)
        for name, gr in zip(("weight", "bias", "v"), grads[:3]):
            torch.testing.assert_close(got_p[name][i], gr)
        torch.testing.assert_close(got_x[i], grads[3])


@pytest.mark.parametrize("qcfg", [None, QuantCfg(grad_rounding="nearest")], ids=["fp", "lp"])
@pytest.mark.parametrize("shape", [(4, 16, 8, 8), (2, 32, 4, 4)])
def test_range_evonorm_fused_equals_composed_autograd(qcfg, shape):
    """The hand-written backward (range_fused.py) == autograd through the composed ops: outputs
    exactly, gradients of x, v, gamma, beta to float rounding (summation order)."""
    torch.manual_seed(0)
    fused = RangeEvoNorm(shape[1], qcfg=qcfg)
    with torch.no_grad():
        fused.v.uniform_(-2, 2)
        fused.bias.normal_()
    composed = copy.deepcopy(fused)
    composed.fused = False
    x = torch.randn(*shape) * 3
    x[0, 0, 0, :2] = x[0, 0, 0, 2]  # ties inside a chunk: the gradient goes to max(-1)'s index
    xs = [x.clone().requires_grad_(), x.clone().requires_grad_()]
    ys = [fused(xs[0]), composed(xs[1])]
    g = torch.randn_like(ys[0])
    for y in ys:
        y.backward(g)
    assert torch.equal(ys[0], ys[1])
    torch.testing.assert_close(xs[0].grad, xs[1].grad, rtol=1e-5, atol=1e-6)
    for name in ("v", "weight", "bias"):
        torch.testing.assert_close(getattr(fused, name).grad, getattr(composed, name).grad,
                                   rtol=1e-5, atol=1e-5)


def test_range_evonorm_fused_backward_leaves_saved_tensors_intact():
    """The eager backward works in place on its own buffers only: a second backward through the
    same graph (retain_graph) gives the same gradients, and the input is unchanged."""
    torch.manual_seed(0)
    norm = RangeEvoNorm(16, qcfg=QuantCfg(grad_rounding="nearest"))
    with torch.no_grad():
        norm.v.uniform_(-2, 2)
    x = (torch.randn(4, 16, 8, 8) * 3).requires_grad_()
    x0 = x.detach().clone()
    y = norm(x)
    g = torch.randn_like(y)
    first = torch.autograd.grad(y, [x, norm.v, norm.weight, norm.bias], g, retain_graph=True)
    second = torch.autograd.grad(y, [x, norm.v, norm.weight, norm.bias], g)
    for a, b in zip(first, second):
        assert torch.equal(a, b)
    assert torch.equal(x.detach(), x0)


@pytest.mark.parametrize("qcfg", [None, QuantCfg()], ids=["fp", "lp"])
def test_range_evonorm_no_grad_forward_identical(qcfg):
    """Evaluation (no autograd node, amax/amin instead of max/min with indices) gives exactly
    the training forward's output."""
    torch.manual_seed(0)
    norm = RangeEvoNorm(16, qcfg=qcfg).eval()
    with torch.no_grad():
        norm.v.uniform_(-2, 2)
        norm.bias.normal_()
    x = torch.randn(4, 16, 8, 8) * 3
    x[0, 0, 0, :3] = x[0, 0, 0, 3]  # ties
    with torch.no_grad():
        fast = norm(x)
    assert torch.equal(fast, norm(x.clone().requires_grad_()).detach())


@pytest.mark.parametrize("m", [2, 3, 32, 33, 128, 129, 512])
def test_first_extremes_are_max_and_mins_first_indices(m):
    """The integer keys give the indices max(-1)/min(-1) return, the first on ties, for rows
    short (reduced across rows) and long, in int16 and int32 keys; ties are made common by
    clamping levels to both ends, as QuantMeasure's batch range does."""
    g = torch.Generator().manual_seed(m)
    q = torch.randint(-60, 316, (64, m), generator=g).clamp(0, 255)
    q[0] = 7  # a row of one value: index 0 both ways
    imx, imn = first_extremes(q.to(level_dtype(m)).view(4, 16, m))
    x = q.float() * 0.37 - 11.0  # the levels' order, as a Q(x) with an injective grid has it
    assert torch.equal(imx.view(-1), x.max(-1).indices) and torch.equal(imn.view(-1), x.min(-1).indices)
    assert torch.equal(imx.view(-1), x.argmax(-1)) and torch.equal(imn.view(-1), x.argmin(-1))  # first, documented
    assert level_dtype(128) == torch.int16 and level_dtype(129) == torch.int32 and level_dtype(2 ** 24) is None


@pytest.mark.parametrize("shape", [(4, 16, 8, 8), (2, 32, 16, 16), (4, 16, 32, 32)])
def test_range_evonorm_levels_path_equals_max_min_path(shape, monkeypatch):
    """The eager 8-bit layer takes its max/min indices from x_q's levels (`first_extremes`): the
    same elements as max/min with indices, so outputs and gradients are bit for bit those of the
    layer with the levels withheld; many ties (a batch range narrower than each sample's). Small
    shapes with the size threshold lifted; the last at it."""
    monkeypatch.setattr(range_fused, "ORDER_MIN_NUMEL", min(range_fused.ORDER_MIN_NUMEL, math.prod(shape)))
    torch.manual_seed(0)
    x = torch.randn(*shape) * 3
    x[0, :, :2] = 50.0  # one sample far above the others: the batch-mean range clamps the rest
    runs = []
    for withheld in (False, True):
        norm = randomize(RangeEvoNorm(shape[1], qcfg=QC))
        if withheld:
            monkeypatch.setattr(norms_mod, "level_dtype", lambda m, bits: None)
        xi = x.clone().requires_grad_()
        y = norm(xi)
        y.backward(torch.randn(y.shape, generator=torch.Generator().manual_seed(1)))
        runs.append((y.detach(), xi.grad, norm.v.grad, norm.weight.grad, norm.bias.grad))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_quantized_levels_equal_quantmeasures_forward_and_refuse_a_degenerate_grid():
    """QuantMeasure.quantized_levels: Q(x) bit for bit as forward, the same running-range update,
    an identity gradient (STE), the levels with Q(x)'s order; where two levels round to one float
    (a range tiny beside its offset), no levels."""
    qm = QuantMeasure(QuantCfg(act_rounding="nearest"))
    twin = copy.deepcopy(qm)
    x = (torch.randn(4, 8, 6, 6) * 2).requires_grad_()
    q_x, order = qm.quantized_levels(x, torch.int16)
    assert torch.equal(q_x, twin(x)) and torch.equal(qm.running_max, twin.running_max)
    q_x.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
    assert order.dtype == torch.int16 and int(order.min()) >= 0 and int(order.max()) <= 255
    flat_q, flat_o = q_x.detach().flatten(), order.flatten()
    assert torch.equal(flat_q.argsort(stable=True), flat_o.argsort(stable=True))
    flat = torch.full((4, 8, 6, 6), 1000.0) + torch.rand(4, 8, 6, 6) * 1e-4  # steps far below 1000's ulp
    assert qm.quantized_levels(flat, torch.int16)[1] is None


# ------------------------------------------- the FP gate: paper hardsigmoid vs official sigmoid

def official_range_en_full(x, weight, bias, v, groups=8, chunks=16, eps=1e-5):
    """Forward of the official ``evonorm.RangeEN_full`` (github.com/aparna-aketi/Low_Precision_DL,
    quantized_training/evonorm.py), re-typed op by op in plain torch: the same chunking
    (B, G, K, -1), the same Python-float scale_fix and the same order (n·s)·γ + β."""
    B, C, H, W = x.shape
    n = x * (x * v).sigmoid()
    y = x.reshape(B, groups, chunks, -1)
    mean_max, mean_min = y.max(-1)[0].mean(-1), y.min(-1)[0].mean(-1)
    scale_fix = (0.5 * 0.35) * (1 + (math.pi * math.log(4)) ** 0.5) / ((2 * math.log(y.size(-1))) ** 0.5)
    scale = 1 / ((mean_max - mean_min) * scale_fix + eps)
    out = (n.reshape(B, groups, -1) * scale.view(B, groups, 1)).reshape(B, C, H, W)
    return out * weight + bias


def test_gate_registry_matches_the_fidelity_option():
    assert tuple(GATES) == FIDELITY_CHOICES["range_evonorm_fp"] == ACTIVATIONS
    assert GATES["hardsigmoid"] is hardsigmoid and GATES["sigmoid"] is torch.sigmoid
    with pytest.raises(ValueError, match="gate"):
        NormSpec("range-evonorm-fp", gate="relu")
    with pytest.raises(ValueError, match="no gate"):
        NormSpec("evonorm", gate="sigmoid")
    torch.manual_seed(3)
    plain = make_norm("range-evonorm-fp", 32)
    torch.manual_seed(3)
    spec = make_norm(NormSpec("range-evonorm-fp"), 32)  # the default spec: the same layer, same init
    x = torch.randn(2, 32, 8, 8)
    assert spec.activation == plain.activation == "hardsigmoid" and torch.equal(spec(x), plain(x))


@pytest.mark.parametrize("shape", [(4, 32, 8, 8), (3, 64, 4, 4)])
def test_range_evonorm_fp_sigmoid_equals_official_range_en_full(shape):
    torch.manual_seed(0)
    layer = make_norm(NormSpec("range-evonorm-fp", gate="sigmoid"), shape[1])
    assert layer.activation == "sigmoid" and layer.qcfg is None
    randomize(layer, seed=5)
    x = (torch.randn(shape) * 3).requires_grad_()
    xr = x.detach().clone().requires_grad_()
    w, b, v = (p.detach().clone().requires_grad_() for p in (layer.weight, layer.bias, layer.v))
    got, want = layer(x), official_range_en_full(xr, w, b, v)
    # The two forwards run the same float32 ops except that lpdl forms s·γ first (n·(s⊗γ)) where
    # the official code forms n·s first: a few float32 roundings (2^-24 ≈ 6e-8 relative each) on
    # outputs of magnitude ≲ 10 here, so |difference| ≲ 1e-6 (measured: 9.5e-7 max over 60 draws,
    # 4.8e-7 / 9.5e-7 for these two shapes); atol 1e-5 leaves 10x headroom while any real
    # difference in the formula (gate, range, scale) is ≥ 1e-2 (test_range_evonorm_fp_gates_differ).
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    g = torch.randn(shape)
    got.backward(g)
    want.backward(g)
    for p, q in ((x, xr), (layer.weight, w), (layer.bias, b), (layer.v, v)):
        torch.testing.assert_close(p.grad, q.grad, atol=1e-4, rtol=1e-5)  # sums of ≤ 4096 such terms


def test_range_evonorm_fp_gates_differ():
    torch.manual_seed(0)
    hard = randomize(make_norm("range-evonorm-fp", 32), seed=7)
    sig = make_norm(NormSpec("range-evonorm-fp", gate="sigmoid"), 32)
    sig.load_state_dict(hard.state_dict())
    x = torch.randn(4, 32, 8, 8)
    diff = (hard(x) - sig(x)).abs().max()
    # |σ(t) − hardsigmoid(t)| peaks at 0.069 at |t| ≈ 1.32, scaled by |x|·s·γ at the output: the
    # gates differ by orders of magnitude more than float32 rounding (measured 0.35 here).
    assert diff > 2e-2


@pytest.mark.parametrize("kind", NORMS)
def test_act_false_drops_only_a_separate_relu(kind):
    """act=False is the ReLU kinds' norm alone (negative outputs survive); the EvoNorm kinds' gate
    is the norm, so they are unchanged; only the ReLU kinds get a ReLU after a residual add."""
    from lpdl_core.quant.norms import RELU_KINDS, trunk_activation
    qcfg = QC if kind == "range-evonorm" else None
    torch.manual_seed(0)
    with_act, without = make_norm(kind, 16, qcfg=qcfg), make_norm(kind, 16, qcfg=qcfg, act=False)
    without.load_state_dict(with_act.state_dict())
    x = torch.randn(4, 16, 8, 8)
    a, b = with_act(x), without(x)
    if kind in RELU_KINDS:
        assert b.min() < 0 and torch.equal(a, torch.relu(b))
        assert isinstance(trunk_activation(kind), torch.nn.ReLU) and "relu=False" in repr(without)
    else:
        assert torch.equal(a, b)
        assert trunk_activation(kind) is None


def test_norms_are_a_registry_of_the_vocabulary():
    from lpdl_core.config import NORMS
    from lpdl_core.quant.norms import REGISTRY, RELU_KINDS, make_norm
    from lpdl_core.quant.quantizer import QuantCfg
    assert tuple(REGISTRY) == NORMS
    assert RELU_KINDS == ("range-bn", "bn", "gn")
    for kind, norm in REGISTRY.items():
        if not norm.needs_qcfg:
            make_norm(kind, 16)
        if not norm.lp_instead:
            make_norm(kind, 16, qcfg=QuantCfg())
        else:
            assert REGISTRY[norm.lp_instead].lp_instead is None   # the suggested kind takes 8 bits
