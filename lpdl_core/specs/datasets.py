"""The datasets as the planner, the bill, the fetchers and the report see them (torch-free): each
one's kind, class count, the input side the paper's image models take, the paper dataset a mini
stand-in replaces, its loader and fetcher, and the size of its training set.

Which models are built for a dataset is the models' spec (lpdl_core.specs.models). The loaders and
fetchers are functions of lpdl_core.data, named here as "module:function" and imported only when
a dataset is loaded or fetched (lpdl_core.data.registry, lpdl_core.pipeline.workflow.prefetch).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import ConfigError

DATA_KINDS = ("image", "text")


@dataclass(frozen=True, kw_only=True)
class DatasetSpec:
    """loader: "module:function" in lpdl_core.data; the function takes the keyword arguments of
    load_dataset (root=, tokenizer=, ...) and returns a DataSplit. fetcher: for a dataset that can
    be downloaded, "module:function" in lpdl_core.data taking (name, data root), fetching what is
    missing and verifying it, returning what the prefetch manifest records; its loader then takes
    download=. None: nothing to fetch (the loader, offline, is the verification).
    class_sizes: the training set's samples per class, in label order, where known (packs and the
    paper's partition tables are planned from them before any data is loaded); train_samples: the
    training set's size (the sum of class_sizes when they are given; the bill's epochs). display:
    its name in the report (a stand-in is shown as the paper dataset it replaces)."""

    name: str
    kind: str                      # one of DATA_KINDS
    classes: int
    loader: str
    size: int | None = None        # image side in pixels the paper models take (None: text)
    standin_for: str | None = None
    fetcher: str | None = None
    class_sizes: tuple[int, ...] | None = None
    train_samples: int | None = None
    display: str = ""

    def __post_init__(self) -> None:
        if self.kind not in DATA_KINDS:
            raise ValueError(f"dataset {self.name}: kind must be one of {DATA_KINDS}, got {self.kind!r}")
        if self.class_sizes is not None:
            if len(self.class_sizes) != self.classes:
                raise ValueError(f"dataset {self.name}: {len(self.class_sizes)} class sizes for {self.classes} classes")
            if self.train_samples not in (None, sum(self.class_sizes)):
                raise ValueError(f"dataset {self.name}: train_samples {self.train_samples} is not the sum of "
                                 f"its class sizes, {sum(self.class_sizes)}")
            object.__setattr__(self, "train_samples", sum(self.class_sizes))

    @property
    def chance(self) -> float:
        """Accuracy in % of a constant guess over balanced classes."""
        return 100.0 / self.classes


_IMAGENETTE_TRAIN = (963, 955, 993, 858, 941, 956, 961, 931, 951, 960)  # imagenette2's train/ folders

DATASET_SPECS: dict[str, DatasetSpec] = {s.name: s for s in (
    DatasetSpec(name="cifar10", display="CIFAR-10", kind="image", classes=10, size=32,
                loader="cifar:load_cifar10", fetcher="cifar:prefetch", class_sizes=(5000,) * 10),
    DatasetSpec(name="cifar100", display="CIFAR-100", kind="image", classes=100, size=32,
                loader="cifar:load_cifar100", fetcher="cifar:prefetch", class_sizes=(500,) * 100),
    DatasetSpec(name="imagenette", display="Imagenette", kind="image", classes=10, size=224,
                loader="imagenette:load_imagenette", fetcher="imagenette:prefetch", class_sizes=_IMAGENETTE_TRAIN),
    DatasetSpec(name="agnews", display="AG News", kind="text", classes=4, loader="agnews:load_agnews",
                class_sizes=(30000,) * 4),
    DatasetSpec(name="sentlen", display="Sentlen", kind="text", classes=6, loader="sentlen:load_sentlen",
                train_samples=100000),
    # stand-ins: what the mini profile trains on instead (lpdl_core.data)
    DatasetSpec(name="digits", kind="image", classes=10, size=32, standin_for="cifar10",
                loader="digits:load_digits_32"),
    DatasetSpec(name="digits-224", kind="image", classes=10, size=224, standin_for="imagenette",
                loader="digits:load_digits_224"),
    DatasetSpec(name="sentlen-standin", kind="text", classes=6, standin_for="sentlen",
                loader="standin_text:load_sentlen_standin"),
    DatasetSpec(name="topics-standin", kind="text", classes=4, standin_for="agnews",
                loader="standin_text:load_topics_standin"),
)}


def dataset_spec(name: str) -> DatasetSpec:
    if name not in DATASET_SPECS:
        raise ConfigError(f"unknown dataset {name!r}; valid: {', '.join(DATASET_SPECS)}")
    return DATASET_SPECS[name]


PAPER_DATASETS = tuple(n for n, s in DATASET_SPECS.items() if s.standin_for is None)
# stand-in -> the paper dataset it replaces in the mini profile
STANDIN_DATASETS = {n: s.standin_for for n, s in DATASET_SPECS.items() if s.standin_for is not None}
DATASETS = PAPER_DATASETS + tuple(STANDIN_DATASETS)
IMAGE_DATASETS = tuple(n for n in PAPER_DATASETS if DATASET_SPECS[n].kind == "image")  # the CNNs' datasets
