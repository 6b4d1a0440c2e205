"""Batched on-device augmentation: exact references on seeded runs, torchvision agreement."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms as T
import torchvision.transforms.v2.functional as TF

from lpdl_core.data import augment as A
from lpdl_core.data.augment import (augment_batch, center_crop, normalize, random_crop_flip,
                                    random_resized_crop_flip, resize_shorter)
from lpdl_core.data.base import DataSplit

MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)


def _imgs(n, c=3, h=32, w=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, c, h, w), generator=g, dtype=torch.uint8)


def _gen(seed=1, device="cpu"):
    return torch.Generator(device=device).manual_seed(seed)


def _split(augment="crop-flip", size=32):
    x = torch.zeros(2, 3, size, size, dtype=torch.uint8)
    y = torch.zeros(2, dtype=torch.int64)
    return DataSplit(name="t", kind="image", num_classes=10, x_train=x, y_train=y, x_test=x, y_test=y,
                     mean=MEAN, std=STD, augment=augment, image_size=size)


# ------------------------------------------------------------------ normalize

def test_normalize_matches_torchvision():
    img = _imgs(1, h=9, w=7)[0]
    hwc = img.permute(1, 2, 0).numpy()
    ref = T.Normalize(MEAN, STD)(T.ToTensor()(hwc))
    out = normalize(img, MEAN, STD)
    assert out.dtype == torch.float32 and out.shape == (3, 9, 7)
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(normalize(img.float() / 255, MEAN, STD), ref)
    batch = _imgs(6).reshape(2, 3, 3, 32, 32)
    assert normalize(batch, MEAN, STD).shape == (2, 3, 3, 32, 32)


# ------------------------------------------------------------------ crop + flip

def _crop_flip_reference(x, top, left, flip, padding=4):
    out = []
    for i in range(len(x)):
        p = F.pad(x[i], (padding,) * 4)
        img = TF.crop(p, int(top[i]), int(left[i]), x.shape[-2], x.shape[-1])
        out.append(TF.horizontal_flip(img) if flip[i] else img)
    return torch.stack(out)


def test_crop_flip_equals_explicit_reference():
    x = _imgs(64)
    out = random_crop_flip(x, padding=4, generator=_gen(7))
    assert out.shape == x.shape and out.dtype == torch.uint8
    top, left, flip = A._crop_flip_params(64, 4, 0.5, _gen(7), "cpu")  # same draws, same order
    assert torch.equal(out, _crop_flip_reference(x, top, left, flip))
    assert 0 < int(flip.sum()) < 64 and len(set(top.tolist())) > 3


def test_crop_flip_is_translated_copy_bruteforce():
    """Independent of the draw order: each output equals exactly one of the 81 x 2 candidates."""
    x = _imgs(24, h=12, w=10, seed=3)
    out = random_crop_flip(x, padding=4, generator=_gen(11))
    seen_flip = 0
    for i in range(len(x)):
        p = F.pad(x[i], (4,) * 4)
        hits = [(dy, dx, fl) for dy in range(9) for dx in range(9) for fl in (0, 1)
                if torch.equal(out[i], (lambda c: c.flip(-1) if fl else c)(p[:, dy:dy + 12, dx:dx + 10]))]
        assert len(hits) == 1, hits
        seen_flip += hits[0][2]
    assert 0 < seen_flip < len(x)


def test_crop_flip_statistics_and_determinism():
    x = _imgs(4000, h=8, w=8)
    _, _, flip = A._crop_flip_params(4000, 4, 0.5, _gen(5), "cpu")
    assert 0.46 < flip.float().mean().item() < 0.54
    top, left, _ = A._crop_flip_params(4000, 4, 0.5, _gen(5), "cpu")
    assert set(top.tolist()) == set(range(9)) and set(left.tolist()) == set(range(9))
    a = random_crop_flip(x, generator=_gen(5))
    assert torch.equal(a, random_crop_flip(x, generator=_gen(5)))
    assert not torch.equal(a, random_crop_flip(x, generator=_gen(6)))
    # zero padding only: a zero border appears in about 8/9 of the rows shifted in
    ones = torch.full((2000, 1, 8, 8), 255, dtype=torch.uint8)
    o = random_crop_flip(ones, generator=_gen(2))
    frac_zero = (o == 0).float().mean().item()
    assert 0.3 < frac_zero < 0.6  # E = 1 - (E[8 - |shift|] / 8)^2 with shift in -4..4: ~0.47


def test_crop_flip_leading_dims():
    x = _imgs(12).reshape(3, 4, 3, 32, 32)
    out = random_crop_flip(x, generator=_gen(9))
    assert out.shape == x.shape
    assert torch.equal(out.reshape(12, 3, 32, 32), random_crop_flip(x.reshape(12, 3, 32, 32), generator=_gen(9)))


def test_no_flip_no_padding_is_identity():
    x = _imgs(5)
    assert torch.equal(random_crop_flip(x, padding=0, flip_p=0.0, generator=_gen()), x)
    assert torch.equal(random_crop_flip(x, padding=0, flip_p=1.0, generator=_gen()), x.flip(-1))


# ------------------------------------------------------------------ random resized crop

def test_rrc_shape_dtype_determinism():
    x = _imgs(6, h=40, w=48).reshape(2, 3, 3, 40, 48)
    out = random_resized_crop_flip(x, size=24, generator=_gen(3))
    assert out.shape == (2, 3, 3, 24, 24) and out.dtype == torch.float32
    assert 0.0 <= out.min().item() and out.max().item() <= 1.0
    assert torch.equal(out, random_resized_crop_flip(x, size=24, generator=_gen(3)))


@pytest.mark.parametrize("size", [48, 20])  # upsampling and (antialiased) downsampling
def test_rrc_full_scale_equals_plain_resize(size):
    x = _imgs(4, h=32, w=32)
    out = random_resized_crop_flip(x, size=size, scale=(1.0, 1.0), ratio=(1.0, 1.0), flip_p=0.0, generator=_gen())
    ref = F.interpolate(x.float() / 255, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=0)
    if size > 32:  # upsampling: antialias is a no-op, plain bilinear
        plain = F.interpolate(x.float() / 255, size=(size, size), mode="bilinear", align_corners=False)
        torch.testing.assert_close(out, plain, atol=1e-5, rtol=0)


def test_rrc_matches_torchvision_resized_crop_per_image():
    x = _imgs(16, h=40, w=56, seed=4)
    out = random_resized_crop_flip(x, size=28, generator=_gen(8))
    g = _gen(8)
    top, left, h, w = A._rrc_params(16, 40, 56, (0.08, 1.0), (3 / 4, 4 / 3), g, "cpu")
    flip = torch.rand(16, generator=g) < 0.5
    for i in range(16):
        ref = TF.resized_crop(x[i].float() / 255, int(top[i]), int(left[i]), int(h[i]), int(w[i]), [28, 28],
                              antialias=True)
        ref = ref.flip(-1) if flip[i] else ref
        torch.testing.assert_close(out[i], ref, atol=1e-5, rtol=0)


def test_rrc_params_distribution_and_fallback():
    n, H, W = 20000, 64, 80
    top, left, h, w = A._rrc_params(n, H, W, (0.08, 1.0), (3 / 4, 4 / 3), _gen(1), "cpu")
    assert (h >= 1).all() and (w >= 1).all() and (top >= 0).all() and (left >= 0).all()
    assert (top + h <= H).all() and (left + w <= W).all()
    frac = (h * w).float() / (H * W)
    assert frac.min() > 0.07 and frac.max() <= 1.0
    ar = w.float() / h.float()
    assert ar.min() > 0.6 and ar.max() < 1.6
    # torchvision's own sampler, for comparison of the area distribution
    torch.manual_seed(0)
    tv = torch.tensor([T.RandomResizedCrop.get_params(torch.empty(1, H, W), [0.08, 1.0], [3 / 4, 4 / 3])
                       for _ in range(3000)])
    tv_frac = (tv[:, 2] * tv[:, 3]).float() / (H * W)
    assert abs(tv_frac.mean().item() - frac.mean().item()) < 0.02
    # impossible scale -> center crop with ratio clamped (torchvision fallback)
    top, left, h, w = A._rrc_params(5, 20, 40, (2.0, 3.0), (3 / 4, 4 / 3), _gen(), "cpu")
    assert h.tolist() == [20] * 5 and w.tolist() == [27] * 5 and top.tolist() == [0] * 5 and left.tolist() == [6] * 5
    tv = T.RandomResizedCrop.get_params(torch.empty(1, 20, 40), [2.0, 3.0], [3 / 4, 4 / 3])
    assert tuple(tv) == (0, 6, 20, 27)


# ------------------------------------------------------------------ resize / center crop

def test_center_crop_and_resize_shorter_match_torchvision():
    x = _imgs(3, h=37, w=50, seed=2)
    torch.testing.assert_close(center_crop(x, 24), TF.center_crop(x, [24]))
    r = resize_shorter(x, 20)
    ref = TF.resize(x, [20], antialias=True)
    assert r.shape == ref.shape == (3, 3, 20, 27) and r.dtype == torch.uint8
    assert (r.int() - ref.int()).abs().max().item() <= 1
    xf = x.float() / 255
    torch.testing.assert_close(resize_shorter(xf, 20), TF.resize(xf, [20], antialias=True), atol=1e-5, rtol=0)
    tall = _imgs(2, h=60, w=30)
    assert resize_shorter(tall, 16).shape == TF.resize(tall, [16], antialias=True).shape == (2, 3, 32, 16)


# ------------------------------------------------------------------ dispatch

def test_augment_batch_dispatch():
    x = _imgs(8).reshape(2, 4, 3, 32, 32)
    s = _split("crop-flip")
    test_out = augment_batch(x, s, train=False)
    assert test_out.dtype == torch.float32 and test_out.shape == x.shape
    torch.testing.assert_close(test_out, normalize(x, MEAN, STD))
    tr = augment_batch(x, s, train=True, generator=_gen(4))
    torch.testing.assert_close(tr, normalize(random_crop_flip(x, generator=_gen(4)), MEAN, STD))
    torch.testing.assert_close(augment_batch(x, _split("none"), train=True), normalize(x, MEAN, STD))
    big = _imgs(2, h=40, w=40)
    r = augment_batch(big, _split("rrc-flip", size=24), train=True, generator=_gen(4))
    assert r.shape == (2, 3, 24, 24) and r.dtype == torch.float32


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_semantics():
    x = _imgs(32, h=40, w=40).cuda()
    g = _gen(3, "cuda")
    out = random_crop_flip(x, generator=g)
    assert out.is_cuda and out.shape == x.shape
    top, left, flip = A._crop_flip_params(32, 4, 0.5, _gen(3, "cuda"), "cuda")
    assert torch.equal(out.cpu(), _crop_flip_reference(x.cpu(), top.cpu(), left.cpu(), flip.cpu()))
    r = random_resized_crop_flip(x, size=24, generator=_gen(3, "cuda"))
    assert r.is_cuda and r.shape == (32, 3, 24, 24)
    g2 = _gen(3, "cuda")
    t, l, h, w = A._rrc_params(32, 40, 40, (0.08, 1.0), (3 / 4, 4 / 3), g2, "cuda")
    fl = (torch.rand(32, generator=g2, device="cuda") < 0.5).cpu()
    for i in range(32):
        ref = TF.resized_crop(x[i].cpu().float() / 255, int(t[i]), int(l[i]), int(h[i]), int(w[i]), [24, 24],
                              antialias=True)
        torch.testing.assert_close(r[i].cpu(), ref.flip(-1) if fl[i] else ref, atol=1e-4, rtol=0)
    # a CPU generator also drives CUDA data (draws moved to the data's device)
    assert random_crop_flip(x, generator=_gen(3)).is_cuda
    n = augment_batch(x, _split(), train=True, generator=_gen(1, "cuda"))
    assert n.is_cuda and n.dtype == torch.float32


@pytest.mark.parametrize("kind", ["crop-flip", "rrc-flip"])
def test_a_part_is_those_rows_of_the_whole_batch(kind):
    """part=(i, k): node i's row augmented alone, with the whole (k, B, ...) batch's draws, equals
    row i of augmenting the whole batch, and leaves the generator where the whole batch does (the
    distributed executor's ranks)."""
    k, B = 4, 3
    x = torch.randint(0, 256, (k, B, 3, 32, 32), dtype=torch.uint8, generator=_gen(1))
    aug = (lambda t, g, part=None: random_crop_flip(t, generator=g, part=part)) if kind == "crop-flip" else \
        (lambda t, g, part=None: random_resized_crop_flip(t, size=24, generator=g, part=part))
    g_all = _gen(4)
    whole = aug(x, g_all)
    for i in range(k):
        g = _gen(4)
        row = aug(x[i:i + 1], g, part=(i, k))
        # the same per-image arithmetic; the resize's batched matmul may block differently by batch size
        torch.testing.assert_close(row, whole[i:i + 1], rtol=0, atol=0 if kind == "crop-flip" else 1e-6)
        assert torch.equal(g.get_state(), g_all.get_state())
    with pytest.raises(ValueError, match="part"):
        aug(x[:1], _gen(), part=(4, 4))
