"""`stop_policy`: a run stops on its forecast only when the forecast is identified (issue #31).

Simulated runs (`scaling.simulate`) through the run's own fit (`report.online.analyse_run`, as the training
loop calls it after every eval), judged against each run's known curve: the true gain left in the budget
and the true ceiling are computed from the simulation, not from the fit."""

from __future__ import annotations

import numpy as np
import pytest

from scalerl.config import FitConfig, SpecError, StopPolicyConfig, spec_from_dict
from scalerl.report.online import analyse_run, stop_decision
from scalerl.scaling.simulate import simulate_run

FIT = FitConfig(bootstrap=0)
SEEDS = range(30)


def _decide(regime: str, seed: int, fraction: float, policy: StopPolicyConfig) -> tuple[dict | None, float, float]:
    """(the decision at `fraction` of the run, the true gain from there to the end, the true ceiling)."""
    run = simulate_run(regime, seed)
    recs = run.records[: int(fraction * (len(run.records) - 1)) + 1]
    total_steps = run.records[-1]["step"]
    decision = stop_decision(analyse_run(recs, FIT, total_steps=total_steps), policy)
    now, end = recs[-1]["compute"], run.records[-1]["compute"]
    true_gain = float(np.diff(run.true_curve(np.array([now, end])))[0])
    return decision, true_gain, run.A


def test_a_bent_run_stops_on_its_plateau_and_stops_are_rarely_wrong() -> None:
    policy = StopPolicyConfig(min_gain=0.05)
    out = [_decide("bent", s, 0.6, policy) for s in SEEDS]
    stops = [(d, g) for d, g, _ in out if d is not None]
    assert len(stops) >= 15, f"{len(stops)} of 30 bent runs stopped with 5 points of gain allowed"
    assert all(d["reason"] == "ForecastPlateau" and d["gain_high"] < 0.05 for d, _ in stops)
    assert all(d["gain_low"] <= d["gain"] <= d["gain_high"] for d, _ in stops)
    assert sum(g > 0.05 for _, g in stops) <= 2, "stopped runs that still had more than min_gain to gain"


@pytest.mark.parametrize("regime", ["near", "not-yet"])
def test_a_run_still_climbing_goes_on(regime: str) -> None:
    out = [_decide(regime, s, 0.6, StopPolicyConfig(min_gain=0.02)) for s in SEEDS]
    wrong = [(d, g) for d, g, _ in out if d is not None and g > 0.02]
    assert len(wrong) <= 2, wrong


def test_an_unidentified_forecast_never_stops_a_run() -> None:
    """From a quarter of a run that has not bent, the forecast is not identified; with a min_gain so large
    that any identified forecast would stop the run, the stops that happen are exactly the identified ones."""
    from scalerl.scaling.predict import predict_gain

    stops = 0
    for seed in SEEDS:
        run = simulate_run("not-yet", seed)
        recs = run.records[: len(run.records) // 4 + 1]
        a = analyse_run(recs, FIT, total_steps=run.records[-1]["step"])
        d = stop_decision(a, StopPolicyConfig(min_gain=0.99))
        if a is None:
            assert d is None
            continue
        identified = predict_gain(a.window, recs[-1]["compute"], run.records[-1]["compute"]).identified
        assert (d is not None) == identified
        stops += d is not None
    assert stops <= 6, f"{stops} of 30 fits on a quarter of an unbent run were identified"


def test_below_target_stops_only_a_run_whose_ceiling_is_below_it() -> None:
    for seed in range(12):
        d_far, _, a_true = _decide("bent", seed, 0.6, StopPolicyConfig(target=0.99))
        d_near, _, _ = _decide("bent", seed, 0.6, StopPolicyConfig(target=max(a_true - 0.05, 0.01)))
        assert d_near is None, (seed, a_true, d_near)
        if d_far is not None:
            assert d_far["reason"] == "ForecastBelowTarget" and d_far["A_high"] < 0.99
    far = sum(_decide("bent", s, 0.6, StopPolicyConfig(target=0.99))[0] is not None for s in range(12))
    assert far >= 8, f"only {far} of 12 bent runs with a ceiling ≤ 0.9 stopped below a 0.99 target"


def test_off_by_default_and_no_fit_no_stop() -> None:
    assert not StopPolicyConfig().enabled
    run = simulate_run("bent", 0)
    a = analyse_run(run.records[:25], FIT, total_steps=run.records[-1]["step"])
    assert stop_decision(a, StopPolicyConfig()) is None
    assert stop_decision(None, StopPolicyConfig(min_gain=0.5)) is None
    # the run's last eval: no budget left, nothing to decide
    done = analyse_run(run.records, FIT, total_steps=run.records[-1]["step"])
    assert stop_decision(done, StopPolicyConfig(min_gain=0.5)) is None


def test_bad_stop_policy_values_are_refused_by_field() -> None:
    for bad, field in (({"min_gain": 0}, "stop_policy.min_gain"), ({"target": 1.5}, "stop_policy.target"),
                       ({"level": 1.0}, "stop_policy.level"), ({"gain": 0.1}, "stop_policy.gain")):
        with pytest.raises(SpecError, match=field.replace(".", r"\.")):
            spec_from_dict({"stop_policy": bad})
