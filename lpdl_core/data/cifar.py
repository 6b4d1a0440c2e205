"""CIFAR-10 / CIFAR-100 loaders (the paper's CIFAR-10 runs; CIFAR-100 is listed but broken in the
official code, see docs/paper-vs-code.md, 'Imagenette and CIFAR-100').

Files live under `data_root(root) / name`, in torchvision's layout:
  <root>/cifar10/cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta}
  <root>/cifar100/cifar-100-python/{train, test, meta}
If they are missing the official archive is fetched with `download.fetch` (temporary file, md5
check, atomic rename; no network -> DatasetMissing saying what to put where), extracted safely,
md5-checked file by file, and only then read by torchvision's dataset class with download=False.

Normalization constants:
  * CIFAR-10 uses the official code's mean (0.4914, 0.4822, 0.4465) and std (0.2023, 0.1994, 0.2010).
    That std is the widespread "wrong" CIFAR-10 std (it is not the per-channel pixel std); the true
    values are about (0.2470, 0.2435, 0.2616). Kept for fidelity to the official code.
  * CIFAR-100: the official repo has no constants (its CIFAR-100 path is broken), so the commonly
    used mean (0.5071, 0.4865, 0.4409) / std (0.2673, 0.2564, 0.2762) are used.
"""
from __future__ import annotations

import os
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch

from .base import ChecksumError, DatasetMissing, DataSplit, data_root
from .download import extract_tar, fetch, md5sum
from ..rehearsal_mark import rehearsal_manifest

CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2023, 0.1994, 0.2010)  # official code; the widespread "wrong" CIFAR-10 std
CIFAR10_TRUE_STD = (0.2470, 0.2435, 0.2616)  # actual per-channel pixel std, for reference only
CIFAR100_MEAN = (0.5071, 0.4865, 0.4409)  # common values; the official repo has none
CIFAR100_STD = (0.2673, 0.2564, 0.2762)


@dataclass(frozen=True)
class _Spec:
    title: str
    folder: str
    archive: str
    url: str
    md5: str
    files_desc: str
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    norm_note: str


SPECS = {
    "cifar10": _Spec(
        "CIFAR-10", "cifar-10-batches-py", "cifar-10-python.tar.gz",
        "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz", "c58f30108f718f92721af3b95e74349a",
        "data_batch_1..data_batch_5, test_batch, batches.meta", 10, CIFAR10_MEAN, CIFAR10_STD,
        "normalization: official code's mean (0.4914, 0.4822, 0.4465) and std (0.2023, 0.1994, 0.2010), "
        "the widespread 'wrong' CIFAR-10 std (true per-channel std is about 0.2470, 0.2435, 0.2616)"),
    "cifar100": _Spec(
        "CIFAR-100", "cifar-100-python", "cifar-100-python.tar.gz",
        "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz", "eb9058c3a382ffc7106e4002c42a8d85",
        "train, test, meta", 100, CIFAR100_MEAN, CIFAR100_STD,
        "normalization: commonly used mean (0.5071, 0.4865, 0.4409) / std (0.2673, 0.2564, 0.2762); "
        "the official repo has no CIFAR-100 constants (its CIFAR-100 path is broken)"),
}


def _tv_class(name: str):
    try:
        from torchvision.datasets import CIFAR10, CIFAR100
    except ImportError as e:  # pragma: no cover
        raise ImportError("loading CIFAR needs torchvision (pip install torchvision)") from e
    return CIFAR10 if name == "cifar10" else CIFAR100


def _expected_files(tv) -> list[tuple[str, str]]:
    """(file name, md5) for every file torchvision reads."""
    return [(f, m) for f, m in tv.train_list + tv.test_list] + [(tv.meta["filename"], tv.meta["md5"])]


def expected_files(name: str) -> list[tuple[str, str]]:
    """(file name in the extracted folder, published md5) of every file load_cifar reads."""
    return _expected_files(_tv_class(name))


def expected_layout(name: str, root: str | os.PathLike | None = None) -> str:
    """Human-readable description of what must be on disk for `name`."""
    s = SPECS[name]
    base = data_root(root) / name
    return (f"{s.title} expected either the folder {base / s.folder}{os.sep} (with {s.files_desc}) or the "
            f"archive {base / s.archive} (md5 {s.md5}) from {s.url}")


def load_cifar(name: Literal["cifar10", "cifar100"], root: str | os.PathLike | None = None,
               download: bool = True, *, verify_md5: bool = True) -> DataSplit:
    """Load CIFAR-10/100 as uint8 (N, 3, 32, 32) CPU tensors with int64 labels.

    verify_md5=False skips the per-file md5 check against the published files (only for test
    fixtures written in the real format; the archive md5 is always checked when it is fetched).
    """
    if name not in SPECS:
        raise ValueError(f"unknown CIFAR dataset {name!r}; expected one of {sorted(SPECS)}")
    spec, tv = SPECS[name], _tv_class(name)
    base = data_root(root) / name
    folder = base / spec.folder
    files = _expected_files(tv)

    if not all((folder / f).is_file() for f, _ in files):
        archive = base / spec.archive
        if not archive.exists() and not download:
            raise DatasetMissing(f"{spec.title} not found (download=False). " + expected_layout(name, root) + ".")
        fetch(spec.url, archive, md5=spec.md5, what=f"{spec.title} archive",
              fix_hint=f"Or put the extracted folder {folder}{os.sep} (with {spec.files_desc}) in place.")
        extract_tar(archive, base, overwrite=True)
        missing = [f for f, _ in files if not (folder / f).is_file()]
        if missing:
            raise DatasetMissing(f"{spec.title}: extracting {archive} did not produce {missing} in {folder}. "
                                 + expected_layout(name, root) + ".")

    rehearsal = rehearsal_manifest(root)
    rehearsal = rehearsal["datasets"].get(name) if rehearsal else None
    if rehearsal:  # lpdl rehearsal-data wrote these files: its manifest's md5s stand for the published ones
        files = [(f, rehearsal.get("md5", {}).get(f, expected)) for f, expected in files]
    if verify_md5:
        for f, expected in files:
            actual = md5sum(folder / f)
            if actual != expected:
                raise ChecksumError(
                    f"{spec.title}: {folder / f} is corrupt (md5 {actual}, expected {expected}). Delete the "
                    f"folder {folder} and run again (it is re-extracted from {base / spec.archive} or "
                    f"re-downloaded from {spec.url}).")

    # Already verified above (or deliberately not): let torchvision read without re-hashing.
    unchecked = type(f"_Unchecked{tv.__name__}", (tv,), {
        "train_list": [[f, None] for f, _ in tv.train_list],
        "test_list": [[f, None] for f, _ in tv.test_list],
        "meta": {**tv.meta, "md5": None},
    })
    try:
        tr = unchecked(str(base), train=True, download=False)
        te = unchecked(str(base), train=False, download=False)
    except Exception as e:
        raise ChecksumError(f"{spec.title}: cannot read {_first_unreadable(folder, files) or folder} "
                            f"({type(e).__name__}: {e}); the file is corrupt or not a CIFAR batch. "
                            f"Delete the folder {folder} and run again.") from e

    def to_tensors(ds, what):
        x = torch.from_numpy(np.ascontiguousarray(ds.data)).permute(0, 3, 1, 2).contiguous()
        y = torch.as_tensor(np.asarray(ds.targets, dtype=np.int64))
        if len(x) != len(y) or (len(y) and (int(y.min()) < 0 or int(y.max()) >= spec.num_classes)):
            raise ChecksumError(f"{spec.title}: {what} labels in {folder} are inconsistent "
                                f"({len(x)} images, {len(y)} labels); the files are corrupt.")
        return x, y

    x_train, y_train = to_tensors(tr, "train")
    x_test, y_test = to_tensors(te, "test")
    class_names = tuple(str(c) for c in tr.classes)
    if len(class_names) != spec.num_classes:
        raise ChecksumError(f"{spec.title}: {folder / tv.meta['filename']} lists {len(class_names)} "
                            f"classes, expected {spec.num_classes}; the file is corrupt.")
    return DataSplit(
        name=name, kind="image", num_classes=spec.num_classes,
        x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test,
        standin_for=None,
        description=(("REHEARSAL DATA (synthetic, lpdl rehearsal-data): " if rehearsal else "")
                     + f"{spec.title} ({len(x_train)} train / {len(x_test)} test, 32x32 RGB, "
                     f"{spec.num_classes} classes) from {folder}; {spec.norm_note}"),
        class_names=class_names, mean=spec.mean, std=spec.std,
        augment="crop-flip", image_size=32,
        extras={"path": str(folder), "rehearsal": bool(rehearsal)},
    )


def _first_unreadable(folder: Path, files: list[tuple[str, str]]) -> Path | None:
    for f, _ in files:
        try:
            with open(folder / f, "rb") as fh:
                obj = pickle.load(fh, encoding="latin1")
            if not isinstance(obj, dict):
                return folder / f
        except Exception:
            return folder / f
    return None


def load_cifar10(root: str | os.PathLike | None = None, **kw) -> DataSplit:
    return load_cifar("cifar10", root, **kw)


def load_cifar100(root: str | os.PathLike | None = None, **kw) -> DataSplit:
    return load_cifar("cifar100", root, **kw)


def prefetch(name: str, root: Path) -> dict:
    """Fetch (when missing) and verify CIFAR-10/100 under the data root: what `lpdl prefetch`'s
    manifest records of it."""
    spec, base = SPECS[name], root / name
    files = dict(expected_files(name))
    present = all((base / spec.folder / f).is_file() for f in files)
    split = load_cifar(name, root, download=True)
    archive = base / spec.archive
    return {"folder": str(base / spec.folder), "archive": str(archive) if archive.is_file() else None,
            "archive_md5": spec.md5, "url": spec.url, "files_md5": files, "fetched": not present,
            "train": len(split.y_train), "test": len(split.y_test)}
