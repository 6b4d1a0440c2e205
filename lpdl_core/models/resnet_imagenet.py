"""ResNet-18 for Imagenette (224 px), as the paper's official code builds it.

Follows `quantized_training/resnet.py::ResNet_imagenet` (FP) and
`resnet_quantized.py::ResNet_imagenetq` (LP) with BasicBlock layers [2, 2, 2, 2]
(docs/paper-vs-code.md, 'Models and parameter counts'): 7x7/2 stem conv + norm, 3x3/2 max-pool,
stages 64/128/256/512 with 1x1 conv + norm projections where the shape changes, avg-pool 7,
FC 512 -> classes. The EvoNorm kinds carry the nonlinearity (no ReLU anywhere); with the ReLU
kinds (BN, GN, Range BN) the blocks put it where the CIFAR ResNet's `BasicBlock` does. The FP/LP
init rules are those of the CIFAR ResNet (`init_resnet`). 11,186,442 FP parameters; 11,186,556 LP with the
official QuantMeasure scalars (Table 1: 11.2M).
"""
from __future__ import annotations

from torch import nn

from ..quant.layers import make_conv, make_linear
from ..quant.norms import make_norm
from ..quant.quantizer import QuantCfg
from .resnet_cifar import init_resnet, make_stage, resolve_precision


class ResNetImagenet(nn.Module):
    """widths: the four stages' channels (ResNet-18: 64/128/256/512). stem "imagenet": 7x7/2
    conv + 3x3/2 max-pool (224 px); "small": one 3x3/1 conv, no pool (the mini profile's 8-px
    stand-in, models/mini.py). strides: the first block's stride in each stage. The pool after the
    last stage is global (AvgPool2d(7) at 224 px)."""

    def __init__(self, layers: tuple[int, ...], num_classes: int, norm: str, qcfg: QuantCfg | None,
                 widths: tuple[int, int, int, int] = (64, 128, 256, 512), stem: str = "imagenet",
                 strides: tuple[int, int, int, int] = (1, 2, 2, 2)):
        super().__init__()
        w1, w2, w3, w4 = widths
        # (B, 3, 224, 224) -> (B, 64, 112, 112) -> max-pool (B, 64, 56, 56)
        if stem == "imagenet":
            self.conv1 = make_conv(3, w1, 7, stride=2, padding=3, qcfg=qcfg)
            self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        elif stem == "small":
            self.conv1 = make_conv(3, w1, 3, stride=1, padding=1, qcfg=qcfg)
            self.maxpool = nn.Identity()
        else:
            raise ValueError(f"stem must be 'imagenet' or 'small', got {stem!r}")
        self.bn1 = make_norm(norm, w1, qcfg=qcfg)
        self.layer1 = make_stage(w1, w1, layers[0], strides[0], norm, qcfg)     # (B, 64, 56, 56)
        self.layer2 = make_stage(w1, w2, layers[1], strides[1], norm, qcfg)     # (B, 128, 28, 28)
        self.layer3 = make_stage(w2, w3, layers[2], strides[2], norm, qcfg)     # (B, 256, 14, 14)
        self.layer4 = make_stage(w3, w4, layers[3], strides[3], norm, qcfg)     # (B, 512, 7, 7)
        self.avgpool = nn.AdaptiveAvgPool2d(1)                         # (B, 512, 1, 1)
        self.fc = make_linear(w4, num_classes, qcfg=qcfg)              # (B, classes)
        init_resnet(self, lp=qcfg is not None)

    def forward(self, x):
        x = self.maxpool(self.bn1(self.conv1(x)))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(self.avgpool(x).flatten(1))


def resnet18(*, num_classes: int = 10, precision: str = "fp32", norm: str | None = None,
             qcfg: QuantCfg | None = None, dataset: str | None = None) -> ResNetImagenet:
    """ResNet-18 (BasicBlock [2, 2, 2, 2]) for 224-px Imagenette (its one dataset)."""
    norm, qcfg = resolve_precision(precision, norm, qcfg)
    return ResNetImagenet((2, 2, 2, 2), num_classes, norm, qcfg)
