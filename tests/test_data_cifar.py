"""CIFAR loaders and safe download/extract, on fixtures written in the real on-disk format.

The real CIFAR batch files are Python 2 pickles: dict keys and strings are py2 `str`, which
`pickle.load(f, encoding="bytes")` shows as b'data', b'labels', ... and torchvision reads with
encoding="latin1". `_py2_pickle` writes exactly that (bytes -> BINSTRING opcodes).
"""
from __future__ import annotations

import io
import os
import pickle
import struct
import tarfile
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import torch

from lpdl_core.data.base import ChecksumError, DatasetMissing
from lpdl_core.data import cifar
from lpdl_core.data.cifar import load_cifar
from lpdl_core.data.download import extract_tar, fetch, md5sum


class _Py2Pickler(pickle._Pickler):
    """Writes `bytes` as Python 2 `str` (SHORT_BINSTRING / BINSTRING), like the real CIFAR files."""
    dispatch = dict(pickle._Pickler.dispatch)

    def save_py2str(self, obj):
        n = len(obj)
        if n < 256:
            self.write(pickle.SHORT_BINSTRING + bytes([n]) + obj)
        else:
            self.write(pickle.BINSTRING + struct.pack("<i", n) + obj)
        self.memoize(obj)

    dispatch[bytes] = save_py2str


def _py2_pickle(obj, path: Path) -> None:
    buf = io.BytesIO()
    _Py2Pickler(buf, protocol=2).dump(obj)
    path.write_bytes(buf.getvalue())


def _batch(rng, n, label_key: bytes, num_classes: int, name: bytes):
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    labels = rng.integers(0, num_classes, size=n).tolist()
    d = {b"batch_label": name, label_key: labels, b"data": data,
         b"filenames": [b"img_%d.png" % i for i in range(n)]}
    if label_key == b"fine_labels":
        d[b"coarse_labels"] = [v // 5 for v in labels]
    return d


CIFAR10_NAMES = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]


def make_cifar10(root: Path, n_per_batch=(3, 4, 2, 5, 3), n_test=4, seed=0):
    rng = np.random.default_rng(seed)
    folder = root / "cifar10" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    batches = []
    for i, n in enumerate(n_per_batch, 1):
        b = _batch(rng, n, b"labels", 10, b"training batch %d of 5" % i)
        _py2_pickle(b, folder / f"data_batch_{i}")
        batches.append(b)
    test = _batch(rng, n_test, b"labels", 10, b"testing batch 1 of 1")
    _py2_pickle(test, folder / "test_batch")
    _py2_pickle({b"label_names": CIFAR10_NAMES, b"num_cases_per_batch": 10000, b"num_vis": 3072},
                folder / "batches.meta")
    return folder, batches, test


def make_cifar100(root: Path, n_train=7, n_test=5, seed=1):
    rng = np.random.default_rng(seed)
    folder = root / "cifar100" / "cifar-100-python"
    folder.mkdir(parents=True)
    train = _batch(rng, n_train, b"fine_labels", 100, b"training batch 1 of 1")
    test = _batch(rng, n_test, b"fine_labels", 100, b"testing batch 1 of 1")
    _py2_pickle(train, folder / "train")
    _py2_pickle(test, folder / "test")
    _py2_pickle({b"fine_label_names": [b"class_%d" % i for i in range(100)],
                 b"coarse_label_names": [b"super_%d" % i for i in range(20)]}, folder / "meta")
    return folder, train, test


@pytest.fixture
def offline(monkeypatch):
    calls = []

    def fail(*a, **k):
        calls.append(a)
        raise urllib.error.URLError("no network (test)")

    monkeypatch.setattr(urllib.request, "urlopen", fail)
    return calls


def test_fixture_is_real_format(tmp_path):
    folder, batches, _ = make_cifar10(tmp_path)
    with open(folder / "data_batch_1", "rb") as f:
        d = pickle.load(f, encoding="bytes")
    assert set(d) >= {b"data", b"labels", b"batch_label", b"filenames"}
    assert d[b"data"].dtype == np.uint8 and d[b"data"].shape == (3, 3072)
    with open(folder / "batches.meta", "rb") as f:
        assert pickle.load(f, encoding="bytes")[b"label_names"][0] == b"airplane"


def test_cifar10_loads_exact_layout(tmp_path):
    folder, batches, test = make_cifar10(tmp_path)
    ds = load_cifar("cifar10", root=tmp_path, download=False, verify_md5=False)
    n = sum(len(b[b"labels"]) for b in batches)
    assert ds.x_train.shape == (n, 3, 32, 32) and ds.x_train.dtype == torch.uint8
    assert ds.x_test.shape == (4, 3, 32, 32) and ds.x_test.dtype == torch.uint8
    assert ds.y_train.dtype == torch.int64 and ds.y_test.dtype == torch.int64
    assert ds.x_train.device.type == "cpu" and ds.x_train.is_contiguous()
    assert ds.y_train.tolist() == sum((b[b"labels"] for b in batches), [])
    assert ds.y_test.tolist() == test[b"labels"]
    # pixel layout: row r of the file = 1024 R, 1024 G, 1024 B values, each row-major 32x32
    raw = np.concatenate([b[b"data"] for b in batches])
    for i in range(n):
        for c in range(3):
            expect = raw[i, c * 1024:(c + 1) * 1024].reshape(32, 32)
            assert np.array_equal(ds.x_train[i, c].numpy(), expect)
    assert ds.x_train[1, 2, 5, 7].item() == raw[1, 2 * 1024 + 5 * 32 + 7]
    assert np.array_equal(ds.x_test.reshape(4, -1).numpy(), test[b"data"])
    assert ds.num_classes == 10 and ds.class_names[0] == "airplane" and len(ds.class_names) == 10
    assert ds.mean == (0.4914, 0.4822, 0.4465) and ds.std == (0.2023, 0.1994, 0.2010)
    assert ds.augment == "crop-flip" and ds.image_size == 32 and ds.standin_for is None
    assert ds.kind == "image" and ds.name == "cifar10" and "0.2470" in ds.description


def test_cifar100_loads(tmp_path):
    folder, train, test = make_cifar100(tmp_path)
    ds = load_cifar("cifar100", root=tmp_path, download=False, verify_md5=False)
    assert ds.x_train.shape == (7, 3, 32, 32) and ds.x_test.shape == (5, 3, 32, 32)
    assert ds.y_train.tolist() == train[b"fine_labels"] and ds.y_test.tolist() == test[b"fine_labels"]
    assert np.array_equal(ds.x_train.reshape(7, -1).numpy(), train[b"data"])
    assert ds.num_classes == 100 and ds.class_names[3] == "class_3"
    assert ds.mean == (0.5071, 0.4865, 0.4409) and ds.std == (0.2673, 0.2564, 0.2762)


def test_data_root_env(tmp_path, monkeypatch):
    make_cifar10(tmp_path)
    monkeypatch.setenv("LPDL_DATA", str(tmp_path))
    assert load_cifar("cifar10", download=False, verify_md5=False).x_test.shape[0] == 4


@pytest.mark.parametrize("name,folder,md5", [
    ("cifar10", "cifar-10-batches-py", "c58f30108f718f92721af3b95e74349a"),
    ("cifar100", "cifar-100-python", "eb9058c3a382ffc7106e4002c42a8d85"),
])
def test_missing_offline_raises_dataset_missing(tmp_path, offline, name, folder, md5):
    with pytest.raises(DatasetMissing) as ei:
        load_cifar(name, root=tmp_path, download=True)
    msg = str(ei.value)
    assert str(tmp_path / name / folder) in msg and md5 in msg and "https://www.cs.toronto.edu/~kriz/" in msg
    assert offline, "urlopen was not called"
    assert not any(".part" in p.name for p in (tmp_path / name).iterdir())


def test_missing_no_download(tmp_path, offline):
    with pytest.raises(DatasetMissing, match="cifar-10-batches-py"):
        load_cifar("cifar10", root=tmp_path, download=False)
    assert not offline


def test_corrupt_batch_md5(tmp_path):
    make_cifar10(tmp_path)  # fixture files cannot match the published md5s
    with pytest.raises(ChecksumError, match=r"data_batch_1 is corrupt .*expected c99cafc152244af753f735de768cd75f"):
        load_cifar("cifar10", root=tmp_path, download=False)


def test_corrupt_batch_unreadable(tmp_path):
    folder, _, _ = make_cifar10(tmp_path)
    b = (folder / "data_batch_3").read_bytes()
    (folder / "data_batch_3").write_bytes(b[: len(b) // 2])
    with pytest.raises(ChecksumError, match="data_batch_3"):
        load_cifar("cifar10", root=tmp_path, download=False, verify_md5=False)


def _tar_of(folder: Path, archive: Path) -> None:
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(folder, arcname=folder.name)


def test_download_path_uses_fetch_and_extracts(tmp_path, monkeypatch):
    src = tmp_path / "src"
    folder, batches, _ = make_cifar10(src)
    archive = tmp_path / "served.tar.gz"
    _tar_of(folder, archive)
    spec = cifar.SPECS["cifar10"]
    monkeypatch.setitem(cifar.SPECS, "cifar10", type(spec)(**{**spec.__dict__, "url": archive.as_uri(),
                                                               "md5": md5sum(archive)}))
    root = tmp_path / "root"
    ds = load_cifar("cifar10", root=root, download=True, verify_md5=False)
    assert ds.x_train.shape[0] == sum(len(b[b"labels"]) for b in batches)
    assert (root / "cifar10" / "cifar-10-python.tar.gz").is_file()
    leftovers = [p.name for p in (root / "cifar10").iterdir() if p.name.startswith(".") or ".part" in p.name]
    assert not leftovers


# ---------------------------------------------------------------- fetch / extract


def test_fetch_success_file_url(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(os.urandom(3 << 20))
    dest = tmp_path / "out" / "file.tar.gz"
    got = fetch(src.as_uri(), dest, md5=md5sum(src), what="test file", fix_hint="")
    assert got == dest and dest.read_bytes() == src.read_bytes()
    assert [p.name for p in dest.parent.iterdir()] == ["file.tar.gz"]
    # second call only verifies
    assert fetch("file:///nonexistent", dest, md5=md5sum(src), what="test file", fix_hint="") == dest


def test_fetch_checksum_mismatch_leaves_nothing(tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(b"hello")
    dest = tmp_path / "out" / "file.bin"
    with pytest.raises(ChecksumError, match="expected 0123"):
        fetch(src.as_uri(), dest, md5="0123" + "0" * 28, what="test file", fix_hint="")
    assert list(dest.parent.iterdir()) == []


def test_fetch_network_failure(tmp_path, offline):
    dest = tmp_path / "file.bin"
    with pytest.raises(DatasetMissing) as ei:
        fetch("https://example.invalid/file.bin", dest, md5="ab" * 16, what="thing", fix_hint="HINT!")
    msg = str(ei.value)
    assert str(dest) in msg and "https://example.invalid/file.bin" in msg and "ab" * 16 in msg and "HINT!" in msg
    assert list(tmp_path.iterdir()) == []


def test_fetch_interrupted_cleans_up(tmp_path, monkeypatch):
    class Resp:
        def __init__(self):
            self.n = 0

        def read(self, k):
            self.n += 1
            if self.n > 2:
                raise KeyboardInterrupt
            return b"x" * 100

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

    monkeypatch.setattr(urllib.request, "urlopen", lambda *a, **k: Resp())
    with pytest.raises(KeyboardInterrupt):
        fetch("https://example.invalid/f", tmp_path / "f.bin", md5="0" * 32, what="f", fix_hint="")
    assert list(tmp_path.iterdir()) == []


def test_fetch_existing_corrupt(tmp_path, offline):
    dest = tmp_path / "file.bin"
    dest.write_bytes(b"corrupt")
    with pytest.raises(ChecksumError) as ei:
        fetch("https://example.invalid/file.bin", dest, md5="1" * 32, what="thing", fix_hint="")
    msg = str(ei.value)
    assert str(dest) in msg and "1" * 32 in msg and md5sum(dest) in msg and "elete" in msg
    assert not offline and dest.exists()


def _tar_with(archive: Path, name: str, data=b"x") -> None:
    with tarfile.open(archive, "w") as tf:
        info = tarfile.TarInfo(name)
        info.size = len(data)
        tf.addfile(info, io.BytesIO(data))


@pytest.mark.parametrize("bad", ["../evil.txt", "ok/../../evil.txt", "/abs/evil.txt"])
def test_extract_rejects_traversal(tmp_path, bad):
    archive = tmp_path / "a.tar"
    _tar_with(archive, bad)
    dest = tmp_path / "dest"
    with pytest.raises(ValueError, match="refusing"):
        extract_tar(archive, dest)
    assert list(dest.iterdir()) == [] and not (tmp_path / "evil.txt").exists()


def test_extract_places_and_refuses_overwrite(tmp_path):
    archive = tmp_path / "a.tar"
    _tar_with(archive, "top/inner.txt", b"content")
    dest = tmp_path / "dest"
    assert extract_tar(archive, dest) == [dest / "top"]
    assert (dest / "top" / "inner.txt").read_bytes() == b"content"
    with pytest.raises(FileExistsError):
        extract_tar(archive, dest)
    (dest / "top" / "inner.txt").write_bytes(b"stale")
    extract_tar(archive, dest, overwrite=True)
    assert (dest / "top" / "inner.txt").read_bytes() == b"content"
    assert [p.name for p in dest.iterdir()] == ["top"]
