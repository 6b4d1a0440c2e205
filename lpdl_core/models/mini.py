"""The mini profile's stand-ins: one small model per paper model, each of its paper model's family,
sized for the 8x8 digits stand-in so the whole grid trains on a laptop.

| paper model  | stand-in          | what is kept                                                    |
|--------------|-------------------|-----------------------------------------------------------------|
| ResNet-20    | `mini-resnet20`   | CIFAR ResNet, 3 stages 16/32/64, 1 BasicBlock per stage (depth 8) |
| ResNet-54    | `mini-resnet54`   | the same, 2 BasicBlocks per stage (depth 14): deeper than above |
| VGG-11       | `mini-vgg11`      | VGG: 3x3 conv + norm pairs [32, 32, M, 64, 64, M, 128, M], MLP head |
| ResNet-18    | `mini-resnet18`   | ImageNet ResNet: 4 stages 16/32/64/128 (8/8/4/2 px), 1 block each, 3x3 stem |
| MobileNetV2  | `mini-mobilenetv2`| inverted residuals (t = 1/4/4), stages 16/32/64, 1x1 head to 128 |

Each stand-in is built by its paper model's own class (same blocks, norms, 8-bit layers and
initialisation), only with fewer or narrower stages: precision, norm kind and the quantizer
settings pass through unchanged. Names and descriptions: lpdl_core.specs.models (MINI_STANDINS) (torch-free),
whose description of a stand-in is part of its runs' identity; the builder of stand-in "mini-x" is
this module's `mini_x`. VGG's classifier keeps the paper's
dropout 0.5: without it the classifier's hidden ReLUs of the single-node 8-bit stand-in died at
the warm-up peak in more seeds (docs/mini-profile.md, "The learning rate, and the one fragile cell").
"""
from __future__ import annotations

from typing import Callable

from torch import nn

from ..config import MINI_STANDINS
from ..quant.quantizer import QuantCfg
from .mobilenetv2 import MobileNetV2
from .resnet_cifar import ResNetCifar, resolve_precision
from .resnet_imagenet import ResNetImagenet
from .vgg import VGG


def mini_resnet20(num_classes, norm, qcfg):
    return ResNetCifar(8, num_classes, norm, qcfg, width=16)


def mini_resnet54(num_classes, norm, qcfg):
    return ResNetCifar(14, num_classes, norm, qcfg, width=16)


def mini_vgg11(num_classes, norm, qcfg):
    return VGG(num_classes, norm, qcfg, "cifar10", cfg=(32, 32, "M", 64, 64, "M", 128, "M"), hidden=128,
               dropout=0.5)


def mini_resnet18(num_classes, norm, qcfg):
    return ResNetImagenet((1, 1, 1, 1), num_classes, norm, qcfg, widths=(16, 32, 64, 128), stem="small",
                          strides=(1, 1, 2, 2))


def mini_mobilenetv2(num_classes, norm, qcfg):
    cfg = ((1, 16, 1, 1), (4, 32, 1, 2), (4, 64, 1, 2))
    return MobileNetV2(num_classes, norm, qcfg, cfg=cfg, stem=16, head=128)


def build_standin(model: str, *, precision: str = "fp32", norm: str | None = None, num_classes: int = 10,
                  qcfg: QuantCfg | None = None) -> nn.Module:
    """The mini stand-in of a paper model at the given precision and norm kind (as build_model)."""
    if model not in MINI_STANDINS:
        raise ValueError(f"no mini stand-in for model {model!r}; models with one: {', '.join(MINI_STANDINS)}")
    norm, qcfg = resolve_precision(precision, norm, qcfg)
    return standin_builder(model)(num_classes, norm, qcfg)


def standin_builder(model: str) -> Callable:
    """The builder of a paper model's stand-in: this module's function named as the stand-in
    (lpdl_core.specs.models, e.g. "mini-resnet20" -> mini_resnet20(num_classes, norm, qcfg))."""
    return globals()[MINI_STANDINS[model][0].replace("-", "_")]


# --------------------------------------------------------------------------------------------
# DistilBERT's stand-in: a tiny DistilBERT that starts from pretrained word embeddings.

def pretrained_word_embeddings(dim: int):
    """(30522, dim) float32: MiniLM's pretrained WordPiece embeddings (the uncased vocabulary of
    distilbert-base-uncased) projected on their top `dim` principal components and scaled to unit
    variance. Deterministic (eigendecomposition of the 384x384 covariance, each component's sign
    fixed by its largest entry); cached under the data root, keyed by the weights' sha256."""
    import torch

    from ..data.base import data_root
    from ..data.cache import file_sha256, load_cache, save_cache
    from .transformer import minilm_path

    weights = minilm_path() / "model.safetensors"
    cache = data_root() / "lpdl-cache" / f"minilm-words-pca{dim}.npz"
    source = f"{weights.name} sha256 {file_sha256(weights)} | pca {dim}"
    z = load_cache(cache, source)
    if z is not None and "words" in z:
        return torch.from_numpy(z["words"])
    from safetensors.torch import load_file

    w = next(v for k, v in load_file(str(weights)).items() if k.endswith("word_embeddings.weight"))
    w = w.double() - w.double().mean(0)
    _, vecs = torch.linalg.eigh(w.T @ w)                 # ascending eigenvalues
    top = vecs[:, -dim:].flip(1)                           # (384, dim), largest first
    top = top * torch.sign(top.gather(0, top.abs().argmax(0, keepdim=True)))
    p = w @ top
    p = (p / p.std()).float().contiguous()
    save_cache(cache, source, {"words": p.numpy()})
    return p


def mini_distilbert(num_labels: int, *, precision: str = "fp32", qcfg: QuantCfg | None = None,
                    dim: int = 64, n_layers: int = 1, n_heads: int = 2, hidden_dim: int = 128,
                    max_length: int = 32) -> nn.Module:
    """DistilBERT's mini stand-in: a DistilBERT of the given size (random init) whose word
    embeddings are `pretrained_word_embeddings(dim)`, frozen (so not gossiped: a node's message
    is the encoder and head). Returns a SequenceClassifier (input ids -> logits)."""
    import torch

    from .transformer import SequenceClassifier, distilbert_classifier, tiny_distilbert_config

    conf = tiny_distilbert_config(vocab_size=30522, num_labels=num_labels, dim=dim, n_layers=n_layers,
                                  n_heads=n_heads, hidden_dim=hidden_dim, max_position_embeddings=max_length)
    model = distilbert_classifier(num_labels, precision=precision, qcfg=qcfg, pretrained=None,
                                  config_overrides=conf)
    words = model.distilbert.embeddings.word_embeddings
    with torch.no_grad():
        words.weight.copy_(pretrained_word_embeddings(dim))
    words.weight.requires_grad_(False)
    return SequenceClassifier(model)
