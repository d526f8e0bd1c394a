"""Ties are ties in `scalerl compare` (identical runs share a rank, shown "=1"), and the power-law row
says when both ceilings merely sit at the fits' bound instead of claiming agreement."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from scalerl.report.tables import comparison_table, power_law_table
from scalerl.scaling import compare_curves, curve_from_arrays
from scalerl.scaling.compare import tie_ranks


def _curve(synth_curve, A, B, C_mid, seed):
    c, y, _ = synth_curve(A, B, C_mid, seed=seed, n=61)
    return curve_from_arrays(c, y)


@pytest.mark.parametrize(("keys", "ranks"), [
    ([3.0, 3.0, 1.0], [1, 1, 3]),
    ([3.0, 2.0, 2.0, 2.0, 1.0], [1, 2, 2, 2, 5]),
    ([0.61, 0.61 * (1 + 1e-12), 0.6], [1, 1, 3]),  # equal up to float noise
    ([2.0, 1.0], [1, 2]),
])
def test_competition_ranks(keys, ranks):
    assert tie_ranks(keys) == ranks


def test_identical_runs_share_a_rank(synth_curve):
    a = _curve(synth_curve, 0.61, 2.0, 2542.0, seed=5)
    worse = _curve(synth_curve, 0.50, 2.0, 2542.0, seed=6)
    cmp = compare_curves([("a", a), ("a-again", a), ("worse", worse)], n_bootstrap=0)
    ranks = {r.name: (r.rank, r.tied) for r in cmp.rows}
    assert ranks == {"a": (1, True), "a-again": (1, True), "worse": (3, False)}
    assert "tied with 'a-again'" in next(r.reason for r in cmp.rows if r.name == "a")
    shown = [row[0] for row in comparison_table(cmp)[1]]
    assert sorted(shown) == ["3", "=1", "=1"]
    assert [d["tied"] for d in cmp.to_dict()["runs"]] == [True, True, False]


def test_same_ceiling_different_efficiency_is_not_a_tie(synth_curve):
    slow = _curve(synth_curve, 0.605, 1.6, 2542.0, seed=10)
    fast = _curve(synth_curve, 0.610, 2.4, 2542.0, seed=20)
    cmp = compare_curves([("slow", slow), ("fast", fast)], n_bootstrap=0)
    assert [(r.name, r.rank, r.tied) for r in cmp.rows] == [("fast", 1, False), ("slow", 2, False)]


def _analysis(sigmoid_a: float, power_a: float) -> Any:
    """The two fields power_law_table reads (pure formatting under test)."""
    return SimpleNamespace(fit=SimpleNamespace(A=sigmoid_a),
                           power_law=SimpleNamespace(A=power_a, B=0.5, D=1.0, r2=0.99))


@pytest.mark.parametrize(("sigmoid_a", "power_a", "expect"), [
    (1.0, 1.0, "both ceilings sit at the fits' bound 1.0"),
    (0.9995, 1.0, "both ceilings sit at the fits' bound 1.0"),
    (0.61, 0.62, "agrees with the sigmoid's within the ±0.02 margin (+0.010)"),
    (0.61, 0.80, "+0.190 from the sigmoid's: power laws fitted early overshoot"),
    (0.80, 0.61, "-0.190 from the sigmoid's (below it)"),
    (0.61, 1.0, "+0.390"),  # only the power law at the bound: a real overshoot
])
def test_power_law_reading(sigmoid_a, power_a, expect):
    reading = power_law_table(_analysis(sigmoid_a, power_a))[1][0][-1]
    assert expect in reading
    if sigmoid_a >= 0.999 and power_a >= 0.999:
        assert "agree" not in reading
