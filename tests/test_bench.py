"""`lpdl bench` writes a well-formed JSON report (the speed targets live in the JSON, not here)."""
import json

import pytest

from lpdl_core.cli import main
from lpdl_core.training.bench import LP_OVER_FP_TARGET, bench_step


def test_bench_json_report(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "--model", "resnet20", "--nodes", "2", "--batch", "2", "--steps", "1",
                 "--warmup", "0", "--device", "cpu", "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    assert rep == json.loads(capsys.readouterr().out)
    assert set(rep["results"]) == {"fp32", "int8"} and rep["nodes"] == 2 and rep["executor"] == "loop"
    for r in rep["results"].values():
        assert r["median_s"] > 0 and r["params"] == 273_258
        assert r["aten_ops"] > r["non_view_ops"] > 0 and r["host_syncs"] == 0
    assert rep["lp_over_fp_aten_ops"] == rep["results"]["int8"]["aten_ops"] / rep["results"]["fp32"]["aten_ops"]
    assert rep["lp_over_fp"] > 0 and rep["target_lp_over_fp"] == LP_OVER_FP_TARGET
    assert rep["meets_target"] == (rep["lp_over_fp"] <= LP_OVER_FP_TARGET)


def test_distributed_bench_splits_each_rank_step():
    """`lpdl bench --executor distributed`: n processes, each rank's step split into compute,
    compression and communication (seconds per step, summing to its total); with --compression
    the messages are top-k (about 1 % of the values plus their indices on the wire)."""
    reps = {c: bench_step(model="resnet20", nodes=2, batch=2, steps=1, warmup=0, executor="distributed",
                          device="cpu", precisions=("fp32",), compression=c) for c in (0.0, 99.0)}
    rep = reps[0.0]
    assert rep["executor"] == "distributed" and rep["processes"] == 2 and rep["device"] == "cpu"
    res = rep["results"]["fp32"]
    assert res["median_s"] > 0 and [s["rank"] for s in res["split_per_rank"]] == [0, 1]
    for s in res["split_per_rank"]:
        assert s["steps"] == 1 and s["communication"] > 0
        assert s["total"] == pytest.approx(s["compute"] + s["compression"] + s["communication"])
    full, top1 = (reps[c]["results"]["fp32"]["bytes_per_step_per_node"] for c in (0.0, 99.0))
    assert reps[99.0]["compression"] == 99.0 and 0 < top1 < full / 20


def test_bench_rejects_a_bad_compression(capsys):
    with pytest.raises(SystemExit) as e:
        main(["bench", "--compression", "100"])
    assert e.value.code == 2 and "outside [0, 100)" in capsys.readouterr().err


def test_bench_standin_times_the_mini_profiles_model(tmp_path):
    """--standin: the paper model's mini stand-in on the 8x8 input, the step `make reproduce` trains."""
    from lpdl_core.models.mini import build_standin

    out = tmp_path / "bench.json"
    assert main(["bench", "--model", "resnet20", "--standin", "--nodes", "2", "--batch", "2", "--steps", "1",
                 "--warmup", "0", "--device", "cpu", "--precisions", "fp32", "--out", str(out)]) == 0
    rep = json.loads(out.read_text())
    standin = sum(p.numel() for p in build_standin("resnet20").parameters())
    assert rep["standin"] is True and rep["results"]["fp32"]["params"] == standin != 273_258
