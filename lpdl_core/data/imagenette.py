"""Imagenette (fastai `imagenette2`, full-size JPEGs): 10 easy ImageNet classes, 9,469 train /
3,925 val images — the paper's Imagenette runs (VGG-11 / ResNet-18 at 224 px).

Layout under the data root (see `base.data_root`)::

    <root>/imagenette2.tgz                       # the fastai archive (optional once extracted)
    <root>/imagenette2/{train,val}/<wnid>/*.JPEG  # what the loader reads
    <root>/imagenette2.lpdl-cache.whole256x512.val256-224.pt   # decoded uint8 tensors (written by us)

Labels follow torchvision's ImageFolder: class folders in sorted-wnid order -> 0..9, files in
sorted name order within a class (the official code reads the data with ImageFolder).

Transforms (official code, trainer_choco.py / trainer_ds.py lines 170-173 and 212-214; see
docs/paper-vs-code.md, 'Transforms'):
  train: Resize(256) -> RandomResizedCrop(224) -> flip -> ImageNet normalization;
  test:  Resize(256) -> CenterCrop(224) -> ImageNet normalization.

To keep the whole dataset resident on the training device as uint8, this loader applies the
deterministic parts at load time:
  * images are decoded with PIL and resized with torchvision on the PIL image, exactly like the
    official ImageFolder + transforms pipeline;
  * val images get the exact official test transform, Resize(256) (shorter side, bilinear) ->
    CenterCrop(224), stored as (3925, 3, 224, 224) uint8;
  * train images get Resize(256) only, the whole image with its aspect ratio (e.g. 341x256 for a
    4:3 photo), stored packed (packed.py, train_layout="packed"): uint8 (9469, 3, 257, L), each
    image landscape (portraits transposed) and zero-padded to L = min(2 x 256, the longest
    resized side), row 256 holding its size. The random part, RandomResizedCrop(224) +
    horizontal flip, runs batched on the device (augment="rrc-flip") with its boxes drawn over
    the whole resized image, as the official code does, sampled as the run's
    Fidelity.crop_sampling: "log-uniform" (current torchvision, the default) or "uniform-swap"
    (torchvision 0.2.1, pinned by the official env.yml: uniform ratio, w/h swapped half the time,
    square centre-crop fallback); crops.py gives both algorithms.
    Cap: an image whose resized long side exceeds 2 x 256 = 512 px (aspect ratio above 2:1) is
    centre-cropped to 512 along it when stored, so its crops come from that central 512x256;
    the loader counts them (extras["train_long_capped"], and the description). At L = 512 the
    train tensor is 3.7 GB (the old centre-square store was 1.9 GB).

Decoding ~13.4k JPEGs takes a minute or two, so the decoded tensors are cached in a .pt file
next to the extracted folder, keyed by the sizes and a fingerprint of the file listing, written
atomically and read back with `torch.load(weights_only=True)`. CACHE_VERSION 3 (and the
"whole" file name) is the packed store; a version-2 cache (`...train256.val256-224.pt`, the
256x256 centre squares) is never read, and may be deleted.
"""
from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch

from .base import ChecksumError, DataSplit, DatasetMissing, data_root
from .imagenette_images import Progress, decode_all, decode_whole, resize_center_crop  # noqa: F401 (API)

URL = "https://s3.amazonaws.com/fast-ai-imageclas/imagenette2.tgz"
MD5 = "fe2fc210e6bb7c5664d602c3cd71e612"
ARCHIVE_NAME = "imagenette2.tgz"
FOLDER_NAME = "imagenette2"
CACHE_VERSION = 3

WNIDS = ("n01440764", "n02102040", "n02979186", "n03000684", "n03028079",
         "n03394916", "n03417042", "n03425413", "n03445777", "n03888605")
CLASS_NAMES = ("tench", "English springer", "cassette player", "chain saw", "church",
               "French horn", "garbage truck", "gas pump", "golf ball", "parachute")
# imagenette2 train split, sorted-wnid order (the official code's hard-coded class_size).
OFFICIAL_TRAIN_SIZES = (963, 955, 993, 858, 941, 956, 961, 931, 951, 960)
OFFICIAL_VAL_SIZE = 3925

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
IMAGE_SIZE = 224          # what the model sees (RandomResizedCrop / CenterCrop output)
TEST_RESIZE = 256         # official Resize(256) before CenterCrop(224)
LONG_CAP_RATIO = 2        # stored train images: long side at most 2 x the shorter (Resize) side

# torchvision's ImageFolder IMG_EXTENSIONS (case-insensitive)
_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")

def _missing_hint(root: Path) -> str:
    return (f"put {ARCHIVE_NAME} (md5 {MD5}) at {root / ARCHIVE_NAME} or the extracted folder "
            f"at {root / FOLDER_NAME}/{{train,val}}")


def _is_extracted(folder: Path) -> bool:
    return (folder / "train").is_dir() and (folder / "val").is_dir()


def ensure_extracted(root: Path, download: bool = True) -> Path:
    """Return <root>/imagenette2, extracting <root>/imagenette2.tgz (md5-checked) or downloading
    it first if needed. Raises DatasetMissing (offline / not allowed) or ChecksumError."""
    from .download import extract_tar, fetch, md5sum

    folder = root / FOLDER_NAME
    if _is_extracted(folder):
        return folder
    if folder.exists():
        raise DatasetMissing(f"{folder} exists but lacks train/ and val/ (interrupted extraction?); "
                             f"remove it, then {_missing_hint(root)}")
    archive = root / ARCHIVE_NAME
    if archive.is_file():
        got = md5sum(archive)
        if got != MD5:
            raise ChecksumError(f"{archive} has md5 {got}, expected {MD5} (imagenette2 full-size "
                                f"archive from {URL}); replace it: {_missing_hint(root)}")
    elif download:
        try:
            fetch(URL, archive, md5=MD5, what="Imagenette (imagenette2.tgz, 1.5 GB)",
                  fix_hint=_missing_hint(root))
        except DatasetMissing as e:
            why = e.__cause__ if e.__cause__ is not None else e
            raise DatasetMissing(f"Imagenette not found under {root} and the download failed "
                                 f"({type(why).__name__}: {why}); {_missing_hint(root)}") from e
    else:
        raise DatasetMissing(f"Imagenette not found (download disabled); {_missing_hint(root)}")
    extract_tar(archive, root)
    if not _is_extracted(folder):
        raise DatasetMissing(f"{archive} did not contain {FOLDER_NAME}/{{train,val}}; "
                             f"{_missing_hint(root)}")
    return folder


def list_split(split_dir: Path) -> tuple[list[Path], list[int]]:
    """ImageFolder ordering: sorted class folders (must be the 10 imagenette wnids) -> labels,
    files sorted by name within each class."""
    classes = sorted(e.name for e in os.scandir(split_dir) if e.is_dir())
    if tuple(classes) != WNIDS:
        raise ValueError(f"{split_dir}: class folders {classes} are not the 10 imagenette2 wnids "
                         f"{list(WNIDS)}")
    paths: list[Path] = []
    labels: list[int] = []
    for label, wnid in enumerate(classes):
        files = sorted(e.name for e in os.scandir(split_dir / wnid)
                       if e.is_file() and e.name.lower().endswith(_EXTENSIONS))
        paths += [split_dir / wnid / f for f in files]
        labels += [label] * len(files)
    return paths, labels


def _fingerprint(paths: list[Path], base: Path) -> str:
    h = hashlib.sha1()
    for p in paths:
        h.update(f"{p.relative_to(base).as_posix()}:{p.stat().st_size}\n".encode())
    return h.hexdigest()


def cache_path(root: Path, train_size: int) -> Path:
    return (root / f"{FOLDER_NAME}.lpdl-cache.whole{train_size}x{LONG_CAP_RATIO * train_size}."
                   f"val{TEST_RESIZE}-{IMAGE_SIZE}.pt")


def _load_cache(path: Path, fingerprint: str) -> dict | None:
    if not path.is_file():
        return None
    try:
        d = torch.load(path, map_location="cpu", weights_only=True)
    except Exception:  # unreadable / truncated / foreign file: rebuild it
        return None
    if not isinstance(d, dict) or d.get("version") != CACHE_VERSION or d.get("fingerprint") != fingerprint:
        return None
    if type(d.get("train_long_capped")) is not int:
        return None
    try:
        if d.get("content_sha256") != _content_sha256(d):
            return None  # edited or damaged: rebuild
    except (KeyError, TypeError, AttributeError):
        return None
    return d


def _content_sha256(d: dict) -> str:
    """sha256 of the cached tensors (about 2.6 GB: a few seconds, against minutes of decoding)."""
    from .cache import digest_arrays
    return digest_arrays({k: d[k].numpy() for k in ("x_train", "y_train", "x_test", "y_test")})


def _save_cache(path: Path, d: dict) -> str | None:
    """Written with lpdl's one atomic writer (lpdl_core.atomic). Returns an error note or None."""
    from ..atomic import replacing
    try:
        with replacing(path) as f:
            torch.save(d, f)
        return None
    except OSError as e:  # WriteFailed names the path
        return f"could not write cache {path}: {e}"


def load_imagenette(root: str | os.PathLike | None = None, download: bool = True, *,
                    train_size: int = 256, progress: Progress | None = None,
                    workers: int | None = None, use_cache: bool = True) -> DataSplit:
    """Load imagenette2 as device-ready uint8 tensors.

    Returns a DataSplit with x_train the whole Resize(train_size) images, packed
    (train_layout="packed": uint8 (9469, 3, train_size + 1, L), packed.py; augment="rrc-flip" to
    224 at train time, boxes over the whole image), x_test (3925, 3, 224, 224) uint8 (exact
    official Resize(256) + CenterCrop(224)), labels in sorted-wnid order, ImageNet mean/std.
    crop_sampling is the default "log-uniform"; registry.load_dataset sets a run's. The extracted
    folder is found (or made from the md5-checked archive, or downloaded
    when `download` and online) under `data_root(root)`; otherwise DatasetMissing says what to put
    where. `progress(split, done, total)` is called while decoding (nothing is printed).
    """
    if train_size < 1:
        raise ValueError(f"train_size must be positive, got {train_size}")
    base = data_root(root)
    folder = ensure_extracted(base, download)
    tr_paths, tr_labels = list_split(folder / "train")
    te_paths, te_labels = list_split(folder / "val")
    fp = _fingerprint(tr_paths + te_paths, folder)
    cpath = cache_path(base, train_size)
    notes: list[str] = []

    d = _load_cache(cpath, fp) if use_cache else None
    from_cache = d is not None
    if d is None:
        w = workers if workers is not None else min(8, os.cpu_count() or 1)
        x_train, capped = decode_whole(tr_paths, train_size, "train", progress, w, LONG_CAP_RATIO)
        d = {
            "version": CACHE_VERSION, "fingerprint": fp, "train_long_capped": capped,
            "x_train": x_train,
            "y_train": torch.tensor(tr_labels, dtype=torch.int64),
            "x_test": decode_all(te_paths, TEST_RESIZE, IMAGE_SIZE, "val", progress, w),
            "y_test": torch.tensor(te_labels, dtype=torch.int64),
        }
        if use_cache:
            d["content_sha256"] = _content_sha256(d)
            err = _save_cache(cpath, d)
            if err:
                notes.append(err)

    counts = tuple(torch.bincount(d["y_train"], minlength=10).tolist())
    warnings: list[str] = []
    if counts != OFFICIAL_TRAIN_SIZES:
        warnings.append(f"WARNING: train class sizes {list(counts)} differ from the official "
                        f"imagenette2 sizes {list(OFFICIAL_TRAIN_SIZES)} (sum 9,469); the skewed "
                        f"partition uses the official sizes, so results are not comparable")
    if len(d["y_test"]) != OFFICIAL_VAL_SIZE:
        warnings.append(f"WARNING: val has {len(d['y_test'])} images, official imagenette2 val "
                        f"has {OFFICIAL_VAL_SIZE}")

    capped, cap = d["train_long_capped"], d["x_train"].shape[-1]
    desc = (f"Imagenette (fastai imagenette2, full size) from {folder}: {len(d['y_train']):,} train / "
            f"{len(d['y_test']):,} val images, 10 classes in sorted-wnid order. Train stored as the "
            f"whole Resize({train_size}) image (uint8, packed, long side at most {cap} px: {capped} "
            f"image(s) wider than that centre-cropped to it), augmented on device with "
            f"RandomResizedCrop({IMAGE_SIZE})+flip with boxes over the whole image, as the official "
            f"code. Val: exact official Resize({TEST_RESIZE})+CenterCrop({IMAGE_SIZE}). ImageNet "
            f"mean/std normalization.")
    if warnings or notes:
        desc += " " + " ".join(warnings + notes)
    return DataSplit(
        name="imagenette", kind="image", num_classes=10,
        x_train=d["x_train"], y_train=d["y_train"], x_test=d["x_test"], y_test=d["y_test"],
        standin_for=None, description=desc, class_names=CLASS_NAMES,
        mean=IMAGENET_MEAN, std=IMAGENET_STD, augment="rrc-flip", image_size=IMAGE_SIZE,
        train_layout="packed",
        extras={"wnids": WNIDS, "folder": str(folder), "cache": str(cpath), "from_cache": from_cache,
                "train_resize": train_size, "train_long_side": cap, "train_long_capped": capped,
                "warnings": tuple(warnings + notes)},
    )


def prefetch(name: str, root: Path) -> dict:
    """Fetch (when missing) and verify Imagenette under the data root: what `lpdl prefetch`'s
    manifest records of it."""
    present = (root / FOLDER_NAME / "train").is_dir()
    folder = ensure_extracted(root, download=True)
    counts = {split: len(list_split(folder / sub)[0]) for split, sub in (("train", "train"), ("test", "val"))}
    archive = root / ARCHIVE_NAME
    return {"folder": str(folder), "archive": str(archive) if archive.is_file() else None,
            "archive_md5": MD5, "url": URL, "fetched": not present, **counts}
