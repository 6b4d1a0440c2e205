"""Rehearsal data (`lpdl rehearsal-data`): the real formats, read by the unchanged loaders, at the
paper's full sizes (scale 1) or a scaled-down copy; learnable; never taken for real data (the
loaders label it, a run's identity says so, and a run on it is another run than one on real data)."""
import json
import pickle
from pathlib import Path

import pytest
import torch

from lpdl_core.cli import main
from lpdl_core.data.rehearsal import REHEARSED, scaled_count, write_rehearsal
from lpdl_core.errors import RunMismatch
from lpdl_core.pipeline.cells.tables import load_cells
from lpdl_core.pipeline.run.runstore import check_identity, run_data, run_identity
from lpdl_core.rehearsal_mark import MANIFEST, REHEARSAL, data_kind

SCALE = 0.004   # CIFAR: 200 + 40 images; Imagenette: 3 or 4 train images a class; AG News: 480 rows


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("rehearsal")
    assert main(["-q", "rehearsal-data", "--out", str(root), "--scale", str(SCALE)]) == 0
    return root


def test_at_scale_one_each_split_has_the_real_datasets_size():
    """The counts the writer uses at scale 1 are the loaders' own official sizes."""
    from lpdl_core.data.agnews import SIZES as AGNEWS
    from lpdl_core.data.imagenette import OFFICIAL_TRAIN_SIZES, OFFICIAL_VAL_SIZE
    from lpdl_core.data.rehearsal import IMAGENETTE_VAL
    from lpdl_core.data.sentlen import SIZES as SENTLEN

    assert [scaled_count(n, 1.0) for n in OFFICIAL_TRAIN_SIZES] == list(OFFICIAL_TRAIN_SIZES)
    assert sum(IMAGENETTE_VAL) == OFFICIAL_VAL_SIZE
    assert {k: scaled_count(v, 1.0) for k, v in AGNEWS.items()} == {"train": 120_000, "test": 7_600}
    assert {k: scaled_count(v, 1.0) for k, v in SENTLEN.items()} == {"tr": 100_000, "va": 10_000, "te": 10_000}
    assert scaled_count(50_000, 1.0) == 50_000 and scaled_count(10_000, 1.0) == 10_000


def test_the_unchanged_loaders_read_every_set_and_label_it(rehearsal):
    from lpdl_core.data.registry import load_dataset

    for name, classes, n_train, size in (("cifar10", 10, 200, 32), ("cifar100", 100, 200, 32)):
        split = load_dataset(name, root=rehearsal, offline=True)
        assert tuple(split.x_train.shape) == (n_train, 3, size, size) and len(split.x_test) == 40
        assert split.x_train.dtype == torch.uint8 and split.num_classes == classes
        assert split.extras["rehearsal"] is True and split.description.startswith("REHEARSAL DATA")
    from lpdl_core.data.imagenette import OFFICIAL_TRAIN_SIZES

    im = load_dataset("imagenette", root=rehearsal, offline=True)
    assert torch.bincount(im.y_train, minlength=10).tolist() == [scaled_count(n, SCALE) for n in OFFICIAL_TRAIN_SIZES]
    assert tuple(im.x_test.shape[1:]) == (3, 224, 224) and im.extras["rehearsal"] is True
    from lpdl_core.data.agnews import read_csv
    from lpdl_core.data.sentlen import BIN_EDGES, read_senteval_tsv

    texts, labels = read_csv(rehearsal / "ag_news_csv" / "train.csv")
    assert len(texts) == 480 and sorted(set(labels)) == [0, 1, 2, 3]
    splits = read_senteval_tsv(rehearsal / "senteval" / "probing" / "sentence_length.txt", len(BIN_EDGES))
    assert {k: len(v[0]) for k, v in splits.items()} == {"tr": 400, "va": 40, "te": 40}
    for sentence, y in zip(*splits["tr"]):  # each sentence's word count is in its label's bin
        lo, hi = BIN_EDGES[y]
        assert lo <= len(sentence.split()) <= hi


def test_the_cifar_batches_have_the_published_files_structure(rehearsal, tmp_path):
    """Key for key and type for type as the loader's own fixture of the published Python 2
    pickles (tests/test_data_cifar.py), read as the real files read: encoding="bytes"."""
    from test_data_cifar import make_cifar10, make_cifar100

    make_cifar10(tmp_path)
    make_cifar100(tmp_path)

    def shape(path: Path) -> dict:
        with open(path, "rb") as f:
            d = pickle.load(f, encoding="bytes")
        return {k: (type(v).__name__, getattr(v, "dtype", None), getattr(v, "ndim", None),
                    type(v[0]).__name__ if isinstance(v, list) else None) for k, v in d.items()}

    for sub, files in (("cifar10/cifar-10-batches-py", ("data_batch_1", "test_batch", "batches.meta")),
                       ("cifar100/cifar-100-python", ("train", "test", "meta"))):
        for f in files:
            assert shape(rehearsal / sub / f) == shape(tmp_path / sub / f), f


def test_the_images_are_learnable_and_deterministic(rehearsal, tmp_path):
    """A nearest-class-mean classifier on raw pixels is far above chance (10 %) on the held-out
    split: each class has its own pattern. The same call writes the same bytes."""
    from lpdl_core.data.registry import load_dataset

    split = load_dataset("cifar10", root=rehearsal, offline=True)
    x, y = split.x_train.flatten(1).float(), split.y_train
    means = torch.stack([x[y == c].mean(0) for c in range(10)])
    pred = torch.cdist(split.x_test.flatten(1).float(), means).argmin(1)
    assert (pred == split.y_test).float().mean() > 0.5
    again = write_rehearsal(tmp_path, scale=SCALE, datasets=("cifar10",))
    first = json.loads((rehearsal / MANIFEST).read_text())
    assert again["datasets"]["cifar10"]["md5"] == first["datasets"]["cifar10"]["md5"]


def test_a_folder_of_other_files_is_refused_and_a_subset_keeps_the_rest(tmp_path, capsys):
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "cifar10").mkdir()
    assert main(["rehearsal-data", "--out", str(tmp_path / "real")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no lpdl-rehearsal.json" in err[0]
    out = tmp_path / "r"
    write_rehearsal(out, scale=SCALE, datasets=("sentlen",))
    write_rehearsal(out, scale=SCALE, datasets=("agnews",))
    m = json.loads((out / MANIFEST).read_text())
    assert sorted(m["datasets"]) == ["agnews", "sentlen"] and all(d["complete"] for d in m["datasets"].values())
    assert set(REHEARSED) >= set(m["datasets"])


def test_a_set_being_written_is_already_rehearsal_data(tmp_path, monkeypatch):
    """Interrupted while writing: the manifest names the set (incomplete), so nothing reads the
    half-written files as real data."""
    import lpdl_core.data.rehearsal as rh

    def fail(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(rh, "write_agnews", fail)
    with pytest.raises(KeyboardInterrupt):
        write_rehearsal(tmp_path, scale=SCALE, datasets=("agnews",))
    m = json.loads((tmp_path / MANIFEST).read_text())
    assert m["datasets"]["agnews"]["complete"] is False
    assert data_kind("agnews", tmp_path) == REHEARSAL and data_kind("cifar10", tmp_path) is None


def test_a_paper_run_on_rehearsal_data_is_another_run(rehearsal, tmp_path):
    """run_data: 'rehearsal' for a paper-profile cell whose dataset the root holds as rehearsal
    data, None for real data and for the mini profile (embedded stand-ins). The identity of a
    run on real data has no 'data' key (so no finished run changes), and one run is never
    accepted for the other."""
    cell = next(c for c in load_cells(tables=["table2"]) if c.dataset == "cifar10")
    assert run_data(cell, "paper", rehearsal) == REHEARSAL
    assert run_data(cell, "paper", tmp_path) is None and run_data(cell, "mini", rehearsal) is None
    real = run_identity(cell, profile="paper", seed=1, fidelity={})
    fake = run_identity(cell, profile="paper", seed=1, fidelity={}, data=run_data(cell, "paper", rehearsal))
    assert "data" not in real and fake == {**real, "data": REHEARSAL}
    with pytest.raises(RunMismatch, match="data 'rehearsal' \\(asked: 'real'\\)"):
        check_identity("m.json", {"identity": fake}, real)
    with pytest.raises(RunMismatch, match="data 'real' \\(asked: 'rehearsal'\\)"):
        check_identity("m.json", {"identity": real}, fake)
    assert run_data(cell, "paper", tmp_path / "nothing") is None  # no data root at all: real data


@pytest.mark.slow
def test_the_paper_profile_trains_a_cell_on_rehearsal_data_through_snakemake(tmp_path):
    """`snakemake --configfile config/paper.yaml` with data_root at a scaled-down rehearsal set:
    the download rule verifies it (the manifest's checksums), the train job reads it offline with
    the unchanged loader, the run says `data: rehearsal` in its identity, and aggregate and the
    report follow. One Table 3 cell, cut to 1 epoch in the cells CSV (the machinery is under test)."""
    import csv

    from repo_copy import copy_repo, small_paper_dir, snakemake_on_rehearsal

    repo = copy_repo(tmp_path / "repo")
    small_paper_dir(repo / "small", n=1, table="table3")
    table = repo / "small" / "table3.csv"
    rows = list(csv.DictReader(table.open()))
    rows[0]["epochs"] = "1"
    with table.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    p = snakemake_on_rehearsal(repo, tmp_path / "data", "threads_per_job=2")
    assert p.returncode == 0, p.stderr[-3000:]
    cell = load_cells(repo / "small", tables=["table3"])[0].cell_id
    m = json.loads((repo / f"results/paper/runs/{cell}/seed1234/metrics.json").read_text())
    assert m["status"] == "ok" and m["epochs_done"] == 1 and m["identity"]["data"] == REHEARSAL
    assert (repo / "results/paper/tables/table3.csv").is_file()
    runs = list(csv.DictReader((repo / "results/paper/runs.csv").open()))
    assert [r["data"] for r in runs if r["cell_id"] == cell] == [REHEARSAL]
    html = (repo / "report/paper/report.html").read_text()
    assert "trained on rehearsal data" in html


def test_the_text_cells_load_the_rehearsal_checkpoint_not_the_hub(rehearsal, tmp_path):
    """With a text set comes hub/distilbert-base-uncased: DistilBERT's architecture (transformers'
    defaults are distilbert-base-uncased's) with seeded random weights, and a WordPiece tokenizer of
    the same vocabulary size. A paper text cell on a rehearsal root plans it (tokenizer and weights,
    nothing to fetch); on a real root it plans the hub checkpoint."""
    from transformers import AutoConfig, AutoTokenizer

    from lpdl_core.config import Fidelity
    from lpdl_core.pipeline.recipe.plan import PRETRAINED_TEXT, plan_cell
    from lpdl_core.rehearsal_mark import rehearsal_model

    m = json.loads((rehearsal / MANIFEST).read_text())
    local = rehearsal_model(PRETRAINED_TEXT, rehearsal)
    assert local == str((rehearsal / m["hub"][PRETRAINED_TEXT]["path"]).resolve())
    cfg = AutoConfig.from_pretrained(local)
    assert (cfg.model_type, cfg.n_layers, cfg.n_heads, cfg.dim, cfg.hidden_dim, cfg.vocab_size) == \
        ("distilbert", 6, 12, 768, 3072, 30522)
    tok = AutoTokenizer.from_pretrained(local)
    assert len(tok) == cfg.vocab_size and tok.pad_token_id == 0
    assert tok("The Markets")["input_ids"] == tok("the markets")["input_ids"]  # uncased
    cell = next(c for c in load_cells(tables=["table5"]) if c.dataset == "agnews")
    plan = plan_cell(cell, "paper", seed=1, fidelity=Fidelity(), data_root=str(rehearsal))
    assert plan.dataset_kwargs["tokenizer"] == local and plan.hub_models == ()
    real = plan_cell(cell, "paper", seed=1, fidelity=Fidelity(), data_root=str(tmp_path))
    assert real.dataset_kwargs["tokenizer"] == PRETRAINED_TEXT and real.hub_models == (PRETRAINED_TEXT,)
    assert rehearsal_model(PRETRAINED_TEXT, tmp_path) is None


def test_runs_csv_says_which_data_a_run_trained_on(rehearsal):
    """runs.csv's `data` column comes from the run's identity: "rehearsal" or "real"."""
    from lpdl_core.pipeline.aggregation.tidy import RUN_COLUMNS, run_row

    cell = next(c for c in load_cells(tables=["table2"]) if c.dataset == "cifar10")
    real = run_identity(cell, profile="paper", seed=1, fidelity={})
    fake = {**real, "data": run_data(cell, "paper", rehearsal)}
    final = {"final": {"mean_acc": 50.0}}
    assert "data" in RUN_COLUMNS
    assert run_row(cell, 1, "paper", {**final, "identity": fake}, 10)["data"] == REHEARSAL
    assert run_row(cell, 1, "paper", {**final, "identity": real}, 10)["data"] == "real"
