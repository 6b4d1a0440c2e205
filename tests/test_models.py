"""The paper's CNNs: exact official parameter counts (docs/paper-vs-code.md, 'Models and parameter
counts'), FP/LP init rules ('FP and LP models are initialised differently'), forward/backward
shapes, a few SGD steps, norm swapping and the registry."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from lpdl_core.models import (MODELS, build_model, count_params, format_model_table, input_size,
                              model_table, resnet_cifar)
from lpdl_core.models.resnet_cifar import BasicBlock
from lpdl_core.quant.layers import QAdd, QConv2d, QLinear, QuantMeasure
from lpdl_core.quant.quantizer import QuantCfg

OFFICIAL = QuantCfg(measure_as_parameters=True)

# name, dataset, FP, LP trainable, LP incl. QuantMeasure scalars (official)
COUNTS = [
    ("resnet20", "cifar10", 273_258, 273_258, 273_380),
    ("resnet54", "cifar10", 760_458, 760_458, 760_760),
    ("vgg11", "cifar10", 9_496_522, 9_493_770, 9_493_806),
    ("vgg11", "imagenette", 9_496_522, 9_493_770, 9_493_806),
    ("resnet18", "imagenette", 11_186_442, 11_186_442, 11_186_556),
    ("mobilenetv2", "cifar10", 2_314_466, 2_314_466, 2_314_696),
]


@pytest.mark.parametrize("name,dataset,fp,lp,lp_official", COUNTS)
def test_parameter_counts(name, dataset, fp, lp, lp_official):
    assert count_params(build_model(name, precision="fp32", dataset=dataset)) == fp
    m = build_model(name, precision="int8", dataset=dataset)
    assert count_params(m) == lp
    # default QuantCfg keeps the running ranges as buffers: no parameter that is not trainable
    assert count_params(m, trainable_only=False) == lp
    m = build_model(name, precision="int8", dataset=dataset, qcfg=OFFICIAL)
    assert count_params(m) == lp
    assert count_params(m, trainable_only=False) == lp_official


def test_resnet20_tensor_counts():
    assert len(list(build_model("resnet20").parameters())) == 86
    assert len(list(build_model("resnet20", precision="int8", qcfg=OFFICIAL).parameters())) == 208
    m = build_model("resnet20", precision="int8")
    assert sum(isinstance(x, QuantMeasure) for x in m.modules()) == 61  # 21 conv/fc + 21 norms + 9 adds x 2


def test_resnet_depth_54_is_8_blocks_per_stage():
    m = resnet_cifar(54)
    assert m.blocks_per_stage == 8
    assert [len(s) for s in (m.layer1, m.layer2, m.layer3)] == [8, 8, 8]
    convs3x3 = sum(isinstance(x, nn.Conv2d) and x.kernel_size == (3, 3) for x in m.modules())
    assert convs3x3 + 1 == 50  # 6n + 2 weight layers (3x3 convs + FC; 1x1 projections not counted)
    assert resnet_cifar(20).blocks_per_stage == 3


def _norms_of_block(b: BasicBlock):
    return [b.bn1, b.bn2] + ([b.downsample[1]] if b.downsample is not None else [])


@pytest.mark.parametrize("name", ["resnet20", "resnet18"])
def test_resnet_lp_init(name):
    torch.manual_seed(0)
    m = build_model(name, precision="int8")
    blocks = [b for b in m.modules() if isinstance(b, BasicBlock)]
    assert blocks
    assert torch.all(m.bn1.weight == 1)
    for b in blocks:
        assert torch.all(b.bn2.weight == 0)  # every block's last norm: zero-init residual branch
        assert torch.all(b.bn1.weight == 1)
        if b.downsample is not None:
            assert torch.all(b.downsample[1].weight == 1)
        assert isinstance(b.conv1, QConv2d) and isinstance(b.add, QAdd)
    assert isinstance(m.fc, QLinear)
    assert abs(m.fc.weight.std().item() - 0.01) < 0.002
    assert torch.all(m.fc.bias == 0)


@pytest.mark.parametrize("name", ["resnet20", "resnet18"])
def test_resnet_fp_init(name):
    torch.manual_seed(0)
    m = build_model(name, precision="fp32")
    for b in m.modules():
        if isinstance(b, BasicBlock):
            for n in _norms_of_block(b):
                assert torch.all(n.weight == 1)
            assert type(b.conv1) is nn.Conv2d
    assert m.fc.weight.std().item() > 0.02  # PyTorch default Linear init, not N(0, 0.01)
    conv = m.layer1[0].conv1  # N(0, sqrt(2 / (9 C_out)))
    expect = (2.0 / (9 * conv.out_channels)) ** 0.5
    assert abs(conv.weight.std().item() / expect - 1) < 0.1


def test_vgg_bias_and_norm_init():
    torch.manual_seed(0)
    fp, lp = build_model("vgg11", precision="fp32"), build_model("vgg11", precision="int8")
    fp_convs = [x for x in fp.modules() if isinstance(x, nn.Conv2d)]
    lp_convs = [x for x in lp.modules() if isinstance(x, nn.Conv2d)]
    assert len(fp_convs) == len(lp_convs) == 8
    assert all(c.bias is not None and torch.all(c.bias == 0) for c in fp_convs)
    assert all(c.bias is None and isinstance(c, QConv2d) for c in lp_convs)
    # LP norm gamma keeps the Range EvoNorm class init U(0, 1) (official VGG-LP); FP EvoNorm gamma = 1
    g = lp.features[1].weight
    assert 0 <= g.min() and g.max() <= 1 and g.std() > 0.1
    assert torch.all(fp.features[1].weight == 1)


def test_mobilenet_structure():
    m = build_model("mobilenetv2", precision="int8")
    shortcut_convs = [b.shortcut[0] for b in m.layers if isinstance(b.shortcut, nn.Sequential)]
    assert len(shortcut_convs) == 4  # stride-1 blocks with in != out: 32->16, 16->24, 64->96, 160->320
    # official LP shortcut conv: 8-bit forward, no gradient bifurcation
    assert all(isinstance(c, QConv2d) and type(c) is not QConv2d for c in shortcut_convs)
    assert len(m.layers) == 17


def _forward_backward(name, precision, dataset):
    torch.manual_seed(0)
    m = build_model(name, precision=precision, dataset=dataset).train()
    s = input_size(name, dataset)
    x = torch.randn(2, 3, s, s)
    out = m(x)
    assert out.shape == (2, 10)
    assert torch.isfinite(out).all()
    nn.functional.cross_entropy(out, torch.tensor([1, 2])).backward()
    grads = [p.grad for p in m.parameters() if p.requires_grad]
    assert all(g is not None for g in grads)
    if s == 32:  # eval path (LP: running activation ranges); skipped at 224 px to keep the file fast
        assert m.eval()(x).shape == (2, 10)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize("name,dataset", [("resnet20", "cifar10"), ("resnet54", "cifar10"), ("vgg11", "cifar10"),
                                          ("mobilenetv2", "cifar10"), ("resnet18", "imagenette"),
                                          ("vgg11", "imagenette")])
def test_forward_backward(name, dataset, precision):
    _forward_backward(name, precision, dataset)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
@pytest.mark.parametrize("name", ["resnet20", "vgg11"])
def test_sgd_lowers_loss_on_a_fixed_batch(name, precision):
    torch.manual_seed(0)
    m = build_model(name, precision=precision).train()
    if name == "vgg11":
        m.classifier[0].p = 0.0  # no dropout: with 8 samples its noise swamps 6 steps of progress
    x, y = torch.randn(8, 3, 32, 32), torch.arange(8) % 10
    opt = torch.optim.SGD(m.parameters(), lr=0.05)
    losses = []
    for _ in range(6):
        loss = nn.functional.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0], losses


@pytest.mark.parametrize("precision,norm",
                         [("fp32", k) for k in ("evonorm", "range-evonorm-fp", "range-bn", "bn", "gn")]
                         + [("int8", k) for k in ("range-evonorm", "range-bn")])
def test_norm_swap_resnet20(precision, norm):
    torch.manual_seed(0)
    m = build_model("resnet20", precision=precision, norm=norm).train()
    x = torch.randn(2, 3, 32, 32)
    out = m(x)
    assert out.shape == (2, 10) and torch.isfinite(out).all()
    out.sum().backward()


def test_build_model_validation():
    with pytest.raises(ValueError, match="valid names: resnet20, resnet54, vgg11, resnet18, mobilenetv2"):
        build_model("resnet56")
    with pytest.raises(ValueError, match="valid precisions: fp32, int8"):
        build_model("resnet20", precision="lp")       # one vocabulary: the cells' precision names
    with pytest.raises(ValueError, match="vgg11.*built for cifar10, cifar100, imagenette only"):
        build_model("vgg11", dataset="imagenet")
    with pytest.raises(ValueError, match="built for imagenette only"):
        build_model("resnet18", dataset="cifar10")
    with pytest.raises(ValueError, match="cifar10"):
        build_model("resnet20", dataset="imagenette")
    with pytest.raises(ValueError):
        build_model("resnet20", precision="int8", norm="evonorm")  # FP-only norm in an LP model
    with pytest.raises(ValueError, match="valid names"):
        input_size("lenet", "cifar10")


def test_input_size():
    assert [input_size(n) for n in MODELS] == [32, 32, 32, 224, 32]
    assert input_size("vgg11", "imagenette") == 224


def test_model_table():
    rows = model_table()
    assert [r["name"] for r in rows] == list(MODELS) + ["distilbert", "distilbert"]
    got = {r["name"]: (r["fp"], r["lp_trainable"], r["lp_official"], r["paper"]) for r in rows[:-2]}
    # DistilBERT-base + classification head (the paper rounds to 66.7M); 38 Linears x 2 range scalars
    assert [(r["dataset"], r["fp"], r["lp_trainable"], r["lp_official"]) for r in rows[-2:]] == [
        ("agnews", 66_956_548, 66_956_548, 66_956_624), ("sentlen", 66_958_086, 66_958_086, 66_958_162)]
    assert got == {
        "resnet20": (273_258, 273_258, 273_380, "0.27M"),
        "resnet54": (760_458, 760_458, 760_760, "0.76M"),
        "vgg11": (9_496_522, 9_493_770, 9_493_806, "9.49M"),
        "resnet18": (11_186_442, 11_186_442, 11_186_556, "11.2M"),
        "mobilenetv2": (2_314_466, 2_314_466, 2_314_696, "—"),
    }
    text = format_model_table(rows)
    lines = text.splitlines()
    assert len(lines) == 2 + len(rows)
    assert len({len(line) for line in lines}) == 1  # aligned
    assert "11,186,556" in text and "0.27M" in text


# ------------------------------------------- Figure 1's nets against the official CIFAR ResNet

class _OfficialBlock(nn.Module):
    """The official `BasicBlock` (github.com/aparna-aketi/Low_Precision_DL,
    quantized_training/resnet.py), transcribed: conv-norm-[ReLU]-conv-norm, += shortcut, [ReLU];
    the ReLUs only when 'evo' is not in the norm type."""

    def __init__(self, cin, cout, stride, make, relu):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = make(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = make(cout)
        self.downsample = None if stride == 1 and cin == cout else nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride, bias=False), make(cout))
        self.relu = relu

    def forward(self, x):
        out = self.bn1(self.conv1(x))
        out = torch.relu(out) if self.relu else out
        out = self.bn2(self.conv2(out))
        out += x if self.downsample is None else self.downsample(x)
        return torch.relu(out) if self.relu else out


class _OfficialResNetCifar(nn.Module):
    """The official `ResNet_cifar10` (same file) for depth 20: stem conv-norm-[ReLU], three stages
    of 16/32/64 channels, AvgPool2d(8), Linear(64, 10). Parameter names match lpdl's."""

    def __init__(self, norm_type):
        super().__init__()
        from lpdl_core.quant.norms import EvoNormS0
        make = {"batchnorm": nn.BatchNorm2d, "groupnorm": lambda c: nn.GroupNorm(2, c),
                "evonorm": EvoNormS0}[norm_type]
        self.relu = "evo" not in norm_type
        self.conv1, self.bn1 = nn.Conv2d(3, 16, 3, 1, 1, bias=False), make(16)
        cin, stages = 16, []
        for cout, stride in ((16, 1), (32, 2), (64, 2)):
            stages.append(nn.Sequential(*[_OfficialBlock(cin if i == 0 else cout, cout, stride if i == 0 else 1,
                                                         make, self.relu) for i in range(3)]))
            cin = cout
        self.layer1, self.layer2, self.layer3 = stages
        self.fc = nn.Linear(64, 10)

    def forward(self, x):
        x = self.bn1(self.conv1(x))
        x = torch.relu(x) if self.relu else x
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(nn.functional.avg_pool2d(x, 8).flatten(1))


@pytest.mark.parametrize("norm,official", [("bn", "batchnorm"), ("gn", "groupnorm"), ("evonorm", "evonorm")])
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_figure1_resnets_equal_the_official_net_with_shared_weights(norm, official, mode):
    """Figure 1's BatchNorm, GroupNorm and EvoNorm ResNet-20s give the official net's logits with
    the same weights (random norm affines, so no γ = 1 / β = 0 hides a misplaced ReLU). Both run
    the same PyTorch operators on the same values in the same order (the residual add's operands
    are swapped, and float addition is commutative), so they agree to float32 rounding; 1e-5 leaves
    room for a convolution algorithm chosen differently per call. A ReLU before the add or in the
    shortcut moved the BN logits by up to 3.9."""
    torch.manual_seed(0)
    ours = build_model("resnet20", precision="fp32", norm=norm)
    with torch.no_grad():
        for name, p in ours.named_parameters():
            if "bn" in name or "downsample.1" in name:
                p.copy_(torch.randn_like(p) * 0.5 + (1.0 if name.endswith("weight") else 0.0))
    theirs = _OfficialResNetCifar(official)
    assert sorted(theirs.state_dict()) == sorted(ours.state_dict())
    theirs.load_state_dict(ours.state_dict())
    getattr(ours, mode)(), getattr(theirs, mode)()
    x = torch.randn(8, 3, 32, 32)
    with torch.no_grad():
        want, got = theirs(x), ours(x)
    assert (got - want).abs().max() <= 1e-5 * max(1.0, want.abs().max()), (got - want).abs().max()


def test_mobilenetv2_bn_keeps_the_linear_bottleneck():
    """With a ReLU kind, MobileNetV2's project norm and shortcut norm have no ReLU, as the
    official `Block_m`; the expand and depthwise norms (and stem and head) do."""
    m = build_model("mobilenetv2", precision="fp32", norm="bn")
    block = next(b for b in m.layers if not isinstance(b.shortcut, nn.Identity))
    assert block.bn1.relu and block.bn2.relu and m.bn1.relu and m.bn2.relu
    assert not block.bn3.relu and not block.shortcut[1].relu
