"""The rehearsal stand-in for the paper's DistilBERT checkpoint: a local model folder in the
format `from_pretrained` reads (config.json, model.safetensors, tokenizer files), written beside
the rehearsal text sets so that the paper profile's AG News and Sentlen cells run offline.

What it is: `distilbert-base-uncased`'s architecture (transformers' `DistilBertConfig()` defaults:
6 layers, 12 heads, dim 768, hidden 3072, 512 positions, vocab 30,522) with seeded random weights,
and an uncased WordPiece tokenizer built from the packaged MiniLM's vocabulary (30,522 tokens, the
size of distilbert-base-uncased's). A step costs what the real checkpoint's step costs (same
shapes, the sequences padded to the same max_length), so `lpdl preflight` times and sizes the real
jobs with it. What it is not: pretrained. Accuracies on it mean nothing, and a run that reads it
is a rehearsal run (its data root holds the rehearsal manifest, which names this folder under
"hub"; lpdl_core.rehearsal_mark.rehearsal_model resolves it).
"""
from __future__ import annotations

import hashlib
from pathlib import Path

HUB_DIR = "hub"
SEED = 0


def folder_name(repo: str) -> str:
    return repo.replace("/", "--")


def write_distilbert(root: Path, repo: str = "distilbert-base-uncased") -> dict:
    """Write `root/hub/<repo>/`; returns its manifest entry {"path", "md5"} (md5 of the weights)."""
    import torch
    import transformers as tf

    from ..models.transformer import minilm_path

    out = Path(root) / HUB_DIR / folder_name(repo)
    out.mkdir(parents=True, exist_ok=True)
    state = torch.random.get_rng_state()
    try:
        torch.manual_seed(SEED)
        model = tf.DistilBertForMaskedLM(tf.DistilBertConfig())
    finally:
        torch.random.set_rng_state(state)
    model.save_pretrained(out)
    tok = tf.AutoTokenizer.from_pretrained(str(minilm_path()), local_files_only=True)
    tok.model_max_length = 512  # distilbert-base-uncased's (MiniLM's files say 256 or 512)
    tok.save_pretrained(out)
    h = hashlib.md5()
    with open(out / "model.safetensors", "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return {"path": f"{HUB_DIR}/{folder_name(repo)}", "md5": h.hexdigest()}
