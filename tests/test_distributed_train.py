"""Whole training runs on the distributed executor (one process per node, 4 gloo ranks) equal the
loop executor's, resume from per-rank checkpoints, and report where a step's time goes.

Tolerance. The parameters follow the loop executor's to float summation order (tests/
test_distributed.py: ≤ 1e-7 relative per round); the metrics are computed from them by
collectives: node accuracies and the averaged model's correct counts are integer counts (equal
unless a test logit sits within that order of a tie), the means and the consensus distance are
sums in another order. So accuracies may differ by at most one test sample per node (100/96
points here; measured: equal), losses and distances by 1e-4 relative. That holds where the
only difference is the mixing's dot product: both sides must compute their convolutions with the
same number of threads. A loop run on two threads sums the convolutions in another order than
the ranks' one thread each, and over the mini cell's 138 steps of 8-bit rounding and top-k that
moved its node accuracies by two test samples (2026-11-27, 2-core EPYC); on one thread each the
distributed run ended at exactly the loop run's node accuracies. A resumed distributed run
takes exactly the uninterrupted one's path (same processes, same order): equal bit for bit.
"""
from __future__ import annotations

import os
import pickle
import sys
from pathlib import Path

import pytest

from lpdl_core.decentral import p2p

sys.path.insert(0, str(Path(__file__).parent))  # the spawned ranks import distributed_train_cases
from distributed_train_cases import N, RUNS, rank_runs, run  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")
# points: one test sample of the 96, plus the float32 rounding of 100·k/N (≤ 1e-5 of 100)
ONE_SAMPLE = 100 / 96 + 1e-4


def _launch(tmp_path, names, **kw) -> list[tuple]:
    codes = p2p.launch(rank_runs, names, str(tmp_path), kw.get("kill_epoch"), kw.get("checkpoint", False),
                       kw.get("identity"), world_size=N, cfg=p2p.P2PCfg(timeout_s=60))
    assert codes == [0] * N, codes
    return {name: [pickle.loads((tmp_path / f"{name}-{r}.pkl").read_bytes()) for r in range(N)] for name in names}


def _close(a: dict, b: dict, acc_tol: float = ONE_SAMPLE) -> None:
    for key in ("mean_acc", "avg_model_acc"):
        assert abs(a[key] - b[key]) <= acc_tol, (key, a[key], b[key])
    for key in ("consensus_distance", "mean_loss", "test_loss", "train_loss", "bytes_per_node"):
        if key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-4, abs=1e-7), (key, a[key], b[key])


@pytest.fixture(scope="module")
def distributed(tmp_path_factory):
    return _launch(tmp_path_factory.mktemp("dist"), list(RUNS))


@pytest.mark.parametrize("name", list(RUNS))
def test_distributed_run_equals_loop(name, distributed):
    loop = run(name, "loop")
    results = [res for res, _ in distributed[name]]
    for res in results:  # every rank returns the same result
        assert res.status == loop.status == "ok" and res.epochs_done == loop.epochs_done
        assert res.final["node_acc"] == results[0].final["node_acc"]
        assert res.executor == "distributed" and loop.executor == "loop"
    res = results[0]
    assert len(res.final["node_acc"]) == N
    for a, b in zip(res.final["node_acc"], loop.final["node_acc"]):
        assert abs(a - b) <= ONE_SAMPLE
    _close(res.final, loop.final)
    for ra, rb in zip(res.curve, loop.curve):
        _close(ra, rb)
    assert res.bytes_per_node == loop.bytes_per_node  # whole bytes per message, summed exactly
    assert (res.partition == loop.partition).all()


def test_step_split_per_rank(distributed):
    res = distributed["choco-tv-fp32"][0][0]
    split = res.step_split
    assert [s["rank"] for s in split] == list(range(N))
    steps = RUNS["choco-tv-fp32"]["run"].epochs * 3  # 192 samples / 4 nodes / batch 16
    for s in split:
        assert s["steps"] == steps
        assert all(s[k] >= 0 for k in ("compute", "compression", "communication"))
        assert s["total"] == pytest.approx(s["compute"] + s["compression"] + s["communication"])
        assert s["compute"] > 0 and s["communication"] > 0


def test_resume_equals_uninterrupted(tmp_path, distributed):
    """All ranks stop after epoch 1 (their checkpoints stay); a rerun resumes at epoch 2 and ends
    exactly as the uninterrupted run. Then: rank 3's newest checkpoint lost (a kill between two
    ranks' saves): every rank resumes from the epoch all of them have, still exactly equal."""
    name = "ds-dring-int8"
    full = distributed[name][0][0]
    _launch(tmp_path, [name], kill_epoch=1, checkpoint=True)
    files = sorted(p.name for p in (tmp_path / name).iterdir())
    assert files == sorted([f"checkpoint.rank{r}of{N}.pt" for r in range(N)]
                           + [f"checkpoint.rank{r}of{N}.pt.prev" for r in range(N)]), files
    (tmp_path / name / f"checkpoint.rank3of{N}.pt").unlink()  # rank 3 has epoch 0 only
    got = _launch(tmp_path, [name], checkpoint=True)[name]
    for res, events in got:
        assert events[0] == {"event": "resumed", "epoch": 1, "epochs": 3}, events[:2]
        assert res.final == full.final and res.curve == full.curve and res.bytes_per_node == full.bytes_per_node


def test_a_checkpoint_of_another_run_is_set_aside_on_every_rank(tmp_path, distributed):
    """Per-rank checkpoints follow the run identity like a single file does: stopped as run A,
    started as run B (same plan, another name), every rank sets its file aside in one notice and
    B trains from scratch, exactly as an uninterrupted run."""
    name = "ds-dring-int8"
    full = distributed[name][0][0]
    _launch(tmp_path, [name], kill_epoch=1, checkpoint=True, identity={"cell_id": "a"})
    got = _launch(tmp_path, [name], checkpoint=True, identity={"cell_id": "b"})[name]
    for res, events in got:
        aside = [e for e in events if e["event"] == "checkpoint-set-aside"]
        assert aside and all("identity.cell_id: 'a', this run: 'b'" in e["reason"] for e in aside), events[:3]
        assert not [e for e in events if e["event"] == "resumed"]
        assert res.final == full.final and res.curve == full.curve


# ----------------------------------------------------------------------------- launching
def test_only_node_process_runs_distributed():
    from lpdl_core.decentral.engine import EngineCfg, Simulator
    from lpdl_core.decentral.topology import Topology
    from distributed_train_cases import cnn_fp32

    with pytest.raises(ValueError, match="NodeProcess"):
        Simulator(cnn_fp32, topology=Topology(name="ring", n=2), engine=EngineCfg(executor="distributed"))
    from lpdl_core.decentral.engine import NodeProcess

    with pytest.raises(ValueError, match="process group of one process per node"):  # no group joined
        NodeProcess(cnn_fp32, topology=Topology(name="ring", n=2), engine=EngineCfg(executor="distributed"))
    from lpdl_core.cli import main

    with pytest.raises(SystemExit) as e:  # lpdl demo runs its nodes in one process
        main(["demo", "--executor", "distributed"])
    assert e.value.code == 2


def test_launch_helpers():
    from lpdl_core import cli
    from lpdl_core.cli import launch
    from lpdl_core.pipeline.workflow.slurm_env import slurm_master_env
    from lpdl_core.training import group

    assert cli.DEFAULT_TIMEOUT_S == group.DEFAULT_TIMEOUT_S
    assert not group.in_group({})
    assert group.in_group({"RANK": "0"})
    assert group.in_group({"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "4"})
    # the batch script of a job of 4 tasks is one process, not a rank
    assert not group.in_group({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"})
    argv = launch.torchrun_argv(4, ["train", "--cell", "x"], python="py")
    assert argv == ["py", "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
                    "--max-restarts=0", "-m", "lpdl_core", "train", "--cell", "x"]
    assert launch.child_env(4, environ={"OMP_NUM_THREADS": "8"})["OMP_NUM_THREADS"] == "2"
    assert launch.child_env(4, environ={"OMP_NUM_THREADS": "2"})["OMP_NUM_THREADS"] == "1"
    env = slurm_master_env({"SLURM_JOB_ID": "123457"})
    assert env == {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(20000 + 123457 % 20000)}
    assert slurm_master_env({"MASTER_ADDR": "h", "MASTER_PORT": "1"}) == {}


def test_group_outside_a_launch(monkeypatch):
    from lpdl_core.errors import LpdlError
    from lpdl_core.training.group import Group

    g = Group.join("loop")
    assert (g.rank, g.world, g.distributed) == (0, 1, False) and g.first(lambda: 7) == 7
    for key in ("RANK", "SLURM_PROCID", "SLURM_STEP_NUM_TASKS"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(LpdlError, match="one of n processes"):
        Group.join("distributed")


# ----------------------------------------------------------------------------- the command
CELL = "t4-imagenette-vgg11-dring4-c90-s0.6-choco-int8"  # 4 nodes, CHOCO top-k 90%, 8-bit, skew 0.6


def _lpdl(*args, timeout=600, threads=2):
    import subprocess

    return subprocess.run([sys.executable, "-m", "lpdl_core", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": str(threads)})


@pytest.mark.slow
def test_lpdl_train_distributed_equals_loop(tmp_path):
    """`lpdl train --cell <a 4-node mini cell> --executor distributed` starts 4 processes (torchrun)
    and ends with the loop executor's final metrics, within the tolerance above; rank 0 alone
    writes the run folder and prints the outcome."""
    import json

    d = _lpdl("train", "--cell", CELL, "--out", str(tmp_path / "dist"), "--device", "cpu", "--executor", "distributed")
    assert d.returncode == 0, d.stderr[-3000:]
    assert d.stdout.count(f"[{CELL}] ok:") == 1, d.stdout
    assert "starting 4 processes" in d.stderr
    # one thread, as each rank has (module docstring: the tolerance needs one summation order)
    lp = _lpdl("train", "--cell", CELL, "--out", str(tmp_path / "loop"), "--device", "cpu", threads=1)
    assert lp.returncode == 0, lp.stderr[-3000:]
    got, ref = (json.loads((tmp_path / k / "metrics.json").read_text()) for k in ("dist", "loop"))
    assert got["executor"] == "distributed" and got["config"]["processes"] == 4
    assert got["identity"] == ref["identity"] and got["status"] == ref["status"] == "ok"
    n_test = 360  # the digits stand-in's test split
    for a, b in zip(got["final"]["node_acc"], ref["final"]["node_acc"]):
        assert abs(a - b) <= 100 / n_test + 1e-4
    assert abs(got["final"]["mean_acc"] - ref["final"]["mean_acc"]) <= 100 / n_test + 1e-4
    assert got["bytes_per_node"] == ref["bytes_per_node"]
    assert [s["rank"] for s in got["step_split"]] == [0, 1, 2, 3]
    assert sorted(p.name for p in (tmp_path / "dist").iterdir() if not p.name.startswith(".")) == \
        ["curve.csv", "metrics.json", "partition.csv"]  # every rank's checkpoint removed


def _rank_pid(rank: int) -> int | None:
    """The pid of the `lpdl_core train` process whose RANK is `rank` (torchrun's worker)."""
    for proc in Path("/proc").iterdir():
        try:
            cmd = (proc / "cmdline").read_bytes().split(b"\0")
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"lpdl_core" in cmd and b"train" in cmd and f"RANK={rank}".encode() in env:
            return int(proc.name)
    return None


@pytest.mark.slow
def test_a_killed_rank_fails_lpdl_train_in_time(tmp_path):
    """kill -9 of one rank mid-run: the command exits non-zero within the timeout (torchrun stops
    the other ranks), and a rerun resumes from the ranks' checkpoints and finishes."""
    import signal
    import subprocess
    import time

    out = tmp_path / "run"
    args = [sys.executable, "-m", "lpdl_core", "train", "--cell", CELL, "--out", str(out), "--device", "cpu",
            "--executor", "distributed", "--dist-timeout", "30"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "2"})
    deadline = time.monotonic() + 300
    while not (out / "checkpoint.rank2of4.pt").exists() and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        time.sleep(0.2)
    pid = _rank_pid(2)
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    try:
        _, err = proc.communicate(timeout=30 + 60)
    finally:
        proc.kill()
    assert proc.returncode != 0 and time.monotonic() - t0 < 90, err[-3000:]
    again = _lpdl("train", "--cell", CELL, "--out", str(out), "--device", "cpu", "--executor", "distributed")
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming at epoch" in again.stderr and (out / "metrics.json").exists()


@pytest.mark.slow
def test_selfcheck_under_torchrun():
    """The cluster smoke test (`torchrun ... -m lpdl_core.decentral.engine.selfcheck --check`):
    every rank matches the loop simulator and says so."""
    import subprocess

    from lpdl_core.cli.launch import child_env

    p = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
                        "-m", "lpdl_core.decentral.engine.selfcheck", "--check", "--algorithm", "choco",
                        "--compressor", "topk", "--ratio", "0.9", "--eta", "0.5"],
                       capture_output=True, text=True, timeout=300, env=child_env(4))
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    lines = [l for l in p.stdout.splitlines() if l.startswith("rank ")]
    assert sorted(int(l.split()[1].rstrip(":")) for l in lines) == [0, 1, 2, 3], p.stdout
    assert not any("MISMATCH" in l for l in lines), p.stdout
