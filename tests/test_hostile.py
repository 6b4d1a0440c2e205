"""Hostile inputs and faults, in one place: what lpdl promises when things go wrong.

Every case is a promise of the README's "What lpdl guarantees":
  * a finished result is never lost and never recomputed for nothing;
  * no number is ever filed under the wrong cell, seed, profile or setting;
  * every bad input is one line naming the field (`lpdl <cmd>: error: ...`, exit 2, or
    `lpdl config error: ...` for the workflow), found before any work, with nothing written;
  * damaged files (metrics, checkpoints, caches, archives) are named in one line, and those lpdl
    can rebuild (checkpoints, caches) are set aside or rebuilt instead of blocking the run.

Sections: config (workflow --config), paper-cell CSVs, command line, results files,
checkpoints, caches, data archives, the pipeline's reruns and locks, kill -9.
The tests drive the documented commands (`lpdl ...`, `snakemake ...`) wherever they can.
"""
from __future__ import annotations

import csv
import gzip
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from repo_copy import copy_repo

from lpdl_core.cli import main
from lpdl_core.pipeline.cells import COLUMNS, PAPER_DIR, load_cells

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
SNAKEMAKE = str(BIN / "snakemake")
ENV = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "OMP_NUM_THREADS": "1"}
PAPER = PAPER_DIR
FAST_CELL = "t1-resnet20-single-c0-s0-none-fp32"  # single node: the quickest mini cell
OTHER_CELL = "t1-resnet20-single-c0-s0-none-int8"


def one_error_line(text: str, prefix: str) -> str:
    """The text holds exactly one error line, starting with prefix, and no traceback. Notices
    (`lpdl: ...` lines from the library's log, e.g. a download attempt) are not errors."""
    lines = [l for l in text.splitlines() if l.strip() and not l.startswith("lpdl: ")]
    assert "Traceback" not in text and len(lines) == 1 and lines[0].startswith(prefix), text
    return lines[0]


def run_cli(capsys, *argv) -> tuple[int, str, str]:
    try:
        code = main(list(argv))
    except SystemExit as e:  # argparse usage errors
        code = e.code
    out = capsys.readouterr()
    return code, out.out, out.err


def lpdl(*argv, timeout=300, env=None, cwd=ROOT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "lpdl_core", *argv], capture_output=True, text=True,
                          timeout=timeout, env=env or ENV, cwd=cwd)


def smk(cwd, *args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([SNAKEMAKE, *args], cwd=cwd, capture_output=True, text=True, env=ENV,
                          timeout=timeout)


def smk_errors(stderr: str) -> list[str]:
    """stderr lines that are not Snakemake's own notices (profile in use, extended config)."""
    notices = ("Using workflow specific profile", "Using profile", "Config file ")
    return [l for l in stderr.splitlines() if l.strip() and not l.startswith(notices)]


def write_rows(path: Path, rows: list[dict]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=COLUMNS)
        w.writeheader()
        w.writerows(rows)
    return path


def paper_rows(table: str) -> list[dict]:
    with open(PAPER / f"{table}.csv", newline="") as f:
        return list(csv.DictReader(f))


def small_paper_dir(dst: Path, cell_ids=(FAST_CELL,), edits: dict | None = None) -> Path:
    """A paper dir whose table1 holds only the given cells (edits apply to every row)."""
    rows = [r for r in paper_rows("table1") if _id(r) in cell_ids]
    for r in rows:
        r.update(edits or {})
    write_rows(dst / "table1.csv", rows)
    return dst


def _id(row: dict) -> str:
    return "t1-{model}-single-c0-s0-none-{precision}".format(**row)


@pytest.fixture
def file_not_dir(tmp_path) -> Path:
    """A regular file where a folder is needed: no process, root included, can write under it."""
    f = tmp_path / "a-file"
    f.write_text("x")
    return f


# ================================================================ 1. workflow config (--config)

@pytest.mark.parametrize("args, planned", [
    (["seeds=[1,2,3]"], "seed3/metrics.json"),                        # the README's own example
    (["seeds=[1, 2]"], "seed2/metrics.json"),
    (["fidelity={quant_ranges: gossiped}"], "results/mini/runs/"),        # typed JSON: test_workflow
    (["fidelity={act_rounding: stochastic, bytes_metric: legacy}"], "results/mini/runs/"),
    (["fidelity=official"], "results/mini-official/runs/"),                 # the one switch
    (["demo={epochs: 2, nodes: 4, skew: 0.8}"], "seed1234/metrics.json"),
])
def test_config_nested_values_documented_forms_work(args, planned):
    p = smk(ROOT, "-n", "-p", "--forceall", "--nolock", "--config", "tables=[fig1]", *args)
    assert p.returncode == 0, p.stderr[-2000:]
    assert planned in p.stdout


@pytest.mark.parametrize("bad, key", [
    ("fidelity={quant_ranges: maybe}", "fidelity"),
    ("fidelity={quant_ranges: 1}", "fidelity"),
    ("fidelity=officiall", "fidelity"),
    ("seeds=[1,x]", "seeds/1"),
    ("seeds=[]", "seeds"),
    ("demo={skew: nan}", "demo/skew"),
    ("threads_per_job=0", "threads_per_job"),
    ("device=tpu", "device"),
    ("executor=threads", "executor"),
    ("unknown_key=1", "(top level)"),
])
def test_config_bad_value_is_one_line_naming_the_key(bad, key):
    p = smk(ROOT, "-n", "--config", bad)
    assert p.returncode != 0
    lines = smk_errors(p.stderr)
    assert len(lines) == 1 and lines[0].startswith(f"lpdl config error: {key}"), p.stderr


def test_config_missing_paper_dir_is_one_line():
    p = smk(ROOT, "-n", "--config", "paper_dir=/nonexistent/paper")
    lines = smk_errors(p.stderr)
    assert p.returncode != 0 and len(lines) == 1 and "/nonexistent/paper" in lines[0], p.stderr


def test_config_data_root_reaches_the_job_as_one_argument(tmp_path, monkeypatch):
    """The train job execs lpdl with an argument list (workflow/scripts/train.py), no shell: a
    data_root full of shell syntax is one argument and runs nothing."""
    import os
    import runpy
    from types import SimpleNamespace

    evil = f"{tmp_path}/my x; touch {tmp_path}/PWNED; $(touch {tmp_path}/PWNED2) `false`"
    p = smk(ROOT, "-n", "--forceall", "--nolock", "--config", "tables=[table1]", f"data_root={evil}")
    assert p.returncode == 0, p.stderr[-2000:]
    calls = {}
    monkeypatch.setattr(os, "environ", dict(os.environ))  # the script sets OMP/HF_* variables: keep them here
    monkeypatch.setattr(os, "execv", lambda exe, argv: calls.update(argv=argv))
    monkeypatch.setattr(os, "dup2", lambda a, b: None)
    sm = SimpleNamespace(config={"profile": "mini", "paper_dir": None, "device": "cpu",
                                 "executor": "loop", "data_root": evil},
                         wildcards=SimpleNamespace(seed="1234", results="mini"), threads=1,
                         params=SimpleNamespace(cells=["t1-resnet20-single-c0-s0-none-fp32"], fidelity="{}"),
                         log=[str(tmp_path / "job.log")])
    runpy.run_path(str(ROOT / "workflow/scripts/train.py"), init_globals={"snakemake": sm})
    argv = calls["argv"]
    assert argv[argv.index("--data-root") + 1] == evil  # one argument, not shell code
    assert not list(tmp_path.glob("PWNED*"))


# ================================================================ 2. paper-cell CSVs

def _bad_csv(tmp_path, edit) -> Path:
    rows = paper_rows("table1")[:3]
    edit(rows)
    return write_rows(tmp_path / "table1.csv", rows)


@pytest.mark.parametrize("edit, where", [
    (lambda rows: rows.append(dict(rows[0])), ":5: cell_id:"),                 # a duplicated cell
    (lambda rows: rows[1].update(lr="nan"), ":3: lr:"),
    (lambda rows: rows[1].update(lr="inf"), ":3: lr:"),
    (lambda rows: rows[0].update(lr="-0.1"), ":2: lr:"),
    (lambda rows: rows[2].update(eta="nan"), ":4: eta:"),
    (lambda rows: rows[0].update(skew="NaN"), ":2: skew:"),
    (lambda rows: rows[0].update(paper_acc="inf"), ":2: paper_acc:"),
    (lambda rows: rows[0].update(epochs="1e3"), ":2: epochs:"),
    (lambda rows: rows[0].update(nodes=""), ":2: nodes:"),
])
def test_csv_malformed_row_rejected_at_load_with_file_line_column(tmp_path, edit, where):
    path = _bad_csv(tmp_path, edit)
    with pytest.raises(ValueError) as e:
        load_cells(tmp_path, tables=["table1"])
    assert str(e.value).startswith(f"{path}{where}"), str(e.value)


def test_csv_short_and_long_rows(tmp_path):
    path = tmp_path / "table1.csv"
    header, first = (PAPER / "table1.csv").read_text().splitlines()[:2]
    path.write_text(f"{header}\n{first.rsplit(',', 3)[0]}\n")
    with pytest.raises(ValueError, match=r"table1\.csv:2: "):
        load_cells(tmp_path, tables=["table1"])
    path.write_text(f"{header}\n{first},extra\n")
    with pytest.raises(ValueError, match=r"table1\.csv:2: "):
        load_cells(tmp_path, tables=["table1"])


def test_csv_duplicate_fails_the_dry_run_in_one_line(tmp_path):
    d = tmp_path / "paper"
    rows = paper_rows("table1")[:2]
    write_rows(d / "table1.csv", rows + [rows[1]])
    p = smk(ROOT, "-n", "--config", f"paper_dir={d}", "tables=[table1]")
    lines = smk_errors(p.stderr)
    assert p.returncode != 0 and len(lines) == 1 and "table1.csv:4: cell_id:" in lines[0], p.stderr


def test_csv_nan_lr_fails_the_dry_run_not_the_job(tmp_path):
    d = tmp_path / "paper"
    rows = paper_rows("table1")[:2]
    rows[0]["lr"] = "nan"
    write_rows(d / "table1.csv", rows)
    p = smk(ROOT, "-n", "--config", f"paper_dir={d}", "tables=[table1]")
    lines = smk_errors(p.stderr)
    assert p.returncode != 0 and len(lines) == 1 and "table1.csv:2: lr:" in lines[0], p.stderr


# ================================================================ 3. the command line

@pytest.mark.parametrize("argv", [
    ["bench", "--batch", "0"],
    ["bench", "--steps", "0"],
    ["bench", "--nodes", "100000"],
    ["bench", "--batch", "ten"],
    ["topology", "--nodes", "100000000"],
    ["topology", "--nodes", "abc"],
    ["topology", "--t", "-1"],
    ["demo", "--nodes", "0"],
    ["demo", "--epochs", "-2"],
    ["demo", "--skew", "nan"],
    ["partition", "--dataset", "cifar10", "--nodes", "0"],
    ["partition", "--class-sizes", "-5,3", "--nodes", "2"],
    ["partition", "--class-sizes", "1,2,x"],
    ["partition", "--nodes", "4"],                                   # neither --dataset nor --class-sizes
    ["cells", "--table", "table9"],
    ["cells", "--paper-dir", "/nonexistent/paper"],
    ["train", "--cell", FAST_CELL, "--out", "unused", "--paper-dir", "/nonexistent/paper"],
    ["train", "--cell", "no-such-cell", "--out", "unused"],
    ["train", "--cell", FAST_CELL, "--out", "unused", "--fidelity", "quant_ranges=maybe"],
    ["train", "--cell", FAST_CELL, "--out", "unused", "--fidelity", "quant_ranges=1"],
    ["train", "--cell", FAST_CELL, "--out", "unused", "--fidelity", "officiall"],
    ["train", "--cell", FAST_CELL, "--out", "unused", "--fidelity", "unknown=1"],
    ["train", "--cell", FAST_CELL, "--out", "unused", "--fidelity", "choco_form"],
    ["train", "--cell", FAST_CELL, "--out", "unused", "--profile", "huge"],
    ["train", "--cell", FAST_CELL, "--out", "unused", "--seed", "-1"],
    ["report", "--results", "/nonexistent/results"],
])
def test_cli_bad_argument_is_one_line_exit_2(capsys, tmp_path, monkeypatch, argv):
    monkeypatch.chdir(tmp_path)  # nothing may be written anywhere
    code, _, err = run_cli(capsys, *argv)
    assert code == 2
    one_error_line(err, f"lpdl {argv[0]}: error: ")
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("argv", [
    ["partition", "--dataset", "cifar10", "--out", "{file}/hist.csv"],
    ["partition", "--dataset", "cifar10", "--out", "{dir}"],
    ["bench", "--steps", "1", "--nodes", "1", "--batch", "2", "--out", "{file}/b.json"],
    ["bench", "--steps", "1", "--nodes", "1", "--batch", "2", "--out", "{dir}"],
    ["train", "--cell", FAST_CELL, "--out", "{file}/run"],
    ["train", "--cell", FAST_CELL, "--out", "{file}"],
])
def test_cli_unwritable_output_fails_before_any_work(capsys, tmp_path, file_not_dir, argv):
    argv = [a.format(file=file_not_dir, dir=tmp_path) for a in argv]
    t0 = time.perf_counter()
    code, out, err = run_cli(capsys, *argv)
    assert code == 2 and time.perf_counter() - t0 < 20  # no epoch, no benchmark ran first
    one_error_line(err, f"lpdl {argv[0]}: error: ")
    assert "epoch" not in out and file_not_dir.read_text() == "x"


def test_cli_report_into_unwritable_folder(capsys, tmp_path, file_not_dir, finished_run):
    results = tmp_path / "results" / "mini"
    shutil.copytree(finished_run, results / "runs" / FAST_CELL / "seed1234")
    code, _, err = run_cli(capsys, "report", "--results", str(results), "--out", f"{file_not_dir}/r",
                           "--no-pdf", "--table", "table1")
    assert code == 2
    one_error_line(err, "lpdl report: error: ")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cli_no_cuda_is_one_line_before_loading_data(capsys, tmp_path):
    code, out, err = run_cli(capsys, "train", "--cell", FAST_CELL, "--out", str(tmp_path / "r"),
                             "--device", "cuda")
    assert code == 2 and "CUDA" in one_error_line(err, "lpdl train: error: ")
    assert not (tmp_path / "r").exists()


# ================================================================ 4. results files

@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    """One real finished run of FAST_CELL (mini profile, seed 1234), made by `lpdl train`."""
    out = tmp_path_factory.mktemp("finished") / "run"
    p = lpdl("train", "--cell", FAST_CELL, "--out", str(out), "--device", "cpu")
    assert p.returncode == 0, p.stderr[-2000:]
    return out


def _copy(run: Path, dst: Path) -> Path:
    shutil.copytree(run, dst, ignore=shutil.ignore_patterns(".kept"))
    return dst


@pytest.mark.parametrize("argv, why", [
    (["--cell", OTHER_CELL], f"holds the result of cell {FAST_CELL} seed 1234"),
    (["--cell", FAST_CELL, "--seed", "7"], "not of cell t1-resnet20-single-c0-s0-none-fp32 seed 7"),
    (["--cell", FAST_CELL, "--profile", "paper"], "(profile paper)"),
    (["--cell", FAST_CELL, "--fidelity", "choco_form=code"], "fidelity.choco_form 'paper' (asked: 'code')"),
])
def test_results_train_refuses_another_runs_result(capsys, tmp_path, finished_run, argv, why):
    run = _copy(finished_run, tmp_path / "run")
    code, out, err = run_cli(capsys, "train", *argv, "--out", str(run))
    assert code == 2 and "mean node acc" not in out
    line = one_error_line(err, "lpdl train: error: ")
    assert str(run / "metrics.json") in line and why in line, line


def test_results_train_refuses_a_result_of_an_edited_cell(capsys, tmp_path, finished_run):
    run = _copy(finished_run, tmp_path / "run")
    paper = small_paper_dir(tmp_path / "paper", edits={"lr": "0.05"})
    code, _, err = run_cli(capsys, "train", "--cell", FAST_CELL, "--out", str(run), "--paper-dir", str(paper))
    assert code == 2 and "lr 0.1 (asked: 0.05)" in one_error_line(err, "lpdl train: error: ")


def test_results_train_returns_its_own_finished_result(capsys, tmp_path, finished_run):
    run = _copy(finished_run, tmp_path / "run")
    code, out, _ = run_cli(capsys, "train", "--cell", FAST_CELL, "--out", str(run))
    acc = json.loads((run / "metrics.json").read_text())["final"]["mean_acc"]
    assert code == 0 and f"mean node acc {acc:.2f}" in out


CORRUPTIONS = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 2]),
    "random-bytes": lambda p: p.write_bytes(os.urandom(512)),
    "empty": lambda p: p.write_bytes(b""),
    "nan-constant": lambda p: p.write_text(p.read_text().replace('"mean_loss": ', '"mean_loss": NaN, "x": ', 1)),
    "not-an-object": lambda p: p.write_text("[1, 2, 3]"),
    "accuracy-150": lambda p: p.write_text(p.read_text().replace('"mean_acc": ', '"mean_acc": 150.0, "y": ', 1)),
    "status-unknown": lambda p: p.write_text(p.read_text().replace('"status": "ok"', '"status": "great"')),
}


@pytest.mark.parametrize("kind", CORRUPTIONS)
def test_results_corrupt_metrics_is_one_line_in_train(capsys, tmp_path, finished_run, kind):
    run = _copy(finished_run, tmp_path / "run")
    CORRUPTIONS[kind](run / "metrics.json")
    code, _, err = run_cli(capsys, "train", "--cell", FAST_CELL, "--out", str(run))
    assert code == 2 and str(run / "metrics.json") in one_error_line(err, "lpdl train: error: ")


@pytest.mark.parametrize("kind", ["truncated", "nan-constant", "accuracy-150"])
def test_results_corrupt_metrics_is_one_line_in_aggregate(capsys, tmp_path, finished_run, kind):
    """The aggregate step is the one reader of run folders (the report reads its CSVs)."""
    results = tmp_path / "results" / "mini"
    run = _copy(finished_run, results / "runs" / FAST_CELL / "seed1234")
    CORRUPTIONS[kind](run / "metrics.json")
    code, _, err = run_cli(capsys, "aggregate", str(results), "--table", "table1")
    assert code == 2 and str(run / "metrics.json") in one_error_line(err, "lpdl aggregate: error: ")
    assert not (results / "runs.csv").exists()


@pytest.mark.parametrize("where", [f"runs/{OTHER_CELL}/seed1234", f"runs/{FAST_CELL}/seed7"])
def test_results_aggregate_refuses_a_mislabelled_run(capsys, tmp_path, finished_run, where):
    results = tmp_path / "results" / "mini"
    _copy(finished_run, results / where)  # FAST_CELL seed 1234's result under another name
    code, _, err = run_cli(capsys, "aggregate", str(results), "--table", "table1")
    assert code == 2 and f"holds the result of cell {FAST_CELL} seed 1234" in one_error_line(err, "lpdl aggregate")


def test_results_report_without_the_aggregate_step_is_one_line(capsys, tmp_path, finished_run):
    results = tmp_path / "results" / "mini"
    _copy(finished_run, results / "runs" / FAST_CELL / "seed1234")
    code, _, err = run_cli(capsys, "report", "--results", str(results), "--out", str(tmp_path / "rep"), "--no-pdf")
    assert code == 2 and "no runs.csv" in one_error_line(err, "lpdl report: error: ")


def test_results_diverged_run_writes_standard_json(tmp_path):
    from lpdl_core.pipeline.results import save_run
    from lpdl_core.training.train import RunResult

    res = RunResult(status="diverged", epochs_done=1, curve=[{"epoch": 0, "train_loss": float("nan")}],
                    final={"mean_acc": float("nan"), "avg_model_acc": 10.0, "consensus_distance": float("inf"),
                           "mean_loss": float("nan"), "node_acc": [float("nan")]},
                    bytes_per_node=1.0, partition=np.ones((1, 10), dtype=int), wall_time_s=1.0,
                    executor="loop", device="cpu", diverged_at={"epoch": 0, "iteration": 3})
    save_run(res, tmp_path, config={"cell_id": "x"})

    def strict(name):
        raise ValueError(f"non-standard JSON constant {name}")

    m = json.loads((tmp_path / "metrics.json").read_text(), parse_constant=strict)
    assert m["final"]["mean_acc"] is None and m["final"]["consensus_distance"] is None


# ================================================================ 5. checkpoints

def _tiny_training(tmp_path, epochs=2):
    import dataclasses

    from lpdl_core.data.registry import load_dataset
    from lpdl_core.decentral.algorithms.base import GossipCfg
    from lpdl_core.decentral.engine import EngineCfg
    from lpdl_core.decentral.optim import OptimCfg
    from lpdl_core.decentral.topology import Topology
    from lpdl_core.training.train import RunCfg, train

    split = load_dataset("digits", image_size=8)
    split = dataclasses.replace(split, x_train=split.x_train[:128], y_train=split.y_train[:128],
                                x_test=split.x_test[:64], y_test=split.y_test[:64])

    def make():
        return torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU(),
                                   torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(4, 10))

    def run(ckpt, run_cfg=None, progress=None):
        return train(make, split, topology=Topology(name="directed-ring", n=2), gossip=GossipCfg(),
                     optim_cfg=OptimCfg(), engine=EngineCfg(device="cpu"),
                     run=run_cfg or RunCfg(epochs=epochs, batch_size=16, lr=0.05),
                     checkpoint=ckpt, progress=progress)
    return run


CHECKPOINT_DAMAGE = {
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: len(p.read_bytes()) // 3]),
    "random-bytes": lambda p: p.write_bytes(os.urandom(4096)),
    "empty": lambda p: p.write_bytes(b""),
    "a-tensor": lambda p: torch.save(torch.zeros(3), p),
    "wrong-shapes": lambda p: torch.save({**torch.load(p, weights_only=True), "sim": {"x": torch.zeros(1)}}, p),
    "bad-epoch": lambda p: torch.save({**torch.load(p, weights_only=True), "epoch": 99}, p),
}


@pytest.mark.parametrize("kind", CHECKPOINT_DAMAGE)
def test_checkpoint_unusable_is_set_aside_and_the_run_restarts(tmp_path, kind):
    run = _tiny_training(tmp_path)
    reference = run(None)
    ckpt = tmp_path / "checkpoint.pt"
    run(ckpt)  # leaves a checkpoint of the last epoch
    CHECKPOINT_DAMAGE[kind](ckpt)
    damaged = ckpt.read_bytes()
    events = []
    result = run(ckpt, progress=events.append)
    aside = [e for e in events if e["event"] == "checkpoint-set-aside"]
    assert len(aside) == 1 and result.status == "ok"
    assert Path(aside[0]["moved_to"]).read_bytes() == damaged  # kept, never deleted
    assert result.final == reference.final  # from scratch, exactly as a fresh run


def test_checkpoint_of_other_settings_is_set_aside(tmp_path):
    from lpdl_core.training.train import RunCfg

    run = _tiny_training(tmp_path)
    ckpt = tmp_path / "checkpoint.pt"
    run(ckpt)
    events = []
    run(ckpt, run_cfg=RunCfg(epochs=1, batch_size=8, lr=0.05), progress=events.append)
    assert events[0]["event"] == "checkpoint-set-aside" and "other settings" in events[0]["reason"]


def test_checkpoint_corrupt_in_a_real_run_is_one_line_and_the_cell_finishes(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "checkpoint.pt").write_bytes(os.urandom(1000))
    p = lpdl("train", "--cell", FAST_CELL, "--out", str(run), "--device", "cpu")
    assert p.returncode == 0 and "Traceback" not in p.stderr, p.stderr[-2000:]
    notes = [l for l in p.stderr.splitlines() if "cannot be used" in l]  # a notice: on stderr
    assert len(notes) == 1 and "checkpoint.pt" in notes[0] and "from scratch" in notes[0]
    assert (run / "metrics.json").exists() and len(list(run.glob("checkpoint.pt.corrupt-*"))) == 1


# ================================================================ 6. caches

@pytest.fixture
def data_root(tmp_path, monkeypatch) -> Path:
    root = tmp_path / "data"
    monkeypatch.setenv("LPDL_DATA", str(root))
    return root


def _digits():
    from lpdl_core.data.digits import _split_8x8
    return _split_8x8(0.2, 0)


def _edit_npz(path: Path) -> None:
    with np.load(path, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["ytr"] = (arrays["ytr"] + 1) % 10  # every training label wrong, file still valid
    with open(path, "wb") as f:
        np.savez(f, **arrays)


@pytest.mark.parametrize("damage", [
    lambda p: p.write_bytes(p.read_bytes()[:100]),          # truncated (BadZipFile)
    lambda p: p.write_bytes(os.urandom(2048)),
    lambda p: p.write_bytes(b""),
    _edit_npz,                                              # edited: valid file, wrong content
])
def test_cache_digits_damaged_or_edited_is_rebuilt(data_root, damage):
    good = _digits()
    (cache,) = (data_root / "lpdl-cache").glob("digits-split-*.npz")
    damage(cache)
    again = _digits()
    assert all(np.array_equal(a, b) for a, b in zip(good, again))
    assert all(np.array_equal(a, b) for a, b in zip(good, _digits()))  # and the rebuilt file is sound


def test_cache_digits_from_other_split_settings_is_not_used(data_root):
    good = _digits()
    (cache,) = (data_root / "lpdl-cache").glob("digits-split-*.npz")
    from lpdl_core.data.digits import _split_8x8
    other = _split_8x8(0.5, 3)  # another cache file; copy it over the first one
    (other_cache,) = [p for p in (data_root / "lpdl-cache").glob("digits-split-*.npz") if p != cache]
    shutil.copy(other_cache, cache)
    assert len(other[0]) != len(good[0])
    assert all(np.array_equal(a, b) for a, b in zip(good, _digits()))


def test_cache_tokens_edited_or_foreign_is_rebuilt(tmp_path):
    from lpdl_core.data import text

    tok = text.get_tokenizer("minilm")
    texts = ["The quick brown fox.", "Jumps over the lazy dog."]
    ids = text.tokenize_cached(texts, tok, max_length=12, cache_dir=tmp_path, key="k")
    (path,) = tmp_path.glob("k-*.pt")
    blob = torch.load(path, weights_only=True)
    torch.save({**blob, "input_ids": torch.zeros_like(ids)}, path)                  # edited ids
    assert torch.equal(text.tokenize_cached(texts, tok, max_length=12, cache_dir=tmp_path, key="k"), ids)
    foreign = text.tokenize_cached(["Other text."] * 2, tok, max_length=12, cache_dir=tmp_path / "o", key="k")
    shutil.copy(next((tmp_path / "o").glob("k-*.pt")), path)                        # other texts
    assert not torch.equal(foreign, ids)
    assert torch.equal(text.tokenize_cached(texts, tok, max_length=12, cache_dir=tmp_path, key="k"), ids)


# ================================================================ 7. data archives (paper profile)

@pytest.fixture
def offline(monkeypatch):
    import urllib.error
    import urllib.request

    def fail(*a, **k):
        raise urllib.error.URLError("no network (test)")
    monkeypatch.setattr(urllib.request, "urlopen", fail)


@pytest.mark.parametrize("setup", [
    lambda root: None,                                                          # nothing on disk
    lambda root: (root / "cifar10").mkdir(parents=True) or
    (root / "cifar10" / "cifar-10-python.tar.gz").write_bytes(os.urandom(4096)),  # corrupt archive
    lambda root: (root / "cifar10" / "cifar-10-batches-py").mkdir(parents=True) or
    (root / "cifar10" / "cifar-10-batches-py" / "data_batch_1").write_bytes(b"junk"),  # partial folder
])
def test_archive_missing_or_corrupt_dataset_is_one_line_and_nothing_written(capsys, tmp_path, data_root,
                                                                             offline, setup):
    setup(data_root)
    out = tmp_path / "run"
    code, _, err = run_cli(capsys, "train", "--cell", FAST_CELL, "--profile", "paper", "--out", str(out),
                           "--device", "cpu")
    assert code == 2 and "cifar" in one_error_line(err, "lpdl train: error: ").lower()
    assert not out.exists()


def test_archive_corrupt_batch_file_is_one_line(capsys, tmp_path, data_root, offline):
    folder = data_root / "cifar10" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for name in ["data_batch_%d" % i for i in range(1, 6)] + ["test_batch", "batches.meta"]:
        (folder / name).write_bytes(b"not the published file")
    code, _, err = run_cli(capsys, "train", "--cell", FAST_CELL, "--profile", "paper",
                           "--out", str(tmp_path / "run"), "--device", "cpu")
    assert code == 2 and "md5" in one_error_line(err, "lpdl train: error: ")


def test_archive_text_dataset_missing_is_one_line(capsys, tmp_path, data_root, offline):
    code, _, err = run_cli(capsys, "train", "--cell", "t1-agnews-distilbert-single-c0-s0-none-fp32",
                           "--profile", "paper", "--out", str(tmp_path / "run"), "--device", "cpu")
    assert code == 2
    one_error_line(err, "lpdl train: error: ")


# ================================================================ 8. the pipeline: reruns and locks

@pytest.fixture(scope="module")
def pipeline(tmp_path_factory) -> Path:
    """A repository copy with one finished cell, made by Snakemake (so it has Snakemake's
    metadata, which is what decides reruns)."""
    repo = copy_repo(tmp_path_factory.mktemp("pipe") / "repo")
    small_paper_dir(repo / "small")
    p = smk(repo, "-c1", "results/mini/tables/table1.csv", "--config", "paper_dir=small", "tables=[table1]")
    assert p.returncode == 0, p.stderr[-3000:]
    return repo


def _metrics(repo: Path) -> Path:
    return repo / "results/mini/runs" / FAST_CELL / "seed1234" / "metrics.json"


def _job_of(cell_id: str):
    """The mini profile's training job that runs cell_id (lpdl_core.pipeline.jobs)."""
    from lpdl_core.pipeline.cells import load_cells
    from lpdl_core.pipeline.jobs import plan_jobs

    return next(j for j in plan_jobs(load_cells(), "mini") if cell_id in j.cells)


@pytest.mark.slow
@pytest.mark.parametrize("change", [
    ["device=cuda"], ["executor=batched"], ["threads_per_job=2"], ["paper_dir=small/"], ["paper_dir=./small"],
])
def test_rerun_setting_that_does_not_change_the_run_reruns_nothing(pipeline, change):
    p = smk(pipeline, "-n", "results/mini/tables/table1.csv", "--config", "paper_dir=small",
            "tables=[table1]", *change)
    assert p.returncode == 0, p.stderr[-2000:]
    assert "Nothing to be done" in p.stdout + p.stderr, p.stdout[-2000:]


@pytest.mark.slow
def test_rerun_another_data_root_reverifies_the_data_and_reruns_no_cell(pipeline):
    """A new data root must be prefetched and verified (the train jobs run offline), so the
    download job runs again; no finished cell does (the jobs read its manifest as ancient)."""
    p = smk(pipeline, "-n", "results/mini/tables/table1.csv", "--config", "paper_dir=small",
            "tables=[table1]", "data_root=/some/where")
    assert p.returncode == 0, p.stderr[-2000:]
    out = p.stdout + p.stderr
    assert "rule download:" in out and "rule train_" not in out and "rule aggregate:" not in out, out[-2000:]


@pytest.mark.slow
def test_rerun_a_failed_rerun_loses_nothing_and_same_settings_restore(pipeline):
    metrics = _metrics(pipeline)
    before = metrics.read_text()
    paper = pipeline / "small" / "table1.csv"
    original = paper.read_text()
    try:
        paper.write_text(original.replace(",0.1,resnet,", ",0.05,resnet,", 1))  # the cell's lr changed
        p = smk(pipeline, "-n", "results/mini/tables/table1.csv", "--config", "paper_dir=small", "tables=[table1]")
        assert "train" in p.stdout  # a defining change reruns the cell
        # ... and the rerun fails (no CUDA here): Snakemake deleted metrics.json, the kept copy remains
        p = smk(pipeline, "-c1", "results/mini/tables/table1.csv", "--config", "paper_dir=small",
                "tables=[table1]", "device=cuda")
        if torch.cuda.is_available():
            pytest.skip("needs a machine without CUDA to make the rerun fail")
        assert p.returncode != 0 and not metrics.exists()
        kept = list(metrics.parent.glob(".kept/*/metrics.json"))
        assert len(kept) == 1 and kept[0].read_text() == before
    finally:
        paper.write_text(original)
    # back to the original settings: restored from the kept copy, not recomputed
    p = smk(pipeline, "-c1", "results/mini/tables/table1.csv", "--config", "paper_dir=small", "tables=[table1]")
    assert p.returncode == 0, p.stderr[-2000:]
    assert metrics.read_text() == before
    log = (pipeline / "results/mini/logs/train" / _job_of(FAST_CELL).name / "seed1234.log").read_text()
    assert "restored the finished result" in log and "epoch 1/" not in log


@pytest.mark.slow
def test_rerun_forced_with_quoted_hostile_data_root_restores_and_runs_no_shell_code(pipeline, tmp_path):
    before = _metrics(pipeline).read_text()
    evil = f"{tmp_path}/my data; touch {tmp_path}/PWNED; false #"
    p = smk(pipeline, "-c1", "--forcerun", _job_of(FAST_CELL).rule, "results/mini/tables/table1.csv", "--config",
            "paper_dir=small", "tables=[table1]", f"data_root={evil}")
    assert p.returncode == 0, p.stderr[-2000:]
    assert not (tmp_path / "PWNED").exists()
    assert _metrics(pipeline).read_text() == before
    # back to the module's data root: the download job verifies it again, no cell reruns
    p = smk(pipeline, "-c1", "results/mini/tables/table1.csv", "--config", "paper_dir=small", "tables=[table1]")
    assert p.returncode == 0 and "rule train_" not in p.stdout and _metrics(pipeline).read_text() == before


@pytest.mark.slow
def test_rerun_aggregate_with_a_corrupt_metrics_is_one_line_in_its_log(pipeline):
    metrics = _metrics(pipeline)
    good = metrics.read_bytes()
    try:
        metrics.write_bytes(good[: len(good) // 2])
        p = smk(pipeline, "-c1", "--forcerun", "aggregate", "results/mini/tables/table1.csv",
                "--config", "paper_dir=small", "tables=[table1]")
        assert p.returncode != 0
        log = (pipeline / "results/mini/logs/aggregate.log").read_text()
        line = one_error_line(log, "lpdl aggregate: error: ")
        assert str(metrics.relative_to(pipeline)) in line or str(metrics) in line
        assert line in p.stderr
    finally:
        metrics.write_bytes(good)


def _fake_snakemake(tmp_path: Path, workdir: Path) -> subprocess.Popen:
    """A live process that looks like Snakemake (a Python script named snakemake) in workdir."""
    script = tmp_path / "bin" / "snakemake"
    script.parent.mkdir(exist_ok=True)
    script.write_text(f"#!{sys.executable}\nimport time\ntime.sleep(120)\n")
    script.chmod(0o755)
    return subprocess.Popen([str(script), "-c2"], cwd=workdir)


def _locked(workdir: Path) -> list[Path]:
    locks = workdir / ".snakemake" / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    (locks / "0.input.lock").write_text("/x\n")
    (locks / "0.output.lock").write_text("/y\n")
    return sorted(locks.iterdir())


def test_lock_of_a_live_run_is_not_cleared(tmp_path):
    work = tmp_path / "wf"
    work.mkdir()
    locks = _locked(work)
    proc = _fake_snakemake(tmp_path, work)
    try:
        time.sleep(0.5)
        p = lpdl("unlock", "--directory", str(work))
        assert p.returncode == 2 and f"pid {proc.pid}" in one_error_line(p.stderr, "lpdl unlock: error: ")
        assert all(l.exists() for l in locks)
    finally:
        proc.kill()
        proc.wait()
    p = lpdl("unlock", "--directory", str(work))  # its owner is dead now: a stale lock
    assert p.returncode == 0 and "cleared a stale lock" in p.stdout and not any(l.exists() for l in locks)


def test_lock_a_live_run_elsewhere_does_not_block(tmp_path):
    work, elsewhere = tmp_path / "wf", tmp_path / "other"
    work.mkdir()
    elsewhere.mkdir()
    _locked(work)
    proc = _fake_snakemake(tmp_path, elsewhere)
    try:
        time.sleep(0.5)
        p = lpdl("unlock", "--directory", str(work))
        assert p.returncode == 0 and "cleared" in p.stdout
    finally:
        proc.kill()
        proc.wait()


def test_lock_make_reproduce_unlocks_only_through_the_liveness_check():
    recipe = (ROOT / "Makefile").read_text().split("\nreproduce:", 1)[1].split("\n\n", 1)[0]
    assert "lpdl unlock" in recipe and "--unlock" not in recipe


# ================================================================ 9. kill -9

def test_kill9_leftover_temp_files_are_not_results(tmp_path, finished_run):
    run = tmp_path / "run"
    run.mkdir()
    (run / ".metrics.json.abc.tmp").write_text(json.dumps({"status": "ok"})[:5])  # killed mid-write
    (run / ".checkpoint.pt.123.tmp").write_bytes(b"\x00" * 10)
    p = lpdl("train", "--cell", FAST_CELL, "--out", str(run), "--device", "cpu")
    assert p.returncode == 0 and (run / "metrics.json").exists()
    ref = json.loads((finished_run / "metrics.json").read_text())
    assert json.loads((run / "metrics.json").read_text())["final"] == ref["final"]


@pytest.mark.slow
def test_kill9_mid_training_then_rerun_resumes_and_equals_uninterrupted(tmp_path, finished_run):
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "lpdl_core", "train", "--cell", FAST_CELL, "--out", str(run),
                             "--device", "cpu"], env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 300
    while not (run / "checkpoint.pt").exists():
        assert proc.poll() is None and time.time() < deadline, "finished before a checkpoint existed"
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (run / "metrics.json").exists()
    p = lpdl("train", "--cell", FAST_CELL, "--out", str(run), "--device", "cpu")
    assert p.returncode == 0 and "resuming at epoch" in p.stderr
    ref = json.loads((finished_run / "metrics.json").read_text())
    assert json.loads((run / "metrics.json").read_text())["final"] == ref["final"]
