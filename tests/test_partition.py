"""Skew / Dirichlet partition: exact official histograms (docs/paper-vs-code.md, 'Data and the
skew partition')."""
from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from lpdl_core.decentral.partition import (
    KNOWN_CLASS_SIZES,
    dirichlet_partition,
    histograms,
    labels_from_class_sizes,
    partition_table,
    skew_partition,
    write_histograms,
)

CIFAR = labels_from_class_sizes(KNOWN_CLASS_SIZES["cifar10"])
NETTE = labels_from_class_sizes(KNOWN_CLASS_SIZES["imagenette"])


def _hist(labels, n, s, seed=1234):
    parts = skew_partition(labels, n, s, seed)
    return parts, histograms(parts, labels, num_classes=int(labels.max()) + 1)


def _assert_disjoint(parts, total):
    cat = np.concatenate(parts)
    assert cat.dtype == np.int64
    assert np.unique(cat).size == cat.size
    assert cat.min() >= 0 and cat.max() < total


def test_labels_from_class_sizes():
    lab = labels_from_class_sizes([2, 0, 3])
    assert lab.tolist() == [0, 0, 2, 2, 2]
    assert CIFAR.size == 50000 and NETTE.size == 9469
    assert KNOWN_CLASS_SIZES["cifar100"] == (500,) * 100


@pytest.mark.parametrize("n,s,size,unused", [
    (8, 0.0, 6250, 0), (8, 0.4, 6250, 0), (8, 1.0, 6250, 0),
    (8, 0.8, 6249, 8), (8, 0.9, 6249, 8),
    (16, 0.0, 3125, 0), (16, 0.4, 3125, 0), (16, 1.0, 3125, 0),
    (16, 0.8, 3124, 16), (16, 0.9, 3124, 16),
])
def test_cifar_sizes_and_unused(n, s, size, unused):
    parts, hist = _hist(CIFAR, n, s)
    assert [len(p) for p in parts] == [size] * n
    assert CIFAR.size - hist.sum() == unused
    _assert_disjoint(parts, CIFAR.size)


def test_cifar_n8_s08_histograms():
    _, h = _hist(CIFAR, 8, 0.8)
    assert h[0].tolist() == [4124, 1117, 142, 122, 99, 134, 105, 151, 122, 133]
    assert h[1].tolist() == [138, 3125, 2116, 125, 142, 120, 122, 117, 132, 112]
    assert h[2, :4].tolist() == [117, 144, 2128, 3132]
    assert h[3, :5].tolist() == [112, 111, 130, 1128, 4122]
    share = h.max(axis=1) / h.sum(axis=1)
    assert np.allclose(share[[0, 3, 4, 7]], 0.66, atol=0.005)
    assert np.allclose(share[[1, 2, 5, 6]], 0.50, atol=0.005)


def test_cifar_n8_s04_histograms():
    _, h = _hist(CIFAR, 8, 0.4)
    assert h[0].tolist() == [2365, 892, 394, 367, 371, 376, 379, 347, 361, 398]
    assert h[1, :4].tolist() == [390, 1860, 1391, 377]
    assert h[3, :5].tolist() == [376, 368, 373, 879, 2368]
    share = h.max(axis=1) / h.sum(axis=1)
    assert np.allclose(share[[0, 3, 4, 7]], 0.378, atol=0.005)
    assert np.allclose(share[[1, 2, 5, 6]], 0.30, atol=0.005)


def test_cifar_n8_s09_and_n16_s09():
    _, h = _hist(CIFAR, 8, 0.9)
    assert h[0].tolist() == [4560, 1190, 64, 67, 80, 56, 59, 51, 58, 64]
    _, h16 = _hist(CIFAR, 16, 0.9)
    assert h16[0].tolist() == [2843, 26, 36, 30, 46, 32, 28, 27, 28, 28]
    share = h16.max(axis=1) / h16.sum(axis=1)
    assert np.allclose(share[:5], [0.91, 0.55, 0.91, 0.73, 0.73], atol=0.005)


def test_cifar_s1_is_class_sorted():
    _, h = _hist(CIFAR, 8, 1.0)
    first = np.array([[5000, 1250, 0, 0, 0], [0, 3750, 2500, 0, 0],
                      [0, 0, 2500, 3750, 0], [0, 0, 0, 1250, 5000]])
    expected = np.zeros((8, 10), dtype=np.int64)
    expected[:4, :5] = first
    expected[4:, 5:] = first  # nodes 4-7: same pattern shifted by 5 classes
    assert np.array_equal(h, expected)


@pytest.mark.parametrize("n,s", [(8, 0.4), (8, 0.8), (8, 0.9), (16, 0.8), (16, 0.4)])
def test_sorted_part_is_s_times_s1_histogram(n, s):
    # The first int(s*N/n) indices of each node come from the sorted pool.
    parts = skew_partition(CIFAR, n, s)
    _, h1 = _hist(CIFAR, n, 1.0)
    take = int(1.0 / n * CIFAR.size * s)
    hs = histograms([p[:take] for p in parts], CIFAR, 10)
    assert np.array_equal(hs, (s * h1).astype(np.int64))
    if (n, s) == (8, 0.8):
        assert hs[0, 0] == 4000 and hs[0, 1] == 1000


@pytest.mark.parametrize("n,sizes,node0", [
    (4, [2366] * 3 + [2362], [688, 664, 375, 73, 100, 95, 99, 94, 90, 88]),
    (8, [1183] * 7 + [1179], [646, 187, 52, 33, 45, 54, 44, 39, 43, 40]),
])
def test_imagenette_s06(n, sizes, node0):
    parts, h = _hist(NETTE, n, 0.6)
    assert [len(p) for p in parts] == sizes
    assert h[0].tolist() == node0
    _assert_disjoint(parts, NETTE.size)


def test_determinism_and_seed():
    a = skew_partition(CIFAR, 8, 0.8, seed=1234)
    b = skew_partition(CIFAR, 8, 0.8, seed=1234)
    c = skew_partition(CIFAR, 8, 0.8, seed=1)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    take = 5000  # sorted-pool part is seed-independent; the random part is not
    assert all(np.array_equal(x[:take], y[:take]) for x, y in zip(a, c))
    assert not all(np.array_equal(x[take:], y[take:]) for x, y in zip(a, c))


@pytest.mark.parametrize("n,s", [(8, 0.8), (8, 0.4), (4, 0.6)])
def test_unsorted_labels_same_histograms(n, s):
    base = NETTE if n == 4 else CIFAR
    perm = np.random.default_rng(0).permutation(base.size)
    shuffled = base[perm]
    parts, h = _hist(shuffled, n, s)
    _, h_ref = _hist(base, n, s)
    assert np.array_equal(h, h_ref)
    _assert_disjoint(parts, base.size)


def test_skew_invalid_args():
    for bad_s in (-0.1, 1.1, float("nan"), "0.5", None):
        with pytest.raises(ValueError):
            skew_partition(CIFAR, 8, bad_s)
    for bad_n in (0, -1, 2.5, True):
        with pytest.raises(ValueError):
            skew_partition(CIFAR, bad_n, 0.5)
    with pytest.raises(ValueError):
        skew_partition(np.array([0, 1]), 3, 0.5)
    with pytest.raises(ValueError):
        skew_partition(np.array([0.5, 1.0]), 1, 0.5)
    with pytest.raises(ValueError):
        skew_partition(np.array([-1, 1]), 1, 0.5)


def test_dirichlet_cover_min_size_and_skew():
    small = dirichlet_partition(CIFAR, 8, 0.1, seed=3, min_size=10)
    large = dirichlet_partition(CIFAR, 8, 100.0, seed=3, min_size=10)
    for parts in (small, large):
        _assert_disjoint(parts, CIFAR.size)
        assert sum(len(p) for p in parts) == CIFAR.size
        assert min(len(p) for p in parts) >= 10
    def mean_share(parts):
        h = histograms(parts, CIFAR, 10)
        return float(np.mean(h.max(axis=1) / h.sum(axis=1)))
    assert mean_share(small) > mean_share(large) + 0.2
    again = dirichlet_partition(CIFAR, 8, 0.1, seed=3, min_size=10)
    assert all(np.array_equal(x, y) for x, y in zip(small, again))


def test_dirichlet_invalid_args():
    with pytest.raises(ValueError):
        dirichlet_partition(CIFAR, 8, 0.0)
    with pytest.raises(ValueError):
        dirichlet_partition(CIFAR, 0, 1.0)
    with pytest.raises(ValueError):
        dirichlet_partition(CIFAR[:20], 4, 1.0, min_size=6)
    with pytest.raises(ValueError):  # tiny alpha, many nodes, few samples: retries exhausted
        dirichlet_partition(labels_from_class_sizes([10, 10]), 10, 1e-3, min_size=2, max_tries=5)


def test_histograms_and_table():
    parts, h = _hist(CIFAR, 8, 0.8)
    assert h.shape == (8, 10) and h.dtype == np.int64
    assert histograms(parts, CIFAR, num_classes=12).shape == (8, 12)
    with pytest.raises(ValueError):
        histograms(parts, CIFAR, num_classes=5)
    table = partition_table(h, unused=8)
    lines = table.splitlines()
    assert len(lines) == 1 + 8 + 2
    assert lines[0].split()[0] == "node" and lines[0].split()[-1] == "max_share"
    assert len({len(line) for line in lines}) == 1  # aligned
    assert lines[1].split() == ["0", "4124", "1117", "142", "122", "99", "134", "105", "151",
                                "122", "133", "6249", "0.660"]
    assert lines[-2].split()[0] == "sum" and lines[-2].split()[-2] == "49992"
    assert lines[-1].split() == ["unused", "8"]
    assert len(partition_table(h).splitlines()) == 1 + 8 + 1


def test_write_histograms_roundtrip(tmp_path):
    _, h = _hist(NETTE, 4, 0.6)
    p_csv = tmp_path / "h.csv"
    write_histograms(h, p_csv, "csv")
    with open(p_csv, newline="") as f:
        rows = list(csv.reader(f))
    assert rows[0] == ["node"] + [f"c{j}" for j in range(10)] + ["total"]
    back = np.array([[int(v) for v in r[1:-1]] for r in rows[1:]])
    assert np.array_equal(back, h)
    assert [int(r[-1]) for r in rows[1:]] == [2366, 2366, 2366, 2362]
    p_json = tmp_path / "h.json"
    write_histograms(h, p_json, "json")
    obj = json.loads(p_json.read_text())
    assert obj["nodes"] == 4 and obj["classes"] == 10
    assert np.array_equal(np.array(obj["counts"]), h)
    assert obj["totals"] == [2366, 2366, 2366, 2362]
    write_histograms(h[:2], p_json, "json")  # overwrite in place
    assert json.loads(p_json.read_text())["nodes"] == 2
    assert sorted(x.name for x in tmp_path.iterdir()) == ["h.csv", "h.json"]  # no temp left
    with pytest.raises(ValueError):
        write_histograms(h, tmp_path / "h.txt", "txt")
