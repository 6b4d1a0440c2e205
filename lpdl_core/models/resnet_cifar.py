"""ResNet for CIFAR-10 (He et al. 2016), as the paper's official code builds it.

Follows `quantized_training/resnet.py::ResNet_cifar10` (FP) and
`resnet_quantized.py::ResNet_cifar10q` (LP) of aparna-aketi/Low_Precision_DL
(docs/paper-vs-code.md, 'EvoNorm-S0 and Range EvoNorm', 'FP and LP models are initialised
differently' and 'Models and parameter counts'):

- n = int((depth - 2) / 6) BasicBlocks per stage, widths 16/32/64, stride 2 at stages 2 and 3,
  a 1x1 conv + norm projection shortcut (option B) only where the shape changes.
- Every norm carries its own nonlinearity (EvoNorm-S0 / Range EvoNorm), so there is no ReLU in
  the trunk: conv-norm-conv-norm, then the residual add (8-bit `QAdd` at LP).
- With the ReLU kinds (BatchNorm, GroupNorm, Range BN: Figure 1's comparison) the block is He et
  al.'s, as the official `BasicBlock`: conv-norm-ReLU-conv-norm, a shortcut norm without ReLU, and
  a ReLU after the residual add (`quant.norms.trunk_activation`); the stem is conv-norm-ReLU.
- Conv weights ~ N(0, sqrt(2 / (k^2 C_out))) at both precisions. FP: every norm gamma = 1,
  PyTorch's default Linear init for the classifier. LP (`init_modelq`): each block's LAST norm
  gamma = 0 (zero-init residual branch), the other norms gamma = 1, classifier W ~ N(0, 0.01), b = 0.

Parameter counts (EvoNorm: 3 tensors of shape (1, C, 1, 1) per norm):
ResNet-20 273,258 FP (86 tensors); LP 273,258 trainable, 273,380 with the official
QuantMeasure scalars (2 per QuantMeasure, 61 of them). `depth=54` gives n = int(52/6) = 8,
i.e. 6*8 + 2 = 50 weight layers and 760,458 parameters: this is the paper's "ResNet-54" as the
official code builds it; a true ResNet-56 has n = 9 (0.858M parameters).
"""
from __future__ import annotations

import math

from torch import nn

from ..quant.layers import make_add, make_conv, make_linear
from ..quant.norms import make_norm, trunk_activation
from ..config import PRECISIONS
from ..quant.quantizer import QuantCfg



def resolve_precision(precision: str, norm: str | None, qcfg: QuantCfg | None) -> tuple[str, QuantCfg | None]:
    """Shared by every paper model: (norm kind, qcfg) for a precision.

    FP: qcfg is ignored (None, plain layers), norm defaults to "evonorm".
    LP: qcfg defaults to QuantCfg(), norm defaults to "range-evonorm".
    Every model hands `norm` to make_norm unread, so it may also be a quant.norms.NormSpec (a kind
    plus its Range EvoNorm gate; how plan_cell passes Fidelity.range_evonorm_fp).
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    if precision == "fp32":
        return norm or "evonorm", None
    return norm or "range-evonorm", qcfg if qcfg is not None else QuantCfg()


class BasicBlock(nn.Module):
    """conv3x3(stride) - norm - conv3x3 - norm, plus an identity or 1x1-conv + norm shortcut.

    EvoNorm kinds: every norm includes its gate (official EvoNorm models have no ReLU), also the
    norm before the add and the one in the shortcut. ReLU kinds (bn, gn, range-bn): the ReLU
    follows the first norm and the residual add, none the second norm or the shortcut's.
    """

    def __init__(self, in_ch: int, out_ch: int, stride: int, norm: str, qcfg: QuantCfg | None):
        super().__init__()
        # (B, in, H, W) -> (B, out, H/s, W/s) -> (B, out, H/s, W/s)
        self.conv1 = make_conv(in_ch, out_ch, 3, stride=stride, padding=1, qcfg=qcfg)
        self.bn1 = make_norm(norm, out_ch, qcfg=qcfg)
        self.conv2 = make_conv(out_ch, out_ch, 3, padding=1, qcfg=qcfg)
        # the block's last norm (gamma = 0 at LP); no ReLU after it with the ReLU kinds
        self.bn2 = make_norm(norm, out_ch, qcfg=qcfg, act=False)
        self.downsample = None
        if stride != 1 or in_ch != out_ch:  # option B: project only where the shape changes
            self.downsample = nn.Sequential(make_conv(in_ch, out_ch, 1, stride=stride, qcfg=qcfg),
                                            make_norm(norm, out_ch, qcfg=qcfg, act=False))
        self.add = make_add(qcfg)  # official `Qsum` at LP: both inputs 8-bit
        self.relu = trunk_activation(norm)  # ReLU after the add (ReLU kinds), else None

    def forward(self, x):
        out = self.bn2(self.conv2(self.bn1(self.conv1(x))))
        residual = x if self.downsample is None else self.downsample(x)
        out = self.add(residual, out)
        return out if self.relu is None else self.relu(out)


def make_stage(in_ch: int, out_ch: int, blocks: int, stride: int, norm: str,
               qcfg: QuantCfg | None) -> nn.Sequential:
    """`blocks` BasicBlocks; only the first one strides (and may project)."""
    layers = [BasicBlock(in_ch, out_ch, stride, norm, qcfg)]
    layers += [BasicBlock(out_ch, out_ch, 1, norm, qcfg) for _ in range(blocks - 1)]
    return nn.Sequential(*layers)


def _reset_norm(m: nn.Module, gamma: float) -> None:
    nn.init.constant_(m.weight, gamma)
    if getattr(m, "bias", None) is not None:
        nn.init.zeros_(m.bias)


def init_resnet(model: nn.Module, lp: bool) -> None:
    """Official `init_model` (FP) / `init_modelq` (LP) for a model with .bn1, BasicBlocks and .fc."""
    for m in model.modules():
        if isinstance(m, nn.Conv2d):  # QConv2d included
            n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
            nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / n))
    _reset_norm(model.bn1, 1.0)
    blocks = [m for m in model.modules() if isinstance(m, BasicBlock)]
    for b in blocks:
        _reset_norm(b.bn1, 1.0)
        _reset_norm(b.bn2, 0.0 if lp else 1.0)  # zero-init residual branch at LP only
        if b.downsample is not None:
            _reset_norm(b.downsample[1], 1.0)
    if lp:
        nn.init.normal_(model.fc.weight, 0.0, 0.01)
        nn.init.zeros_(model.fc.bias)
    # FP keeps PyTorch's default nn.Linear init for the classifier


class ResNetCifar(nn.Module):
    def __init__(self, depth: int, num_classes: int, norm: str, qcfg: QuantCfg | None, width: int = 16):
        super().__init__()
        n = int((depth - 2) / 6)  # official: depth=54 -> n=8 (50 weight layers), not 9
        if n < 1:
            raise ValueError(f"resnet_cifar depth must be >= 8, got {depth}")
        self.depth, self.blocks_per_stage = depth, n
        w = width  # 16 in the paper; smaller only for the mini profile
        # (B, 3, 32, 32) -> (B, w, 32, 32)
        self.conv1 = make_conv(3, w, 3, padding=1, qcfg=qcfg)
        self.bn1 = make_norm(norm, w, qcfg=qcfg)
        self.layer1 = make_stage(w, w, n, 1, norm, qcfg)          # (B, w, 32, 32)
        self.layer2 = make_stage(w, 2 * w, n, 2, norm, qcfg)      # (B, 2w, 16, 16)
        self.layer3 = make_stage(2 * w, 4 * w, n, 2, norm, qcfg)  # (B, 4w, 8, 8)
        # Global average pool: the official AvgPool2d(8) on the 8x8 map, any input size here.
        self.avgpool = nn.AdaptiveAvgPool2d(1)                    # (B, 4w, 1, 1)
        self.fc = make_linear(4 * w, num_classes, qcfg=qcfg)      # (B, classes)
        init_resnet(self, lp=qcfg is not None)

    def forward(self, x):
        x = self.bn1(self.conv1(x))
        x = self.layer3(self.layer2(self.layer1(x)))
        return self.fc(self.avgpool(x).flatten(1))


def resnet_cifar(depth: int, *, num_classes: int = 10, precision: str = "fp32", norm: str | None = None,
                 qcfg: QuantCfg | None = None, width: int = 16) -> ResNetCifar:
    """CIFAR ResNet of `depth` (20 -> ResNet-20, 54 -> the paper's "ResNet-54", n = 8).
    width: channels of the first stage (paper: 16); the mini profile uses depth 8, width 8."""
    norm, qcfg = resolve_precision(precision, norm, qcfg)
    return ResNetCifar(depth, num_classes, norm, qcfg, width)


def resnet20(*, dataset: str | None = None, **kw) -> ResNetCifar:
    """The paper's ResNet-20 (32 px: the CIFAR dataset changes only num_classes)."""
    return resnet_cifar(20, **kw)


def resnet54(*, dataset: str | None = None, **kw) -> ResNetCifar:
    """The paper's ResNet-54 (32 px: the CIFAR dataset changes only num_classes)."""
    return resnet_cifar(54, **kw)
