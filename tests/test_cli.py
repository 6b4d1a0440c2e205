"""The `lpdl` command line and the core demo."""
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from lpdl_core.cli import main
from lpdl_core.training.demo import DemoRun, format_table, run_demo

ROOT = Path(__file__).resolve().parents[1]


def test_topology_prints_matrix_and_slem(capsys):
    assert main(["topology", "--graph", "directed-ring", "--nodes", "8"]) == 0
    out = capsys.readouterr().out
    assert "SLEM: 0.9239" in out and "node 0: in [7]  out [1]" in out


def test_topology_bad_size_is_one_clear_line(capsys):
    assert main(["topology", "--graph", "grid-official", "--nodes", "3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs n >= 5" in err[0]


def test_partition_cifar_table_and_files(tmp_path, capsys):
    csv, js = tmp_path / "h.csv", tmp_path / "h.json"
    assert main(["partition", "--dataset", "cifar10", "--nodes", "8", "--skew", "0.8", "--out", str(csv)]) == 0
    out = capsys.readouterr().out
    assert "4124  1117   142   122    99   134   105   151   122   133   6249" in out
    assert csv.read_text().splitlines()[1] == "0,4124,1117,142,122,99,134,105,151,122,133,6249"
    sizes = ",".join(["5000"] * 10)
    assert main(["partition", "--class-sizes", sizes, "--nodes", "8", "--skew", "0.8", "--out", str(js)]) == 0
    assert json.loads(js.read_text())["counts"][0] == [4124, 1117, 142, 122, 99, 134, 105, 151, 122, 133]


def test_partition_argument_errors(capsys):
    assert main(["partition", "--nodes", "8"]) == 2
    assert main(["partition", "--class-sizes", "10,x", "--nodes", "2"]) == 2
    with pytest.raises(SystemExit) as e:  # argparse: a usage error, one line, exit 2
        main(["partition", "--dataset", "cifar10", "--skew", "1.5"])
    assert e.value.code == 2
    err = [l for l in capsys.readouterr().err.splitlines() if l.strip()]
    assert len(err) == 3 and all(l.startswith("lpdl partition: error: ") for l in err)


def test_demo_small_runs_and_reports():
    runs = (DemoRun("ds", 0.0, 1.0), DemoRun("choco", 0.99, 0.01))
    results = run_demo(epochs=2, nodes=4, device="cpu", runs=runs)
    table = format_table(results)
    assert table.count("\n") == 3 and "choco" in table and "99%" in table
    for _, r in results:
        assert r.status == "ok" and r.epochs_done == 2 and r.partition.shape == (4, 10)
        assert 0 <= r.final["mean_acc"] <= 100 and r.bytes_per_node > 0
    dense, sparse = (r.bytes_per_node for _, r in results)
    assert sparse < dense / 20  # 99% top-k: ~66x fewer bytes (values + indices)


@pytest.mark.slow
def test_demo_cli_default_learns():
    """`lpdl demo` (what `make reproduce` runs): uncompressed runs learn the digits well."""
    proc = subprocess.run([sys.executable, "-m", "lpdl_core", "demo", "--quiet", "--device", "cpu"],
                          capture_output=True, text=True, check=True, timeout=600)
    rows = [l.split() for l in proc.stdout.splitlines() if l.startswith(("ds ", "choco "))]
    assert len(rows) == 4
    for row in rows:
        assert row[-1] == "ok"
        if row[1] == "0%":
            assert float(row[3].rstrip("%")) > 85.0  # mean node accuracy


@pytest.mark.slow
def test_snakemake_demo_target(tmp_path):
    snakemake = shutil.which("snakemake") or str(Path(sys.executable).parent / "snakemake")
    work = tmp_path / "wf"
    shutil.copytree(ROOT, work, ignore=shutil.ignore_patterns(".venv", ".git", "results", ".snakemake"))
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    # nested values given with --config arrive as strings (skew '0.8'), so override by file
    (work / "demo.yaml").write_text("demo: {epochs: 2, nodes: 4, skew: 0.8}\n")
    proc = subprocess.run([snakemake, "-c2", "demo", "--configfile", "config/config.yaml", "demo.yaml"],
                          cwd=work, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (work / "results/demo/table.txt").read_text()
    assert "avg-model acc" in table and table.count("ok") == 4
