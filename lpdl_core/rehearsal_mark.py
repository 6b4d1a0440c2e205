"""How a data root says it holds rehearsal data (`lpdl rehearsal-data`), readable without torch:
the loaders label what they read from it, and a run's identity says which data it trained on, so a
run on rehearsal data is never taken for a run on the real data (lpdl_core.data.rehearsal writes
the sets; this module only reads their manifest).

A data root is the config's `data_root`, else $LPDL_DATA, else ./data (as the loaders resolve it).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

MANIFEST = "lpdl-rehearsal.json"
FORMAT = 1
REHEARSAL = "rehearsal"   # the identity's "data" value of a run on rehearsal data (real data: no key)


def resolve_root(root: str | os.PathLike | None) -> Path:
    """The data root the loaders read: root, else $LPDL_DATA, else ./data."""
    if root is not None and str(root) != "":
        return Path(root).expanduser()
    env = os.environ.get("LPDL_DATA")
    return Path(env).expanduser() if env else Path("data")


def rehearsal_manifest(root: str | os.PathLike | None) -> dict | None:
    """The manifest of a rehearsal data root, or None for a real one (or an unreadable manifest,
    which the writer never leaves: it replaces the file atomically)."""
    path = resolve_root(root) / MANIFEST
    if not path.is_file():
        return None
    try:
        m = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    ok = isinstance(m, dict) and m.get("format") == FORMAT and isinstance(m.get("datasets"), dict)
    return m if ok else None


def data_kind(dataset: str, root: str | os.PathLike | None) -> str | None:
    """REHEARSAL when the data root holds rehearsal data of this dataset (complete or being
    written), None when a run on it reads real data."""
    m = rehearsal_manifest(root)
    return REHEARSAL if m is not None and dataset in m["datasets"] else None


def rehearsal_model(repo: str, root: str | os.PathLike | None) -> str | None:
    """The local folder of a rehearsal root's stand-in for the hub model `repo` (random weights in
    the checkpoint's format, lpdl_core.data.rehearsal_hub), or None when the root has none."""
    m = rehearsal_manifest(root)
    entry = (m or {}).get("hub", {}).get(repo) if m else None
    if not isinstance(entry, dict) or not isinstance(entry.get("path"), str):
        return None
    path = resolve_root(root) / entry["path"]
    return str(path.resolve()) if (path / "config.json").is_file() else None
