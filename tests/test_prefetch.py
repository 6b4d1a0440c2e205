"""Prefetch, then offline jobs: `lpdl prefetch` (lpdl_core.pipeline.workflow.prefetch) fetches and verifies what
the cells' runs load through the loaders' own paths; train jobs run offline (`lpdl train
--offline`, HF_HUB_OFFLINE=1) behind the workflow's download rule.

Only the network edge is replaced: dataset URLs by file:// URLs of fixture archives written in the
real format (tests/test_data_cifar.py, tests/test_data_imagenette.py), the hub snapshot by a tiny
DistilBERT and tokenizer saved locally and laid out as the Hugging Face cache lays out a download.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import urllib.request
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
from repo_copy import ROOT, copy_repo
from test_data_cifar import _tar_of, make_cifar10
from test_data_imagenette import _make_tree
from test_data_text import AG_TEST, AG_TRAIN, SENTLEN_LINES, _write_sentlen

from lpdl_core.cli import main
from lpdl_core.config import DATASETS, PAPER_DATASETS, STANDIN_DATASETS
from lpdl_core.data import cifar
from lpdl_core.pipeline.workflow import prefetch as pf
from lpdl_core.data import imagenette as inet
from lpdl_core.data.download import md5sum
from lpdl_core.pipeline.cells.tables import PAPER_DIR, load_cells

BIN = Path(sys.executable).parent
REPO = "distilbert-base-uncased"


def _cells(**match):
    return [c for c in load_cells() if all(getattr(c, k) == v for k, v in match.items())]


def _serve(monkeypatch, spec_key: str, archive: Path, md5: str | None = None) -> None:
    """CIFAR's published URL -> the fixture archive (file://), its md5 -> the fixture's."""
    spec = cifar.SPECS[spec_key]
    monkeypatch.setitem(cifar.SPECS, spec_key, type(spec)(**{**spec.__dict__, "url": archive.as_uri(),
                                                             "md5": md5 or md5sum(archive)}))


@pytest.fixture
def env(monkeypatch):
    """The hub-offline variables as found, restored afterwards (lpdl train --offline sets them)."""
    for k in pf.OFFLINE_ENV:
        monkeypatch.setenv(k, "")
        monkeypatch.delenv(k)


@pytest.fixture
def urlopen_calls(monkeypatch):
    """Every urlopen call, recorded on top of the real one (file:// fixtures still work)."""
    calls, real = [], urllib.request.urlopen

    def spy(req, *a, **k):
        calls.append(getattr(req, "full_url", req))
        return real(req, *a, **k)

    monkeypatch.setattr(urllib.request, "urlopen", spy)
    return calls


@pytest.fixture
def cifar_archive(tmp_path, monkeypatch):
    """A CIFAR-10 archive in the real format served from a file:// URL; torchvision's published
    per-file md5s replaced by the fixture's, so the loader's every check runs."""
    from torchvision.datasets import CIFAR10

    folder, _, _ = make_cifar10(tmp_path / "src")
    archive = tmp_path / "served" / "cifar-10-python.tar.gz"
    archive.parent.mkdir()
    _tar_of(folder, archive)
    _serve(monkeypatch, "cifar10", archive)
    md5 = {f.name: md5sum(f) for f in folder.iterdir()}
    monkeypatch.setattr(CIFAR10, "train_list", [[f, md5[f]] for f, _ in CIFAR10.train_list])
    monkeypatch.setattr(CIFAR10, "test_list", [[f, md5[f]] for f, _ in CIFAR10.test_list])
    monkeypatch.setattr(CIFAR10, "meta", {**CIFAR10.meta, "md5": md5[CIFAR10.meta["filename"]]})
    return archive


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """An empty HF cache in tmp_path; the hub download -> a tiny DistilBERT + tokenizer saved
    locally, placed as a real download places it (refs/main -> snapshots/<commit>/)."""
    import huggingface_hub.constants as constants
    from transformers import DistilBertForSequenceClassification, DistilBertTokenizerFast

    from lpdl_core.models.transformer import tiny_distilbert_config

    cache, tiny = tmp_path / "hf" / "hub", tmp_path / "tiny"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    words = "the a of to and in is was it on for he said that with new two one".split()
    tiny.mkdir()
    (tiny / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n")
    DistilBertTokenizerFast(vocab_file=str(tiny / "vocab.txt")).save_pretrained(tiny)
    DistilBertForSequenceClassification(tiny_distilbert_config(vocab_size=len(words) + 5)).save_pretrained(tiny)
    state = SimpleNamespace(cache=cache, calls=[], drop=())

    def download(repo):
        state.calls.append(repo)
        commit = "0123456789abcdef0123456789abcdef01234567"
        top = cache / f"models--{repo.replace('/', '--')}"
        shutil.copytree(tiny, top / "snapshots" / commit, dirs_exist_ok=True,
                        ignore=lambda folder, names: [n for n in names if n in state.drop])
        (top / "refs").mkdir(exist_ok=True)
        (top / "refs" / "main").write_text(commit)
        return top / "snapshots" / commit

    monkeypatch.setattr(pf, "download_snapshot", download)
    return state


def test_cifar_prefetch_lands_verified_in_the_data_root_and_a_second_run_only_verifies(
        tmp_path, cifar_archive, urlopen_calls):
    root = tmp_path / "data"
    cells = _cells(dataset="cifar10", model="resnet20")
    m = pf.prefetch(cells, "paper", data_root=str(root))
    (entry,) = m["datasets"]
    folder = root / "cifar10" / "cifar-10-batches-py"
    assert (entry["name"], entry["fetched"], entry["cells"]) == ("cifar10", True, len(cells))
    assert entry["folder"] == str(folder) and md5sum(entry["archive"]) == entry["archive_md5"] == md5sum(cifar_archive)
    assert entry["files_md5"] == {f.name: md5sum(f) for f in folder.iterdir()} and len(entry["files_md5"]) == 7
    assert urlopen_calls == [cifar_archive.as_uri()] and m["hub"] == [] and m["data_root"] == str(root.resolve())
    assert not [p for p in root.rglob("*") if ".part" in p.name or p.name.startswith(".extract")]
    stamp = {p: p.stat().st_mtime_ns for p in root.rglob("*")}

    again = pf.prefetch(cells, "paper", data_root=str(root))
    assert urlopen_calls == [cifar_archive.as_uri()]  # no second download
    assert again["datasets"][0]["fetched"] is False and again["datasets"][0]["files_md5"] == entry["files_md5"]
    assert {p: p.stat().st_mtime_ns for p in root.rglob("*")} == stamp and "nothing fetched" in again["summary"]


def test_a_corrupt_archive_is_refused_in_one_line_and_leaves_nothing(tmp_path, cifar_archive, monkeypatch, capsys):
    good = md5sum(cifar_archive)
    bad = tmp_path / "bad.tar.gz"
    bad.write_bytes(cifar_archive.read_bytes()[:-100] + b"\0" * 100)
    _serve(monkeypatch, "cifar10", bad, md5=good)
    root, out = tmp_path / "data", tmp_path / "manifest.json"
    rc = main(["prefetch", "--table", "table2", "--data-root", str(root), "--out", str(out)])
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("lpdl: ")]
    assert rc == 2 and len(err) == 1 and err[0].startswith("lpdl prefetch: error: CIFAR-10 archive")
    assert f"expected {good}" in err[0] and "deleted" in err[0]
    assert not [p for p in root.rglob("*") if p.is_file()] and not out.exists()


def test_the_manifest_lists_exactly_what_the_paper_cells_load_and_distilbert_loads_offline(
        tmp_path, cifar_archive, hub, monkeypatch, env):
    """table1 loads all four paper datasets and DistilBERT: every one fetched or verified through
    its loader, the hub model left loadable in a fresh process with HF_HUB_OFFLINE=1."""
    root = tmp_path / "data"
    _make_tree(tmp_path / "inet")
    inet_tgz = tmp_path / "served" / "imagenette2.tgz"
    with tarfile.open(inet_tgz, "w:gz") as tf:
        tf.add(tmp_path / "inet" / "imagenette2", arcname="imagenette2")
    monkeypatch.setattr(inet, "URL", inet_tgz.as_uri())
    monkeypatch.setattr(inet, "MD5", md5sum(inet_tgz))
    (root / "ag_news_csv").mkdir(parents=True)
    (root / "ag_news_csv" / "train.csv").write_text(AG_TRAIN)
    (root / "ag_news_csv" / "test.csv").write_text(AG_TEST)
    _write_sentlen(root / "senteval" / "probing" / "sentence_length.txt")
    out = tmp_path / "manifest.json"

    assert main(["prefetch", "--table", "table1", "--data-root", str(root), "--out", str(out)]) == 0
    m = json.loads(out.read_text())
    cells = load_cells(tables=["table1"])
    loads = Counter(c.dataset for c in cells)  # what the cells name, independently of the plans
    assert {e["name"]: e["cells"] for e in m["datasets"]} == dict(loads) and m["embedded"] == []
    assert [(e["name"], e["cells"]) for e in m["hub"]] == [(REPO, sum(c.model == "distilbert" for c in cells))]
    by = {e["name"]: e for e in m["datasets"]}
    assert (by["imagenette"]["train"], by["imagenette"]["test"]) == (25, 21) and by["imagenette"]["fetched"]
    assert by["sentlen"]["train"] == sum(s == "tr" for s, _, _ in SENTLEN_LINES) and by["agnews"]["test"] == 2
    assert by["agnews"]["tokenizer"] == REPO and (root / "cache" / "tokens").is_dir()  # token cache filled
    assert hub.calls == [REPO] and Path(m["hub"][0]["snapshot"]).is_dir() and m["hf_hub_cache"] == str(hub.cache)
    assert {"config.json", "model.safetensors", "vocab.txt", "tokenizer_config.json"} <= set(m["hub"][0]["files"])

    # what a train job does, in a fresh process: hub access off, local files only
    code = ("from transformers import AutoTokenizer\n"
            "from lpdl_core.models.transformer import distilbert_classifier\n"
            f"tok = AutoTokenizer.from_pretrained({REPO!r}, local_files_only=True)\n"
            f"model = distilbert_classifier(4, pretrained={REPO!r})\n"
            "print(tok('the new one')['input_ids'], model.config.dim)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                       env={**os.environ, **pf.OFFLINE_ENV, "HF_HUB_CACHE": str(hub.cache)})
    assert p.returncode == 0 and p.stdout.strip().endswith(" 64"), p.stderr[-2000:]

    assert main(["prefetch", "--table", "table1", "--data-root", str(root)]) == 0
    assert hub.calls == [REPO]  # the second run found the snapshot in the cache


def test_a_hub_snapshot_that_does_not_load_is_refused_then_fetched_again(tmp_path, hub, env, capsys):
    """Verification builds the model the way the run will: weights missing from the download is a
    one-line error; a cached snapshot that does not load is downloaded again."""
    hub.drop = ("model.safetensors",)
    args = ["prefetch", "--table", "table5", "--data-root", str(tmp_path / "data")]
    assert main(args) == 2 and hub.calls == [REPO]
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("lpdl: ")]
    assert len(err) == 1 and "cannot load pretrained DistilBERT weights" in err[0], err
    hub.drop = ()
    with pytest.raises(Exception, match="AG News not found"):  # the model loads now; the data is missing
        pf.prefetch(load_cells(tables=["table5"]), "paper", data_root=str(tmp_path / "data"))
    assert hub.calls == [REPO, REPO] and (pf.cached_snapshot(REPO) / "model.safetensors").is_file()


def test_needs_follow_plan_cell_for_every_paper_and_mini_cell():
    cells = load_cells()
    paper = pf.needs(cells, "paper")
    assert {n.name: len(n.cells) for n in paper if n.kind == "dataset"} == dict(Counter(c.dataset for c in cells))
    assert [(n.kind, n.name) for n in paper if n.kind == "hub"] == [("hub", REPO)]
    mini = pf.needs(cells, "mini")
    assert {n.kind for n in mini} == {"embedded"} and {n.name for n in mini} <= set(STANDIN_DATASETS)
    assert set(PAPER_DATASETS) | set(STANDIN_DATASETS) == set(DATASETS)


def test_mini_prefetch_fetches_nothing_and_imports_no_hub_or_vision_stack():
    code = ("import sys, json, io, contextlib\nfrom lpdl_core.cli import main\nbuf = io.StringIO()\n"
            "with contextlib.redirect_stdout(buf):\n    assert main(['-q', 'prefetch', '--profile', 'mini']) == 0\n"
            "m = json.loads(buf.getvalue())\n"
            "print(m['summary'], sorted({e['name'] for e in m['embedded']}), m['datasets'], m['hub'],\n"
            "      [k for k in ('transformers', 'torchvision', 'huggingface_hub') if k in sys.modules])\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr[-2000:]
    assert p.stdout.strip() == ("nothing to fetch: every dataset is an embedded stand-in and no hub model is loaded "
                                "['digits', 'sentlen-standin', 'topics-standin'] [] [] []")


@pytest.mark.parametrize("dataset", ["cifar10", "imagenette"])
def test_offline_train_of_a_missing_dataset_names_prefetch_and_never_opens_a_connection(
        tmp_path, dataset, monkeypatch, capsys, env):
    calls = []

    def refuse(*a, **k):
        calls.append(a)
        raise OSError("network disabled in test")

    monkeypatch.setattr(urllib.request, "urlopen", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)
    cell = _cells(dataset=dataset)[0].cell_id
    rc = main(["train", "--offline", "--profile", "paper", "--cell", cell, "--data-root", str(tmp_path / "empty"),
               "--out", str(tmp_path / "run"), "--device", "cpu"])
    err = [line for line in capsys.readouterr().err.splitlines() if not line.startswith("lpdl: ")]
    assert rc == 2 and len(err) == 1 and "not found" in err[0] and "`lpdl prefetch`" in err[0], err
    assert calls == [] and os.environ["HF_HUB_OFFLINE"] == "1"


def test_the_train_script_runs_lpdl_train_offline(tmp_path, monkeypatch, env):
    import runpy

    calls = {}
    monkeypatch.setattr(os, "environ", dict(os.environ))  # the script sets OMP/HF_* variables: keep them here
    monkeypatch.setattr(os, "execv", lambda exe, argv: calls.update(argv=argv, env=dict(os.environ)))
    monkeypatch.setattr(os, "dup2", lambda a, b: None)
    monkeypatch.setenv("OMP_NUM_THREADS", "")
    sm = SimpleNamespace(config={"profile": "paper", "paper_dir": None, "device": "cpu", "executor": "loop",
                                 "data_root": ""},
                         wildcards=SimpleNamespace(seed="1234", results="paper"), threads=1,
                         params=SimpleNamespace(cells=["t1-resnet20-single-c0-s0-none-fp32"], fidelity="{}"),
                         log=[str(tmp_path / "job.log")])
    runpy.run_path(str(ROOT / "workflow/scripts/train.py"), init_globals={"snakemake": sm})
    assert "--offline" in calls["argv"] and calls["argv"][1:4] == ["-m", "lpdl_core", "train"]
    assert {k: calls["env"].get(k) for k in pf.OFFLINE_ENV} == pf.OFFLINE_ENV


def _smk(cwd, *args, **env):
    return subprocess.run([str(BIN / "snakemake"), *args], cwd=cwd, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", **env})


def test_no_train_job_depends_on_the_download_job():
    """The data is verified by the onstart hook, not by a job upstream of the train jobs: a rerun
    of such a job hid every train job from Snakemake (it ran only the download and said "100%
    done"), and a plain input would rerun every finished cell."""
    p = _smk(ROOT, "--profile", "slurm", "--dag", "--forceall", "--nolock", "--configfile", "config/paper.yaml",
             LPDL_SLURM_ACCOUNT="", LPDL_SLURM_PARTITION="")
    assert p.returncode == 0, p.stderr[-2000:]
    nodes = dict((num, name) for num, name in re.findall(r'^\s*(\d+)\[label = "([^"\\]+)', p.stdout, re.M))
    edges = set(re.findall(r"^\s*(\d+) -> (\d+)", p.stdout, re.M))
    train = {n for n, name in nodes.items() if name.startswith("train_")}
    from lpdl_core.pipeline.workflow.jobs import plan_jobs
    assert len(train) == len(plan_jobs(load_cells(), "paper", "block")) and "download" not in nodes.values()
    assert not [e for e in edges if e[1] in train]  # nothing upstream of a train job


def test_the_workflow_and_lpdl_prefetch_agree_on_the_request(tmp_path, capsys):
    """The manifest records the request it served, spelled as the workflow spells it, so the hook
    verifies again exactly when the request changes."""
    req = pf.prefetch_request(profile="mini", tables=["table3", "table1"], paper_dir=f"{PAPER_DIR}/../paper/",
                              data_root=str(tmp_path / "data") + "/", fidelities=[{"act_rounding": "stochastic"}])
    out = tmp_path / "download.json"
    assert main(["prefetch", *pf.request_args(req), "--out", str(out)]) == 0
    capsys.readouterr()
    assert pf.manifest_serves(out, req)
    same = pf.prefetch_request(profile="mini", tables=["table1", "table3"], paper_dir=str(PAPER_DIR),
                               data_root=str(tmp_path / "data"), fidelities=[{"act_rounding": "stochastic"}])
    assert pf.manifest_serves(out, same)  # another spelling of the same request
    for change in ({"data_root": str(tmp_path / "other")}, {"tables": ["table1"]},
                   {"fidelities": [{"act_rounding": "nearest"}]}, {"profile": "paper"}):
        assert not pf.manifest_serves(out, pf.prefetch_request(**{**dict(
            profile="mini", tables=["table1", "table3"], paper_dir=str(PAPER_DIR), data_root=str(tmp_path / "data"),
            fidelities=[{"act_rounding": "stochastic"}]), **change}))
    assert not pf.manifest_serves(tmp_path / "none.json", req)


@pytest.mark.slow
def test_the_paper_run_verifies_the_data_before_any_job_and_stops_in_one_line(tmp_path):
    """Paper profile, a data root whose CIFAR files are corrupt: Snakemake's onstart hook runs
    `lpdl prefetch` before any job, which refuses in one line; no train job starts."""
    repo = copy_repo(tmp_path / "repo")
    cell = "t1-resnet20-single-c0-s0-none-fp32"
    (repo / "small").mkdir()
    lines = (PAPER_DIR / "table1.csv").read_text().splitlines()
    ids = [c.cell_id for c in load_cells(None, tables=["table1"])]
    (repo / "small" / "table1.csv").write_text("\n".join([lines[0], lines[1 + ids.index(cell)]]) + "\n")
    folder = tmp_path / "data" / "cifar10" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch", "batches.meta"]:
        (folder / name).write_bytes(b"not the published file")
    p = _smk(repo, "-c1", "--configfile", "config/paper.yaml", "--config", "paper_dir=small", "tables=[table1]",
             f"data_root={tmp_path / 'data'}", "device=cpu")
    assert p.returncode == 1, p.stderr[-2000:]
    errors = [l for l in p.stderr.splitlines() if "error" in l.lower()]
    assert len(errors) == 1 and errors[0].startswith("lpdl prefetch: error: ") and "md5" in errors[0], p.stderr
    assert "Traceback" not in p.stderr
    assert not (repo / "results/paper/runs").exists() and not (repo / "results/paper/logs/train").exists()
    assert "lpdl prefetch" in (repo / "results/paper/logs/download.log").read_text()


def test_the_download_rule_alone_writes_the_manifest(tmp_path):
    repo = copy_repo(tmp_path / "repo")
    p = _smk(repo, "-c1", "download")
    assert p.returncode == 0, p.stderr[-2000:]
    m = json.loads((repo / "results/mini/download.json").read_text())
    assert m["profile"] == "mini" and m["datasets"] == [] and m["hub"] == [] and m["cells"] == len(load_cells())
