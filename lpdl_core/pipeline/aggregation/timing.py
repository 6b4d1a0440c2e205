"""Where a pipeline run's time went, as JSON (`lpdl timing results/mini`). Torch-free.

Reads what the DAG leaves behind: each training job's Snakemake benchmark (its wall seconds,
results/{profile}/benchmarks/train/{job}/seed{seed}.tsv) and each run's metrics.json (the
seconds spent inside train(): training steps, per-epoch evaluation and the final gossip rounds).
A job's seconds outside its runs' train() are its fixed cost: starting Python, importing torch,
loading the data, building models and writing results. Runs recorded as another cell's run
(`config.same_run_as`) cost nothing and are counted apart; the cells of a pack (`config.packed_with`),
which trained together and each record the pack's wall time, share it equally.
"""
from __future__ import annotations

import csv
import json
import os
import platform
from collections import Counter, defaultdict
from datetime import datetime, timezone
from pathlib import Path

from ...errors import LpdlError


def _bench_seconds(path: Path) -> float:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    if not rows or "s" not in rows[0]:
        raise LpdlError(f"{path}: not a Snakemake benchmark file (no 's' column)")
    return float(rows[0]["s"])


def machine() -> dict:
    """The machine this runs on: CPU model (Linux /proc/cpuinfo, else platform), cores, OS."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"cpu": cpu, "cores": os.cpu_count(), "os": platform.platform(terse=True)}


def pipeline_timing(results_dir: str | Path, jobs, cells, seeds=None) -> dict:
    """jobs: lpdl_core.pipeline.workflow.jobs.plan_jobs(...) for the run; cells: the cells they hold; seeds: only
    these seeds' jobs (None: every seed found)."""
    results = Path(results_dir)
    by_id = {c.cell_id: c for c in cells}
    job_rows, runs, shas = [], [], Counter()
    for job in jobs:
        for bench in sorted((results / "benchmarks" / "train" / job.name).glob("seed*.tsv")):
            seed = bench.stem.removeprefix("seed")
            if seeds is not None and int(seed) not in seeds:
                continue
            train_s, computed, shared = 0.0, 0, 0
            for cid in job.cells:
                mpath = results / "runs" / cid / f"seed{seed}" / "metrics.json"
                if not mpath.is_file():
                    continue
                m = json.loads(mpath.read_text())
                if m.get("config", {}).get("same_run_as"):
                    shared += 1
                    continue
                computed += 1
                # a packed run records its whole pack's wall time: each of its cells takes a share
                share = float(m["wall_time_s"]) / (1 + len(m.get("config", {}).get("packed_with") or ()))
                train_s += share
                shas[(m.get("provenance", {}).get("git_sha") or "unknown")[:12]] += 1
                c = by_id[cid]
                runs.append({"cell": cid, "seed": int(seed), "table": c.table, "model": c.model,
                             "precision": c.precision, "nodes": c.nodes, "train_s": round(share, 2)})
            wall = _bench_seconds(bench)
            job_rows.append({"job": job.name, "seed": int(seed), "wall_s": round(wall, 2), "runs": computed,
                             "shared": shared, "train_s": round(train_s, 2),
                             "outside_train_s": round(wall - train_s, 2)})
    if not job_rows:
        which = f" for seed(s) {', '.join(map(str, seeds))}" if seeds else ""
        raise LpdlError(f"{results}: no training benchmarks{which} under benchmarks/train/ (run the pipeline first)")
    by_table: dict[str, float] = defaultdict(float)
    by_model: dict[str, float] = defaultdict(float)
    for r in runs:
        by_table[r["table"]] += r["train_s"]
        by_model[f"{r['model']} {r['precision']}"] += r["train_s"]
    wall = sum(j["wall_s"] for j in job_rows)
    train = sum(j["train_s"] for j in job_rows)
    return {
        "results": str(results),
        "computed_utc": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "git_sha_of_runs": dict(shas.most_common()),
        "machine": machine(),
        "jobs": len(job_rows),
        "runs_computed": sum(j["runs"] for j in job_rows),
        "runs_shared": sum(j["shared"] for j in job_rows),
        "job_wall_s": round(wall, 1),
        "train_s": round(train, 1),
        "outside_train_s": round(wall - train, 1),
        "outside_train_s_per_job": round((wall - train) / len(job_rows), 2),
        "train_s_by_table": {k: round(v, 1) for k, v in sorted(by_table.items())},
        "train_s_by_model": {k: round(v, 1) for k, v in sorted(by_model.items(), key=lambda kv: -kv[1])},
        "slowest_runs": sorted(runs, key=lambda r: -r["train_s"])[:10],
        "jobs_detail": sorted(job_rows, key=lambda j: -j["wall_s"]),
    }
