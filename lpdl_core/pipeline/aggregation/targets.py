"""Did the mini run learn? The mini profile's learning targets, checked on finished runs
(`lpdl targets results/mini`). Torch-free; reads only metrics.json files.

Targets (per seed; accuracies are the final mean node test accuracy, in %):
  single-node     every single-node image cell (Table 1, FP and LP) >= 93
  8-node          every 8-node cell at skew 0 and 0 % compression >= 90
  8-node FP-LP    |FP - LP| <= 2 points for each such cell pair
  16-node         every 16-node cell at skew 0 and 0 % compression >= 85
  text            every text cell at skew 0 and 0 % compression (single node included) >= 2x chance
  figure 1        every Figure 1 run ends with validation error <= 15 (accuracy >= 85)
and, over all cells, how many ended within LEARNED_MARGIN points of chance ("did not learn").
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ...config import LEARNED_MARGIN
from ...config import DATASET_SPECS


@dataclass(frozen=True)
class Check:
    target: str
    seed: int
    subject: str          # a cell id, or "cell A vs cell B"
    value: float | None   # None: no finished run
    bound: str            # e.g. ">= 93"
    ok: bool


def _acc(results: Path, cell_id: str, seed: int) -> tuple[float | None, int | None]:
    path = results / "runs" / cell_id / f"seed{seed}" / "metrics.json"
    if not path.is_file():
        return None, None
    m = json.loads(path.read_text())
    if m.get("status") != "ok":
        return None, None
    return float(m["final"]["mean_acc"]), num_classes(m, path.parent)


def num_classes(metrics: dict, run_dir: Path) -> int | None:
    """Classes of the data the run trained on: metrics["num_classes"], else the class columns of
    its partition.csv (runs made before num_classes was recorded)."""
    if metrics.get("num_classes"):
        return int(metrics["num_classes"])
    part = run_dir / "partition.csv"
    if part.is_file():
        header = part.read_text().splitlines()[:1]
        cols = header[0].split(",") if header else []
        return len([c for c in cols if c not in ("node", "total")]) or None
    return None


def _at_least(target, seed, cell_id, value, bound) -> Check:
    return Check(target, seed, cell_id, value, f">= {bound:g}", value is not None and value >= bound)


def check_targets(results_dir: str | Path, cells, seeds) -> list[Check]:
    """Every target's check for every seed (cells: lpdl_core.pipeline.cells.cell.Cell, the ones that ran)."""
    results = Path(results_dir)
    out: list[Check] = []
    for seed in seeds:
        acc = {c.cell_id: _acc(results, c.cell_id, seed)[0] for c in cells}
        base = [c for c in cells if c.skew == 0 and c.compression == 0]
        for c in cells:
            a = acc[c.cell_id]
            if c.nodes == 1 and c.model != "distilbert":
                out.append(_at_least("single-node image >= 93", seed, c.cell_id, a, 93))
            if c.table == "fig1":
                out.append(_at_least("figure 1 val. error <= 15", seed, c.cell_id, a, 85))
        for c in base:
            a = acc[c.cell_id]
            if c.model == "distilbert":
                out.append(_at_least("text >= 2x chance", seed, c.cell_id, a, 2 * DATASET_SPECS[c.dataset].chance))
            elif c.nodes == 8:
                out.append(_at_least("8-node >= 90", seed, c.cell_id, a, 90))
            elif c.nodes == 16:
                out.append(_at_least("16-node >= 85", seed, c.cell_id, a, 85))
        lp = {(c.table, c.block, c.algorithm, c.momentum, c.skew, c.compression): c for c in base
              if c.nodes == 8 and c.model != "distilbert" and c.precision == "int8"}
        for c in base:
            key = (c.table, c.block, c.algorithm, c.momentum, c.skew, c.compression)
            if c.nodes == 8 and c.model != "distilbert" and c.precision == "fp32" and key in lp:
                a, b = acc[c.cell_id], acc[lp[key].cell_id]
                gap = None if a is None or b is None else a - b
                out.append(Check("8-node |FP - LP| <= 2", seed, f"{c.cell_id} vs {lp[key].cell_id}", gap,
                                 "|x| <= 2", gap is not None and abs(gap) <= 2))
    return out


def not_learned(results_dir: str | Path, cells, seeds) -> list[tuple[str, int, float]]:
    """(cell, seed, accuracy) of every finished run within LEARNED_MARGIN points of chance."""
    results = Path(results_dir)
    out = []
    for seed in seeds:
        for c in cells:
            a, classes = _acc(results, c.cell_id, seed)
            if a is not None and classes and a <= 100 / classes + LEARNED_MARGIN:
                out.append((c.cell_id, seed, a))
    return out


def format_checks(checks: list[Check]) -> str:
    """One line per target and seed: passed/total and the failures with their values."""
    groups: dict[tuple[str, int], list[Check]] = {}
    for ch in checks:
        groups.setdefault((ch.target, ch.seed), []).append(ch)
    lines = []
    for (target, seed), chs in groups.items():
        bad = [c for c in chs if not c.ok]
        vals = [c.value for c in chs if c.value is not None]
        span = f"{min(vals):.1f} to {max(vals):.1f}" if vals else "no runs"
        lines.append(f"{target:28s} seed {seed:<5d} {len(chs) - len(bad)}/{len(chs)} met  (values {span})"
                     + "".join(f"\n    NOT MET {c.subject}: {'missing' if c.value is None else f'{c.value:.2f}'}"
                               f" (needs {c.bound})" for c in bad))
    return "\n".join(lines)
