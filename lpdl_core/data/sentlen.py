"""SentEval Sentlen (Conneau & Kiela 2018; Conneau et al. 2018 probing tasks), the paper's
6-class NLP task (Sec. 4.2, Table 5, Fig. 7): predict a sentence's length bin.

File: SentEval's `data/probing/sentence_length.txt` (from the SentEval repository,
github.com/facebookresearch/SentEval, `data/probing/`), looked up as
`<root>/senteval/probing/sentence_length.txt`, else `<root>/sentence_length.txt`. Each line is
`<split>\\t<label>\\t<sentence>` with split tr (100,000) / va (10,000) / te (10,000); the
sentence is pre-tokenized (space-separated, punctuation split off). SentEval itself reads the
label from field 2 and the sentence from the last field; so does this loader.

Labels: the file's labels are the integers 0-5. The bins are by sentence length in words
(tokens): 5-8, 9-12, 13-16, 17-20, 21-25, 26-28 (the paper, Sec. 4.2; Conneau et al. 2018).
Label k is taken to be the k-th bin in increasing length -- the natural order, not checked
here against the real file (a loaded file records the observed token-count range of each
label in extras["observed_lengths"] so this can be verified).
"""
from __future__ import annotations

from pathlib import Path

import torch

from .base import DataSplit, DatasetMissing, data_root
from .text import pad_id_of, resolve_tokenizer, tokenize_cached, tokenizer_label

BIN_EDGES = ((5, 8), (9, 12), (13, 16), (17, 20), (21, 25), (26, 28))
CLASS_NAMES = tuple(f"{lo}-{hi} words" for lo, hi in BIN_EDGES)
SIZES = {"tr": 100_000, "va": 10_000, "te": 10_000}
SPLITS = ("tr", "va", "te")


def read_senteval_tsv(path, num_classes: int) -> dict[str, tuple[list[str], list[int]]]:
    """{"tr"|"va"|"te": (sentences, integer labels)} of a SentEval probing-format file."""
    out: dict[str, tuple[list[str], list[int]]] = {s: ([], []) for s in SPLITS}
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                continue
            fields = line.split("\t")
            if len(fields) < 3 or fields[0] not in out:
                raise ValueError(f"{path}:{lineno}: expected '<tr|va|te>\\t<label>\\t<sentence>', "
                                 f"got {line[:80]!r}")
            try:
                label = int(fields[1])
            except ValueError:
                raise ValueError(f"{path}:{lineno}: label {fields[1]!r} is not an integer") from None
            if not 0 <= label < num_classes:
                raise ValueError(f"{path}:{lineno}: label {label} not in 0..{num_classes - 1}")
            out[fields[0]][0].append(fields[-1].strip())
            out[fields[0]][1].append(label)
    return out


def candidates(root=None) -> list[Path]:
    base = data_root(root)
    return [base / "senteval" / "probing" / "sentence_length.txt", base / "sentence_length.txt"]


def observed_lengths(sentences: list[str], labels: list[int], num_classes: int) -> list:
    """[(min, max) whitespace-token count] per label ([] for an absent label)."""
    spans: list = [[] for _ in range(num_classes)]
    for s, y in zip(sentences, labels):
        n = len(s.split())
        spans[y] = [min(spans[y][0], n), max(spans[y][1], n)] if spans[y] else [n, n]
    return [tuple(s) for s in spans]


def load_sentlen(root=None, *, tokenizer="distilbert-base-uncased", max_length: int = 64,
                 cache_dir: Path | None = None, cache: bool = True) -> DataSplit:
    """Sentlen as int64 token ids: tr -> train, te -> test, va -> extras["val"] = (x, y)."""
    paths = candidates(root)
    path = next((p for p in paths if p.is_file()), None)
    if path is None:
        raise DatasetMissing(
            f"SentEval Sentlen not found: looked for {paths[0]} and {paths[1]}. Get "
            f"sentence_length.txt from SentEval's data/probing folder "
            f"(https://github.com/facebookresearch/SentEval/tree/main/data/probing; "
            f"tab-separated lines '<tr|va|te>\\t<label 0-5>\\t<sentence>', 100k/10k/10k) and put "
            f"it at {paths[0]}, or set data_root / $LPDL_DATA to the folder holding senteval/.")
    data = read_senteval_tsv(path, len(BIN_EDGES))
    if not data["tr"][0] or not data["te"][0]:
        raise ValueError(f"{path}: needs both tr and te lines")
    tok = resolve_tokenizer(tokenizer)
    cdir = (Path(cache_dir) if cache_dir is not None
            else data_root(root) / "cache" / "tokens") if cache else None
    xs, ys = {}, {}
    for split in SPLITS:
        sents, labels = data[split]
        xs[split] = tokenize_cached(sents, tok, max_length=max_length, cache_dir=cdir,
                                    key=f"sentlen-{split}") if sents else \
            torch.empty((0, max_length), dtype=torch.long)
        ys[split] = torch.tensor(labels, dtype=torch.long)
    counts = {s: len(ys[s]) for s in SPLITS}
    return DataSplit(
        name="sentlen", kind="text", num_classes=len(BIN_EDGES),
        x_train=xs["tr"], y_train=ys["tr"], x_test=xs["te"], y_test=ys["te"],
        description=(f"SentEval Sentlen probing task: 6 sentence-length bins "
                     f"({', '.join(CLASS_NAMES)}); {counts['tr']} train / {counts['va']} val / "
                     f"{counts['te']} test (published 100k/10k/10k); tokenizer "
                     f"{tokenizer_label(tokenizer, tok)}, max_length {max_length}"),
        class_names=CLASS_NAMES, pad_id=pad_id_of(tok),
        extras={"val": (xs["va"], ys["va"]), "bin_edges": BIN_EDGES, "source": str(path),
                "observed_lengths": observed_lengths(*data["tr"], len(BIN_EDGES)),
                "tokenizer": tokenizer_label(tokenizer, tok), "max_length": max_length,
                "full_size": counts == SIZES},
    )
