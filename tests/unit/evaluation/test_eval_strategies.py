"""Strategies over n samples per problem: hand-computed maj@k, best-of-k, pass@k, costs, and the
verified-sampling cost; plus the interpolation used to compare at equal tokens."""

from __future__ import annotations

import itertools
import math

import pytest

from scalerl.evaluation.strategies import (
    ProblemSamples,
    StrategyPoint,
    best_of_n_points,
    interpolate_accuracy,
    k_subsets,
    majority_points,
    random_points,
    sample_points,
    verified_points,
)


def _p(pid, answers, correct, tokens=None, scores=None):
    n = len(answers)
    return ProblemSamples(problem_id=pid, answers=answers, correct=correct, tokens=tokens or [10] * n,
                          thinking_tokens=[t - 2 for t in (tokens or [10] * n)], scores=scores,
                          scorer_tokens=[20] * n if scores is not None else None, reference="7")


def _judge(p, winner):
    return winner == p.reference


def test_k_subsets_exact_when_few():
    assert k_subsets(4, 2, subsets=64, rng=None) == list(itertools.combinations(range(4), 2))  # C(4,2) = 6 <= 64
    with pytest.raises(ValueError):
        k_subsets(3, 4, subsets=8, rng=None)


def test_majority_hand_computed():
    # answers 7, 7, 3, 9 (7 is right). All C(4,k) subsets are enumerated:
    # k=1: 2 of 4 singletons are "7" -> 0.5
    # k=2: pairs {7,7} -> 7; {7,3},{7,9} (x2 each) -> the earlier answer wins the tie: 7 when 7 comes first:
    #      (0,1)=7 ok, (0,2)=7 ok, (0,3)=7 ok, (1,2)=7 ok, (1,3)=7 ok, (2,3)=3 wrong -> 5/6
    # k=4: 7 has 2 votes -> right -> 1
    p = _p("a", ["7", "7", "3", "9"], [True, True, False, False])
    pts = majority_points([p], [1, 2, 4], _judge)
    assert [pt.accuracy for pt in pts] == pytest.approx([0.5, 5 / 6, 1.0])
    assert [pt.gen_tokens for pt in pts] == [10, 20, 40]  # k x mean tokens
    assert [pt.thinking_tokens for pt in pts] == [8, 16, 32]


def test_majority_ignores_missing_answers_and_normalises():
    # None casts no vote; "7.0" and "7" are the same answer; 3 appears twice but 7 three times.
    p = _p("a", [None, "3", "7.0", "7", " 7 ", "3"], [False, False, True, True, True, False])
    (pt,) = majority_points([p], [6], _judge)
    assert pt.accuracy == 1.0


def test_best_of_n_uses_the_scores_and_random_is_the_mean():
    # scores pick sample 2 (correct) whenever it is in the subset; k=4 (all) -> correct.
    # k=1: mean correctness 1/4. k=2: subsets containing index 2: 3 of 6 -> 0.5 ... but a subset without 2
    # picks the best of the others: (0,1): 0.3 vs 0.1 -> 0 (wrong); (0,3): 0.3 vs 0.2 -> 0 (wrong);
    # (1,3): 0.2 -> 3 (wrong). So k=2 -> 3/6.
    p = _p("a", ["1", "2", "7", "4"], [False, False, True, False], scores=[0.3, 0.1, 0.9, 0.2])
    pts = best_of_n_points([p], [1, 2, 4])
    assert [pt.accuracy for pt in pts] == pytest.approx([0.25, 0.5, 1.0])
    assert [pt.scorer_tokens for pt in pts] == [20, 40, 80]
    assert [pt.accuracy for pt in random_points([p], [1, 2, 4])] == [0.25, 0.25, 0.25]


def test_best_of_n_ties_go_to_the_earliest():
    p = _p("a", ["1", "7"], [False, True], scores=[0.5, 0.5])
    assert best_of_n_points([p], [2])[0].accuracy == 0.0


def test_sample_is_unbiased_pass_at_k():
    # n=4, c=1: pass@2 = 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5
    p = _p("a", ["7", "1", "2", "3"], [True, False, False, False])
    assert [pt.accuracy for pt in sample_points([p], [1, 2, 4])] == pytest.approx([0.25, 0.5, 1.0])


def test_verified_cost_stops_at_first_success():
    # tokens 10 (wrong), 30 (right). k=1: one random sample: (10 + 30)/2 = 20 tokens.
    # k=2: order (wrong, right) costs 40, (right, ...) costs 30 -> 35 in expectation; pass@2 = 1.
    p = _p("a", ["1", "7"], [False, True], tokens=[10, 30])
    pts = verified_points([p], [1, 2])
    assert pts[0].gen_tokens == pytest.approx(20)
    assert pts[1].gen_tokens == pytest.approx(35)
    assert [pt.accuracy for pt in pts] == [0.5, 1.0]


def test_verified_cost_matches_enumerating_every_order():
    tokens, correct = [5, 7, 11, 13, 17], [False, True, False, True, False]
    p = _p("a", ["x"] * 5, correct, tokens=tokens)
    for k in range(1, 6):
        total = 0
        orders = list(itertools.permutations(range(5)))
        for order in orders:
            for i in order[:k]:
                total += tokens[i]
                if correct[i]:
                    break
        assert verified_points([p], [k])[0].gen_tokens == pytest.approx(total / len(orders))


def test_bad_k_and_missing_scores_raise():
    p = _p("a", ["1"], [True])
    with pytest.raises(ValueError, match="k must be in"):
        sample_points([p], [2])
    with pytest.raises(ValueError, match="scorer"):
        best_of_n_points([p], [1])


def test_interpolation_is_linear_in_log_tokens():
    pts = [StrategyPoint("s", 1, 0.2, 0, 0, 10.0, 0), StrategyPoint("s", 4, 0.6, 0, 0, 40.0, 0)]
    # 20 tokens is halfway in log between 10 and 40 -> 0.4
    assert interpolate_accuracy(pts, 20.0) == pytest.approx(0.4)
    assert interpolate_accuracy(pts, 10.0) == pytest.approx(0.2)
    assert interpolate_accuracy(pts, 80.0) is None
    assert math.isclose(interpolate_accuracy(pts, 40.0) or 0, 0.6)
