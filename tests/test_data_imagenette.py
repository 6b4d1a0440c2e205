"""Imagenette loader on a tiny imagenette2 tree built in the real layout (no downloads)."""
import dataclasses
import hashlib
import socket
import tarfile

import numpy as np
import pytest
import torch
from PIL import Image

from lpdl_core.data import augment as A
from lpdl_core.data import imagenette as inet
from lpdl_core.data import imagenette_images as inet_images
from lpdl_core.data import packed
from lpdl_core.data.base import ChecksumError, DatasetMissing

SIZES = [(300, 200), (200, 300), (256, 256), (341, 256), (180, 240), (600, 200)]  # (w, h), mixed aspect ratios
N_TRAIN = sum(2 + c % 2 for c in range(10))
N_CAPPED = sum(1 for k in range(N_TRAIN) if k % len(SIZES) == 5)  # 600x200 -> 768x256, above 2:1


def _image(rng: np.random.Generator, w: int, h: int) -> Image.Image:
    yy, xx = np.mgrid[0:h, 0:w]
    base = np.stack([xx * 255 / w, yy * 255 / h, (xx + yy) * 127 / (w + h)], -1)
    noise = rng.normal(0, 20, (h, w, 3))
    return Image.fromarray(np.clip(base + noise, 0, 255).astype(np.uint8))


def _make_tree(top):
    """imagenette2/{train,val}/<wnid>/*.JPEG; class c has 2 + c % 2 train images, 2 val images."""
    rng = np.random.default_rng(0)
    k = 0
    for split, count in (("train", lambda c: 2 + c % 2), ("val", lambda c: 2)):
        for c, wnid in enumerate(inet.WNIDS):
            d = top / "imagenette2" / split / wnid
            d.mkdir(parents=True)
            for j in range(count(c)):
                w, h = SIZES[k % len(SIZES)]
                k += 1
                _image(rng, w, h).save(d / f"{wnid}_{j:05d}.JPEG", quality=90)
    # a grey JPEG (ImageFolder converts to RGB)
    Image.fromarray(rng.integers(0, 255, (230, 260), dtype=np.uint8), "L").save(
        top / "imagenette2" / "val" / inet.WNIDS[9] / "zz_grey.JPEG")


def _md5(p):
    return hashlib.md5(p.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def archive(tmp_path_factory):
    src = tmp_path_factory.mktemp("src")
    _make_tree(src)
    tgz = src / "imagenette2.tgz"
    with tarfile.open(tgz, "w:gz") as tf:
        tf.add(src / "imagenette2", arcname="imagenette2")
    return tgz


@pytest.fixture
def root(tmp_path, archive, monkeypatch):
    r = tmp_path / "data"
    r.mkdir()
    (r / "imagenette2.tgz").write_bytes(archive.read_bytes())
    monkeypatch.setattr(inet, "MD5", _md5(archive))
    return r


@pytest.fixture
def no_network(monkeypatch):
    def refuse(*a, **k):
        raise OSError("network disabled in test")
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    monkeypatch.setattr(socket.socket, "connect", refuse)


def test_extracts_from_archive_and_loads(root, no_network):
    s = inet.load_imagenette(root, download=False)
    assert (root / "imagenette2" / "train").is_dir() and (root / "imagenette2" / "val").is_dir()
    # whole Resize(256) images, packed: 257 rows (256 + the size header), long side <= 512
    assert s.x_train.shape == (N_TRAIN, 3, 257, 512) and s.x_train.dtype == torch.uint8
    assert s.train_layout == "packed" and s.crop_sampling == "log-uniform"
    assert s.extras["train_long_capped"] == N_CAPPED and s.extras["train_long_side"] == 512
    assert f"{N_CAPPED} image(s) wider than that" in s.description
    assert s.x_test.shape == (21, 3, 224, 224) and s.x_test.dtype == torch.uint8
    assert s.y_train.tolist() == [c for c in range(10) for _ in range(2 + c % 2)]
    assert s.y_test.tolist() == [c for c in range(10) for _ in range(2)] + [9]
    assert s.class_names[0] == "tench" and s.class_names[9] == "parachute"
    assert s.mean == (0.485, 0.456, 0.406) and s.std == (0.229, 0.224, 0.225)
    assert s.augment == "rrc-flip" and s.image_size == 224 and s.standin_for is None
    assert s.label == "imagenette"
    assert "WARNING" in s.description and "963" in s.description  # tiny tree != official sizes
    assert s.extras["warnings"]


def test_transforms_match_official_pil_and_torchvision_v2(root):
    from torchvision.transforms import v2
    import torchvision.transforms as T

    s = inet.load_imagenette(root, download=False)
    val = inet.list_split(root / "imagenette2" / "val")[0]
    train = inet.list_split(root / "imagenette2" / "train")[0]
    official = T.Compose([T.Resize(256), T.CenterCrop(224), T.PILToTensor()])  # on PIL, as ImageFolder
    official_train = T.Compose([T.Resize(256), T.PILToTensor()])  # the whole image
    tv_test = v2.Compose([v2.Resize(256), v2.CenterCrop(224)])  # on the decoded uint8 tensor
    tv_train = v2.Resize(256)

    def capped(img):  # long side above 512: centre-cropped to 512 when stored
        return v2.functional.center_crop(img, [min(img.shape[-2], 512), min(img.shape[-1], 512)])
    stored = [packed.image(s.x_train, i) for i in range(len(train))]
    for xs, paths, pil_tf, tv_tf in ((s.x_test, val, official, tv_test),
                                     (stored, train, lambda im: capped(official_train(im)),
                                      lambda t: capped(tv_train(t)))):
        for i, p in enumerate(paths):
            with Image.open(p) as im:
                rgb = im.convert("RGB")
            assert torch.equal(xs[i], pil_tf(rgb)), p
            tensor = torch.from_numpy(np.asarray(rgb).copy()).permute(2, 0, 1)
            diff = (xs[i].int() - tv_tf(tensor).int()).abs()
            assert diff.max() <= 2, (p, diff.max())
    assert {tuple(x.shape[-2:]) for x in stored} == {(256, 384), (384, 256), (256, 256), (256, 341),
                                                     (341, 256), (256, 512)}


def test_cache_written_and_reused(root, monkeypatch):
    a = inet.load_imagenette(root, download=False)
    cache = inet.cache_path(root, 256)
    assert cache.is_file() and not a.extras["from_cache"]
    assert cache.name == "imagenette2.lpdl-cache.whole256x512.val256-224.pt"  # not the old train256 name
    assert not list(root.glob("*.tmp"))

    def boom(path):
        raise AssertionError("decoded although the cache is valid")
    monkeypatch.setattr(inet_images, "decode", boom)
    b = inet.load_imagenette(root, download=False)
    assert b.extras["from_cache"]
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.x_test, b.x_test)
    assert torch.equal(a.y_train, b.y_train) and torch.equal(a.y_test, b.y_test)
    # a different stored train size is a different cache; a changed listing invalidates
    with pytest.raises(AssertionError, match="decoded"):
        inet.load_imagenette(root, download=False, train_size=240)
    extra = root / "imagenette2" / "train" / inet.WNIDS[0] / "new.JPEG"
    extra.write_bytes((root / "imagenette2" / "val" / inet.WNIDS[0]).iterdir().__next__().read_bytes())
    with pytest.raises(AssertionError, match="decoded"):
        inet.load_imagenette(root, download=False)


def test_train_size_option(root):
    s = inet.load_imagenette(root, download=False, train_size=240, use_cache=False)
    assert s.x_train.shape[1:] == (3, 241, 480) and s.x_test.shape[1:] == (3, 224, 224)
    assert min(packed.image(s.x_train, 0).shape[-2:]) == 240
    assert not inet.cache_path(root, 240).exists()


def test_progress_callback(root):
    seen = []
    inet.load_imagenette(root, download=False, progress=lambda *a: seen.append(a), use_cache=False)
    assert ("train", 25, 25) in seen and ("val", 21, 21) in seen


@pytest.mark.parametrize("how", ["wrong-md5", "truncated"])
def test_corrupt_archive_checksum_error(root, monkeypatch, no_network, how):
    tgz = root / "imagenette2.tgz"
    if how == "wrong-md5":
        monkeypatch.setattr(inet, "MD5", "0" * 32)
    else:
        tgz.write_bytes(tgz.read_bytes()[: tgz.stat().st_size // 2])
    with pytest.raises(ChecksumError, match="md5"):
        inet.load_imagenette(root, download=True)
    assert not (root / "imagenette2").exists()
    assert [p.name for p in root.iterdir()] == ["imagenette2.tgz"]


def test_missing_offline(tmp_path, no_network):
    root = tmp_path / "empty"
    root.mkdir()
    for download in (False, True):
        with pytest.raises(DatasetMissing) as e:
            inet.load_imagenette(root, download=download)
        msg = str(e.value)
        assert str(root / "imagenette2.tgz") in msg and inet.MD5 in msg
        assert str(root / "imagenette2") + "/{train,val}" in msg
    assert not (root / "imagenette2").exists()
    assert list(root.iterdir()) == []  # no partial download left behind


def test_data_root_from_env(root, monkeypatch):
    monkeypatch.setenv("LPDL_DATA", str(root))
    s = inet.load_imagenette(None, download=False)
    assert len(s.y_test) == 21


def test_wrong_classes_rejected(tmp_path):
    for split in ("train", "val"):
        (tmp_path / "imagenette2" / split / "n00000000").mkdir(parents=True)
    with pytest.raises(ValueError, match="wnids"):
        inet.load_imagenette(tmp_path, download=False)


def test_old_cache_versions_are_not_reused(root, monkeypatch):
    a = inet.load_imagenette(root, download=False)
    cache = inet.cache_path(root, 256)
    d = torch.load(cache, weights_only=True)
    d["version"] = 2  # a centre-square (version 2) cache under this name is rebuilt
    torch.save(d, cache)
    b = inet.load_imagenette(root, download=False)
    assert not b.extras["from_cache"] and torch.equal(a.x_train, b.x_train)


def _strips(w=400, h=300, strip=40) -> Image.Image:
    """A 4:3 photo: dark grey middle, pure red outer strips `strip` px wide at both ends of the long
    side (34 px each after Resize(256) to 341x256: outside the central 256x256 square)."""
    a = np.full((h, w, 3), 40, np.uint8)
    a[:, :strip] = a[:, w - strip:] = (255, 0, 0)
    return Image.fromarray(a)


@pytest.mark.parametrize("how", ["log-uniform", "uniform-swap"])
def test_training_crops_reach_the_outer_strips(root, how):
    """The stored image is the whole Resize(256) image, so RandomResizedCrop boxes reach its
    outer strips (never in the old centre-256 square), and each augmented crop is torchvision's
    resized_crop of the official Resize(256) image at its box."""
    import torchvision.transforms as T
    import torchvision.transforms.v2.functional as TF

    inet.ensure_extracted(root, download=False)
    first = inet.list_split(root / "imagenette2" / "train")[0][0]
    _strips().save(first, quality=95)
    s = dataclasses.replace(inet.load_imagenette(root, download=False, use_cache=False), crop_sampling=how)
    official = T.Compose([T.Resize(256), T.PILToTensor()])(_strips_rgb(first))
    assert official.shape == (3, 256, 341) and torch.equal(packed.image(s.x_train, 0), official)
    # the old storage, Resize(256) -> CenterCrop(256), has none of the red strips
    assert not _red(inet.resize_center_crop(_strips_rgb(first), 256, 256)[None].float() / 255).any()

    n = 120
    xb = s.x_train[torch.zeros(n, dtype=torch.long)].reshape(4, n // 4, *s.x_train.shape[1:])  # node-stacked
    out = A.augment_batch(xb, s, train=True, generator=torch.Generator().manual_seed(3)).reshape(n, 3, 224, 224)
    img = out * torch.tensor(s.std).view(3, 1, 1) + torch.tensor(s.mean).view(3, 1, 1)
    g = torch.Generator().manual_seed(3)
    top, left, h, w = A._rrc_params(n, 256, 341, (0.08, 1.0), (3 / 4, 4 / 3), g, "cpu", how=how)
    flip = torch.rand(n, generator=g) < 0.5
    assert (left < 34).sum() > n // 10 and (left + w > 341 - 34).sum() > n // 10  # both strips reached
    hit = _red(img).flatten(1).any(1)
    assert hit.float().mean() > 0.2
    for i in range(0, n, 11):
        ref = TF.resized_crop(official.float() / 255, int(top[i]), int(left[i]), int(h[i]), int(w[i]), [224, 224],
                              antialias=True)
        torch.testing.assert_close(img[i], ref.flip(-1) if flip[i] else ref, atol=1e-4, rtol=0)


def _strips_rgb(path):
    with Image.open(path) as im:
        return im.convert("RGB")


def _red(x: torch.Tensor) -> torch.Tensor:
    """(N, H, W) mask of clearly red pixels of float images (N, 3, H, W) in [0, 1]."""
    return (x[:, 0] > 0.7) & (x[:, 1] < 0.3) & (x[:, 2] < 0.3)
