"""Derived-data caches that verify themselves.

A cache stores, beside its arrays, what it was built from (`source`: a digest of the inputs and
the build settings) and a sha256 of its own content. `load_cache` returns the arrays only when
the file is readable, was built from the same source, and its content still hashes to the stored
digest; otherwise it logs one line saying why and returns None, and the caller rebuilds (and
`save_cache` replaces the file atomically). An edited, truncated or foreign cache is therefore
never used, and never stops a run.
"""
from __future__ import annotations

import hashlib
import logging
import os
from pathlib import Path
from typing import Mapping

import numpy as np

from ..atomic import replacing

log = logging.getLogger("lpdl.data")
FORMAT = 2


def digest_arrays(arrays: Mapping[str, np.ndarray]) -> str:
    """sha256 over each array's name, dtype, shape and bytes (in name order)."""
    h = hashlib.sha256()
    for name in sorted(arrays):
        a = np.ascontiguousarray(arrays[name])
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_cache(path: str | os.PathLike, source: str) -> dict[str, np.ndarray] | None:
    """The cached arrays if `path` is a sound cache built from `source`, else None (logged)."""
    path = Path(path)
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in z.files}
        meta = {k: str(arrays.pop(k)) for k in ("_format", "_source", "_content") if k in arrays}
    except Exception as e:  # noqa: BLE001  (zip, OS, value, EOF errors alike: unreadable)
        log.warning("cache %s is unreadable (%s); rebuilding it", path, type(e).__name__)
        return None
    if meta.get("_format") != str(FORMAT) or meta.get("_source") != source:
        log.warning("cache %s was built from other data or settings; rebuilding it", path)
        return None
    if meta.get("_content") != digest_arrays(arrays):
        log.warning("cache %s does not match its own checksum (edited or damaged); rebuilding it", path)
        return None
    return arrays


def save_cache(path: str | os.PathLike, source: str, arrays: Mapping[str, np.ndarray]) -> None:
    """Write atomically (a concurrent reader sees the old file or the new one); a folder that
    cannot be written only costs a rebuild next time (logged)."""
    path = Path(path)
    payload = {**arrays, "_format": np.array(str(FORMAT)), "_source": np.array(source),
               "_content": np.array(digest_arrays(arrays))}
    try:
        with replacing(path) as f:  # lpdl's one atomic writer
            np.savez(f, **payload)
    except OSError as e:  # WriteFailed names the path
        log.warning("could not write cache (%s)", e)
