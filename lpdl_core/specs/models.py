"""The paper's models as the planner, the bill and the report see them (torch-free): each one's
display name, whether it is a CNN or a text model, the paper datasets it is built for, its mini
stand-in, the host memory a paper job of it asks SLURM for, its relative step cost and its size in
the paper's Table 1.

The CNNs are built by the functions their specs name (lpdl_core.models.registry), DistilBERT by
lpdl_core.models.transformer, the stand-ins by lpdl_core.models.mini (a test builds each).
"""
from __future__ import annotations

from dataclasses import dataclass

_CIFAR = ("cifar10", "cifar100")


@dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """standin: (its name, what it is) of a CNN, recorded by every mini run (the text model's is the
    tiny DistilBERT that lpdl_core.pipeline.recipe.mini describes). mem_mb: a paper job's host memory
    (the dataset in memory plus the model's state; not measured on a cluster: `lpdl preflight`
    measures it, and a measured peak raises the request). step_cost: one node's step relative to
    ResNet-20's (the mini stand-ins' measured step times; only the order of jobs depends on it).
    paper_params: its parameter count as the paper's Table 1 prints it. builder: a CNN's builder,
    "module:function" in lpdl_core.models (called with dataset=, num_classes=, precision=, norm=,
    qcfg=); its stand-in "mini-x" is built by lpdl_core.models.mini's `mini_x`."""

    name: str
    display: str
    kind: str                       # "cnn" | "text"
    datasets: tuple[str, ...]
    mem_mb: int
    standin: tuple[str, str] | None = None
    step_cost: float = 1.0
    paper_params: str = "—"
    builder: str | None = None


SPECS: dict[str, ModelSpec] = {s.name: s for s in (
    ModelSpec(name="resnet20", display="ResNet-20", kind="cnn", datasets=_CIFAR, mem_mb=24000, paper_params="0.27M",
              builder="resnet_cifar:resnet20",
              standin=("mini-resnet20", "CIFAR ResNet depth 8 (1 block per stage), widths 16/32/64")),
    ModelSpec(name="resnet54", display="ResNet-54", kind="cnn", datasets=_CIFAR, mem_mb=24000, step_cost=1.8,
              paper_params="0.76M", builder="resnet_cifar:resnet54",
              standin=("mini-resnet54", "CIFAR ResNet depth 14 (2 blocks per stage), widths 16/32/64")),
    ModelSpec(name="vgg11", display="VGG-11", kind="cnn", datasets=(*_CIFAR, "imagenette"), mem_mb=64000,
              step_cost=0.9, paper_params="9.49M", builder="vgg:vgg11",
              standin=("mini-vgg11", "VGG [32, 32, M, 64, 64, M, 128, M] + 128-unit MLP head, dropout 0.5 before it")),
    ModelSpec(name="resnet18", display="ResNet-18", kind="cnn", datasets=("imagenette",), mem_mb=64000,
              step_cost=2.0, paper_params="11.2M", builder="resnet_imagenet:resnet18",
              standin=("mini-resnet18", "ImageNet-style ResNet, 4 stages 16/32/64/128 at 8/8/4/2 px, 1 block each, "
                                        "3x3 stem")),
    ModelSpec(name="mobilenetv2", display="MobileNetV2", kind="cnn", datasets=_CIFAR, mem_mb=24000,
              builder="mobilenetv2:mobilenetv2",
              standin=("mini-mobilenetv2", "MobileNetV2, 3 inverted-residual stages 16/32/64 (t = 1/4/4), head 128")),
    ModelSpec(name="distilbert", display="DistilBERT", kind="text", datasets=("agnews", "sentlen"), mem_mb=64000,
              step_cost=0.6),
)}
CNN_MODELS = tuple(n for n, s in SPECS.items() if s.kind == "cnn")
TEXT_MODELS = tuple(n for n, s in SPECS.items() if s.kind == "text")
# paper model -> (its mini stand-in, what it is) for the CNNs: built by lpdl_core.models.mini, each
# by its paper model's own class; the mini protocol (lpdl_core.pipeline.recipe.mini) records the description
MINI_STANDINS = {n: s.standin for n, s in SPECS.items() if s.standin}
MINI_IMAGE_SIZE = 8  # the side in pixels of the stand-ins' input: the digits stand-in at its native size
