"""Per-table results: every cell of a paper table with its reproduced value(s), the paper's value
and the difference. Missing runs stay missing (never filled); diverged runs are marked; a cell
within LEARNED_MARGIN points of chance is marked as not learned; a cell whose mini run was
computed once for another cell names that cell (same_run_as)."""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Iterable, Mapping

from .cells import Cell
from .config import LEARNED_MARGIN
from .runstore import read_run_metrics, run_identity

KEYS = ("table", "block", "cell_id", "dataset", "model", "nodes", "topology", "compression", "eta",
        "skew", "algorithm", "precision", "momentum", "norm")


def _stats(values: list[float]) -> tuple[float | None, float | None]:
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def aggregate_table(cells: Iterable[Cell], runs: Mapping[str, list[dict]], profile: str) -> list[dict]:
    """One row per cell. runs: cell_id -> metrics.json dicts of its seeds (finished ones only).

    reproduced = mean over seeds of the mean per-node test accuracy (the official metric);
    avg_model = the same for the parameter-averaged model; delta = reproduced - paper.
    chance = 100 / the classes of the data the runs trained on (metrics num_classes; empty when
    not recorded); learned = reproduced > chance + LEARNED_MARGIN (empty when either is unknown).
    """
    rows = []
    for c in cells:
        ms = runs.get(c.cell_id, [])
        ok = [m for m in ms if m.get("status") == "ok"]
        mean, std = _stats([m["final"]["mean_acc"] for m in ok])
        amean, astd = _stats([m["final"]["avg_model_acc"] for m in ok])
        status = "missing" if not ms else ("ok" if len(ok) == len(ms) else
                                           "diverged" if not ok else "partly-diverged")
        diverged = [m.get("diverged_at") for m in ms if m.get("status") == "diverged"]
        classes = next((m["num_classes"] for m in ms if m.get("num_classes")), None)
        chance = 100.0 / classes if classes else None
        same = sorted({m["config"]["same_run_as"] for m in ms if m.get("config", {}).get("same_run_as")})
        rows.append({
            **{k: getattr(c, k) for k in KEYS if k != "cell_id"}, "cell_id": c.cell_id,
            "profile": profile, "seeds": len(ok), "status": status,
            "reproduced": mean, "reproduced_std": std, "avg_model": amean, "avg_model_std": astd,
            "paper": c.paper_acc,
            "delta": (mean - c.paper_acc) if (mean is not None and c.paper_acc is not None) else None,
            "chance": chance,
            "learned": (mean > chance + LEARNED_MARGIN) if (mean is not None and chance is not None) else None,
            "same_run_as": ";".join(same),
            "consensus_distance": _stats([m["final"]["consensus_distance"] for m in ok])[0],
            "mb_per_node": _stats([m["bytes_per_node"] / 1e6 for m in ok])[0],
            "wall_time_s": sum(m.get("wall_time_s", 0.0) for m in ms) or None,
            "diverged_at": json.dumps(diverged) if diverged else "",
            "mapping": "; ".join(ms[0]["config"].get("mapping", [])) if ms else "",
        })
    return rows


def run_dir(results_dir: str | Path, cell_id: str, seed: int) -> Path:
    """results/{profile}/runs/{cell}/seed{seed}: where one run lives."""
    return Path(results_dir) / "runs" / cell_id / f"seed{seed}"


def seeds_present(results_dir: str | Path, cell_id: str) -> list[int]:
    """Seeds with a finished run (a metrics.json) of a cell, ascending."""
    d = Path(results_dir) / "runs" / cell_id
    found = [p.parent.name.removeprefix("seed") for p in d.glob("seed*/metrics.json")] if d.is_dir() else []
    return sorted(int(s) for s in found if s.isdigit())


def collect_runs(cells: Iterable[Cell], results_dir: str | Path, *, profile: str, seeds=None,
                 fidelity=None) -> dict[str, list[dict]]:
    """cell_id -> the metrics.json of its runs, read from their own folders and checked.

    seeds: the seeds to read (a missing run stays missing); None = every seed present.
    fidelity: the fidelity options the runs must have (None: any). A corrupt metrics.json is a
    CorruptFile and a run of another cell, seed, profile or setting a RunMismatch, each one line
    naming the file: a result is never filed under a name it does not have.
    """
    out: dict[str, list[dict]] = {}
    for c in cells:
        for seed in (seeds_present(results_dir, c.cell_id) if seeds is None else seeds):
            path = run_dir(results_dir, c.cell_id, seed) / "metrics.json"
            if not path.exists():
                continue
            want = run_identity(c, profile=profile, seed=seed, fidelity=fidelity or {})
            if fidelity is None:
                del want["fidelity"]
            out.setdefault(c.cell_id, []).append(read_run_metrics(path, want))
    return out
