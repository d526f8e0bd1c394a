"""Test-time-scaling metrics: pass@k, mean@k, majority vote, best-of-N, bootstrap CI (hand-computed values)."""

from __future__ import annotations

import itertools
import math
from fractions import Fraction

import numpy as np
import pytest

import scalerl.evaluation as evaluation
from scalerl.evaluation.metrics import (
    best_of_n,
    bootstrap_ci,
    maj_at_k,
    majority_vote,
    mean_at_k,
    normalize_answer,
    oracle_best_of_n,
    paired_gain,
    pass_at_k,
    pass_at_k_curve,
)
from scalerl.tasks.math_answer import math_equal


def _exact_pass_at_k(n: int, c: int, k: int) -> Fraction:
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))  # math.comb(m, k) == 0 when m < k


# ------------------------------------------------------------------------------------------- pass@k


@pytest.mark.parametrize(("n", "c", "k", "expected"), [
    (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    (10, 3, 5, 11 / 12),  # 1 - C(7,5)/C(10,5) = 1 - 21/252 = 1 - 1/12
    (10, 1, 1, 0.1),  # k = 1: c/n = 1/10
    (10, 7, 1, 0.7),  # k = 1: 7/10
    (6, 2, 3, 0.8),  # 1 - C(4,3)/C(6,3) = 1 - 4/20
    (5, 3, 3, 1.0),  # n - c = 2 < k = 3: every 3-subset holds a correct sample
])
def test_pass_at_k_small_cases(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)
    assert pass_at_k(n, c, k) == pytest.approx(float(_exact_pass_at_k(n, c, k)), abs=1e-12)


@pytest.mark.parametrize("n", [1, 2, 7, 64])
def test_pass_at_k_n_equals_k_is_any_correct(n):
    # with k = n the only subset is all samples: 1 if any is correct, else 0 (exactly)
    assert pass_at_k(n, 0, n) == 0.0
    for c in range(1, n + 1):
        assert pass_at_k(n, c, n) == 1.0


@pytest.mark.parametrize(("n", "k"), [(1, 1), (8, 3), (1000, 1), (1000, 999)])
def test_pass_at_k_extremes(n, k):
    assert pass_at_k(n, 0, k) == 0.0  # empty product: 1 - 1
    assert pass_at_k(n, n, k) == 1.0  # n - c = 0 < k


def test_pass_at_k_exactly_one_when_fewer_wrong_than_k():
    # n=10, c=8: only 2 wrong samples, so any 3 samples include a correct one
    assert pass_at_k(10, 8, 3) == 1.0
    # n=10, c=7: 3 wrong, k=3 -> 1 - C(3,3)/C(10,3) = 1 - 1/120
    assert pass_at_k(10, 7, 3) == pytest.approx(119 / 120, abs=1e-15)


@pytest.mark.parametrize(("n", "c"), [(500, 1), (500, 17), (500, 250), (500, 490), (2000, 13)])
@pytest.mark.parametrize("k", [1, 2, 10, 64, 100, 256])
def test_pass_at_k_large_n_matches_exact_fractions(n, c, k):
    # C(500, 256) has ~150 digits: a float binomial would overflow; the product form stays accurate
    assert pass_at_k(n, c, k) == pytest.approx(float(_exact_pass_at_k(n, c, k)), rel=1e-12, abs=1e-12)


def test_pass_at_k_k1_is_mean_accuracy():
    for c in range(0, 501, 50):
        assert pass_at_k(500, c, 1) == pytest.approx(c / 500, abs=1e-12)


@pytest.mark.parametrize(("n", "c"), [(20, 3), (200, 1), (500, 40)])
def test_pass_at_k_monotone_in_k(n, c):
    values = [pass_at_k(n, c, k) for k in range(1, n + 1)]
    assert all(a <= b for a, b in itertools.pairwise(values))
    # strictly increasing until k > n - c (while 1 - pass@k is above float resolution), then exactly 1
    head = values[: n - c + 1]
    assert all(a < b for a, b in itertools.pairwise(head) if a < 1 - 1e-9)
    # k = n - c: 1 - C(n-c, n-c)/C(n, n-c) = 1 - 1/C(n, c)  (e.g. 1 - 1/1140 for n=20, c=3)
    assert values[n - c - 1] == pytest.approx(1 - 1 / math.comb(n, c))
    assert values[n - c :] == [1.0] * c  # k = n - c + 1, ..., n


def test_pass_at_k_monotone_in_c():
    values = [pass_at_k(30, c, 4) for c in range(31)]
    assert all(a <= b for a, b in itertools.pairwise(values))


@pytest.mark.parametrize(("n", "c", "k", "match"), [
    (3, 1, 4, "k=4 > n=3"),
    (0, 0, 1, "k=1 > n=0"),
    (5, 1, 0, "k >= 1"),
    (5, 1, -2, "k >= 1"),
    (5, -1, 2, "c=-1"),
    (5, 6, 2, "c=6"),
])
def test_pass_at_k_errors(n, c, k, match):
    with pytest.raises(ValueError, match=match):
        pass_at_k(n, c, k)


def test_pass_at_k_curve_averages_over_problems():
    problems = [(5, 2), (4, 0), (4, 4)]
    curve = pass_at_k_curve(problems, [1, 2])
    assert list(curve) == [1, 2]
    # k=1: (2/5 + 0 + 1) / 3 = 1.4 / 3
    assert curve[1] == pytest.approx(1.4 / 3)
    # k=2: (0.7 + 0 + 1) / 3 = 1.7 / 3  (0.7 = 1 - C(3,2)/C(5,2))
    assert curve[2] == pytest.approx(1.7 / 3)


def test_pass_at_k_curve_accepts_iterators_and_checks_inputs():
    assert pass_at_k_curve(iter([(2, 1)]), iter([1, 2])) == {1: 0.5, 2: 1.0}  # k=2=n, c>0
    with pytest.raises(ValueError, match="at least one problem"):
        pass_at_k_curve([], [1])
    with pytest.raises(ValueError, match="k=5 > n=4"):
        pass_at_k_curve([(8, 1), (4, 1)], [5])  # k must fit every problem's n


# ------------------------------------------------------------------------------------------- mean@k


def test_mean_at_k():
    assert mean_at_k([True, False, True, True]) == 0.75  # 3 / 4
    assert mean_at_k([False] * 5) == 0.0
    assert mean_at_k([True]) == 1.0
    with pytest.raises(ValueError):
        mean_at_k([])


def test_mean_at_k_equals_pass_at_1():
    correct = [True, False, False, True, False, True, False, False]  # 3 of 8
    assert mean_at_k(correct) == pytest.approx(pass_at_k(len(correct), sum(correct), 1))


# ------------------------------------------------------------------------------------ majority vote


@pytest.mark.parametrize(("raw", "expected"), [
    (None, None),
    ("", None),
    ("   ", None),
    (" . ", None),
    ("42", "42"),
    ("  42.  ", "42"),  # strip, trailing period
    ("1,000", "1000"),
    ("1,234,567", "1234567"),
    ("1,2", "1,2"),  # not a thousands grouping: a pair, kept
    ("0.50", "0.5"),
    ("2.0", "2"),
    ("2.500", "2.5"),
    (".5", "0.5"),
    ("-.50", "-0.5"),
    ("+3", "3"),
    ("-3", "-3"),
    ("-0.0", "0"),
    ("007", "7"),
    ("1/2", "1/2"),
    ("2/4", "1/2"),
    ("1 / 2", "1/2"),
    ("-6/4", "-3/2"),
    ("4/2", "2"),
    ("1/0", "1/0"),  # not a number: left alone
    ("\\frac{2}{4}", "1/2"),
    ("$\\dfrac{3}{6}$", "1/2"),
    ("$12$", "12"),
    ("x  +\n 1", "x + 1"),  # whitespace runs collapsed
    ("Paris.", "Paris"),
    ("0.5", "0.5"),  # decimals and fractions keep their own form
])
def test_normalize_answer(raw, expected):
    assert normalize_answer(raw) == expected


def test_normalize_answer_huge_numbers_are_exact_and_safe():
    big = "123456789012345678901234567890123456789"
    assert normalize_answer(big + ".000") == big  # no rounding to a float or a 28-digit Decimal
    huge = "7" * 5000 + "/7"  # beyond Python's int <-> str digit limit: kept as text, no exception
    assert normalize_answer(huge) == huge


def test_majority_vote_counts_normalised_answers():
    # "1,000", "1000" and "1000." are one answer (3 votes) against "999" (2 votes)
    assert majority_vote(["999", "1,000", "1000", "999", "1000."]) == "1000"
    # "2/4" and "1/2" pool: 2 votes against 1 for "0.25"
    assert majority_vote(["0.25", "2/4", "1/2"]) == "1/2"


def test_majority_vote_ties_go_to_earliest_first_occurrence():
    assert majority_vote(["b", "a", "a", "b"]) == "b"  # 2-2: "b" occurs first
    assert majority_vote(["a", "b", "b", "a"]) == "a"
    assert majority_vote(["c", "b", "a"]) == "c"  # all 1 vote
    # the count, not the position, wins when counts differ
    assert majority_vote(["c", "b", "a", "a"]) == "a"
    # first occurrence is judged after normalisation: "+5" (index 0) and "5" are one answer
    assert majority_vote(["+5", "7", "7", "5"]) == "5"


def test_majority_vote_ignores_none():
    assert majority_vote([None, None, "3", None]) == "3"  # None is not an answer, however frequent
    assert majority_vote([None, "", "  "]) is None
    assert majority_vote([]) is None


def test_majority_vote_custom_normaliser():
    assert majority_vote(["A", "a", "b"], normalize=lambda s: s.lower() if s else None) == "a"


def test_maj_at_k():
    def exact(answer: str, reference: str) -> bool:
        return answer == reference

    assert maj_at_k(["3", "4", "4"], "4", exact) is True
    assert maj_at_k(["3", "3", "4"], "4", exact) is False  # the majority is wrong, though one sample is right
    assert maj_at_k([None, None], "4", exact) is False  # nothing extracted
    assert maj_at_k(["1,000", "1000", "7"], "1000", exact) is True  # the winner is normalised


def test_maj_at_k_with_math_equal():
    assert maj_at_k(["0.5", "1/2", "0.50"], "\\frac{1}{2}", math_equal) is True  # "0.5": 2 votes


# ---------------------------------------------------------------------------------------- best-of-N


def test_best_of_n_picks_highest_score():
    assert best_of_n([0.1, 0.9, 0.3], ["a", "b", "c"]) == "b"
    assert best_of_n([-5.0, -1.0], [10, 20]) == 20
    assert best_of_n([float("-inf"), 0.0], ["x", "y"]) == "y"


def test_best_of_n_ties_go_to_earliest():
    assert best_of_n([0.5, 0.9, 0.9, 0.1], ["a", "b", "c", "d"]) == "b"
    assert best_of_n([1.0, 1.0, 1.0], ["a", "b", "c"]) == "a"


def test_best_of_n_errors():
    with pytest.raises(ValueError, match="2 scores for 3 candidates"):
        best_of_n([0.1, 0.2], ["a", "b", "c"])
    with pytest.raises(ValueError, match="at least one"):
        best_of_n([], [])
    with pytest.raises(ValueError, match="NaN"):
        best_of_n([0.1, float("nan")], ["a", "b"])


def test_oracle_best_of_n_is_upper_bound():
    correct = [False, True, False]
    scores = [0.9, 0.2, 0.5]  # the verifier prefers a wrong candidate
    assert best_of_n(scores, correct) is False
    assert oracle_best_of_n(correct) is True
    assert oracle_best_of_n([False, False]) is False
    # averaged over problems the oracle is the empirical pass@N (pass@k with k = n)
    assert oracle_best_of_n(correct) == (pass_at_k(3, 1, 3) == 1.0)
    with pytest.raises(ValueError):
        oracle_best_of_n([])


# ---------------------------------------------------------------------------------------- bootstrap


def test_bootstrap_ci_contains_mean_and_has_plausible_width():
    values = [0.0, 1.0] * 50  # mean 0.5, sd 0.5, n = 100
    lo, hi = bootstrap_ci(values)
    assert lo < 0.5 < hi
    # normal approximation: 2 * 1.96 * 0.5 / sqrt(100) = 0.196
    assert 0.15 < hi - lo < 0.25


def test_bootstrap_ci_narrows_with_more_data():
    small = bootstrap_ci([0.0, 1.0] * 20)  # n = 40
    large = bootstrap_ci([0.0, 1.0] * 2000)  # n = 4000: width shrinks ~ 1/sqrt(n), ~10x
    assert small[0] < 0.5 < small[1]
    assert large[0] < 0.5 < large[1]
    assert (large[1] - large[0]) < (small[1] - small[0]) / 5


def test_bootstrap_ci_level_and_seed():
    values = [0.2, 0.9, 0.4, 0.7, 1.0, 0.0, 0.3, 0.6]
    assert bootstrap_ci(values, seed=3) == bootstrap_ci(values, seed=3)  # deterministic
    lo90, hi90 = bootstrap_ci(values, level=0.90)
    lo99, hi99 = bootstrap_ci(values, level=0.99)
    assert lo99 <= lo90 < hi90 <= hi99  # same resamples (same seed): wider level, wider interval
    mean = sum(values) / len(values)  # 4.1 / 8 = 0.5125
    assert lo90 < mean < hi90


def test_bootstrap_ci_degenerate_and_errors():
    assert bootstrap_ci([0.7]) == (0.7, 0.7)
    assert bootstrap_ci([0.25] * 10) == pytest.approx((0.25, 0.25))
    with pytest.raises(ValueError, match="at least one"):
        bootstrap_ci([])
    with pytest.raises(ValueError, match="level"):
        bootstrap_ci([0.1, 0.2], level=1.0)
    with pytest.raises(ValueError, match="n_resamples"):
        bootstrap_ci([0.1, 0.2], n_resamples=0)
    with pytest.raises(ValueError, match="NaN"):
        bootstrap_ci([0.1, float("nan")])


# ------------------------------------------------------------------------------------------ exports


def test_package_exports():
    for name in ("pass_at_k", "pass_at_k_curve", "mean_at_k", "normalize_answer", "majority_vote", "maj_at_k",
                 "best_of_n", "oracle_best_of_n", "bootstrap_ci"):
        assert name in evaluation.__all__
        assert callable(getattr(evaluation, name))


def test_paired_gain_is_the_mean_difference_with_a_paired_interval():
    before = [0.0, 0.25, 0.5, 0.25, 0.0, 0.75, 0.5, 0.25]
    after = [b + 0.25 for b in before]  # every prompt gains exactly 0.25: no spread, a point interval
    assert paired_gain(before, after) == pytest.approx((0.25, 0.25, 0.25))
    # Prompts differ a lot from each other but each gains about the same: the paired interval is narrow
    # where an unpaired one (from the two means' own intervals) would overlap 0.
    rng = np.random.default_rng(1)
    base = rng.uniform(0, 0.8, 64)
    gain, lo, hi = paired_gain(base, base + rng.uniform(0.05, 0.15, 64), n_resamples=2000, seed=3)
    assert 0.05 < lo < gain < hi < 0.15
    assert bootstrap_ci(base)[1] > bootstrap_ci(base + 0.1)[0]  # unpaired intervals overlap
    with pytest.raises(ValueError, match="same problems"):
        paired_gain([0.1, 0.2], [0.3])
