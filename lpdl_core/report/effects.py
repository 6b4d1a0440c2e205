"""The paper's effects, block by block: what changes when one axis changes, in the paper and in
the reproduction, with the spread over seeds.

On stand-in data (the mini profile) absolute accuracies cannot match the paper's, but effects can:
FP − LP, CHOCO − DS, the drop from the smallest to the largest skew, 8 vs 16 nodes, and 0 % vs
compressed. An effect compares pairs of cells that differ in that axis only (and in what goes
with it: the norm with the precision, η with the compression, block and batch per node with the
node count). For every seed s the reproduced effect is the mean over the block's pairs of
acc_s(a) − acc_s(b); the table gives its mean and standard deviation over seeds beside the
paper's effect (the mean of the same differences of the paper's numbers).

Only cells that learned count: a cell within LEARNED_MARGIN points of chance (100 / classes of the
data its run trained on) did not learn in that seed, and every pair touching it is left out (a run
whose classes are unknown cannot be judged and counts). Every block with pairs in the paper gets a
row, with or without results. Verdicts:
  same sign      the reproduced effect has the paper's sign (its size may differ: stand-ins and a
                 short protocol set magnitudes, so only the direction is compared);
  opposite sign  it has the other sign;
  no sign        the paper's or the reproduced effect is under SIGN_EPS points: no direction to
                 compare (two cells computed as one run give exactly 0 +- 0);
  within noise   the seed spread is at least as large as the reproduced effect (>= 2 seeds; a
                 spread under SIGN_EPS is no noise);
  not learned   no pair of learned cells;
  missing       no pair with results.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Iterable, Mapping

from ..pipeline.cells.cell import columns
from .model import LEARNED_MARGIN

SIGN_EPS = 0.05        # |effect| below this (points) has no sign
EFFECT_VERDICTS = ("same sign", "opposite sign", "no sign", "within noise", "not learned", "missing")
PAIRING = columns("pairing")   # what a pair of runs agrees on, but the effect's axis (Cell's metadata)


@dataclass(frozen=True)
class Effect:
    """One effect: the axis that changes, its two sides, and how pairs are formed."""

    name: str
    axis: str
    a: Callable[[list], object]          # picks side a's value from the values present
    b: Callable[[list], object]
    ignore: tuple[str, ...] = ()         # axes that change with `axis` (not pairing keys)
    where: Callable[[object], bool] = lambda c: True


EFFECTS = (
    Effect("FP − LP", "precision", lambda v: "fp32", lambda v: "int8"),
    Effect("CHOCO − DS", "algorithm", lambda v: "choco", lambda v: "ds"),
    Effect("skew drop (smallest − largest skew)", "skew", min, max),
    Effect("8 − 16 nodes", "nodes", lambda v: 8, lambda v: 16, ignore=("block", "batch_per_node"),
           where=lambda c: c.compression == 0),
    Effect("0 % − compressed", "compression", lambda v: 0, lambda v: max(v), ignore=("eta",)),
)


@dataclass(frozen=True, kw_only=True)
class EffectRow:
    effect: str
    table: str
    block: str                  # "resnet20-dring8", or "resnet20-dring8 vs resnet20-dring16"
    pairs: int                  # pairs of learned cells behind `reproduced` (in any seed)
    paper: float | None         # the paper's effect (points) over those pairs (none: all the block's)
    reproduced: float | None    # mean over seeds of the reproduced effect
    spread: float | None        # standard deviation over seeds (None with one seed)
    seeds: int
    verdict: str                # one of EFFECT_VERDICTS
    title: str = ""             # the block as a reader names it, e.g. "ResNet-20, directed ring, 8 nodes"


def chance(num_classes: int) -> float:
    return 100.0 / num_classes


def learned(acc: float | None, num_classes: int | None) -> bool:
    """Whether an accuracy is more than LEARNED_MARGIN points above chance (num_classes None:
    unknown, so it cannot be said not to have learned)."""
    if acc is None:
        return False
    return num_classes is None or acc > chance(num_classes) + LEARNED_MARGIN


def _key(cell, effect: Effect) -> tuple:
    return tuple(getattr(cell, k) for k in PAIRING if k != effect.axis and k not in effect.ignore)


def _pairs(cells: list, effect: Effect) -> dict[tuple[str, str, str], list[tuple[object, object]]]:
    """(table, block of a, block of b) -> [(cell a, cell b)] for cells differing only in
    effect.axis (block names repeat across tables: Table 1 and Table 5 both have
    "agnews-distilbert")."""
    groups: dict[tuple, dict[object, object]] = {}
    for c in cells:
        if effect.where(c):
            groups.setdefault(_key(c, effect), {})[getattr(c, effect.axis)] = c
    out: dict[tuple[str, str], list] = {}
    for g in groups.values():
        values = list(g)
        if len(values) < 2:
            continue
        va, vb = effect.a(values), effect.b(values)
        if va in g and vb in g and va != vb:
            out.setdefault((g[va].table, g[va].block, g[vb].block), []).append((g[va], g[vb]))
    return out


def seed_sign(values: list[float]) -> str | int:
    """The direction of per-seed effects: "within noise" (their spread is at least their mean,
    and at least SIGN_EPS), "no sign" (the mean is under SIGN_EPS: identical runs give exactly
    0 +- 0), else the mean's sign, +1 or -1. Shared with the extension grids' effects."""
    mean = statistics.fmean(values)
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    if spread >= max(abs(mean), SIGN_EPS):
        return "within noise"
    if abs(mean) < SIGN_EPS:
        return "no sign"
    return 1 if mean > 0 else -1


def _verdict(paper: float | None, values: list[float]) -> str:
    """Sign agreement of the per-seed effects with the paper's; noise first (seed_sign)."""
    sign = seed_sign(values)
    if isinstance(sign, str):
        return sign
    if paper is None or abs(paper) < SIGN_EPS:
        return "no sign"
    return "same sign" if (paper > 0) == (sign > 0) else "opposite sign"


def _paper_effect(pairs: list) -> float | None:
    """Mean of the paper's a - b over pairs where it gives both numbers."""
    d = [a.paper_acc - b.paper_acc for a, b in pairs if a.paper_acc is not None and b.paper_acc is not None]
    return statistics.fmean(d) if d else None


def seed_effects(pairs: list, acc: Mapping, seeds: list[int], num_classes: Mapping,
                 key: Callable[[object], str] = lambda c: c.cell_id) -> tuple[list[float], list, bool]:
    """(effect per seed over its learned pairs, the pairs used in any seed, whether any pair had
    results at all). key: a pair member's cell id (the members are cells, or ids with key=str)."""
    per_seed, used, with_results = [], [], False
    for s in seeds:
        both = [(a, b) for a, b in pairs if (key(a), s) in acc and (key(b), s) in acc]
        with_results |= bool(both)
        ok = [(a, b) for a, b in both if learned(acc[key(a), s], num_classes.get(key(a)))
              and learned(acc[key(b), s], num_classes.get(key(b)))]
        if ok:
            per_seed.append(statistics.fmean(acc[key(a), s] - acc[key(b), s] for a, b in ok))
            used += [p for p in ok if p not in used]
    return per_seed, used, with_results


def block_effects(cells: Iterable, acc: Mapping[tuple[str, int], float], seeds: Iterable[int],
                  num_classes: Mapping[str, int]) -> list[EffectRow]:
    """Every effect in every block that has pairs in the paper, with or without results.

    cells: the paper cells (lpdl_core.pipeline.cells.cell.Cell). acc: (cell_id, seed) -> reproduced accuracy
    of finished runs (status ok). num_classes: cell_id -> classes of the data it ran on (cells
    absent: unknown). The paper's effect is taken over the pairs the reproduction used (like for
    like), or over all of the block's pairs where none was used.
    """
    cells, seeds = list(cells), sorted(set(seeds))
    rows = []
    for effect in EFFECTS:
        for (table, block_a, block_b), pairs in _pairs(cells, effect).items():
            per_seed, used, with_results = seed_effects(pairs, acc, seeds, num_classes)
            paper = _paper_effect(used or pairs)
            if per_seed:
                verdict, mean = _verdict(paper, per_seed), statistics.fmean(per_seed)
                spread = statistics.stdev(per_seed) if len(per_seed) > 1 else None
            else:
                verdict, mean, spread = ("not learned" if with_results else "missing"), None, None
            rows.append(EffectRow(effect=effect.name, table=table,
                                  block=block_a if block_a == block_b else f"{block_a} vs {block_b}",
                                  pairs=len(used), paper=paper, reproduced=mean, spread=spread,
                                  seeds=len(per_seed), verdict=verdict))
    return rows
