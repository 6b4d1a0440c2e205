"""The verdict rule that reads an effect's trend over training lengths (lpdl_core.report.trend),
on hand-made numbers: flat, closing, noisy and crossing gaps, for a claim and for a grid's effect."""
from __future__ import annotations

import pytest

from lpdl_core.report.trend import ONE_LENGTH, Point, claim_verdict, grid_trend, rate_words, trend


def ladder(means, spreads=(0.3, 0.3, 0.3), lengths=(6, 12, 24)):
    return [Point(length=L, mean=m, spread=s, seeds=3) for L, m, s in zip(lengths, means, spreads)]


def test_a_flat_gap_does_not_hold():
    """FP − LP stays near 5 points (bound 1): it stopped moving, on the wrong side."""
    verdict, evidence = claim_verdict(ladder([5.2, 4.9, 5.0]), bound=1.0, below=True)
    assert verdict == "does not hold"
    assert "settled" in evidence and "24 ep +5.00 ± 0.30" in evidence


def test_a_closing_gap_is_converging_with_its_rate():
    """The issue's 99 %, skew 0 pairs: 8.44, 4.41, 2.05 against a bound of 2: still moving toward
    the bound by more than the seed spread, halving per doubling; at that rate it crosses 2 at
    about 25 epochs."""
    verdict, evidence = claim_verdict(ladder([8.44, 4.41, 2.05]), bound=2.0, below=True)
    assert verdict == "converging"
    assert "×0.46 per doubling of epochs (halves per doubling)" in evidence
    assert "reaches 2 at about 25 epochs" in evidence


def test_a_noisy_gap_is_within_noise():
    """Settled (moved 0.1 with a spread of 0.8) and 0.5 over the bound, within the spread."""
    verdict, _ = claim_verdict(ladder([2.0, 1.4, 1.5], spreads=(0.8, 0.8, 0.8)), bound=1.0, below=True)
    assert verdict == "within noise"


def test_a_gap_that_crosses_the_bound_holds():
    """Over the bound at 12 epochs, under it at 24 and still moving toward the paper's side."""
    verdict, _ = claim_verdict(ladder([2.1, 1.9, 0.4]), bound=1.0, below=True)
    assert verdict == "holds"


def test_a_crossing_away_from_the_paper_does_not_hold():
    """LP − FP ≥ 0 (claim 5): +0.9 at 12 epochs, −2.0 at 24, moving away: does not hold."""
    verdict, _ = claim_verdict(ladder([1.5, 0.9, -2.0]), bound=0.0, below=False)
    assert verdict == "does not hold"


def test_holding_but_moving_away_is_not_settled():
    verdict, _ = claim_verdict(ladder([3.0, 2.5, 0.8]), bound=0.0, below=False)
    assert verdict == "not settled"


def test_settled_on_the_paper_side_holds():
    verdict, _ = claim_verdict(ladder([0.9, 0.4, 0.5]), bound=1.0, below=True)
    assert verdict == "holds"


def test_one_length_cannot_judge():
    verdict, evidence = claim_verdict([Point(length=6, mean=8.4, spread=None, seeds=1)], bound=2.0, below=True)
    assert verdict == ONE_LENGTH and evidence == "6 epochs only: +8.40 (one seed)"


def test_one_seed_has_no_noise():
    """Without a spread any move counts as moving."""
    t = trend([Point(length=6, mean=1.0, spread=None, seeds=1), Point(length=12, mean=0.99, spread=None, seeds=1)])
    assert t.noise == 0 and not t.settled


def test_the_rate_is_per_doubling_whatever_the_step():
    """6 → 24 epochs is two doublings: a quarter over two is a half per doubling."""
    t = trend([Point(length=6, mean=8.0, spread=0.1, seeds=3), Point(length=24, mean=2.0, spread=0.1, seeds=3)])
    assert t.per_doubling == pytest.approx(0.5)
    assert rate_words(0.5) == "×0.50 per doubling of epochs (halves per doubling)"
    assert rate_words(0.8) == "×0.80 per doubling of epochs"


@pytest.mark.parametrize("means, kind", [
    ([-27.1, -10.3, -4.5], "shrinking"),   # the QG-GUTm − DS deficit closing with training
    ([-2.0, -5.0, -9.0], "growing"),
    ([-3.0, -1.0, 1.5], "crossing zero"),
    ([-4.0, -4.1, -4.0], "settled"),
])
def test_a_grid_effect_says_where_it_heads(means, kind):
    assert grid_trend(ladder(means))[0] == kind


def test_a_grid_effect_at_one_length_has_no_trend():
    assert grid_trend(ladder([1.0])[:1]) == ("", "")
