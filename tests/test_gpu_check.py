"""scripts/gpu-check.sh, the GPU checks and measurements as one short run: on a CPU only its dry run
and its budget are checked (its commands must stay valid as the CLI changes)."""
from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

from lpdl_core.cli.parser import build_parser

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "gpu-check.sh"


def _run(tmp_path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT)], env={**os.environ, "OUT": str(tmp_path / "out"), **env},
                          capture_output=True, text=True, timeout=60, check=True)


def test_every_bench_of_the_dry_run_parses_as_the_cli_reads_it(tmp_path):
    lines = [shlex.split(line) for line in _run(tmp_path, DRY_RUN="1", PYTHON="python3").stdout.splitlines()]
    benches = [line[3:] for line in lines if line[:3] == ["python3", "-m", "lpdl_core"]]
    assert [b[b.index("--model") + 1] for b in benches] == ["resnet20", "vgg11", "resnet54"]
    for argv in benches:
        args = build_parser().parse_args(argv)
        assert (args.device, args.executor, args.compile, args.int8_arithmetic) == ("cuda", "batched", True, "integer")
        assert args.warmup >= 1  # the first step compiles; it is never timed
    tests = next(line for line in lines if "pytest" in line)
    assert tests[tests.index("-m", 3) + 1] == "gpu" and all((ROOT / t).is_file() for t in tests if t.endswith(".py"))
    assert not (tmp_path / "out").exists()  # a dry run writes nothing


def test_steps_picks_the_steps_and_the_budget_skips_what_would_not_fit(tmp_path):
    only = _run(tmp_path, DRY_RUN="1", STEPS="vgg11").stdout.splitlines()
    assert len(only) == 1 and "--model vgg11" in only[0]
    out = _run(tmp_path, BUDGET_S="0", PYTHON="false").stdout  # nothing fits: nothing runs
    assert out.count("skipped: ") == 5 and "needs about 240 s" in out
    assert list((tmp_path / "out").iterdir()) == []
