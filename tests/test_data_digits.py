"""The digits stand-in for the paper's CNN datasets (scikit-learn load_digits, embedded)."""
import numpy as np
import pytest
import torch

from lpdl_core.data.base import DataSplit
from lpdl_core.data.digits import load, load_digits_standin


@pytest.fixture(scope="module")
def s32() -> DataSplit:
    return load_digits_standin()


def test_sizes_shapes_and_dtype(s32):
    assert s32.x_train.shape == (1437, 3, 32, 32) and s32.x_test.shape == (360, 3, 32, 32)
    assert s32.x_train.dtype == torch.uint8 and s32.y_train.dtype == torch.int64
    assert s32.kind == "image" and s32.num_classes == 10 and s32.image_size == 32
    assert s32.augment == "crop-flip" and s32.name == "digits"
    assert int(s32.x_train.max()) == 255 and int(s32.x_train.min()) == 0


def test_stratified_class_balance(s32):
    tr = torch.bincount(s32.y_train, minlength=10)
    te = torch.bincount(s32.y_test, minlength=10)
    assert (tr > 0).all() and (te > 0).all()
    total = tr + te
    # stratified: each class's test share is 20% up to rounding
    assert ((te.float() - 0.2 * total.float()).abs() <= 1.0).all()
    assert s32.class_sizes == tuple(tr.tolist())


def test_deterministic_by_seed():
    a, b, c = load_digits_standin(seed=3), load_digits_standin(seed=3), load_digits_standin(seed=4)
    assert torch.equal(a.x_train, b.x_train) and torch.equal(a.y_test, b.y_test)
    assert not torch.equal(a.y_train, c.y_train)


def test_nearest_upsampling_exact(s32):
    from sklearn.datasets import load_digits
    x = s32.x_train
    blocks = x.reshape(len(x), 3, 8, 4, 8, 4)
    assert (blocks == blocks[:, :, :, :1, :, :1]).all()  # every 4x4 block constant
    assert (x[:, :1] == x).all()  # grey replicated
    # the 8x8 content is the original pixels 0..16 scaled to 0..255
    src = np.rint(load_digits().images * (255 / 16)).astype(np.uint8)
    small = x[:, 0, ::4, ::4].numpy()
    rows = {r.tobytes() for r in src}
    assert all(im.tobytes() in rows for im in small[:50])


def test_mean_std_plausible(s32):
    x = s32.x_train.float() / 255
    m, sd = s32.mean, s32.std
    assert len(m) == 3 and len(sd) == 3 and m[0] == m[1] == m[2]
    assert 0.2 < m[0] < 0.4 and 0.3 < sd[0] < 0.45
    assert abs(m[0] - x.mean().item()) < 1e-4 and abs(sd[0] - x.std().item()) < 1e-3


def test_label_and_description_say_standin(s32):
    assert s32.standin_for == "cifar10"
    assert s32.label == "digits (stand-in for cifar10)"
    assert "STAND-IN" in s32.description and "load_digits" in s32.description
    assert "mirror" in s32.description


def test_224_variant():
    s = load_digits_standin(standin_for="imagenette", image_size=224)
    assert s.x_train.shape == (1437, 3, 224, 224) and s.x_test.shape == (360, 3, 224, 224)
    assert s.augment == "rrc-flip" and s.image_size == 224 and s.name == "digits-224"
    assert s.label == "digits-224 (stand-in for imagenette)"
    blocks = s.x_test[:8].reshape(8, 3, 8, 28, 8, 28)
    assert (blocks == blocks[:, :, :, :1, :, :1]).all()
    assert torch.equal(s.x_test[:8, :, ::28, ::28], load_digits_standin().x_test[:8, :, ::4, ::4])
    assert load_digits_standin(standin_for="imagenette").image_size == 224


def test_bad_size():
    with pytest.raises(ValueError):
        load_digits_standin(image_size=30)


def test_legacy_load_unchanged():
    s = load()
    assert s.x_train.shape == (1437, 1, 8, 8) and s.x_train.dtype == torch.float32
    assert abs(s.x_train.mean().item()) < 1e-4
