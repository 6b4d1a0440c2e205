"""Rehearsal data: the paper's datasets' on-disk formats at their full sizes, filled with
synthetic, class-dependent, deterministic content (`lpdl rehearsal-data --out DIR`).

What it is for: running the paper profile end to end where the real data cannot be fetched (a
machine without internet, a CI runner, a dry rehearsal before a GPU allocation), and measuring what
the real data will cost (`lpdl preflight`: decoding, augmentation, memory, step times). The
unchanged loaders read it: CIFAR-10/100 as torchvision's python batches, Imagenette as
imagenette2's folder of JPEGs, AG News as its CSVs, Sentlen as SentEval's probing file.

What it is not: data anyone should report an accuracy on. Each image is its class's pattern (a
colour and oriented stripes) with per-image phase, offset and noise, so a model can learn it; each
sentence draws from its class's words. A manifest (`lpdl-rehearsal.json` at the root) records
what was written and every file's md5; the CIFAR loader accepts those md5s in place of the
published ones only under such a manifest, and every DataSplit read from it says "rehearsal" in
its description and `extras["rehearsal"]`, which runs record.

Sizes (scale 1): CIFAR-10 50,000 + 10,000 images, CIFAR-100 50,000 + 10,000, Imagenette 9,469
train + 3,925 val JPEGs at about 500 × 375 (a tenth portrait), AG News 120,000 + 7,600 rows,
Sentlen 100,000 + 10,000 + 10,000 lines. A smaller `scale` keeps every format and every class.
With a text set comes `hub/distilbert-base-uncased/`, the checkpoint's format with random weights
(lpdl_core.data.rehearsal_hub), which the paper's text cells load from a rehearsal root.
"""
from __future__ import annotations

import hashlib
import json
import pickle
from pathlib import Path
from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    import numpy as np

from ..rehearsal_mark import FORMAT, MANIFEST, rehearsal_manifest

REHEARSED = ("cifar10", "cifar100", "imagenette", "agnews", "sentlen")
IMAGENETTE_VAL = (387, 395, 357, 386, 409, 394, 389, 419, 399, 390)   # imagenette2's val, per class
Progress = Callable[[str, int, int], None]


def scaled_count(n: int, scale: float) -> int:
    return max(1, round(n * scale))


def _patterns(labels: np.ndarray, classes: int, h: int, w: int, rng: np.random.Generator) -> np.ndarray:
    """uint8 (N, h, w, 3): each label's colour and stripe orientation, with per-image phase,
    brightness and noise (deterministic given rng)."""
    import numpy as np

    n = len(labels)
    yy, xx = np.meshgrid(np.linspace(0, 1, h, dtype=np.float32), np.linspace(0, 1, w, dtype=np.float32),
                         indexing="ij")
    theta = np.pi * labels / classes
    freq = 3.0 + 5.0 * ((labels * 7) % classes) / classes
    phase = rng.uniform(0, 2 * np.pi, n).astype(np.float32)
    wave = np.sin(2 * np.pi * freq[:, None, None] * (np.cos(theta)[:, None, None] * xx + np.sin(theta)[:, None, None]
                                                      * yy) + phase[:, None, None])
    hue = 2 * np.pi * labels / classes
    colour = np.stack([np.cos(hue), np.cos(hue - 2.1), np.cos(hue + 2.1)], 1).astype(np.float32)  # (N, 3)
    base = 128 + 60 * colour[:, None, None, :] * (0.6 + 0.4 * wave[..., None])
    noise = rng.normal(0, 18, (n, h, w, 3)).astype(np.float32)
    bright = rng.uniform(-20, 20, (n, 1, 1, 1)).astype(np.float32)
    return np.clip(base + noise + bright, 0, 255).astype(np.uint8)


def _balanced(n: int, classes: int, rng: np.random.Generator) -> np.ndarray:
    import numpy as np

    labels = np.arange(n) % classes
    rng.shuffle(labels)
    return labels.astype(np.int64)


def _md5(path: Path) -> str:
    h = hashlib.md5()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _py2_pickle(obj, path: Path) -> None:
    """Pickle as the published CIFAR batches are: Python 2 pickles (protocol 2) whose strings,
    keys included, are Python 2 `str` (BINSTRING opcodes), which torchvision reads with
    encoding="latin1". Written to a temporary name, then renamed."""
    import io
    import struct

    class Py2Pickler(pickle._Pickler):
        dispatch = dict(pickle._Pickler.dispatch)

        def save_py2str(self, b: bytes) -> None:
            op = pickle.SHORT_BINSTRING + bytes([len(b)]) if len(b) < 256 else \
                pickle.BINSTRING + struct.pack("<i", len(b))
            self.write(op + b)
            self.memoize(b)

        dispatch[bytes] = save_py2str

    buf = io.BytesIO()
    Py2Pickler(buf, protocol=2).dump(obj)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_bytes(buf.getvalue())
    tmp.replace(path)


def write_cifar(root: Path, name: str, scale: float = 1.0, progress: Progress | None = None) -> dict:
    """torchvision's layout under root/<name>/: the python batches (CIFAR-10: data_batch_1..5,
    test_batch, batches.meta; CIFAR-100: train, test, meta), Python 2 pickles as the published
    ones: the images a uint8 array of rows of R, G, B planes. Returns {file: md5}."""
    import numpy as np

    rng = np.random.default_rng([FORMAT, REHEARSED.index(name)])
    classes = 10 if name == "cifar10" else 100
    n_train, n_test = scaled_count(50_000, scale), scaled_count(10_000, scale)
    folder = root / name / ("cifar-10-batches-py" if name == "cifar10" else "cifar-100-python")
    folder.mkdir(parents=True, exist_ok=True)

    def batch(n: int, label: str) -> dict:
        y = _balanced(n, classes, rng)
        # R, G, B planes; 5,000 images at a time, so 50,000 never hold float32 temporaries at once
        x = np.concatenate([_patterns(y[k:k + 5000], classes, 32, 32, rng).transpose(0, 3, 1, 2).reshape(-1, 3072)
                            for k in range(0, n, 5000)])
        names = [f"rehearsal_{label.replace(' ', '_')}_{k:05d}.png".encode() for k in range(n)]
        if name == "cifar10":
            return {b"batch_label": label.encode(), b"labels": y.tolist(), b"data": x, b"filenames": names}
        return {b"filenames": names, b"batch_label": label.encode(), b"fine_labels": y.tolist(),
                b"coarse_labels": (y // 5).tolist(), b"data": x}

    if name == "cifar10":
        per = [n_train // 5 + (k < n_train % 5) for k in range(5)]
        files = {f"data_batch_{k + 1}": batch(n, f"training batch {k + 1} of 5") for k, n in enumerate(per)}
        files["test_batch"] = batch(n_test, "testing batch 1 of 1")
        files["batches.meta"] = {b"label_names": [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog",
                                                  b"frog", b"horse", b"ship", b"truck"],
                                 b"num_cases_per_batch": per[0], b"num_vis": 3072}
    else:
        files = {"train": batch(n_train, "training batch 1 of 1"), "test": batch(n_test, "testing batch 1 of 1"),
                 "meta": {b"fine_label_names": [b"class%02d" % k for k in range(100)],
                          b"coarse_label_names": [b"super%02d" % k for k in range(20)]}}
    md5 = {}
    for k, (fname, obj) in enumerate(files.items()):
        _py2_pickle(obj, folder / fname)
        md5[fname] = _md5(folder / fname)
        if progress:
            progress(name, k + 1, len(files))
    return md5


def write_imagenette(root: Path, scale: float = 1.0, progress: Progress | None = None) -> dict:
    """imagenette2/{train,val}/<wnid>/*.JPEG at imagenette2's counts per class (scaled), about
    500 × 375 px, a tenth of them portrait. Returns the counts."""
    import numpy as np

    from PIL import Image

    from .imagenette import FOLDER_NAME, OFFICIAL_TRAIN_SIZES, WNIDS

    rng = np.random.default_rng([FORMAT, REHEARSED.index("imagenette")])
    counts = {"train": [scaled_count(n, scale) for n in OFFICIAL_TRAIN_SIZES],
              "val": [scaled_count(n, scale) for n in IMAGENETTE_VAL]}
    total, done = sum(map(sum, counts.values())), 0
    for split, per_class in counts.items():
        for c, (wnid, n) in enumerate(zip(WNIDS, per_class)):
            folder = root / FOLDER_NAME / split / wnid
            folder.mkdir(parents=True, exist_ok=True)
            for k in range(n):
                w, h = int(rng.integers(460, 541)), 375
                if rng.random() < 0.1:
                    w, h = h, w
                img = _patterns(np.array([c]), 10, h, w, rng)[0]
                stem = f"{wnid}_{k}" if split == "train" else f"ILSVRC2012_val_{c:02d}{k:06d}"
                Image.fromarray(img).save(folder / f"{stem}.JPEG", format="JPEG", quality=85)
                done += 1
                if progress and done % 500 == 0:
                    progress("imagenette", done, total)
    return {split: sum(v) for split, v in counts.items()}


# one small vocabulary per class (AG News: World, Sports, Business, Sci/Tech), and filler
_WORDS = (("minister", "election", "border", "treaty", "capital", "embassy", "protest", "summit"),
          ("match", "season", "coach", "goal", "tournament", "league", "striker", "champion"),
          ("shares", "profit", "market", "merger", "quarter", "investor", "revenue", "bank"),
          ("software", "chip", "research", "internet", "space", "device", "network", "scientists"))
_FILLER = ("the", "a", "of", "in", "on", "after", "with", "new", "says", "for", "to", "and", "its", "over")


def _sentence(rng: np.random.Generator, words, n: int) -> str:
    picks = [words[int(i)] if rng.random() < 0.4 else _FILLER[int(j)]
             for i, j in zip(rng.integers(0, len(words), n), rng.integers(0, len(_FILLER), n))]
    return " ".join(picks)


def write_agnews(root: Path, scale: float = 1.0) -> dict:
    """ag_news_csv/{train,test}.csv: no header, "class index","title","description", class 1-4."""
    import numpy as np

    import csv

    from .agnews import SIZES, SUBDIR

    rng = np.random.default_rng([FORMAT, REHEARSED.index("agnews")])
    folder = root / SUBDIR
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for split, size in SIZES.items():
        n = scaled_count(size, scale)
        labels = _balanced(n, 4, rng)
        with open(folder / f"{split}.csv", "w", newline="", encoding="utf-8") as f:
            w = csv.writer(f, quoting=csv.QUOTE_ALL)
            for y in labels:
                words = _WORDS[int(y)]
                w.writerow([int(y) + 1, _sentence(rng, words, int(rng.integers(4, 10))),
                            _sentence(rng, words, int(rng.integers(15, 40)))])
        out[split] = n
    return out


def write_sentlen(root: Path, scale: float = 1.0) -> dict:
    """senteval/probing/sentence_length.txt: '<tr|va|te>\\t<label>\\t<sentence>', the sentence's
    word count in its label's bin."""
    import numpy as np

    from .sentlen import BIN_EDGES, SIZES

    rng = np.random.default_rng([FORMAT, REHEARSED.index("sentlen")])
    path = root / "senteval" / "probing" / "sentence_length.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    vocab = tuple(w for ws in _WORDS for w in ws)
    out = {}
    with open(path, "w", encoding="utf-8") as f:
        for split, size in SIZES.items():
            n = scaled_count(size, scale)
            for y in _balanced(n, len(BIN_EDGES), rng):
                lo, hi = BIN_EDGES[int(y)]
                f.write(f"{split}\t{int(y)}\t{_sentence(rng, vocab, int(rng.integers(lo, hi + 1)))}\n")
            out[split] = n
    return out


def write_rehearsal(out: str | Path, *, scale: float = 1.0, datasets=REHEARSED,
                    progress: Progress | None = None) -> dict:
    """Write the rehearsal sets into `out` and its manifest; returns the manifest. Sets already
    there and not asked for are kept (the manifest lists each set with its scale). A set being
    written is in the manifest from the start, marked incomplete until done, so an interrupted
    write is never read as real data."""
    import shutil

    if not 0 < scale <= 1:
        raise ValueError(f"scale must be in (0, 1], got {scale}")
    unknown = sorted(set(datasets) - set(REHEARSED))
    if unknown:
        raise ValueError(f"unknown rehearsal dataset {unknown[0]!r}; known: {', '.join(REHEARSED)}")
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    manifest = rehearsal_manifest(root) or {"format": FORMAT, "datasets": {}}
    manifest["note"] = ("synthetic class-dependent data in the real formats: for rehearsals and timings, "
                        "not for accuracies")

    def save() -> None:
        tmp = root / (MANIFEST + ".tmp")
        tmp.write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
        tmp.replace(root / MANIFEST)

    for name in datasets:
        manifest["datasets"][name] = {"scale": scale, "complete": False}
        save()
        if name == "imagenette":  # a folder of files: another scale's images must not stay behind
            from .imagenette import FOLDER_NAME

            shutil.rmtree(root / FOLDER_NAME, ignore_errors=True)
            for cache in root.glob(f"{FOLDER_NAME}.lpdl-cache*"):
                cache.unlink()
        if name in ("cifar10", "cifar100"):
            written = {"md5": write_cifar(root, name, scale, progress)}
        elif name == "imagenette":
            written = write_imagenette(root, scale, progress)
        elif name == "agnews":
            written = write_agnews(root, scale)
        else:
            written = write_sentlen(root, scale)
        manifest["datasets"][name] = {**written, "scale": scale, "complete": True}
        save()
    if {"agnews", "sentlen"} & set(datasets):  # their paper cells load the DistilBERT checkpoint too
        from .rehearsal_hub import write_distilbert

        if progress:
            progress("distilbert-base-uncased (random weights)", 0, 1)
        manifest.setdefault("hub", {})["distilbert-base-uncased"] = write_distilbert(root)
        save()
    return manifest
