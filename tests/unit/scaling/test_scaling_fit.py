"""The paper's fitting procedure on synthetic curves with known parameters (spec §1.3, §4.1, §1.7)."""

from __future__ import annotations

import numpy as np
import pytest

from cpu_budget import cpu_budget
from scalerl.scaling import (
    FitError,
    curve_from_arrays,
    curve_from_records,
    fit_power_law,
    fit_sigmoid,
    fit_window,
)
from scalerl.scaling.fit import a_grid, c_mid_grid

SEEDS = (0, 1, 2)


@pytest.mark.parametrize("name", ["scalerl-8b", "bs2048-100k", "scout"])
@pytest.mark.parametrize("spacing", ["linear", "log"])
def test_recovers_table1_parameters(name, spacing, table1, synth_curve) -> None:
    A, B, C_mid = table1[name]
    for seed in SEEDS:
        c, y, _ = synth_curve(A, B, C_mid, seed=seed, spacing=spacing)
        fit = fit_sigmoid(c, y)
        assert abs(fit.A - A) <= 0.02, (seed, fit)
        assert abs(fit.B / B - 1) <= 0.15, (seed, fit)
        assert abs(fit.C_mid / C_mid - 1) <= 0.15, (seed, fit)
        assert fit.n_points == c.size - 1  # the compute-0 point only fixes R0
        assert fit.R0 == float(y[0])  # noqa: SIM300 (ruff reads the attribute R0 as a constant)
        assert fit.r2 > 0.99


@pytest.mark.parametrize("name", ["scalerl-8b", "bs2048-100k", "scout"])
def test_half_compute_fit_forecasts_the_end(name, table1, synth_curve) -> None:
    """The paper's protocol (§1.5–1.6): fit on the first half of the compute, extrapolate to the end."""
    A, B, C_mid = table1[name]
    for seed in SEEDS:
        c, y, p = synth_curve(A, B, C_mid, seed=seed, n=75)
        fit = fit_sigmoid(c, y, max_compute=c[-1] / 2)
        assert fit.n_points < 40
        assert abs(float(fit.predict(c[-1])) - p[-1]) <= 0.02, (seed, fit)


def test_power_law_overshoots_on_early_data(table1, synth_curve) -> None:
    """Paper App. A.4: fitted early, the power law's ceiling is far too high (A = 1.0 vs 0.645)."""
    for name in ("scalerl-8b", "bs2048-100k", "scout"):
        A, B, C_mid = table1[name]
        c, y, _ = synth_curve(A, B, C_mid, seed=0)
        early = c <= c[-1] / 2
        pl = fit_power_law(c[early], y[early])
        sig = fit_sigmoid(c[early], y[early])
        assert pl.A > A + 0.02, pl
        assert abs(sig.A - A) <= 0.02
        assert pl.B > 0 and pl.D > 0


def test_power_law_recovers_a_power_law() -> None:
    c = np.geomspace(10, 1e4, 40)
    y = 0.7 - 0.9 * c**-0.5
    pl = fit_power_law(c, y)
    assert abs(pl.A - 0.7) <= 2e-3
    assert abs(pl.B / 0.5 - 1) <= 0.02


def test_quickstart_scale_compute(synth_curve) -> None:
    """The same defaults work for a CPU run of ~0.001–0.2 device-hours (grids adapt to the data)."""
    c, y, _ = synth_curve(0.42, 1.3, 0.05, seed=3, n=40, r0=0.12)
    fit = fit_sigmoid(c, y)
    assert abs(fit.A - 0.42) <= 0.02
    assert fit.C_mid == pytest.approx(0.05, rel=0.15)
    grid = c_mid_grid(c[c > 0])
    assert grid[0] <= c[c > 0].min() / 10 * 1.0001 and grid[-1] >= c.max() * 100 * 0.9999


def test_a_grid_follows_the_data() -> None:
    g = a_grid(best=0.61, r0=0.3)
    assert g[0] == pytest.approx(0.59) and g[-1] == pytest.approx(1.0)
    assert np.allclose(np.diff(g), 0.005)
    assert a_grid(best=0.31, r0=0.3)[0] > 0.3  # never at or below R0


def test_fit_is_fast(synth_curve) -> None:
    c, y, _ = synth_curve(0.61, 1.92, 2542.0, seed=0, n=300)
    fit_sigmoid(c, y)  # warm-up (imports)
    with cpu_budget(1.0, "a sigmoid fit of 300 points"):
        fit_sigmoid(c, y)


def test_min_max_compute_window_and_given_r0(synth_curve) -> None:
    c, y, _ = synth_curve(0.61, 1.92, 2542.0, seed=0)
    win = fit_window(curve_from_arrays(c, y), min_compute=1500, max_compute=6000)
    assert win.compute.min() >= 1500 and win.compute.max() <= 6000
    fit = fit_sigmoid(c, y, min_compute=1500, max_compute=6000, r0=0.3)
    assert fit.R0 == 0.3 and fit.n_points == win.compute.size


def test_fixed_a_holds_a() -> None:
    c = np.linspace(0, 10000, 41)
    y = 0.3 + 0.31 / (1 + (2542 / np.maximum(c, 1e-9)) ** 1.92)
    fit = fit_sigmoid(c, y, fixed_a=0.62)
    assert fit.A == 0.62
    free = fit_sigmoid(c, y)
    assert free.sse <= fit.sse


def test_r0_from_the_smallest_compute_when_there_is_no_step_zero() -> None:
    c = np.array([5.0, 10, 20, 40, 80, 160])
    y = np.array([0.2, 0.25, 0.33, 0.42, 0.48, 0.5])
    fit = fit_sigmoid(c[::-1], y[::-1])  # order does not matter
    # the first eval is R0 and only R0: one measurement is not used twice (issue #31), so 5 points are fitted
    assert fit.R0 == 0.2 and fit.n_points == 5
    win = fit_window(curve_from_arrays(c, y))
    assert win.compute.tolist() == [10, 20, 40, 80, 160] and win.r0_compute == 5.0
    # a given R0 is no measurement: then every point is fitted
    assert fit_sigmoid(c, y, r0=0.15).n_points == 6


@pytest.mark.parametrize(
    ("compute", "rate", "needle"),
    [
        ([0, 1, 2, 3], [0.1, 0.2, 0.3, 0.4], "only 3 usable point"),
        ([0, 5, 5, 5, 5, 5], [0.1, 0.2, 0.3, 0.3, 0.31, 0.3], "no spread in compute"),
        ([0, 1, 2, 3, 4], [0.1, 0.2, float("nan"), 0.3, 0.4], "NaN"),
        ([0, 1, 2, 3, 4], [0.1, 0.2, 1.3, 0.3, 0.4], "outside [0, 1]"),
        ([0, 1, -2, 3, 4], [0.1, 0.2, 0.3, 0.3, 0.4], "negative"),
        ([0, 1, 2, 3, 4], [0.5, 0.4, 0.3, 0.3, 0.2], "no point rises above R0"),
        ([], [], "non-empty"),
        ([1, 2], [0.1], "equally long"),
    ],
)
def test_degenerate_inputs_raise_fit_error(compute, rate, needle) -> None:
    with pytest.raises(FitError, match=None) as e:
        fit_sigmoid(np.asarray(compute, dtype=float), np.asarray(rate, dtype=float))
    assert needle in str(e.value)
    assert isinstance(e.value, ValueError)


def test_window_errors() -> None:
    c, y = np.linspace(0, 10, 11), np.linspace(0.1, 0.5, 11)
    with pytest.raises(FitError, match="window is empty"):
        fit_sigmoid(c, y, min_compute=5, max_compute=5)
    with pytest.raises(FitError, match="at least 4 points"):
        fit_sigmoid(c, y, max_compute=3)
    with pytest.raises(FitError, match="R0"):
        fit_sigmoid(c, y, r0=1.5)


def test_records_select_eval_records_and_report_bad_ones() -> None:
    recs = [
        {"kind": "step", "step": 1, "loss": 0.3},
        {"kind": "eval", "step": 0, "compute": 0.0, "pass_rate": 0.3},
        {"kind": "fit", "step": 2, "compute": 1.0, "A": 0.6},
        {"compute": 1.0, "pass_rate": 0.35},
        {"compute": 2.0},  # a CSV row of another logger without an eval value: skipped
    ]
    curve = curve_from_records(recs)
    assert len(curve) == 2
    with pytest.raises(FitError, match="eval record without 'pass_rate'"):
        curve_from_records([*recs, {"kind": "eval", "step": 9, "compute": 3.0}])
    with pytest.raises(FitError, match="not a number"):
        curve_from_records([{"kind": "eval", "compute": "soon", "pass_rate": 0.3}])
    with pytest.raises(FitError, match="no eval records"):
        curve_from_records([{"kind": "step", "loss": 1.0}])


def test_prompt_rates_kept_only_when_consistent() -> None:
    recs = [
        {"kind": "eval", "compute": float(i), "pass_rate": 0.5, "prompt_pass_rates": [0.25, 0.75]} for i in range(5)
    ]
    assert curve_from_records(recs).prompt_pass_rates is not None
    recs[2]["prompt_pass_rates"] = [0.0, 0.0]  # mean disagrees with pass_rate
    assert curve_from_records(recs).prompt_pass_rates is None
    del recs[2]["prompt_pass_rates"]
    assert curve_from_records(recs).prompt_pass_rates is None


@pytest.mark.parametrize("name", ["scalerl-8b", "bs2048-100k", "scout"])
def test_noiseless_curve_is_recovered_exactly(name, table1) -> None:
    """Without noise the least-squares optimum is the truth; the grid alone (step 0.005) would miss it."""
    A, B, C_mid = table1[name]
    c = np.linspace(0, 4 * C_mid, 41)
    y = 0.3 + (A - 0.3) / (1 + (C_mid / np.maximum(c, 1e-12)) ** B)
    y[0] = 0.3
    fit = fit_sigmoid(c, y)
    assert abs(fit.A - A) < 1e-4
    assert abs(fit.B / B - 1) < 1e-3 and abs(fit.C_mid / C_mid - 1) < 1e-3
    assert fit.sse < 1e-12


def test_fit_reaches_the_least_squares_optimum(synth_curve) -> None:
    """No other (A, B, C_mid) has a lower SSE: a local solver started at the truth does not beat the fit."""
    from scipy.optimize import least_squares

    from scalerl.scaling import sigmoid

    c, y, _ = synth_curve(0.645, 1.70, 10909.0, seed=11)
    fit = fit_sigmoid(c, y)
    m = c > 0

    def resid(p: np.ndarray) -> np.ndarray:
        return y[m] - sigmoid(c[m], A=p[0], B=p[1], C_mid=np.exp(p[2]), R0=float(y[0]))

    best = least_squares(resid, [0.645, 1.70, np.log(10909.0)], method="lm")
    assert fit.sse <= float(np.sum(best.fun**2)) * (1 + 1e-6)


def test_vectorised_b_profile_matches_curve_fit_per_pair(synth_curve) -> None:
    """The paper fits B with scipy's curve_fit for each (A, C_mid) pair; our vectorised solve agrees."""
    from scipy.optimize import curve_fit

    from scalerl.scaling.fit import profile_b

    c, y, _ = synth_curve(0.61, 1.92, 2542.0, seed=2)
    r0, cp, yp = float(y[0]), c[1:], y[1:]
    a_vals = np.array([0.60, 0.61, 0.63, 0.70])
    cm_vals = np.array([1500.0, 2542.0, 4000.0])
    b, sse = profile_b(ln_c=np.log(cp), y=yp, w=np.ones_like(yp), r0=r0, a=a_vals, ln_c_mid=np.log(cm_vals))
    for i, a in enumerate(a_vals):
        for j, cm in enumerate(cm_vals):

            def model(cc: np.ndarray, bb: float, a: float = a, cm: float = cm) -> np.ndarray:
                return r0 + (a - r0) / (1 + (cm / cc) ** bb)

            (b_ref,), _ = curve_fit(model, cp, yp, p0=[1.0], bounds=(0.02, 30.0))
            sse_ref = float(np.sum((yp - model(cp, b_ref)) ** 2))
            assert sse[i, j] <= sse_ref * (1 + 1e-4) + 1e-9, (a, cm)
            assert abs(b[i, j] - b_ref) <= 2e-3 * max(1.0, b_ref), (a, cm, b[i, j], b_ref)
