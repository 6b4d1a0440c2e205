"""Embedded offline stand-ins for the paper's two NLP datasets, built from English prose that
ships with CPython (the pydoc reference topics `pydoc_data.topics` and standard-library
docstrings) by `scripts/extract_standin_text.py` and committed under `resources/`, so they do
not drift with the Python version. Neither is SentEval or AG News data; reports name them as
stand-ins.

* `load_sentlen_standin` ("sentlen-standin", stand-in for SentEval Sentlen): 2,760 sentences
  in 6 word-count bins (whitespace tokens) of 460 each, bin edges chosen so the bins are as
  equal as the source allows: 3-6, 7-8, 9-10, 11-13, 14-18, 19-40 words (recorded in
  extras["bin_edges"]); 80/20 tr/te per bin. Same file format as SentEval's
  sentence_length.txt (`<tr|te>\\t<label>\\t<sentence>`).
* `load_topics_standin` ("topics-standin", stand-in for AG News): 1,680 sentences, 4 balanced
  classes of 420 = the topical family of the stdlib module whose docstrings the sentence comes
  from: networking/internet (socket, ssl, http.*, urllib.*, email.*, smtplib, imaplib, ...),
  text/data formats (json, csv, xml.*, html.*, string, re, codecs, base64, ...), math/numbers
  (math, cmath, decimal, fractions, statistics, random, numbers, operator, ...), system/files
  (os, sys, pathlib, shutil, subprocess, io, tempfile, tarfile, zipfile, ...). The module
  lists are in extras["modules"]; 80/20 tr/te per class.

Exact counts, bin edges, module lists and the Python that built the files are in
`resources/standin_text_meta.json`. Default tokenizer: "minilm" (packaged, offline).
"""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import torch

from .base import DataSplit
from .sentlen import read_senteval_tsv
from .text import pad_id_of, resolve_tokenizer, tokenize_cached, tokenizer_label

SENTLEN_FILE = "sentlen_standin.tsv"
TOPICS_FILE = "topics_standin.tsv"
META_FILE = "standin_text_meta.json"


def resource_path(name: str):
    """A Traversable for a file in lpdl_core/data/resources (works from an installed wheel)."""
    return resources.files("lpdl_core.data").joinpath("resources", name)


def load_meta() -> dict:
    return json.loads(resource_path(META_FILE).read_text(encoding="utf-8"))


def read_standin(name: str, num_classes: int) -> dict[str, tuple[list[str], list[int]]]:
    """{"tr"|"va"|"te": (sentences, labels)} of a committed stand-in TSV."""
    with resources.as_file(resource_path(name)) as path:
        return read_senteval_tsv(path, num_classes)


def _build(name: str, standin_for: str, file: str, class_names: tuple[str, ...],
           description: str, extras: dict, tokenizer, max_length: int,
           cache_dir: Path | None) -> DataSplit:
    data = read_standin(file, len(class_names))
    tok = resolve_tokenizer(tokenizer)
    xs, ys = {}, {}
    for split in ("tr", "te"):
        sents, labels = data[split]
        xs[split] = tokenize_cached(sents, tok, max_length=max_length, cache_dir=cache_dir,
                                    key=f"{name}-{split}")
        ys[split] = torch.tensor(labels, dtype=torch.long)
    tok_name = tokenizer_label(tokenizer, tok)
    return DataSplit(
        name=name, kind="text", num_classes=len(class_names),
        x_train=xs["tr"], y_train=ys["tr"], x_test=xs["te"], y_test=ys["te"],
        standin_for=standin_for, class_names=class_names, pad_id=pad_id_of(tok),
        description=f"{description}; {len(ys['tr'])} train / {len(ys['te'])} test; tokenizer "
                    f"{tok_name}, max_length {max_length}",
        extras={**extras, "tokenizer": tok_name, "max_length": max_length,
                "source": f"lpdl_core/data/resources/{file}"},
    )


def load_sentlen_standin(*, tokenizer="minilm", max_length: int = 64,
                         cache_dir: Path | None = None) -> DataSplit:
    """Sentence-length probing stand-in for SentEval Sentlen (see module doc)."""
    meta = load_meta()
    edges = tuple(tuple(e) for e in meta["sentlen"]["bin_edges"])
    class_names = tuple(f"{lo}-{hi} words" for lo, hi in edges)
    desc = (f"Sentlen-style sentence-length probing on English sentences from CPython "
            f"{meta['built_with_python']}'s own documentation (pydoc_data.topics + stdlib "
            f"docstrings), not SentEval data: 6 word-count bins "
            f"{', '.join(f'{lo}-{hi}' for lo, hi in edges)} (whitespace tokens), "
            f"{meta['sentlen']['per_bin']} sentences each, balanced")
    return _build("sentlen-standin", "sentlen", SENTLEN_FILE, class_names, desc,
                  {"bin_edges": edges, "built_with_python": meta["built_with_python"]},
                  tokenizer, max_length, cache_dir)


def load_topics_standin(*, tokenizer="minilm", max_length: int = 64,
                        cache_dir: Path | None = None) -> DataSplit:
    """4-class topic classification stand-in for AG News (see module doc)."""
    meta = load_meta()
    class_names = tuple(meta["topics"]["class_names"])
    desc = (f"4-class topic classification of English sentences from CPython "
            f"{meta['built_with_python']} standard-library docstrings, not AG News data: the "
            f"label is the topical family of the module the sentence documents "
            f"({', '.join(class_names)}), {meta['topics']['per_class']} sentences each, balanced")
    return _build("topics-standin", "agnews", TOPICS_FILE, class_names, desc,
                  {"modules": meta["topics"]["modules"],
                   "built_with_python": meta["built_with_python"]},
                  tokenizer, max_length, cache_dir)
