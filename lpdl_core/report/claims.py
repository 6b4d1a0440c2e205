"""The paper's headline claims, checked on whatever numbers are present.

Each claim compares pairs of cells that differ in one axis only (precision, algorithm or skew)
and both have a result (status ok: every seed finished; diverged and missing cells are left out).
The verdict is 'holds', 'does not hold' or 'not enough cells' (fewer pairs than MIN_PAIRS), or
'within noise' where a claim about pairs does not hold but the spread over seeds of its effect
(the mean pair difference, seed by seed; two or more seeds) is at least as large as the effect
itself: seed noise is not evidence against the paper.
Values are the reproduced mean per-node test accuracy (%), averaged over seeds. In the mini
profile only cells that learned count (so both cells of every pair learned): a cell within
LEARNED_MARGIN points of chance is left out. The paper profile judges every finished cell.

1. 8-bit training without compression is within 1 point of full precision (Section 4.1: "minimal
   accuracy loss of less than 1%"): mean FP - LP over the compression-0 pairs < 1.
2. With compression LP loses 1-2 points: mean FP - LP over compressed pairs <= 2.
3. CHOCO-SGD performs at least as well as Deep-Squeeze (Section 6): mean CHOCO - DS >= 0.
4. Accuracy falls as skew rises (Section 6): in most (> half) settings the accuracy at the
   largest skew is below that at the smallest, and the mean drop is positive.
5. At skew 0.9 without compression LP-CHOCO >= CHOCO for ResNet-20 (Section 4.1): every such pair.
6. LP cuts compute and memory about 4x (Section 5, Figure 3): both ratios of the analytic cost
   model (lpdl_core.training.cost, 8-bit weights/activations/layer gradients, float32 weight gradients as
   the paper's bifurcation keeps them) are >= 3. The all-8-bit ratios are given as evidence.
"""
from __future__ import annotations

import statistics
from typing import Callable, Iterable

from .data import not_learned_cells, per_seed_acc, rows_of
from .effects import seed_effects
from .model import Claim, ReportData

MIN_PAIRS = 2
DECENTRALIZED = ("table2", "table3", "table4", "table5")
_AXES = ("table", "block", "dataset", "model", "nodes", "topology", "compression", "eta", "skew",
         "algorithm", "precision", "momentum")


def _ok_rows(data: ReportData, tables: Iterable[str]) -> list[dict]:
    flat = set(not_learned_cells(data)) if data.profile == "mini" else set()
    return [r for t in tables for r in rows_of(data, t) if r["status"] == "ok"
            and r["reproduced"] is not None and r["cell_id"] not in flat]


def _seed_effects(data: ReportData, pairs) -> list[float]:
    """The claim's effect seed by seed: mean over pairs of acc_s(a) - acc_s(b) (effects.seed_effects,
    with no per-seed learned filter: the claim's rows are already those that learned on average)."""
    acc = per_seed_acc(data)
    return seed_effects(pairs, acc, sorted({s for _, s in acc}), {}, key=lambda r: r["cell_id"])[0]


def _pairs(rows: list[dict], axis: str, a, b) -> list[tuple[dict, dict]]:
    """(row with axis == a, row with axis == b) for rows equal on every other axis."""
    key = lambda r: tuple(r[k] for k in _AXES if k != axis)
    other = {key(r): r for r in rows if r[axis] == b}
    return [(r, other[key(r)]) for r in rows if r[axis] == a and key(r) in other]


def _fmt(pairs, diff: Callable[[dict, dict], float], what: str) -> tuple[float, str]:
    d = [diff(x, y) for x, y in pairs]
    mean = statistics.fmean(d)
    return mean, (f"{len(d)} pairs; mean {what} {mean:+.2f} points (min {min(d):+.2f}, "
                  f"max {max(d):+.2f})")


def _precision_gap(data: ReportData, compressed: bool) -> list[tuple[dict, dict]]:
    rows = [r for r in _ok_rows(data, DECENTRALIZED) if (r["compression"] > 0) == compressed]
    # norm is not a pairing axis: FP runs use EvoNorm, LP ones Range EvoNorm (the paper's pairs)
    return _pairs(rows, "precision", "fp32", "int8")


def _claim(number: int, text: str, pairs, ok: Callable[[float], bool], diff, what: str,
           data: ReportData | None = None) -> Claim:
    if len(pairs) < MIN_PAIRS:
        return Claim(number=number, text=text, verdict="not enough cells", cells=len(pairs),
                     evidence=f"{len(pairs)} complete pair(s); at least {MIN_PAIRS} needed")
    mean, evidence = _fmt(pairs, diff, what)
    verdict, evidence = _noise("holds" if ok(mean) else "does not hold", evidence, data, pairs)
    return Claim(number=number, text=text, verdict=verdict, evidence=evidence, cells=len(pairs))


def _noise(verdict: str, evidence: str, data: ReportData | None, pairs) -> tuple[str, str]:
    """Add the effect's spread over seeds to the evidence; 'does not hold' becomes 'within noise'
    where that spread is at least as large as the effect."""
    per_seed = _seed_effects(data, pairs) if data is not None else []
    if len(per_seed) < 2:
        return verdict, evidence
    mean, spread = statistics.fmean(per_seed), statistics.stdev(per_seed)
    evidence += f"; over {len(per_seed)} seeds {mean:+.2f} ± {spread:.2f}"
    if verdict == "does not hold" and 0 < spread and spread >= abs(mean):
        verdict = "within noise"
    return verdict, evidence


def _skew_trend(data: ReportData) -> Claim:
    text = "Accuracy falls as the degree of skew rises."
    groups: dict[tuple, dict[float, dict]] = {}
    for r in _ok_rows(data, DECENTRALIZED):
        groups.setdefault(tuple(r[k] for k in _AXES if k != "skew"), {})[r["skew"]] = r
    pairs = [(g[min(g)], g[max(g)]) for g in groups.values() if len(g) >= 2]
    drops = [lo["reproduced"] - hi["reproduced"] for lo, hi in pairs]
    if len(drops) < MIN_PAIRS:
        return Claim(number=4, text=text, verdict="not enough cells", cells=len(drops),
                     evidence=f"{len(drops)} setting(s) with two or more skews; {MIN_PAIRS} needed")
    falling = sum(d > 0 for d in drops)
    mean = statistics.fmean(drops)
    holds = falling > len(drops) / 2 and mean > 0
    verdict, evidence = _noise("holds" if holds else "does not hold",
                               f"{falling} of {len(drops)} settings lower at their largest skew than "
                               f"at their smallest; mean drop {mean:+.2f} points", data, pairs)
    return Claim(number=4, text=text, verdict=verdict, cells=len(drops), evidence=evidence)


def _lp_at_high_skew(data: ReportData) -> Claim:
    text = ("At skew 0.9 without compression, LP-CHOCO (8-bit) is at least as accurate as CHOCO "
            "(32-bit) for ResNet-20.")
    rows = [r for r in _ok_rows(data, ["table2"]) if r["model"] == "resnet20"
            and r["compression"] == 0 and r["skew"] == 0.9 and r["algorithm"] == "choco"]
    pairs = _pairs(rows, "precision", "int8", "fp32")
    if not pairs:
        return Claim(number=5, text=text, verdict="not enough cells", cells=0,
                     evidence="no ResNet-20 skew-0.9 uncompressed CHOCO pair with both results")
    diffs = [lp["reproduced"] - fp["reproduced"] for lp, fp in pairs]
    parts = ", ".join(f"n={lp['nodes']}: {d:+.2f}" for (lp, _), d in zip(pairs, diffs))
    verdict, evidence = _noise("holds" if min(diffs) >= 0 else "does not hold",
                               f"LP - FP per graph: {parts}", data, pairs)
    return Claim(number=5, text=text, verdict=verdict, cells=len(pairs), evidence=evidence)


def _cost_claim(cost: dict | None) -> Claim:
    text = "Low precision cuts compute and memory per node per iteration about 4x (Figure 3)."
    if not cost:
        return Claim(number=6, text=text, verdict="not enough cells", evidence="no cost data")
    c, m = cost["compute_ratio"], cost["memory_ratio"]
    evidence = (f"analytic cost model for {cost.get('model', 'ResNet-20')}: compute {c:.2f}x, memory "
                f"{m:.2f}x lower in LP as implemented ({cost.get('assumption', '')})")
    return Claim(number=6, text=text, verdict="holds" if min(c, m) >= 3 else "does not hold",
                 cells=1, evidence=evidence)


def check_claims(data: ReportData, cost: dict | None = None) -> list[Claim]:
    """The six claims, in order. cost: {'compute_ratio', 'memory_ratio', ...} (claim 6; default
    the report's cost.json)."""
    cost = cost if cost is not None else data.cost
    gap = lambda fp, lp: fp["reproduced"] - lp["reproduced"]
    return [
        _claim(1, "8-bit training without communication compression is within 1% of full "
                  "precision.", _precision_gap(data, False), lambda m: m < 1.0, gap, "FP - LP", data),
        _claim(2, "With communication compression, 8-bit training loses about 1-2% (at most 2 "
                  "points).", _precision_gap(data, True), lambda m: m <= 2.0, gap, "FP - LP", data),
        _claim(3, "CHOCO-SGD performs at least as well as Deep-Squeeze.",
               _pairs(_ok_rows(data, DECENTRALIZED), "algorithm", "choco", "ds"),
               lambda m: m >= 0.0, lambda ch, ds: ch["reproduced"] - ds["reproduced"], "CHOCO - DS", data),
        _skew_trend(data),
        _lp_at_high_skew(data),
        _cost_claim(cost),
    ]
