"""The paper's comparison rule (spec §1.4): A first; within ±0.02, B at a shared A."""

from __future__ import annotations

import json

import numpy as np
import pytest

from scalerl.scaling import FitError, compare_curves, curve_from_arrays


def _curve(synth_curve, A, B, C_mid, seed):
    c, y, _ = synth_curve(A, B, C_mid, seed=seed, n=61)
    return curve_from_arrays(c, y)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_tied_ceilings_are_ranked_by_b_at_the_shared_a(synth_curve, seed) -> None:
    # LOO-like pair: same ceiling within the margin, different efficiency (worse run listed first)
    slow = _curve(synth_curve, 0.605, 1.6, 2542.0, seed=10 + seed)
    fast = _curve(synth_curve, 0.610, 2.4, 2542.0, seed=20 + seed)
    cmp = compare_curves([("slow", slow), ("fast", fast)], n_bootstrap=50)
    assert cmp.rule == "shared_A"
    assert cmp.a_spread <= 0.02
    assert cmp.shared_a == pytest.approx(np.mean([r.fit.A for r in cmp.rows]))
    assert [r.name for r in cmp.rows] == ["fast", "slow"]
    assert [r.rank for r in cmp.rows] == [1, 2]
    for r in cmp.rows:
        assert r.shared_fit is not None and cmp.shared_a == r.shared_fit.A
        assert r.B_ci is not None and r.B_ci[0] <= r.shared_fit.B <= r.B_ci[1]
    assert cmp.rows[0].reason == "highest B at the shared A"
    assert "lower at the shared A" in cmp.rows[1].reason


def test_distinct_ceilings_are_ranked_by_a_even_against_b(synth_curve) -> None:
    low_a_fast = _curve(synth_curve, 0.60, 2.4, 2542.0, seed=3)
    high_a_slow = _curve(synth_curve, 0.66, 1.5, 2542.0, seed=4)
    cmp = compare_curves([("low", low_a_fast), ("high", high_a_slow)], n_bootstrap=0)
    assert cmp.rule == "A" and cmp.shared_a is None
    assert [r.name for r in cmp.rows] == ["high", "low"]
    assert all(r.shared_fit is None and r.B_ci is None for r in cmp.rows)
    assert cmp.rows[0].reason == "highest A" and "A 0.0" in cmp.rows[1].reason


def test_three_runs_flag_a_tie_between_neighbours(synth_curve) -> None:
    runs = [
        ("a", _curve(synth_curve, 0.60, 1.9, 2542.0, seed=5)),
        ("b", _curve(synth_curve, 0.67, 1.9, 2542.0, seed=6)),
        ("c", _curve(synth_curve, 0.605, 1.9, 2542.0, seed=7)),
    ]
    cmp = compare_curves(runs, n_bootstrap=0)
    assert cmp.rule == "A"
    assert cmp.rows[0].name == "b"
    assert "a tie on A" in cmp.rows[2].reason


def test_comparison_to_dict_is_json(synth_curve) -> None:
    cmp = compare_curves(
        [("x", _curve(synth_curve, 0.61, 1.9, 2542.0, 0)), ("y", _curve(synth_curve, 0.61, 2.2, 2542.0, 1))],
        n_bootstrap=20,
    )
    d = json.loads(json.dumps(cmp.to_dict()))
    assert d["rule"] == "shared_A" and len(d["runs"]) == 2
    assert {"name", "rank", "A", "B", "C_mid", "shared_B", "B_ci", "reason"} <= set(d["runs"][0])


def test_compare_needs_two_usable_runs(synth_curve) -> None:
    good = _curve(synth_curve, 0.61, 1.9, 2542.0, 0)
    with pytest.raises(FitError, match="at least two runs"):
        compare_curves([("only", good)])
    bad = curve_from_arrays([0.0, 1.0, 2.0], [0.3, 0.35, 0.4])
    with pytest.raises(FitError, match="run 'bad'"):
        compare_curves([("good", good), ("bad", bad)])
