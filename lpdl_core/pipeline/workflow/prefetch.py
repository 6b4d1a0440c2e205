"""Fetch and verify, once and before any training job, everything the cells' runs will load: the
paper datasets under the data root and the pretrained hub models (DistilBERT's weights and
tokenizer) in the Hugging Face cache. `lpdl prefetch` and the workflow's `download` rule run it.

Why: compute nodes often have no internet, and a grid of jobs starting at once must not each try
to download (or half-download) the same archive. The download rule runs this once where Snakemake
runs; every train job then runs offline (`lpdl train --offline`, HF_HUB_OFFLINE=1) and a missing
file is a one-line DatasetMissing, never a download attempt.

What is needed comes from `plan_cell`, the very plan the training run loads from (its dataset,
its loader's keyword arguments, its `hub_models`), so it cannot drift from what training loads.
Each item goes through its loader's own fetch-and-verify path, so the same checks apply:

* cifar10 / cifar100: `load_cifar(download=True)`: archive md5, safe extraction, md5 of every
  file, read back;
* imagenette: `ensure_extracted(download=True)`: archive md5, safe extraction, the 10 class
  folders listed. Decoding the JPEGs (minutes of CPU) is left to the jobs;
* agnews / sentlen (no download source): the loader itself, offline: files present and parsed,
  tokenized with the prefetched tokenizer (which fills the token cache under the data root);
* hub repositories: a snapshot of the files from_pretrained reads (HUB_FILES) into the HF cache,
  then the tokenizer and the model of the first cell that needs it loaded with hub access off;
* embedded stand-ins (the mini profile): nothing; the manifest lists them as embedded.

A second run only verifies: whatever is on disk is checked, nothing is downloaded again.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from ...config import STANDIN_DATASETS, Fidelity

log = logging.getLogger("lpdl.prefetch")

MANIFEST_FORMAT = 1
# How the train jobs run: hub access off for huggingface_hub, transformers and datasets alike.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
# What from_pretrained reads of a hub model and its tokenizer (not the TF / Flax / ONNX copies).
HUB_FILES = ("*.json", "*.txt", "*.model", "*.safetensors")


@dataclass(frozen=True, kw_only=True)
class Need:
    """One thing the runs load: a dataset (with its plan's loader arguments) or a hub repository.
    probe: for a hub repository, builds the model of the first cell that loads it (a verification
    that goes through the training run's own code)."""

    kind: str  # "hub" | "dataset" | "embedded" (a stand-in shipped with lpdl: nothing to fetch)
    name: str
    cells: tuple[str, ...]
    kwargs: tuple[tuple[str, Any], ...] = ()
    probe: Callable[[], Any] | None = field(default=None, compare=False, repr=False)


def needs(cells: Iterable, profile: str, *, fidelities: Iterable[Fidelity] = (Fidelity(),),
          data_root: str | None = None) -> tuple[Need, ...]:
    """Every dataset and hub repository the cells' runs load in `profile`, in any of the fidelity
    modes, by plan_cell: hub repositories first (the text datasets' tokenizer is one)."""
    from ..recipe.plan import plan_cell

    cells = list(cells)
    datasets: dict[tuple, list] = {}
    hubs: dict[str, list] = {}
    for fid in fidelities:
        for cell in cells:
            plan = plan_cell(cell, profile, fidelity=fid, data_root=data_root)
            key = (plan.dataset, tuple(sorted(plan.dataset_kwargs.items())))
            datasets.setdefault(key, [plan, []])[1].append(cell.cell_id)
            for repo in plan.hub_models:
                hubs.setdefault(repo, [plan, []])[1].append(cell.cell_id)
    out = [Need(kind="hub", name=repo, cells=tuple(dict.fromkeys(ids)), probe=plan.make_model)
           for repo, (plan, ids) in sorted(hubs.items())]
    out += [Need(kind="embedded" if name in STANDIN_DATASETS else "dataset", name=name,
                 cells=tuple(dict.fromkeys(ids)), kwargs=kw)
            for (name, kw), (_, ids) in sorted(datasets.items(), key=lambda kv: kv[0][0])]
    return tuple(out)


@contextlib.contextmanager
def hub_offline() -> Iterator[None]:
    """Hub access off for the duration (as in a train job); the loaders read these at call time."""
    saved = {k: os.environ.get(k) for k in OFFLINE_ENV}
    os.environ.update(OFFLINE_ENV)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


# ---------------------------------------------------------------- the hub

def cached_snapshot(repo: str) -> Path | None:
    """The repository's snapshot folder in the HF cache, or None (no network)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo, allow_patterns=list(HUB_FILES), local_files_only=True))
    except Exception:  # noqa: BLE001  (not cached, partial, unreadable: fetch it)
        return None


def download_snapshot(repo: str) -> Path:
    """The network edge: HUB_FILES of `repo` from the hub into the HF cache; its snapshot folder."""
    from huggingface_hub import snapshot_download

    from ...models.transformer import PretrainedUnavailableError

    try:
        return Path(snapshot_download(repo, allow_patterns=list(HUB_FILES)))
    except Exception as e:  # noqa: BLE001  (connection, HTTP, offline mode, disk: one line)
        cause = str(e).splitlines()[0] if str(e) else ""
        raise PretrainedUnavailableError(
            f"cannot download {repo} from the Hugging Face hub ({type(e).__name__}: {cause}); run "
            f"`lpdl prefetch` where the hub is reachable, with the same HF_HOME as the jobs") from e


def _hub(need: Need, root: Path) -> dict:
    from ...models.transformer import PretrainedUnavailableError
    from ...data.base import DatasetMissing
    from ...data.text import get_tokenizer

    def verify() -> None:
        with hub_offline():
            get_tokenizer(need.name)
            need.probe()

    snap, fetched = cached_snapshot(need.name), False
    if snap is None:
        log.info("prefetch: downloading %s from the Hugging Face hub", need.name)
        snap, fetched = download_snapshot(need.name), True
    try:
        verify()
    except (DatasetMissing, PretrainedUnavailableError, OSError, ValueError):
        if fetched:
            raise
        log.info("prefetch: the cached %s does not load; downloading it again", need.name)
        snap, fetched = download_snapshot(need.name), True
        verify()
    files = {p.relative_to(snap).as_posix(): p.stat().st_size for p in sorted(snap.rglob("*")) if p.is_file()}
    return {"snapshot": str(snap), "revision": snap.name, "files": files, "fetched": fetched,
            "verified": "tokenizer and model load with HF_HUB_OFFLINE=1"}


# ---------------------------------------------------------------- datasets

def _loaded(need: Need, root: Path) -> dict:
    """A dataset with no download source: its loader, offline, is the verification."""
    from ...data.registry import load_dataset

    with hub_offline():
        split = load_dataset(need.name, offline=True, **dict(need.kwargs))
    keep = ("source", "tokenizer", "max_length", "full_size")
    return {**{k: split.extras[k] for k in keep if k in split.extras}, "fetched": False,
            "train": len(split.y_train), "test": len(split.y_test)}


def fetch_dataset(need: Need, root: Path) -> dict:
    """A paper dataset fetched and verified by the fetcher its spec names (lpdl_core.specs.datasets,
    "module:function" in lpdl_core.data), or, with none, verified by loading it offline."""
    from ...data.registry import fetcher

    fetch = fetcher(need.name)
    return _loaded(need, root) if fetch is None else fetch(need.name, root)


# need kind -> (manifest section, how it is fetched and verified)
KINDS: dict[str, tuple[str, Callable[[Need, Path], dict]]] = {
    "hub": ("hub", _hub),
    "dataset": ("datasets", fetch_dataset),
    "embedded": ("embedded", lambda need, root: {"fetched": False}),
}


def prefetch(cells: Iterable, profile: str, *, fidelities: Iterable[Fidelity] = (Fidelity(),),
             data_root: str | None = None) -> dict:
    """Fetch and verify everything the cells' runs load; the manifest (what, where, checksums).
    Raises the loader's one-line DatasetMissing / ChecksumError, or PretrainedUnavailableError."""
    from ...data.base import data_root as resolve_root

    cells = list(cells)
    root = resolve_root(data_root)
    items = needs(cells, profile, fidelities=tuple(fidelities), data_root=data_root)
    entries: dict[str, list] = {section: [] for section, _ in KINDS.values()}
    for need in items:
        section, fetch = KINDS[need.kind]
        log.info("prefetch: %s %s (%d cells)", need.kind, need.name, len(need.cells))
        loader = {k: v for k, v in need.kwargs if k != "root"}  # what tells two entries of one dataset apart
        entries[section].append({"name": need.name, "cells": len(need.cells), **({"loader": loader} if loader else {}),
                                 **fetch(need, root)})
    manifest = {"format": MANIFEST_FORMAT, "profile": profile, "cells": len(cells),
                "data_root": str(root.resolve()), **entries}
    if entries["hub"]:
        from huggingface_hub import constants
        manifest["hf_hub_cache"] = str(constants.HF_HUB_CACHE)
    fetched = [e["name"] for e in entries["hub"] + entries["datasets"] if e["fetched"]]
    manifest["summary"] = (
        "nothing to fetch: every dataset is an embedded stand-in and no hub model is loaded"
        if not entries["hub"] and not entries["datasets"] else
        f"{len(entries['hub']) + len(entries['datasets'])} verified"
        + (f", fetched now: {', '.join(fetched)}" if fetched else ", nothing fetched (already there)"))
    return manifest


def prefetch_request(*, profile: str, tables: Iterable[str] | None = None, paper_dir: str | None = None,
                     data_root: str | None = None, fidelities: Iterable[Mapping] = ()) -> dict:
    """What a prefetch is asked for, normalized (another spelling of the same folder, or the same
    modes in another order, is the same request). The manifest records it; the workflow compares it
    (`manifest_serves`) to decide whether the data must be verified again."""
    fids = sorted({json.dumps(Fidelity.from_mapping(dict(f)).as_dict(), sort_keys=True) for f in fidelities}) or \
        [json.dumps(Fidelity().as_dict(), sort_keys=True)]
    return {"profile": profile, "tables": sorted(tables or ()),
            "paper_dir": os.path.normpath(paper_dir) if paper_dir else None,
            "data_root": os.path.normpath(data_root) if data_root else None, "fidelities": fids}


def request_args(request: Mapping) -> list[str]:
    """The `lpdl prefetch` options of a request (the inverse of what _cmd_prefetch builds)."""
    return ["--profile", request["profile"], *(a for t in request["tables"] for a in ("--table", t)),
            *(("--paper-dir", request["paper_dir"]) if request["paper_dir"] else ()),
            *(("--data-root", request["data_root"]) if request["data_root"] else ()),
            *(a for f in request["fidelities"] for a in ("--fidelity-json", f))]


def manifest_serves(path: str | os.PathLike, request: Mapping) -> bool:
    """Whether the manifest at path records a finished prefetch of exactly this request."""
    try:
        return json.loads(Path(path).read_text())["request"] == json.loads(json.dumps(request))
    except (OSError, ValueError, KeyError, TypeError):
        return False


def write_manifest(manifest: dict, path: str | os.PathLike) -> Path:
    """Atomically (a reader sees the old manifest or the new one, never half of one)."""
    from ...atomic import write_atomic

    return write_atomic(path, json.dumps(manifest, indent=2, sort_keys=True) + "\n")
