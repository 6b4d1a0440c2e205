"""MobileNetV2 (Sandler et al. 2018) with CIFAR strides, as the paper's official code builds it.

Follows `quantized_training/mobilenetv2_quantized.py` of aparna-aketi/Low_Precision_DL (the FP
`mobilenetv2.py` is not in the public snapshot; docs/paper-vs-code.md, 'Models and parameter
counts', gives its count):

- 3x3 stem conv 3 -> 32, stride 1 for CIFAR; blocks from the (t, c, n, s) table below, with the
  second row's stride 2 -> 1 for CIFAR; 1x1 conv 320 -> 1280; avg-pool 4; FC 1280 -> classes.
- Each block is expand 1x1 - norm - depthwise 3x3(s) - norm - project 1x1 - norm (the expansion
  conv exists even for t = 1). A norm follows every conv and carries the nonlinearity
  (EvoNorm-S0 / Range EvoNorm; no ReLU6). With the ReLU kinds (BN, GN, Range BN) the project
  conv's norm and the shortcut's norm have no ReLU (the linear bottleneck, as the official
  `Block_m`); the stem, expand, depthwise and head norms do.
- Stride-1 blocks add a shortcut: identity when in == out, else a 1x1 conv + norm; stride-2
  blocks have none. This gives the official 2,314,466 FP parameters (2,254,858 without the
  four 1x1 shortcut convs).

Official LP details kept: the residual add is a plain float add (no `Qsum`), and the LP 1x1
shortcut conv is built without biprecision/num_bits_grad, i.e. 8-bit input and weight but a
float layer gradient (`QConv2dFloatGrad`). LP count with the official QuantMeasure scalars:
2,314,696 (115 QuantMeasures). The official LP model's `init_modelq` call is commented out, so
all layers keep PyTorch's/the norm class's default init (Range EvoNorm gamma ~ U(0, 1)); FP is
built with the same default init (its init code is not public). Not used in the paper.
"""
from __future__ import annotations

import torch.nn.functional as F
from torch import nn

from ..quant.layers import Add, QConv2d, make_conv, make_linear
from ..quant.norms import make_norm
from ..quant.quantizer import QuantCfg
from .resnet_cifar import resolve_precision

# (expansion t, out channels c, blocks n, first stride s); CIFAR: row 2 stride 1 (ImageNet: 2)
CFG_CIFAR = [(1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2),
             (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1)]


class QConv2dFloatGrad(QConv2d):
    """8-bit input and weight, float gradients: the official LP shortcut conv (no biprecision)."""

    def forward(self, x):
        qx, qw, qb = self.quantized_operands(x)
        return F.conv2d(qx, qw, qb, self.stride, self.padding, self.dilation, self.groups)


class Block(nn.Module):
    """expand 1x1 -> depthwise 3x3 -> project 1x1, each followed by a norm (+ shortcut if stride 1)."""

    def __init__(self, in_ch: int, out_ch: int, t: int, stride: int, norm: str, qcfg: QuantCfg | None):
        super().__init__()
        self.stride = stride
        mid = t * in_ch
        # (B, in, H, W) -> (B, mid, H, W) -> (B, mid, H/s, W/s) -> (B, out, H/s, W/s)
        self.conv1 = make_conv(in_ch, mid, 1, qcfg=qcfg)
        self.bn1 = make_norm(norm, mid, qcfg=qcfg)
        self.conv2 = make_conv(mid, mid, 3, stride=stride, padding=1, groups=mid, qcfg=qcfg)
        self.bn2 = make_norm(norm, mid, qcfg=qcfg)
        self.conv3 = make_conv(mid, out_ch, 1, qcfg=qcfg)
        self.bn3 = make_norm(norm, out_ch, qcfg=qcfg, act=False)  # linear bottleneck
        self.shortcut = nn.Identity()
        if stride == 1 and in_ch != out_ch:
            conv = nn.Conv2d(in_ch, out_ch, 1, bias=False) if qcfg is None else \
                QConv2dFloatGrad(in_ch, out_ch, 1, bias=False, qcfg=qcfg)
            self.shortcut = nn.Sequential(conv, make_norm(norm, out_ch, qcfg=qcfg, act=False))
        self.add = Add()  # official: plain `out + shortcut(x)` at both precisions

    def forward(self, x):
        out = self.bn3(self.conv3(self.bn2(self.conv2(self.bn1(self.conv1(x))))))
        return self.add(out, self.shortcut(x)) if self.stride == 1 else out


class MobileNetV2(nn.Module):
    """cfg: (expansion t, channels c, repeats n, stride s) per stage; stem and head: the first and
    last conv widths (32 and 1280 for CIFAR MobileNetV2; the mini stand-in is smaller)."""

    def __init__(self, num_classes: int, norm: str, qcfg: QuantCfg | None,
                 cfg: tuple = tuple(CFG_CIFAR), stem: int = 32, head: int = 1280):
        super().__init__()
        # (B, 3, 32, 32) -> (B, 32, 32, 32)
        self.conv1 = make_conv(3, stem, 3, padding=1, qcfg=qcfg)
        self.bn1 = make_norm(norm, stem, qcfg=qcfg)
        layers, in_ch = [], stem
        for t, c, n, s in cfg:  # spatial 32 -> 32 -> 32 -> 16 -> 8 -> 8 -> 4 -> 4
            for i in range(n):
                layers.append(Block(in_ch, c, t, s if i == 0 else 1, norm, qcfg))
                in_ch = c
        self.layers = nn.Sequential(*layers)                 # (B, 320, 4, 4)
        self.conv2 = make_conv(in_ch, head, 1, qcfg=qcfg)    # (B, 1280, 4, 4)
        self.bn2 = make_norm(norm, head, qcfg=qcfg)
        self.avgpool = nn.AdaptiveAvgPool2d(1)               # (B, 1280, 1, 1): AvgPool2d(4) at 32 px
        self.linear = make_linear(head, num_classes, qcfg=qcfg)

    def forward(self, x):
        x = self.bn2(self.conv2(self.layers(self.bn1(self.conv1(x)))))
        return self.linear(self.avgpool(x).flatten(1))


def mobilenetv2(*, num_classes: int = 10, precision: str = "fp32", norm: str | None = None,
                qcfg: QuantCfg | None = None, dataset: str | None = None) -> MobileNetV2:
    """MobileNetV2 for 32-px CIFAR (the dataset changes only num_classes)."""
    norm, qcfg = resolve_precision(precision, norm, qcfg)
    return MobileNetV2(num_classes, norm, qcfg)
