"""LR schedule and per-node sampler (docs/paper-vs-code.md, 'Optimizer, schedule, batch and seeds')
and layout views."""
import numpy as np
import pytest
import torch

from lpdl_core.data.sampler import NodeSampler
from lpdl_core.decentral.layout import Layout
from lpdl_core.decentral.partition import (KNOWN_CLASS_SIZES, dirichlet_partition, epoch_samples,
                                          labels_from_class_sizes, skew_partition)
from lpdl_core.training.schedule import ScheduleCfg, lr_at


def test_resnet_lr_trace():
    cfg = ScheduleCfg(kind="resnet")
    trace = [lr_at(e, 0.1, cfg) for e in range(200)]
    assert trace[0] == pytest.approx(0.01)
    assert all(v == pytest.approx(0.1) for v in trace[1:100])
    assert all(v == pytest.approx(0.01) for v in trace[100:150])
    assert all(v == pytest.approx(0.001) for v in trace[150:200])


def test_vgg_lr_trace():
    cfg = ScheduleCfg(kind="vgg")
    assert lr_at(0, 0.1, cfg) == pytest.approx(0.01)
    assert lr_at(29, 0.1, cfg) == pytest.approx(0.1)
    assert lr_at(30, 0.1, cfg) == pytest.approx(0.05)
    assert lr_at(199, 0.1, cfg) == pytest.approx(0.0015625)


def test_imagenette_multistep_and_validation():
    cfg = ScheduleCfg(kind="multistep", milestones=(50, 75))
    assert [lr_at(e, 0.1, cfg) for e in (0, 1, 49, 50, 75, 99)] == pytest.approx(
        [0.01, 0.1, 0.1, 0.01, 0.001, 0.001])
    with pytest.raises(ValueError):
        ScheduleCfg(kind="linear")
    with pytest.raises(ValueError):
        ScheduleCfg(kind="multistep", milestones=(75, 50))


@pytest.mark.parametrize("n, skew, iters", [(8, 0.0, 196), (8, 0.8, 196), (16, 0.9, 196)])
def test_cifar_iterations_per_epoch(n, skew, iters):
    labels = labels_from_class_sizes(KNOWN_CLASS_SIZES["cifar10"])
    s = NodeSampler(skew_partition(labels, n, skew), batch_size=256 // n)
    assert s.iters_per_epoch == iters


def test_imagenette_iterations_with_short_last_node():
    labels = labels_from_class_sizes(KNOWN_CLASS_SIZES["imagenette"])
    for n in (4, 8):
        parts = skew_partition(labels, n, 0.6)
        assert len(parts[-1]) < len(parts[0])
        s = NodeSampler(parts, batch_size=256 // n)
        assert s.iters_per_epoch == 37
        batches = list(s.epoch(0))
        assert len(batches) == 37 and all(b.shape[0] == n for b in batches)
        streams = torch.cat(batches, dim=1).numpy()
        for i, p in enumerate(parts):  # every own sample seen; only own samples
            assert set(streams[i]) == set(p.tolist())


def test_equal_sizes_each_sample_once_and_reshuffled():
    parts = [np.arange(i * 50, (i + 1) * 50) for i in range(4)]
    s = NodeSampler(parts, batch_size=16, seed=7)
    e0 = torch.cat(list(s.epoch(0)), dim=1).numpy()
    e1 = torch.cat(list(s.epoch(1)), dim=1).numpy()
    assert [b.shape[1] for b in s.epoch(0)] == [16, 16, 16, 2]
    for i in range(4):
        assert sorted(e0[i]) == list(parts[i])
    assert not np.array_equal(e0, e1)
    assert np.array_equal(e0, torch.cat(list(NodeSampler(parts, 16, seed=7).epoch(0)), 1).numpy())


def test_a_dirichlet_epoch_is_its_mean_shard_and_a_skew_epoch_its_largest():
    """Every Dirichlet split of a dataset trains the same steps on the same number of samples per
    epoch (its mean shard), whatever its alpha; the paper's skew split keeps its largest shard."""
    labels = labels_from_class_sizes((50,) * 10)
    skew = skew_partition(labels_from_class_sizes(KNOWN_CLASS_SIZES["imagenette"]), 8, 0.6)
    assert epoch_samples(skew) == max(len(p) for p in skew) > min(len(p) for p in skew)
    for alpha in (1.0, 0.1, 0.01):
        parts = dirichlet_partition(labels, 4, alpha, seed=3)
        sizes = [len(p) for p in parts]
        assert epoch_samples(parts, alpha) == 125 < max(sizes)  # 500 samples over 4 nodes
        s = NodeSampler(parts, batch_size=16, seed=7, epoch_len=epoch_samples(parts, alpha))
        assert s.iters_per_epoch == 8 and [b.shape[1] for b in s.epoch(0)] == [16] * 7 + [13]
        e0, e1 = (torch.cat(list(s.epoch(e)), 1).numpy() for e in (0, 1))
        for i, p in enumerate(parts):
            assert set(e0[i]) <= set(p.tolist())  # only own samples
            if len(p) >= 125:  # a larger shard: a fresh random 125 of its samples each epoch
                assert len(set(e0[i])) == 125 and (len(p) == 125 or set(e0[i]) != set(e1[i]))
            else:  # a smaller one: every own sample, topped up
                assert set(e0[i]) == set(p.tolist())
    with pytest.raises(ValueError, match="epoch_len must be >= 1"):
        NodeSampler([np.arange(3)], 2, epoch_len=0)


def test_layout_views_roundtrip():
    lay = Layout.from_shapes([(2, 3), (4,), (1, 2, 2)])
    assert lay.d == 14 and lay.numels == (6, 4, 4)
    flat = torch.arange(3 * 14.0).view(3, 14)
    views = lay.views(flat)
    assert [v.shape for v in views] == [(3, 2, 3), (3, 4), (3, 1, 2, 2)]
    views[1].zero_()  # views alias the flat buffer
    assert flat[:, 6:10].abs().sum() == 0
    assert torch.equal(lay.flatten(views, lead=1), flat)
