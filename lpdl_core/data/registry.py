"""Dataset names -> loaders. Paper datasets need files under the data root (no downloads work on
offline machines; each loader says what to put where). Stand-ins ship with the package or with
Python/scikit-learn and are always named as stand-ins."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ..config import DATASET_SPECS, DATASETS
from ..config import PAPER_DATASETS, STANDIN_DATASETS as STANDINS  # noqa: F401 (lpdl_core.data re-exports them)
from .base import DataSplit, DatasetMissing


def _cifar(name: str) -> Callable[..., DataSplit]:
    from .cifar import load_cifar
    return lambda **kw: load_cifar(name, **kw)


def _imagenette() -> Callable[..., DataSplit]:
    from .imagenette import load_imagenette
    return load_imagenette


def _agnews() -> Callable[..., DataSplit]:
    from .agnews import load_agnews
    return load_agnews


def _sentlen() -> Callable[..., DataSplit]:
    from .sentlen import load_sentlen
    return load_sentlen


def _digits(standin_for: str, image_size: int) -> Callable[..., DataSplit]:
    from .digits import load_digits_standin
    return lambda **kw: load_digits_standin(**{"standin_for": standin_for, "image_size": image_size, **kw})


def _sentlen_standin() -> Callable[..., DataSplit]:
    from .standin_text import load_sentlen_standin
    return load_sentlen_standin


def _topics_standin() -> Callable[..., DataSplit]:
    from .standin_text import load_topics_standin
    return load_topics_standin


# name -> a function returning its loader (one per DATASET_SPECS entry: lpdl_core.config holds each
# dataset's kind, classes, size and models, torch-free, for the planner too); the loader modules are
# imported only when asked for, so loading digits never imports torchvision's datasets or the text stack
LOADERS: dict[str, Callable[[], Callable[..., DataSplit]]] = {
    "cifar10": lambda: _cifar("cifar10"),
    "cifar100": lambda: _cifar("cifar100"),
    "imagenette": _imagenette,
    "agnews": _agnews,
    "sentlen": _sentlen,
    "digits": lambda: _digits("cifar10", DATASET_SPECS["digits"].size),
    "digits-224": lambda: _digits("imagenette", DATASET_SPECS["digits-224"].size),
    "sentlen-standin": _sentlen_standin,
    "topics-standin": _topics_standin,
}


def _loader(name: str) -> Callable[..., DataSplit]:
    if name not in LOADERS:
        raise ValueError(f"unknown dataset {name!r}; valid: {', '.join(DATASETS)}")
    return LOADERS[name]()


# Loaders that fetch their files when they are missing (they take download=). An offline run
# passes download=False, so a cluster job never starts a download of its own.
FETCHING = frozenset({"cifar10", "cifar100", "imagenette"})
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
    loader = _loader(name)
    if not offline:
        return loader(**kwargs)
    try:
        return loader(**kwargs, **({"download": False} if name in FETCHING else {}))
    except DatasetMissing as e:
        raise DatasetMissing(f"{str(e).rstrip()} {OFFLINE_HINT}") from e
