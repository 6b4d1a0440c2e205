"""The paper's headline claims, checked on whatever runs are present, at every length of training.

Each claim compares pairs of runs whose settings differ in one column only (precision, algorithm or
skew; the norm goes with the precision). Runs come from the paper's decentralized tables and from
extension grids that declare themselves evidence for the claims (`claims: true`, such as
config/extensions/claims.yaml, `make reproduce-claims`). A run's settings are its cell's columns
without table, block and id, so a grid cell that is a paper cell's run counts once.

A setting counts at a length where every seed of it finished (status ok) and, in the mini profile,
where its mean over seeds learned (more than LEARNED_MARGIN points above chance). For every seed
s the claim's effect is the mean over its pairs of acc_s(a) − acc_s(b) (claim 5: the smallest
pair's); the point at a length is the mean over seeds ± the seed spread.

1. 8-bit training without compression is within 1 point of full precision (Section 4.1: "minimal
   accuracy loss of less than 1%"): FP − LP over the compression-0 pairs < 1.
2. With compression LP loses 1-2 points: FP − LP over compressed pairs <= 2.
3. CHOCO-SGD performs at least as well as Deep-Squeeze (Section 6): CHOCO − DS >= 0.
4. Accuracy falls as skew rises (Section 6): the drop from each setting's smallest to its largest
   skew, averaged, is > 0 (the evidence counts the settings where it falls).
5. At skew 0.9 without compression LP-CHOCO >= CHOCO for ResNet-20 (Section 4.1): every pair.
6. LP cuts compute and memory about 4x (Section 5, Figure 3), from the analytic cost model
   (lpdl_core.training.cost): see `_cost_claim`.

Lengths. Claims 1, 2 and 5 are about where training ends: 8-bit starts slower, so at a short
length they measure the start. In the mini profile, where runs of several lengths are present
(grids with a length ladder), every claim is judged by its trend over the lengths present for all
of its pairs (lpdl_core.report.trend: holds, converging, within noise, does not hold, not settled).
With one length only, claims 1, 2 and 5 are not judged ("one length cannot judge") and name
`make reproduce-claims`; claims 3 and 4 are judged at that length, with the noise rule below. The
paper profile runs the paper's own protocol, so its single length judges every claim.

Noise rule at a single length: 'does not hold' becomes 'within noise' where the effect's spread
over seeds (two or more) is at least its distance to the claim's bound.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Callable, Iterable

import pandas as pd

from ..pipeline.cells.cell import columns
from .effects import learned
from .model import Claim, ReportData
from .trend import ONE_LENGTH, Point, claim_verdict, on_side

MIN_PAIRS = 2
DECENTRALIZED = ("table2", "table3", "table4", "table5")
# what a run's settings are for pairing: every cell column that changes the run, but the norm
# (FP runs use EvoNorm, LP ones Range EvoNorm: the paper's pairs) and the length (a point each):
# Cell's "setting" columns
SETTINGS = columns("setting")
LENGTH_DEPENDENT = (1, 2, 5)
ONE_LENGTH_VERDICT = "not judged at one length"
REPRODUCE_CLAIMS = "make reproduce-claims"


@dataclass(frozen=True, kw_only=True)
class ClaimSpec:
    number: int
    text: str
    what: str                                  # the effect, e.g. "FP − LP"
    axis: str                                  # the column a pair differs in
    a: Callable[[list], object]                # side a's value among those present
    b: Callable[[list], object]
    bound: float
    below: bool                                # the paper's side: effect < bound (else >= bound)
    where: Callable[[dict], bool] = lambda s: True
    reduce: str = "mean"                       # over a seed's pairs: mean | min
    strict: bool = False                       # the side is effect > bound (not >=)

    def ok(self, m: float) -> bool:
        return on_side(m, self.bound, self.below, self.strict)

    @property
    def side(self) -> str:
        return "<" if self.below else (">" if self.strict else "≥")


CLAIMS = (
    ClaimSpec(number=1, text="8-bit training without communication compression is within 1% of full precision.",
              what="FP − LP", axis="precision", a=lambda v: "fp32", b=lambda v: "int8", bound=1.0, below=True,
              where=lambda s: s["compression"] == 0),
    ClaimSpec(number=2, text="With communication compression, 8-bit training loses about 1-2% (at most 2 points).",
              what="FP − LP", axis="precision", a=lambda v: "fp32", b=lambda v: "int8", bound=2.0, below=True,
              where=lambda s: s["compression"] > 0),
    ClaimSpec(number=3, text="CHOCO-SGD performs at least as well as Deep-Squeeze.", what="CHOCO − DS",
              axis="algorithm", a=lambda v: "choco", b=lambda v: "ds", bound=0.0, below=False),
    ClaimSpec(number=4, text="Accuracy falls as the degree of skew rises.", what="smallest − largest skew",
              axis="skew", a=min, b=max, bound=0.0, below=False, strict=True),
    ClaimSpec(number=5, text="At skew 0.9 without compression, LP-CHOCO (8-bit) is at least as accurate as CHOCO "
                             "(32-bit) for ResNet-20.", what="LP − FP (smallest pair)", axis="precision",
              a=lambda v: "int8", b=lambda v: "fp32", bound=0.0, below=False, reduce="min",
              where=lambda s: s["model"] == "resnet20" and s["compression"] == 0 and s["skew"] == 0.9
              and s["algorithm"] == "choco" and s["momentum"] == "nesterov"),  # Table 2's (Table 3's is QGM)
)


def claim_runs(data: ReportData, grid_runs: Iterable[pd.DataFrame] = ()) -> pd.DataFrame:
    """One row per (settings, length, seed) of every finished run that counts (module docstring):
    the paper's decentralized tables and the claims grids' runs, with `length` (the epochs it
    trained; 0 in the paper profile, whose one protocol is the paper's) and `acc`."""
    frames = [f for f in [data.runs[data.runs["table"].isin(DECENTRALIZED)] if len(data.runs) else None,
                          *grid_runs] if f is not None and len(f)]
    if not frames:
        return pd.DataFrame(columns=[*SETTINGS, "length", "seed", "acc"])
    runs = pd.concat(frames, ignore_index=True)
    runs["length"] = runs["epochs_done"].fillna(0).astype(int) if data.profile == "mini" else 0
    key = [*SETTINGS, "length"]
    runs = runs.drop_duplicates([*key, "seed"])
    rows = []
    for _, g in runs.groupby(key, sort=False, dropna=False):
        if not (g["status"] == "ok").all() or g["mean_acc"].isna().any():
            continue  # a diverged or damaged seed: the setting does not count at this length
        classes = g["num_classes"].dropna()
        if data.profile == "mini" and not learned(float(g["mean_acc"].mean()),
                                                  int(classes.iloc[0]) if len(classes) else None):
            continue
        rows += [{**{k: r[k] for k in key}, "seed": int(r["seed"]), "acc": float(r["mean_acc"])}
                 for r in g.to_dict("records")]
    return pd.DataFrame(rows, columns=[*key, "seed", "acc"])


def _pairs(settings: list[dict], spec: ClaimSpec) -> list[tuple[tuple, tuple]]:
    """(settings of side a, of side b) for settings equal in every column but spec.axis."""
    rest = [k for k in SETTINGS if k not in (spec.axis,)]
    groups: dict[tuple, dict] = {}
    for s in settings:
        if spec.where(s):
            groups.setdefault(tuple(s[k] for k in rest), {})[s[spec.axis]] = tuple(s[k] for k in SETTINGS)
    out = []
    for g in groups.values():
        va, vb = spec.a(list(g)), spec.b(list(g))
        if va in g and vb in g and va != vb:
            out.append((g[va], g[vb]))
    return out


def _points(runs: pd.DataFrame, spec: ClaimSpec) -> tuple[list[Point], int, str]:
    """The claim's effect at every length (over the pairs present at all of them), the number of
    those pairs, and words on them: at the longest length, how many pairs (mean over seeds) lie on
    the paper's side; for claim 5 the graphs compared."""
    lengths = sorted(runs["length"].unique()) if len(runs) else []
    acc = {(tuple(r[k] for k in SETTINGS), int(r["length"]), int(r["seed"])): float(r["acc"])
           for r in runs.to_dict("records")}
    by_length = {}
    for L in lengths:
        at = runs[runs["length"] == L].drop_duplicates(list(SETTINGS))
        by_length[L] = set(_pairs(at[list(SETTINGS)].to_dict("records"), spec))
    common = set.intersection(*by_length.values()) if by_length else set()
    points = []
    for L in lengths:
        per_seed = []
        for s in sorted(runs.loc[runs["length"] == L, "seed"].unique()):
            d = [acc[a, L, s] - acc[b, L, s] for a, b in common if (a, L, s) in acc and (b, L, s) in acc]
            if d:
                per_seed.append(min(d) if spec.reduce == "min" else statistics.fmean(d))
        if per_seed and len(common) >= (1 if spec.reduce == "min" else MIN_PAIRS):
            points.append(Point(length=int(L), mean=statistics.fmean(per_seed), seeds=len(per_seed),
                                spread=statistics.stdev(per_seed) if len(per_seed) > 1 else None, pairs=len(common)))
    return points, len(common), _pair_words(common, spec, acc, lengths[-1] if lengths else None)


def _pair_words(pairs, spec: ClaimSpec, acc: dict, length) -> str:
    side = 0
    for a, b in pairs:
        d = [acc[a, length, s] - acc[b, length, s] for (x, L, s) in acc if x == a and L == length
             and (b, L, s) in acc]
        if d and spec.ok(statistics.fmean(d)):
            side += 1
    words = f"{side} of {len(pairs)} on the paper's side" if pairs else ""
    if spec.reduce == "min" and pairs:  # every pair counts: name each, by its graph
        each = []
        for a, b in sorted(pairs, key=lambda p: dict(zip(SETTINGS, p[0]))["nodes"]):
            d = [acc[a, L, s] - acc[b, L, s] for (x, L, s) in acc if x == a and L == length and (b, L, s) in acc]
            if d:
                each.append(f"n={dict(zip(SETTINGS, a))['nodes']}: {statistics.fmean(d):+.2f}")
        words += "; " + ", ".join(each)
    return words


def _judge(spec: ClaimSpec, runs: pd.DataFrame, profile: str) -> Claim:
    points, pairs, words = _points(runs, spec)
    if not points:
        return Claim(number=spec.number, text=spec.text, verdict="not enough cells", cells=pairs,
                     evidence=f"{pairs} complete pair(s) with results at every length; "
                              f"at least {1 if spec.reduce == 'min' else MIN_PAIRS} needed")
    verdict, evidence = claim_verdict(points, bound=spec.bound, below=spec.below, strict=spec.strict)
    side = spec.side
    at = f" at {points[-1].length} epochs" if len(points) > 1 else ""
    head = f"{spec.what} {side} {spec.bound:g}; {pairs} pairs" + (f" ({words}{at})" if words else "")
    if verdict == ONE_LENGTH:
        p = points[0]
        verdict = _single_length(spec, p, profile)
        length = f"{p.length} epochs" if profile == "mini" else "the paper's protocol"
        evidence = f"{head}; at {length}: {p.mean:+.2f}" + (
            f" ± {p.spread:.2f} over {p.seeds} seeds" if p.spread is not None else " (one seed)")
        if verdict == ONE_LENGTH_VERDICT:
            evidence += (f". 8-bit starts slower, so one short length measures the start, not where training "
                         f"ends: `{REPRODUCE_CLAIMS}` trains these pairs at several lengths")
    else:
        evidence = f"{head}; {evidence}"
    return Claim(number=spec.number, text=spec.text, verdict=verdict, evidence=evidence, cells=pairs,
                 points=tuple(points), what=f"{spec.what} {side} {spec.bound:g}")


def _single_length(spec: ClaimSpec, p: Point, profile: str) -> str:
    if profile == "mini" and spec.number in LENGTH_DEPENDENT:
        return ONE_LENGTH_VERDICT
    if spec.ok(p.mean):
        return "holds"
    return "within noise" if p.spread and p.spread >= abs(p.mean - spec.bound) else "does not hold"


def _cost_claim(cost: dict | None) -> Claim:
    """Claim 6 from the cost model: 'holds' where both ratios as implemented are >= 3. The paper's
    "~4x" assumes every operand 8-bit; gradient bifurcation keeps the weight-gradient GEMM at 32
    bits (8-bit activations times float32 output gradients), so the modelled compute falls 2x as
    implemented. Where the all-8-bit ratios are >= 3 and those as implemented are not, the verdict
    says both: 'holds for the all-8-bit scheme; <r>x as implemented'."""
    text = "Low precision cuts compute and memory per node per iteration about 4x (Figure 3)."
    if not cost:
        return Claim(number=6, text=text, verdict="not enough cells", evidence="no cost data")
    c, m = cost["compute_ratio"], cost["memory_ratio"]
    ratios = cost.get("ratios", {})
    c8, m8 = ratios.get("compute_all8"), ratios.get("memory_all8")
    evidence = (f"analytic cost model for {cost.get('model', 'ResNet-20')}: as implemented (8-bit weights, "
                f"activations and layer gradients; 32-bit weight gradients, the gradient bifurcation) compute "
                f"{c:.2f}x and memory {m:.2f}x lower"
                + (f"; with every operand 8-bit, the paper's assumption, compute {c8:.2f}x and memory {m8:.2f}x"
                   if c8 is not None and m8 is not None else "")
                + f" ({cost.get('assumption', '')})")
    if min(c, m) >= 3:
        verdict = "holds"
    elif c8 is not None and m8 is not None and min(c8, m8) >= 3:
        verdict = f"holds for the all-8-bit scheme; {min(c, m):.2g}x as implemented"
    else:
        verdict = "does not hold"
    return Claim(number=6, text=text, verdict=verdict, cells=1, evidence=evidence)


def check_claims(data: ReportData, cost: dict | None = None, grid_runs: Iterable[pd.DataFrame] = (),
                 with_cost: bool = True) -> list[Claim]:
    """Claims 1-5 on the paper's runs and grid_runs (the claims grids' runs.csv frames), and claim 6
    from cost ({'compute_ratio', 'memory_ratio', 'ratios', ...}; default the report's cost.json)
    unless with_cost is False (a report of grids alone, which has no cost model)."""
    runs = claim_runs(data, grid_runs)
    claims = [_judge(spec, runs, data.profile) for spec in CLAIMS]
    if with_cost:
        claims.append(_cost_claim(cost if cost is not None else data.cost))
    return claims
