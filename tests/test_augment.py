"""Batched on-device augmentation: exact references on seeded runs, torchvision agreement."""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch
import torch.nn.functional as F
import torchvision.transforms as T
import torchvision.transforms.v2.functional as TF

from lpdl_core.config import FIDELITY_CHOICES, Fidelity
from lpdl_core.data import augment as A
from lpdl_core.data import crops, packed
from lpdl_core.data.augment import (augment_batch, center_crop, normalize, random_crop_flip,
                                    random_resized_crop_flip, resize_shorter)
from lpdl_core.data.base import DataSplit
from lpdl_core.run_options import RunOptions

PACK_CPU = RunOptions(executor="batched", pack_size=4, device="cpu")

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


# ------------------------------------------------------------------ crop samplings (Fidelity.crop_sampling)

def _geometries(n, seed=0):
    """n (H, W) pairs: ordinary photos, tall and wide ones, and extreme strips (every attempt
    fails there, so the fallback runs)."""
    g = torch.Generator().manual_seed(seed)
    h = torch.randint(16, 400, (n,), generator=g)
    w = torch.randint(16, 400, (n,), generator=g)
    strip = torch.arange(n) % 7 == 0
    return torch.where(strip, torch.full_like(h, 20), h), torch.where(strip, torch.full_like(w, 400), w)


def _draws(n, seed):
    g = _gen(seed)
    return crops.draw_uniforms(n, lambda shape: torch.rand(shape, generator=g))


def _get_params_v021(img_h, img_w, scale, ratio, attempts, offsets):
    """torchvision 0.2.1's RandomResizedCrop.get_params, transcribed as plain Python; the
    random.uniform / random.random / random.randint calls take their uniforms from `attempts`
    ((u1, u2, u3) per attempt) and `offsets` ((v1, v2)): uniform(a, b) = a + (b - a) u and
    randint(a, b) = a + floor(u (b - a + 1))."""
    area = img_h * img_w
    for u1, u2, u3 in attempts:
        target_area = (scale[0] + (scale[1] - scale[0]) * u1) * area
        aspect_ratio = ratio[0] + (ratio[1] - ratio[0]) * u2
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if u3 < 0.5:
            w, h = h, w
        if w <= img_w and h <= img_h:
            i = math.floor(offsets[0] * (img_h - h + 1))
            j = math.floor(offsets[1] * (img_w - w + 1))
            return i, j, h, w, False
    side = min(img_h, img_w)  # fallback: the centred square
    return (img_h - side) // 2, (img_w - side) // 2, side, side, True


@pytest.mark.parametrize("scale", [(0.08, 1.0), (0.5, 2.5)])
def test_uniform_swap_boxes_equal_torchvision_021_transcription(scale):
    n, ratio = 3000, (3 / 4, 4 / 3)
    H, W = _geometries(n)
    top, left, h, w = A._rrc_params(n, H, W, scale, ratio, _gen(5), "cpu", how="uniform-swap")
    d = _draws(n, 5)  # the same generator, the same draws
    fallbacks = swapped_wins = 0
    for k in range(n):
        attempts = d.u[:, k].double().T.tolist()
        ref = _get_params_v021(int(H[k]), int(W[k]), scale, ratio, attempts, d.v[:, k].double().tolist())
        assert (int(top[k]), int(left[k]), int(h[k]), int(w[k])) == ref[:4], (k, int(H[k]), int(W[k]))
        fallbacks += ref[4]
        swapped_wins += (not ref[4]) and (int(h[k]) > int(w[k])) != (H[k] > W[k]).item()
    assert 100 < fallbacks < n - 100 and swapped_wins > 100  # both branches exercised


class _Feed:
    """Stands in for the `torch` module that current torchvision's RandomResizedCrop.get_params
    sees: its torch.empty(1).uniform_(a, b) and torch.randint(a, b, size) return values made from
    given uniforms (a + (b - a) u and a + floor(u (b - a))), and its float math is float64."""

    def __init__(self, uniforms, offsets):
        self._u, self._v = iter(uniforms), iter(offsets)
        self.exp = torch.exp

    def tensor(self, values):
        return torch.tensor(values, dtype=torch.float64)

    def log(self, t):
        return torch.tensor([math.log(float(v)) for v in t], dtype=torch.float64)

    def empty(self, *shape):
        feed = self

        class _Draw:
            def uniform_(self, a, b):
                return torch.tensor([float(a) + (float(b) - float(a)) * next(feed._u)], dtype=torch.float64)
        return _Draw()

    def randint(self, low, high, size):
        return torch.tensor([low + math.floor(next(self._v) * (high - low))])


@pytest.mark.parametrize("scale", [(0.08, 1.0), (0.5, 2.5)])
def test_log_uniform_boxes_equal_current_torchvision(monkeypatch, scale):
    """Current torchvision's own get_params code, fed the same uniforms, gives every box."""
    import torchvision.transforms.transforms as tvt

    n, ratio = 1500, [3 / 4, 4 / 3]
    H, W = _geometries(n, seed=1)
    top, left, h, w = A._rrc_params(n, H, W, scale, ratio, _gen(6), "cpu", how="log-uniform")
    d = _draws(n, 6)
    for k in range(n):
        u = d.u[:2, k].double().T.reshape(-1).tolist()  # u1, u2 of attempt 0, then attempt 1, ...
        monkeypatch.setattr(tvt, "torch", _Feed(u, d.v[:, k].double().tolist()))
        ref = T.RandomResizedCrop.get_params(torch.empty(1, int(H[k]), int(W[k])), list(scale), ratio)
        assert (int(top[k]), int(left[k]), int(h[k]), int(w[k])) == tuple(ref), (k, int(H[k]), int(W[k]))
    monkeypatch.undo()
    # and the two samplings differ: uniform-swap's ratio is uniform, its fallback a square
    t2, l2, h2, w2 = A._rrc_params(n, H, W, scale, ratio, _gen(6), "cpu", how="uniform-swap")
    assert not torch.equal(torch.stack([top, left, h, w]), torch.stack([t2, l2, h2, w2]))


def test_sampling_registry_is_the_fidelity_vocabulary():
    assert tuple(crops.SAMPLINGS) == FIDELITY_CHOICES["crop_sampling"]
    with pytest.raises(ValueError, match="unknown crop sampling 'x'"):
        crops.crop_boxes(_draws(2, 0), 10, 10, how="x")
    with pytest.raises(ValueError, match="crop_sampling 'x' is not one of"):
        dataclasses.replace(_split("rrc-flip"), crop_sampling="x")


def test_uniform_swap_swaps_half_the_time():
    """uniform-swap: r ~ U(3/4, 4/3) alone has P(r <= 1) = (1 - 3/4) / (4/3 - 3/4) = 3/7; the swap
    (w/h = 1/r half the time) makes it 1/2."""
    _, _, h, w = A._rrc_params(20000, 1000, 1000, (0.08, 0.2), (3 / 4, 4 / 3), _gen(2), "cpu", how="uniform-swap")
    assert abs((w <= h).double().mean().item() - 0.5) < 0.02


# ------------------------------------------------------------------ packed whole images

def _packed(sizes, short=16, long=28, seed=0):
    x = packed.empty(len(sizes), short, long)
    origs = []
    for i, (h, w) in enumerate(sizes):
        img = _imgs(1, h=h, w=w, seed=seed + i)[0]
        packed.put(x, i, img)
        origs.append(img)
    return x, origs


def test_packed_put_geometry_roundtrip():
    sizes = [(16, 16), (16, 24), (24, 16), (16, 28), (40, 16), (16, 33)]  # the last two longer than 28
    x, origs = _packed(sizes)
    assert x.shape == (6, 3, 17, 28) and x.dtype == torch.uint8
    H, W, tr = packed.geometry(x)
    assert H.tolist() == [16, 16, 24, 16, 28, 16] and W.tolist() == [16, 24, 16, 28, 16, 28]
    assert tr.tolist() == [False, False, True, False, True, False]
    for i, (img, (h, w)) in enumerate(zip(origs, sizes)):
        if max(h, w) <= 28:
            assert torch.equal(packed.image(x, i), img)
        else:  # centre-cropped to 28 along the long side, as CenterCrop
            assert torch.equal(packed.image(x, i), TF.center_crop(img, [min(h, 28), min(w, 28)]))
    assert (x[1, :, :16, 24:] == 0).all() and (x[0, 1:, 16] == 0).all()
    with pytest.raises(ValueError, match="shorter side 12, expected 16"):
        packed.put(x, 0, _imgs(1, h=12, w=20)[0])


@pytest.mark.parametrize("how", ["log-uniform", "uniform-swap"])
def test_packed_rrc_equals_torchvision_on_each_whole_image(how):
    sizes = [(16, 16), (16, 24), (24, 16), (16, 28), (20, 16), (16, 19)] * 4
    x, origs = _packed(sizes)
    out = random_resized_crop_flip(x, size=12, generator=_gen(9), sampling=how, packed=True)
    assert out.shape == (24, 3, 12, 12)
    g = _gen(9)
    H, W, _ = packed.geometry(x)
    top, left, h, w = A._rrc_params(24, H, W, (0.08, 1.0), (3 / 4, 4 / 3), g, "cpu", how=how)
    flip = torch.rand(24, generator=g) < 0.5
    for i, img in enumerate(origs):
        ref = TF.resized_crop(img.float() / 255, int(top[i]), int(left[i]), int(h[i]), int(w[i]), [12, 12],
                              antialias=True)
        torch.testing.assert_close(out[i], ref.flip(-1) if flip[i] else ref, atol=1e-5, rtol=0)
    # node-stacked leading dims and parts, as the executors pass them
    k = 4
    whole = random_resized_crop_flip(x.reshape(k, 6, *x.shape[1:]), size=12, generator=_gen(3), sampling=how,
                                     packed=True)
    for i in range(k):
        g = _gen(3)
        row = random_resized_crop_flip(x.reshape(k, 6, *x.shape[1:])[i:i + 1], size=12, generator=g,
                                       sampling=how, packed=True, part=(i, k))
        torch.testing.assert_close(row, whole[i:i + 1], rtol=0, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("how", ["log-uniform", "uniform-swap"])
def test_cuda_packed_matches_cpu(how):
    """A CPU generator drives CUDA data with the same draws: the same boxes, the same crops."""
    x, _ = _packed([(16, 16), (16, 24), (24, 16), (16, 28), (20, 16), (16, 19)] * 8)
    cpu = random_resized_crop_flip(x, size=12, generator=_gen(9), sampling=how, packed=True)
    cuda = random_resized_crop_flip(x.cuda(), size=12, generator=_gen(9), sampling=how, packed=True)
    assert cuda.is_cuda
    torch.testing.assert_close(cuda.cpu(), cpu, atol=1e-4, rtol=0)


# ------------------------------------------------------------------ the option reaches the augmentation

def test_fidelity_crop_sampling_reaches_augment_batch():
    from lpdl_core.data.registry import load_dataset

    base = load_dataset("digits", image_size=48, augment="rrc-flip")
    assert base.crop_sampling == "log-uniform"
    swap = load_dataset("digits", image_size=48, augment="rrc-flip",
                        crop_sampling=Fidelity(crop_sampling="uniform-swap").crop_sampling)
    assert swap.crop_sampling == "uniform-swap"
    xb = base.x_train[:64]
    a = augment_batch(xb, base, train=True, generator=_gen(1))
    b = augment_batch(xb, swap, train=True, generator=_gen(1))
    assert not torch.equal(a, b)
    ref = random_resized_crop_flip(xb, size=48, generator=_gen(1), sampling="uniform-swap")
    torch.testing.assert_close(b, normalize(ref, base.mean, base.std))


@pytest.mark.parametrize("packed_run", [False, True])
def test_runs_load_their_data_with_the_fidelity_crop_sampling(tmp_path, monkeypatch, packed_run):
    """run_cell and run_cells_packed hand Fidelity.crop_sampling to the dataset loader."""
    from lpdl_core.data import registry
    from lpdl_core.pipeline.cells.tables import cells_by_id, load_cells
    from lpdl_core.pipeline.run.runcell import run_cell
    from lpdl_core.pipeline.run.runpack import run_cells_packed

    seen = []

    class Stop(ValueError):
        pass

    def fake(name, *, offline=False, crop_sampling=None, **kw):
        seen.append(crop_sampling)
        raise Stop("stop before training")
    monkeypatch.setattr(registry, "load_dataset", fake)
    cells = cells_by_id(load_cells())
    ids = ["t2-resnet20-dring16-c90-s0.9-choco-int8", "t2-resnet20-dring16-c90-s0.9-choco-fp32"]
    fid = Fidelity(crop_sampling="uniform-swap")
    if packed_run:
        out = run_cells_packed([cells[i] for i in ids], lambda cid: str(tmp_path / cid), "mini", fidelity=fid,
                               options=PACK_CPU)
        assert all(isinstance(e, Stop) for e in out.values())
    else:
        with pytest.raises(Stop):
            run_cell(cells[ids[0]], tmp_path / "run", "mini", fidelity=fid, options=RunOptions(device="cpu"))
    assert seen and set(seen) == {"uniform-swap"}
