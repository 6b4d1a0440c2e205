"""Dataset names -> loaders. Paper datasets need files under the data root (no downloads work on
offline machines; each loader says what to put where). Stand-ins ship with the package or with
Python/scikit-learn and are always named as stand-ins."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ..config import DATASET_SPECS, DATASETS
from ..config import PAPER_DATASETS, STANDIN_DATASETS as STANDINS  # noqa: F401 (lpdl_core.data re-exports them)
from ..specs import named
from .base import DataSplit, DatasetMissing


def loader(name: str) -> Callable[..., DataSplit]:
    """The dataset's loader, named by its spec (lpdl_core.specs.datasets: "module:function" in this
    package), imported only when asked for: loading digits never imports torchvision's datasets or
    the text stack."""
    if name not in DATASET_SPECS:
        raise ValueError(f"unknown dataset {name!r}; valid: {', '.join(DATASETS)}")
    return named(__package__, DATASET_SPECS[name].loader)


def fetcher(name: str) -> Callable | None:
    """The dataset's fetcher, named by its spec: (name, data root) -> what the prefetch manifest
    records; None for a dataset with nothing to download."""
    path = DATASET_SPECS[name].fetcher
    return None if path is None else named(__package__, path)


# Loaders that fetch their files when they are missing (they take download=): the datasets with a
# fetcher. An offline run passes download=False, so a cluster job never starts a download of its own.
FETCHING = frozenset(n for n, s in DATASET_SPECS.items() if s.fetcher)
OFFLINE_HINT = ("This run is offline (lpdl train --offline, as every workflow train job): fetch and verify "
                "the data first with `lpdl prefetch` or the workflow's download rule, `snakemake download`.")


def load_dataset(name: str, *, offline: bool = False, crop_sampling: str | None = None, **kwargs) -> DataSplit:
    """Load a dataset by name; keyword arguments go to its loader (e.g. root=..., tokenizer=...).

    offline=True: nothing is downloaded, and a missing dataset's DatasetMissing says how to
    prefetch it (the hub side of offline is HF_HUB_OFFLINE=1, set by `lpdl train --offline`).
    crop_sampling: a run's Fidelity.crop_sampling, recorded on the split (DataSplit.crop_sampling)
    for its "rrc-flip" augmentation; None keeps the loader's ("log-uniform")."""
    split = _labelled(name, _load(name, offline, kwargs), kwargs.get("root"))
    return split if crop_sampling is None else replace(split, crop_sampling=crop_sampling)


def _labelled(name: str, split: DataSplit, root) -> DataSplit:
    """A paper dataset read from a rehearsal data root (lpdl rehearsal-data): said so in its
    description and extras["rehearsal"], which every run records."""
    from ..rehearsal_mark import data_kind

    if split.standin_for is not None or split.extras.get("rehearsal") is False or data_kind(name, root) is None:
        return split
    desc = split.description if split.description.startswith("REHEARSAL") else \
        f"REHEARSAL DATA (synthetic, lpdl rehearsal-data): {split.description}"
    return replace(split, description=desc, extras={**split.extras, "rehearsal": True})


def _load(name: str, offline: bool, kwargs: dict) -> DataSplit:
    load = loader(name)
    if not offline:
        return load(**kwargs)
    try:
        return load(**kwargs, **({"download": False} if name in FETCHING else {}))
    except DatasetMissing as e:
        raise DatasetMissing(f"{str(e).rstrip()} {OFFLINE_HINT}") from e
