"""Dataset names -> loaders. Paper datasets need files under the data root (no downloads work on
offline machines; each loader says what to put where). Stand-ins ship with the package or with
Python/scikit-learn and are always named as stand-ins."""
from __future__ import annotations

from typing import Callable

from .base import DataSplit

PAPER_DATASETS = ("cifar10", "cifar100", "imagenette", "agnews", "sentlen")
STANDINS = {  # stand-in name -> the paper dataset it replaces in the mini profile
    "digits": "cifar10",
    "digits-224": "imagenette",
    "sentlen-standin": "sentlen",
    "topics-standin": "agnews",
}
DATASETS = PAPER_DATASETS + tuple(STANDINS)


def _loader(name: str) -> Callable[..., DataSplit]:
    if name in ("cifar10", "cifar100"):
        from .cifar import load_cifar
        return lambda **kw: load_cifar(name, **kw)
    if name == "imagenette":
        from .imagenette import load_imagenette
        return load_imagenette
    if name == "agnews":
        from .agnews import load_agnews
        return load_agnews
    if name == "sentlen":
        from .sentlen import load_sentlen
        return load_sentlen
    if name == "digits":
        from .digits import load_digits_standin
        return lambda **kw: load_digits_standin(**{"standin_for": "cifar10", "image_size": 32, **kw})
    if name == "digits-224":
        from .digits import load_digits_standin
        return lambda **kw: load_digits_standin(**{"standin_for": "imagenette", "image_size": 224, **kw})
    if name == "sentlen-standin":
        from .standin_text import load_sentlen_standin
        return load_sentlen_standin
    if name == "topics-standin":
        from .standin_text import load_topics_standin
        return load_topics_standin
    raise ValueError(f"unknown dataset {name!r}; valid: {', '.join(DATASETS)}")


def load_dataset(name: str, **kwargs) -> DataSplit:
    """Load a dataset by name; keyword arguments go to its loader (e.g. root=..., tokenizer=...)."""
    return _loader(name)(**kwargs)
