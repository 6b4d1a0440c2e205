"""Name -> model for the paper's CNNs, input sizes, parameter counts and the `lpdl models` table.

Counts follow docs/paper-vs-code.md, 'Models and parameter counts' (measured on the official
classes); the paper's Table 1 column is the rounded value it reports (MobileNetV2 is not in the
paper).
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from ..config import CNN_MODELS as MODELS, DATASET_SPECS, MODEL_DATASETS, PRECISIONS
from ..specs import named
from ..specs.models import SPECS as MODEL_SPECS
from ..quant.quantizer import QuantCfg

PAPER_TABLE1 = {n: MODEL_SPECS[n].paper_params for n in MODELS}  # the parameter counts the paper prints


def builder(name: str) -> Callable[..., nn.Module]:
    """The CNN's builder named by its spec ("module:function" in lpdl_core.models), taking
    dataset=, num_classes=, precision=, norm=, qcfg=."""
    return named(__package__, MODEL_SPECS[name].builder)


def _dataset(name: str, dataset: str | None) -> str:
    """The dataset a model is built for: `dataset` if it is one of them, its first by default."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; valid names: {', '.join(MODELS)}")
    datasets = MODEL_DATASETS[name]
    if dataset is not None and dataset not in datasets:
        raise ValueError(f"model {name!r} is built for {', '.join(datasets)} only, got dataset {dataset!r}")
    return dataset or datasets[0]


def build_model(name: str, *, precision: str = "fp32", norm: str | None = None, num_classes: int = 10,
                dataset: str | None = None, qcfg: QuantCfg | None = None) -> nn.Module:
    """A paper CNN. precision "fp32" (plain layers, EvoNorm) or "int8" (8-bit layers, Range
    EvoNorm, qcfg defaulting to QuantCfg()); norm overrides the norm kind (see
    quant.norms.make_norm). dataset: one the model is built for (default: its first; it selects
    VGG-11's 32-px or 224-px variant)."""
    dataset = _dataset(name, dataset)
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; valid precisions: {', '.join(PRECISIONS)}")
    return builder(name)(dataset=dataset, num_classes=num_classes, precision=precision, norm=norm, qcfg=qcfg)


def input_size(name: str, dataset: str | None = None) -> int:
    """Input side in pixels: 224 on Imagenette (ResNet-18 is built for it only), else 32."""
    return DATASET_SPECS[_dataset(name, dataset)].size


def count_params(model: nn.Module, trainable_only: bool = True) -> int:
    """Number of parameter scalars (with trainable_only=False also the requires_grad=False ones,
    e.g. the official QuantMeasure running ranges)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def model_table(qcfg_official: QuantCfg = QuantCfg(measure_as_parameters=True),
                progress: Callable[[dict], None] | None = None) -> list[dict]:
    """One row per model: FP params, LP trainable params, LP params incl. the QuantMeasure
    scalars as the official code counts them (measure_as_parameters=True), Table 1 value.
    progress, if given, is called before each model is built with
    {"event": "model", "name", "index" (1-based), "total"} (DistilBERT's rows count as one)."""
    rows = []
    total = len(MODELS) + 1
    for i, name in enumerate(MODELS, 1):
        if progress is not None:
            progress({"event": "model", "name": name, "index": i, "total": total})
        ds = MODEL_DATASETS[name]
        rows.append(dict(
            name=name,
            dataset="/".join(ds),
            fp=count_params(build_model(name, precision="fp32", dataset=ds[0])),
            lp_trainable=count_params(build_model(name, precision="int8", dataset=ds[0])),
            lp_official=count_params(build_model(name, precision="int8", dataset=ds[0], qcfg=qcfg_official),
                                     trainable_only=False),
            paper=PAPER_TABLE1[name],
        ))
    if progress is not None:
        progress({"event": "model", "name": "distilbert", "index": total, "total": total})
    rows.extend(_distilbert_rows(qcfg_official))
    return rows


def _distilbert_rows(qcfg_official: QuantCfg) -> list[dict]:
    """DistilBERT-base sequence classifiers (Table 1's NLP rows), built on the meta device
    (shapes only, no weights). Skipped when transformers is not installed."""
    try:
        from transformers import DistilBertConfig, DistilBertForSequenceClassification
    except ImportError:
        return []
    from .transformer import quantize_linears

    rows = []
    for dataset, labels in (("agnews", 4), ("sentlen", 6)):
        with torch.device("meta"):
            fp = DistilBertForSequenceClassification(DistilBertConfig(num_labels=labels))
            n_fp = count_params(fp)
            lp = quantize_linears(fp, qcfg_official)
            rows.append(dict(name="distilbert", dataset=dataset, fp=n_fp, lp_trainable=count_params(lp),
                             lp_official=count_params(lp, trainable_only=False), paper="66.7M"))
    return rows


def format_model_table(rows: list[dict]) -> str:
    """Aligned text table of `model_table` rows."""
    head = ("model", "dataset", "FP params", "LP trainable", "LP incl. QuantMeasure", "paper Table 1")
    body = [(r["name"], r["dataset"], f"{r['fp']:,}", f"{r['lp_trainable']:,}", f"{r['lp_official']:,}",
             r["paper"]) for r in rows]
    widths = [max(len(line[i]) for line in (head, *body)) for i in range(len(head))]
    fmt = lambda line: "  ".join(c.ljust(w) if i < 2 else c.rjust(w)  # noqa: E731
                                 for i, (c, w) in enumerate(zip(line, widths)))
    sep = "  ".join("-" * w for w in widths)
    return "\n".join([fmt(head), sep, *map(fmt, body)])
