"""Per-table results: every cell of a paper table with its reproduced value(s), the paper's value
and the difference. Missing runs stay missing (never filled); diverged runs are marked."""
from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Iterable, Mapping

from .cells import Cell

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
        rows.append({
            **{k: getattr(c, k) for k in KEYS if k != "cell_id"}, "cell_id": c.cell_id,
            "profile": profile, "seeds": len(ok), "status": status,
            "reproduced": mean, "reproduced_std": std, "avg_model": amean, "avg_model_std": astd,
            "paper": c.paper_acc,
            "delta": (mean - c.paper_acc) if (mean is not None and c.paper_acc is not None) else None,
            "consensus_distance": _stats([m["final"]["consensus_distance"] for m in ok])[0],
            "mb_per_node": _stats([m["bytes_per_node"] / 1e6 for m in ok])[0],
            "wall_time_s": sum(m.get("wall_time_s", 0.0) for m in ms) or None,
            "diverged_at": json.dumps(diverged) if diverged else "",
            "mapping": "; ".join(ms[0]["config"].get("mapping", [])) if ms else "",
        })
    return rows


def load_runs(paths: Iterable[str | Path]) -> dict[str, list[dict]]:
    """metrics.json files -> cell_id -> list of metrics (one per seed)."""
    out: dict[str, list[dict]] = {}
    for p in paths:
        p = Path(p)
        if not p.exists():
            continue
        m = json.loads(p.read_text())
        out.setdefault(m["config"]["cell_id"], []).append(m)
    return out

