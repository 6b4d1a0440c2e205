r"""How an effect moves with the length of training, and what that lets a verdict say.

An effect (FP − LP, CHOCO − DS, ...) measured at lengths L_1 < … < L_k epochs is, at each length,
a mean over seeds m_i with a seed spread s_i (standard deviation; none with one seed). A run of
L epochs has its own schedule (warm-up and cosine over its own steps), so each length is its own
protocol and a mean at L says where training of that length ends.

The trend is read from the two longest lengths a = L_{k−1}, b = L_k:

    Δ = m_b − m_a            the move,       noise = max(s_a, s_b)   (0 with one seed)

* **settled**: |Δ| ≤ noise. The effect has stopped moving by more than its seed spread, so the
  longest length speaks for longer training too.
* **moving**: |Δ| > noise, toward or away from a side (a claim's bound, or zero).
* The rate, where m_a and m_b have one sign: q = (m_b / m_a)^(1 / log2(b / a)), the factor per
  doubling of epochs ("halves per doubling" for q ≈ 0.5).

A claim states a bound B and a side: the effect is below B (claims 1 and 2: FP − LP < 1, ≤ 2) or
at least B (claims 3–5). `claim_verdict`:

    holds          settled and on the paper's side at L_k, or moving toward that side and
                   already on it at L_k;
    converging     moving toward the paper's side by more than the noise, not yet on it (the
                   evidence gives q and, where the effect decays toward 0 across B, the length
                   at which q reaches B);
    within noise   settled, not on the paper's side, but B lies within the seed spread s_b;
    does not hold  settled and off the paper's side by more than s_b, or moving away from the
                   paper's side while off it;
    not settled    on the paper's side at L_k but moving away from it by more than the noise.

One length cannot say any of this (`ONE_LENGTH`); the caller decides what a single length is
worth (the paper profile's 200 epochs are the paper's own protocol).

An extension grid's effect has no paper side. `grid_trend` names where it heads: settled, or
shrinking / growing in size (with q), or crossing zero between a and b.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

ONE_LENGTH = "one length"
CLAIM_TREND_VERDICTS = ("holds", "converging", "within noise", "does not hold", "not settled")
GRID_TRENDS = ("settled", "shrinking", "growing", "crossing zero")
HALF_BAND = (0.4, 0.6)   # a per-doubling factor in this band is called "halves per doubling"


@dataclass(frozen=True, kw_only=True)
class Point:
    """An effect at one length: mean over seeds, seed spread (None with one seed)."""

    length: int
    mean: float
    spread: float | None
    seeds: int
    pairs: int = 0


@dataclass(frozen=True, kw_only=True)
class Trend:
    a: Point                     # the second-longest length
    b: Point                     # the longest
    moved: float                 # m_b − m_a
    noise: float                 # max(s_a, s_b); 0 where no spread is known
    per_doubling: float | None   # q, where m_a and m_b are non-zero and of one sign

    @property
    def settled(self) -> bool:
        return abs(self.moved) <= self.noise


def trend(points: Sequence[Point]) -> Trend | None:
    """The trend between the two longest lengths of `points` (None with fewer than two lengths)."""
    pts = sorted(points, key=lambda p: p.length)
    if len(pts) < 2:
        return None
    a, b = pts[-2], pts[-1]
    if a.length == b.length:
        raise ValueError(f"two points at length {a.length}")
    noise = max(s for s in (a.spread, b.spread, 0.0) if s is not None)
    q = None
    if a.mean and b.mean and (a.mean > 0) == (b.mean > 0):
        q = (b.mean / a.mean) ** (1.0 / math.log2(b.length / a.length))
    return Trend(a=a, b=b, moved=b.mean - a.mean, noise=noise, per_doubling=q)


def rate_words(q: float | None, what: str = "") -> str:
    """'×0.48 per doubling of epochs (halves per doubling)' and the like; '' without a rate."""
    if q is None:
        return ""
    words = f"{what}×{q:.2f} per doubling of epochs"
    if HALF_BAND[0] <= q <= HALF_BAND[1]:
        words += " (halves per doubling)"
    return words


def _crossing_length(t: Trend, bound: float) -> float | None:
    """Where the effect, decaying toward 0 at its rate q, reaches `bound` (None where it does not)."""
    q, m = t.per_doubling, t.b.mean
    if q is None or not 0 < q < 1 or bound == 0 or (bound > 0) != (m > 0) or abs(bound) >= abs(m):
        return None
    return t.b.length * 2 ** (math.log(bound / m) / math.log(q))


def on_side(m: float, bound: float, below: bool, strict: bool = False) -> bool:
    """Whether an effect m is on a claim's side: m < bound (below), m > bound (strict) or m ≥ bound."""
    return m < bound if below else (m > bound if strict else m >= bound)


def claim_verdict(points: Sequence[Point], *, bound: float, below: bool, strict: bool = False) -> tuple[str, str]:
    """(verdict, evidence) of a claim 'effect < bound' (below=True), 'effect > bound' (strict) or
    'effect ≥ bound' over the lengths in `points` (the module docstring's rule); (ONE_LENGTH, ...)
    for a single length."""
    t = trend(points)
    ok = lambda m: on_side(m, bound, below, strict)  # noqa: E731
    if t is None:
        p = points[0]
        return ONE_LENGTH, f"{p.length} epochs only: {_at(p)}"
    toward = t.moved < 0 if below else t.moved > 0
    side = ok(t.b.mean)
    if t.settled:
        if side:
            verdict = "holds"
        elif t.b.spread is not None and abs(t.b.mean - bound) <= t.b.spread:
            verdict = "within noise"
        else:
            verdict = "does not hold"
    elif toward:
        verdict = "holds" if side else "converging"
    else:
        verdict = "not settled" if side else "does not hold"
    return verdict, _evidence(t, points, bound, verdict)


def _at(p: Point) -> str:
    spread = f" ± {p.spread:.2f}" if p.spread is not None else " (one seed)"
    return f"{p.mean:+.2f}{spread}"


def _evidence(t: Trend, points: Sequence[Point], bound: float, verdict: str) -> str:
    ladder = ", ".join(f"{p.length} ep {_at(p)}" for p in sorted(points, key=lambda p: p.length))
    how = (f"settled: moved {t.moved:+.2f} from {t.a.length} to {t.b.length} epochs, within the seed "
           f"spread {t.noise:.2f}" if t.settled else
           f"moving: {t.moved:+.2f} from {t.a.length} to {t.b.length} epochs, more than the seed spread "
           f"{t.noise:.2f}")
    rate = rate_words(t.per_doubling, "effect ")
    out = f"{ladder}; {how}" + (f"; {rate}" if rate else "")
    if verdict == "converging":
        cross = _crossing_length(t, bound)
        if cross is not None:
            out += f"; at that rate it reaches {bound:g} at about {cross:.0f} epochs"
    return out


def grid_trend(points: Sequence[Point]) -> tuple[str, str]:
    """(trend, words) of an extension grid's effect over its length ladder: settled, shrinking,
    growing or crossing zero between the two longest lengths ('' and '' for one length)."""
    t = trend(points)
    if t is None:
        return "", ""
    if t.settled:
        return "settled", f"moved {t.moved:+.2f} from {t.a.length} to {t.b.length} epochs (seed spread {t.noise:.2f})"
    if (t.a.mean > 0) != (t.b.mean > 0) and t.a.mean and t.b.mean:
        return "crossing zero", f"{t.a.mean:+.2f} at {t.a.length} epochs, {t.b.mean:+.2f} at {t.b.length}"
    kind = "shrinking" if abs(t.b.mean) < abs(t.a.mean) else "growing"
    return kind, rate_words(t.per_doubling) or f"moved {t.moved:+.2f}"
