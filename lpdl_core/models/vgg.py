"""VGG-11 (Simonyan & Zisserman 2015, configuration A) as the paper's official code builds it.

Follows `quantized_training/vgg.py` (FP) and `vgg_quantized.py` (LP) of
aparna-aketi/Low_Precision_DL (docs/paper-vs-code.md, 'FP and LP models are initialised differently'
and 'Models and parameter counts'):

- features: [64, M, 128, M, 256, 256, M, 512, 512, M, 512, 512, M], each conv 3x3 pad 1 followed
  by the norm, which carries the nonlinearity (no separate ReLU);
- classifier: Dropout(0.5) -> Linear(512, 512) -> ReLU -> Linear(512, classes);
- Imagenette (224 px, 7x7 after the five pools) adds AvgPool2d(7) before the classifier.

FP and LP differ in more than precision (a faithful comparison keeps this): FP convs have a
zero-initialised bias, LP convs have none; LP norms keep their class init (Range EvoNorm
gamma ~ U(0, 1)). Conv weights ~ N(0, sqrt(2 / (k^2 C_out))) at both precisions; Linear layers
keep PyTorch's default init. 9,496,522 FP parameters; 9,493,770 LP trainable (no conv bias),
9,493,806 with the official QuantMeasure scalars (Table 1: 9.49M).
"""
from __future__ import annotations

import math

from torch import nn

from ..quant.layers import make_conv, make_linear
from ..quant.norms import make_norm
from ..quant.quantizer import QuantCfg
from ..config import IMAGE_DATASETS
from .resnet_cifar import resolve_precision

CFG_A = [64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M"]


class VGG(nn.Module):
    """cfg: conv widths and "M" max-pools (default configuration A); hidden: the classifier's
    hidden width; dropout: before the classifier (0.5 in the paper). The defaults are VGG-11; the
    mini profile's stand-in is a smaller configuration of this same class (models/mini.py)."""

    def __init__(self, num_classes: int, norm: str, qcfg: QuantCfg | None, dataset: str,
                 cfg: tuple = tuple(CFG_A), hidden: int = 512, dropout: float = 0.5):
        super().__init__()
        layers, in_ch = [], 3
        for v in cfg:  # (B, 3, S, S) -> (B, 512, S/32, S/32) for configuration A
            if v == "M":
                layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
            else:
                layers += [make_conv(in_ch, v, 3, padding=1, bias=qcfg is None, qcfg=qcfg),
                           make_norm(norm, v, qcfg=qcfg)]
                in_ch = v
        self.features = nn.Sequential(*layers)
        # CIFAR: (B, 512, 1, 1) already; Imagenette: (B, 512, 7, 7) -> (B, 512, 1, 1)
        self.avgpool = nn.AvgPool2d(7) if dataset == "imagenette" else nn.Identity()
        self.classifier = nn.Sequential(
            nn.Dropout(dropout) if dropout else nn.Identity(),
            make_linear(in_ch, hidden, qcfg=qcfg),
            nn.ReLU(),
            make_linear(hidden, num_classes, qcfg=qcfg),
        )
        for m in self.modules():
            if isinstance(m, nn.Conv2d):  # QConv2d included
                n = m.kernel_size[0] * m.kernel_size[1] * m.out_channels
                nn.init.normal_(m.weight, 0.0, math.sqrt(2.0 / n))
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, x):
        x = self.avgpool(self.features(x))
        return self.classifier(x.flatten(1))  # (B, C_last) -> (B, classes)


def vgg11(*, num_classes: int = 10, precision: str = "fp32", norm: str | None = None,
          qcfg: QuantCfg | None = None, dataset: str = "cifar10") -> VGG:
    """VGG-11 for 32-px CIFAR (dataset "cifar10" or "cifar100") or 224-px Imagenette ("imagenette")."""
    if dataset not in IMAGE_DATASETS:
        raise ValueError(f"vgg11 dataset must be one of {IMAGE_DATASETS}, got {dataset!r}")
    norm, qcfg = resolve_precision(precision, norm, qcfg)
    return VGG(num_classes, norm, qcfg, dataset)
