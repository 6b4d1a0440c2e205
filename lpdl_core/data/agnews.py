"""AG News (Zhang, Zhao, LeCun 2015), the paper's 4-class NLP task (Sec. 4.2, Table 5, Fig. 6).

Source, in order:
1. the standard CSVs `<root>/ag_news_csv/train.csv` (120,000 rows) and `test.csv` (7,600 rows)
   from the well-known `ag_news_csv.tgz` (Xiang Zhang's char-CNN data release; also mirrored
   e.g. by torchtext / fast.ai): no header, columns `"class index","title","description"`,
   class index 1-4 = World, Sports, Business, Sci/Tech, fields double-quoted with "" escapes;
2. else the Hugging Face `ag_news` dataset, only if the `datasets` package is importable *and*
   the dataset is already in its cache (no download is attempted; `datasets` is not a
   dependency of lpdl);
3. else DatasetMissing saying where to put the CSVs.

Text = title + " " + description (as the paper: "titles and description fields"), with the
backslashes the release uses for escaped newlines (e.g. `dwindling\\band`) replaced by spaces
and whitespace collapsed. HTML-entity remnants of the release ("#39;", "quot;") are kept as
they are, as in the Hugging Face copy. Labels 0-3 (class index - 1).
"""
from __future__ import annotations

import contextlib
import csv
import os
import re
from pathlib import Path

import torch

from .base import DataSplit, DatasetMissing, data_root
from .text import pad_id_of, resolve_tokenizer, tokenize_cached, tokenizer_label

CLASS_NAMES = ("World", "Sports", "Business", "Sci/Tech")
SIZES = {"train": 120_000, "test": 7_600}
SUBDIR = "ag_news_csv"
HF_NAMES = ("fancyzhx/ag_news", "ag_news")
_BACKSLASHES = re.compile(r"\\+")


def clean_text(title: str, description: str) -> str:
    """title + " " + description, newline-escape backslashes -> spaces, whitespace collapsed."""
    return " ".join(_BACKSLASHES.sub(" ", f"{title} {description}").split())


def read_csv(path: Path) -> tuple[list[str], list[int]]:
    """(texts, labels 0-3) of one AG News CSV."""
    texts, labels = [], []
    with open(path, newline="", encoding="utf-8") as f:
        for lineno, row in enumerate(csv.reader(f), 1):
            if not row:
                continue
            if len(row) < 3:
                raise ValueError(f"{path}:{lineno}: expected 3 columns (class index, title, "
                                 f"description), got {len(row)}")
            try:
                label = int(row[0]) - 1
            except ValueError:
                raise ValueError(f"{path}:{lineno}: class index {row[0]!r} is not 1-4 "
                                 f"(a header line? the release has none)") from None
            if not 0 <= label < 4:
                raise ValueError(f"{path}:{lineno}: class index {row[0]!r} is not 1-4")
            texts.append(clean_text(row[1], " ".join(row[2:])))
            labels.append(label)
    return texts, labels


def _from_hf_cache():
    """{"train": (texts, labels), "test": ...} from a cached HF `ag_news`, or None."""
    try:
        import datasets
    except ImportError:
        return None
    cfg = getattr(datasets, "config", None)
    saved = {k: getattr(cfg, k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")
             if cfg is not None and hasattr(cfg, k)}
    env_saved = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")}
    try:
        for k in saved:
            setattr(cfg, k, True)
        os.environ.update({k: "1" for k in env_saved})
        for name in HF_NAMES:
            with contextlib.suppress(Exception):
                ds = datasets.load_dataset(name)
                return {split: ([" ".join(_BACKSLASHES.sub(" ", t).split()) for t in ds[split]["text"]],
                                [int(y) for y in ds[split]["label"]])
                        for split in ("train", "test")}
        return None
    finally:
        for k, v in saved.items():
            setattr(cfg, k, v)
        for k, v in env_saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def load_agnews(root=None, *, tokenizer="distilbert-base-uncased", max_length: int = 128,
                cache_dir: Path | None = None, cache: bool = True) -> DataSplit:
    """AG News as int64 token ids (N, max_length), labels 0-3.

    tokenizer: a name for `text.get_tokenizer` ("distilbert-base-uncased" needs the HF cache;
    "minilm" works offline) or a tokenizer object. Token ids are cached under
    `cache_dir` (default `<root>/cache/tokens`) unless cache=False.
    """
    base = data_root(root)
    folder = base / SUBDIR
    files = {split: folder / f"{split}.csv" for split in ("train", "test")}
    if all(p.is_file() for p in files.values()):
        data = {split: read_csv(p) for split, p in files.items()}
        source = str(folder)
    else:
        data = _from_hf_cache()
        source = "huggingface datasets cache (ag_news)"
        if data is None:
            missing = ", ".join(str(p) for p in files.values() if not p.is_file())
            raise DatasetMissing(
                f"AG News not found: missing {missing}. Put train.csv (120,000 rows) and "
                f"test.csv (7,600 rows) from the standard ag_news_csv.tgz archive (Zhang et al. "
                f"2015 char-CNN release; columns class index 1-4, title, description; no header) "
                f"in {folder}/ (e.g. `tar xzf ag_news_csv.tgz -C {base}`), or set data_root / "
                f"$LPDL_DATA to the folder that holds ag_news_csv/. A cached Hugging Face "
                f"`ag_news` dataset is used instead when the `datasets` package is installed.")
    tok = resolve_tokenizer(tokenizer)
    cdir = (Path(cache_dir) if cache_dir is not None else base / "cache" / "tokens") if cache else None
    xs, ys = {}, {}
    for split, (texts, labels) in data.items():
        xs[split] = tokenize_cached(texts, tok, max_length=max_length, cache_dir=cdir,
                                    key=f"agnews-{split}")
        ys[split] = torch.tensor(labels, dtype=torch.long)
    n_tr, n_te = len(ys["train"]), len(ys["test"])
    return DataSplit(
        name="agnews", kind="text", num_classes=4,
        x_train=xs["train"], y_train=ys["train"], x_test=xs["test"], y_test=ys["test"],
        description=(f"AG News (Zhang et al. 2015): news title + description, 4 classes; "
                     f"{n_tr} train / {n_te} test (published: 120,000 / 7,600); tokenizer "
                     f"{tokenizer_label(tokenizer, tok)}, max_length {max_length}"),
        class_names=CLASS_NAMES, pad_id=pad_id_of(tok),
        extras={"source": source, "tokenizer": tokenizer_label(tokenizer, tok),
                "max_length": max_length,
                "full_size": n_tr == SIZES["train"] and n_te == SIZES["test"]},
    )
