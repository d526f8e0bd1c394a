"""Bootstrap intervals: coverage on repeated synthetic runs, determinism, agreement with the full fit."""

from __future__ import annotations

import numpy as np
import pytest

from cpu_budget import cpu_budget
from scalerl.scaling import (
    FitError,
    analyse_curve,
    bootstrap_sigmoid,
    curve_from_arrays,
    curve_from_records,
    fit_sigmoid_window,
    fit_window,
)
from scalerl.scaling.bootstrap import batched_lm

TRIALS = 30


def test_point_bootstrap_interval_of_a_covers_truth(synth_curve, table1) -> None:
    """≥ 80% of 95% intervals contain the true A (measured: 29/30 on this set-up)."""
    A, B, C_mid = table1["scalerl-8b"]
    hits_a = hits_b = 0
    for trial in range(TRIALS):
        c, y, _ = synth_curve(A, B, C_mid, seed=1000 + trial, n=41)
        win = fit_window(curve_from_arrays(c, y))
        boot = bootstrap_sigmoid(win, fit_sigmoid_window(win), n_resamples=200, seed=trial)
        assert boot.method == "points"
        lo, hi = boot.interval("A")
        hits_a += lo <= A <= hi
        lo, hi = boot.interval("B")
        hits_b += lo <= B <= hi
    assert hits_a / TRIALS >= 0.8, hits_a
    assert hits_b / TRIALS >= 0.8, hits_b


def test_prompt_bootstrap_covers_the_population_ceiling(prompt_curve, records_of, table1) -> None:
    """Each trial draws a new 1,000-prompt eval set: its own ceiling misses the population's A by prompt
    sampling, which only the prompt bootstrap sees. Coverage of the population A must stay ≥ 80%."""
    A, B, C_mid = table1["bs2048-100k"]
    hits = 0
    trials = 20
    for trial in range(trials):
        c, rates = prompt_curve(A, B, C_mid, seed=2000 + trial, n=41)
        curve = curve_from_records(records_of(c, rates.mean(axis=1), rates))
        a = analyse_curve(curve, n_bootstrap=200, seed=trial)
        assert a.bootstrap is not None and a.bootstrap.method == "prompts"
        lo, hi = a.bootstrap.interval("A")
        hits += lo <= A <= hi
    assert hits / trials >= 0.8, hits


def test_bootstrap_is_seeded(synth_curve) -> None:
    c, y, _ = synth_curve(0.61, 1.92, 2542.0, seed=4)
    win = fit_window(curve_from_arrays(c, y))
    fit = fit_sigmoid_window(win)
    one = bootstrap_sigmoid(win, fit, n_resamples=50, seed=7)
    two = bootstrap_sigmoid(win, fit, n_resamples=50, seed=7)
    three = bootstrap_sigmoid(win, fit, n_resamples=50, seed=8)
    np.testing.assert_array_equal(one.samples, two.samples)
    assert not np.array_equal(one.samples, three.samples)


def test_batched_refit_of_the_original_data_reproduces_the_fit(synth_curve) -> None:
    """The bootstrap's batched Levenberg–Marquardt, started elsewhere, lands on the grid fit's optimum."""
    c, y, _ = synth_curve(0.645, 1.70, 10909.0, seed=5)
    win = fit_window(curve_from_arrays(c, y))
    fit = fit_sigmoid_window(win)
    n = win.compute.size
    p, sse = batched_lm(
        ln_c=np.log(win.compute),
        y=win.pass_rate[None],
        w=np.ones((1, n)),
        r0=np.array([win.r0]),
        p0=np.array([[0.7, 1.0, np.log(5000.0)]]),
        lo=np.array([[win.r0 + 1e-6, 0.02, 0.0]]),
        hi=np.array([[1.0, 30.0, 20.0]]),
    )
    assert p[0, 0] == pytest.approx(fit.A, abs=1e-4)
    assert p[0, 1] == pytest.approx(fit.B, rel=1e-3)
    assert np.exp(p[0, 2]) == pytest.approx(fit.C_mid, rel=1e-3)
    assert sse[0] == pytest.approx(fit.sse, rel=1e-6)


def test_forecast_band_brackets_the_fit_and_widens_with_distance(synth_curve) -> None:
    c, y, _ = synth_curve(0.61, 1.92, 2542.0, seed=6)
    a = analyse_curve(curve_from_arrays(c, y), max_compute=c[-1] / 2, predict=[c[-1] / 2, c[-1], 4 * c[-1]])
    widths = []
    for f in a.forecasts:
        assert f.lo is not None and f.hi is not None
        assert f.lo <= f.pass_rate <= f.hi
        widths.append(f.hi - f.lo)
    assert widths[0] < widths[1]


def test_bootstrap_is_fast(synth_curve) -> None:
    c, y, _ = synth_curve(0.61, 1.92, 2542.0, seed=0, n=300)
    win = fit_window(curve_from_arrays(c, y))
    fit = fit_sigmoid_window(win)
    with cpu_budget(3.0, "200 bootstrap refits"):
        bootstrap_sigmoid(win, fit, n_resamples=200)


def test_bootstrap_rejects_bad_settings(synth_curve) -> None:
    c, y, _ = synth_curve(0.61, 1.92, 2542.0, seed=0)
    win = fit_window(curve_from_arrays(c, y))
    fit = fit_sigmoid_window(win)
    with pytest.raises(FitError, match="at least 2 resamples"):
        bootstrap_sigmoid(win, fit, n_resamples=1)
    with pytest.raises(FitError, match="prompt_pass_rates"):
        bootstrap_sigmoid(win, fit, method="prompts")


def test_forecast_interval_covers_the_end_when_points_are_log_spaced(synth_curve, table1) -> None:
    """Log-spaced evals leave few points in the upper half of the fit window, so a half-compute forecast
    is noisier (measured sd ≈ 0.013 vs 0.007 linear); its bootstrap interval must say so and cover."""
    A, B, C_mid = table1["scalerl-8b"]
    hits, trials = 0, 12
    for seed in range(trials):
        c, y, p = synth_curve(A, B, C_mid, seed=300 + seed, spacing="log")
        a = analyse_curve(curve_from_arrays(c, y), max_compute=c[-1] / 2, predict=[c[-1]], n_bootstrap=200, seed=seed)
        f = a.forecasts[0]
        assert f.lo is not None and f.hi is not None
        hits += f.lo <= p[-1] <= f.hi
    assert hits / trials >= 0.8, hits
