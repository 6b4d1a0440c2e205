"""One training run end to end on the data paths of issue 4: the digits stand-in with on-device
augmentation, host-resident data, a real-format CIFAR fixture, divergence reporting."""
import dataclasses

import pytest
from kill_helpers import Killed, kill_after_epoch
import torch
from torch import nn

from lpdl_core.data.registry import DATASETS, STANDINS, load_dataset
from lpdl_core.decentral.algorithms.base import GossipCfg
from lpdl_core.decentral.compress import CompressorCfg
from lpdl_core.decentral.engine import EngineCfg
from lpdl_core.decentral.optim import OptimCfg
from lpdl_core.decentral.topology import Topology
from lpdl_core.training.run_cfg import RunCfg
from lpdl_core.training.train import train


def small_cnn():
    return nn.Sequential(nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.ReLU(),
                         nn.Conv2d(8, 16, 3, stride=2, padding=1), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def subset(split, n_train=256, n_test=128):
    return dataclasses.replace(split, x_train=split.x_train[:n_train], y_train=split.y_train[:n_train],
                               x_test=split.x_test[:n_test], y_test=split.y_test[:n_test])


def _train(split, **run_kw):
    return train(small_cnn, split, topology=Topology(name="directed-ring", n=4),
                 gossip=GossipCfg(algorithm="choco", eta=0.5, compressor=CompressorCfg(kind="topk", ratio=0.9)),
                 optim_cfg=OptimCfg(), engine=EngineCfg(device="cpu"),
                 run=RunCfg(epochs=2, batch_size=16, lr=0.05, skew=0.8, **run_kw))


def test_digits_standin_device_and_host_paths_agree():
    split = subset(load_dataset("digits"))
    assert split.label == "digits (stand-in for cifar10)" and split.x_train.dtype == torch.uint8
    a = _train(split)
    b = _train(split, data_on="host")
    assert a.status == b.status == "ok" and a.epochs_done == 2
    assert a.final == b.final and a.curve == b.curve  # same data, same augmentation draws
    assert a.partition.shape == (4, 10) and a.partition.sum() <= 256
    assert len(a.curve) == 2 and {"mean_acc", "avg_model_acc", "consensus_distance"} <= set(a.curve[0])


def test_divergence_is_reported_not_raised():
    split = subset(load_dataset("digits"))
    res = train(small_cnn, split, topology=Topology(name="directed-ring", n=2), gossip=GossipCfg(),
                optim_cfg=OptimCfg(), engine=EngineCfg(device="cpu"),
                run=RunCfg(epochs=3, batch_size=16, lr=1e12, skew=0.0))
    assert res.status == "diverged" and res.diverged_at["epoch"] == 0
    assert res.epochs_done == 0


def test_registry_names():
    assert set(STANDINS) <= set(DATASETS)
    with pytest.raises(ValueError, match="unknown dataset"):
        load_dataset("mnist")


def test_real_format_cifar_fixture_trains(tmp_path):
    """The real CIFAR-10 loader (on a generated batch-file fixture) feeds the training loop."""
    from test_data_cifar import make_cifar10

    make_cifar10(tmp_path, n_per_batch=(8, 8, 8, 8, 8), n_test=8)
    split = load_dataset("cifar10", root=tmp_path, download=False, verify_md5=False)
    assert split.standin_for is None and split.augment == "crop-flip"
    res = train(small_cnn, split, topology=Topology(name="ring", n=2), gossip=GossipCfg(),
                optim_cfg=OptimCfg(), engine=EngineCfg(device="cpu"),
                run=RunCfg(epochs=1, batch_size=4, lr=0.01, skew=0.0))
    assert res.status == "ok" and res.partition.sum() == 40


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_text_standin_trains_tiny_distilbert(precision):
    """Sentlen stand-in (token ids from the offline MiniLM tokenizer) through a tiny DistilBERT."""
    from lpdl_core.models.transformer import SequenceClassifier, distilbert_classifier, tiny_distilbert_config

    split = subset(load_dataset("sentlen-standin"), n_train=96, n_test=48)
    assert split.kind == "text" and split.x_train.dtype == torch.int64 and split.num_classes == 6
    make = lambda: SequenceClassifier(distilbert_classifier(  # noqa: E731
        6, precision=precision, pretrained=None,
        config_overrides=tiny_distilbert_config(vocab_size=30522, num_labels=6)), pad_token_id=split.pad_id)
    res = train(make, split, topology=Topology(name="ring", n=3), gossip=GossipCfg(),
                optim_cfg=OptimCfg(), engine=EngineCfg(device="cpu"),
                run=RunCfg(epochs=1, batch_size=8, lr=0.01, skew=0.5))
    assert res.status == "ok" and res.partition.shape == (3, 6)
    assert 0.0 <= res.final["mean_acc"] <= 100.0


def test_save_run_writes_partition_with_the_run(tmp_path):
    import json

    from lpdl_core.pipeline.run.results import save_run

    split = subset(load_dataset("digits"), n_train=64, n_test=32)
    res = train(small_cnn, split, topology=Topology(name="directed-ring", n=2), gossip=GossipCfg(),
                optim_cfg=OptimCfg(), engine=EngineCfg(device="cpu"),
                run=RunCfg(epochs=1, batch_size=8, lr=0.01, skew=0.8))
    save_run(res, tmp_path / "run", config={"dataset": "digits", "skew": 0.8}, class_names=split.class_names)
    m = json.loads((tmp_path / "run/metrics.json").read_text())
    assert m["status"] == "ok" and m["config"]["skew"] == 0.8 and m["provenance"]["torch"]
    lines = (tmp_path / "run/partition.csv").read_text().splitlines()
    assert len(lines) == 3 and lines[0].startswith("node,") and lines[0].endswith(",total")
    assert sum(int(l.split(",")[-1]) for l in lines[1:]) == int(res.partition.sum())
    assert len((tmp_path / "run/curve.csv").read_text().splitlines()) == 2


def test_resume_from_checkpoint_equals_uninterrupted_run(tmp_path):
    """Kill after epoch 1 (simulated by a progress callback raising), rerun: identical metrics."""
    split = subset(load_dataset("digits"), n_train=96, n_test=32)
    kw = dict(topology=Topology(name="directed-ring", n=2),
              gossip=GossipCfg(algorithm="ds", eta=0.5, compressor=CompressorCfg(kind="randomk", ratio=0.5)),
              optim_cfg=OptimCfg(), engine=EngineCfg(device="cpu"),
              run=RunCfg(epochs=3, batch_size=16, lr=0.05, skew=0.8, final_gossip_rounds=2))
    full = train(small_cnn, split, **kw)

    ck = tmp_path / "ck.pt"
    with pytest.raises(Killed):
        train(small_cnn, split, **kw, checkpoint=ck, progress=kill_after_epoch(1))
    assert ck.exists() and not list(tmp_path.glob(".*tmp"))
    events = []
    resumed = train(small_cnn, split, **kw, checkpoint=ck, progress=events.append)
    assert events[0] == {"event": "resumed", "epoch": 2, "epochs": 3}
    assert resumed.final == full.final and resumed.curve == full.curve
    assert resumed.bytes_per_node == full.bytes_per_node

    # a checkpoint of other settings is set aside (kept) and the run starts from scratch
    other = dict(kw, run=RunCfg(epochs=1, batch_size=16, lr=0.1, skew=0.8))
    events = []
    train(small_cnn, split, **other, checkpoint=ck, progress=events.append)
    assert (events[0]["event"] == "checkpoint-set-aside"
            and events[0]["reason"].startswith("written for another run (run: "))
    assert len(list(tmp_path.glob("ck.pt.unusable-*"))) == 1
