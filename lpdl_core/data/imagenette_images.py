"""Imagenette's images as the official ImageFolder + torchvision transforms read them: PIL
decoding, torchvision Resize (shorter side, bilinear, antialiased on the PIL image), and the two
stores imagenette.py keeps: CenterCrop'ed squares (val) and whole resized images, packed
(packed.py; train). Decoding runs on a thread pool; `progress(split, done, total)` reports it.
"""
from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

Progress = Callable[[str, int, int], None]  # (split, done, total)


def decode(path: Path):
    """Decode one image exactly as torchvision's ImageFolder default loader does:
    PIL `Image.open(path).convert("RGB")` (grey and CMYK JPEGs become RGB)."""
    from PIL import Image
    with Image.open(path) as im:
        return im.convert("RGB")


def resize_shorter_side(img, resize: int):
    """torchvision Resize(resize) (shorter side, bilinear with antialias -- PIL's resampling on a
    PIL image, as in the official pipeline); returns uint8 (3, H', W'), min(H', W') = resize.
    Accepts a PIL image or a uint8 (3, H, W) tensor."""
    from torchvision.transforms.v2 import functional as F
    img = F.resize(img, [resize], interpolation=F.InterpolationMode.BILINEAR, antialias=True)
    return img if isinstance(img, torch.Tensor) else F.pil_to_tensor(img)


def resize_center_crop(img, resize: int, crop: int) -> torch.Tensor:
    """Resize(resize) then CenterCrop(crop); returns uint8 (3, crop, crop)."""
    from torchvision.transforms.v2 import functional as F
    return F.center_crop(resize_shorter_side(img, resize), [crop, crop])


def resized_long_side(path: Path, resize: int) -> int:
    """The long side Resize(resize) gives the image at path, from its header (no decoding):
    int(resize * long / short), torchvision's rule."""
    from PIL import Image
    with Image.open(path) as im:
        w, h = im.size
    return int(resize * max(w, h) / min(w, h))


def _run(paths: list[Path], work: Callable[[int], object], split: str, progress: Progress | None,
         workers: int) -> list:
    if progress is not None:
        progress(split, 0, len(paths))
    out = []
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        for done, r in enumerate(pool.map(work, range(len(paths))), 1):
            out.append(r)
            if progress is not None and (done % 256 == 0 or done == len(paths)):
                progress(split, done, len(paths))
    return out


def decode_all(paths: list[Path], resize: int, crop: int, split: str,
               progress: Progress | None, workers: int) -> torch.Tensor:
    """Resize(resize) -> CenterCrop(crop) of every image: uint8 (N, 3, crop, crop)."""
    out = torch.empty((len(paths), 3, crop, crop), dtype=torch.uint8)

    def work(i: int) -> None:
        out[i] = resize_center_crop(decode(paths[i]), resize, crop)

    _run(paths, work, split, progress, workers)
    return out


def decode_whole(paths: list[Path], resize: int, split: str, progress: Progress | None,
                 workers: int, cap_ratio: int) -> tuple[torch.Tensor, int]:
    """Resize(resize) of every image, packed (packed.py) with L = min(cap_ratio x resize, the
    longest resized side); returns it and how many images were centre-cropped to L."""
    from . import packed
    with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
        longest = max(pool.map(lambda p: resized_long_side(p, resize), paths), default=resize)
    out = packed.empty(len(paths), resize, min(cap_ratio * resize, longest))
    capped = _run(paths, lambda i: packed.put(out, i, resize_shorter_side(decode(paths[i]), resize)),
                  split, progress, workers)
    return out, sum(capped)
