"""Prediction intervals of a measured eval (`scaling.predict`) and "not identified yet", on small known cases."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.special import expit
from scipy.stats import t as t_dist

from cpu_budget import cpu_budget
from scalerl.scaling import FitError, curve_from_arrays, curve_from_records, fit_window, profile, sigmoid
from scalerl.scaling import predict as pr
from scalerl.scaling.simulate import SimSettings, simulate_run


def _window(c: np.ndarray, y: np.ndarray, **kw: object):  # type: ignore[no-untyped-def]
    return fit_window(curve_from_arrays(c, y, **kw))  # type: ignore[arg-type]


@pytest.mark.parametrize("bent", [True, False])
def test_closed_form_range_matches_a_brute_force_search(bent: bool) -> None:
    """At one (B, C_mid) the range of R(C) over {SSE ≤ t, A ≤ 1} is closed form (an ellipse cut by a chord);
    a brute-force scan of (R0, A) on a fine lattice, SSE summed point by point, must give the same range.
    Independent noise of variance 1/w here (a diagonal whitener), so SSE = Σ w·residual²."""
    c = np.array([0.0, 1, 2, 3, 4, 5, 6])
    rng = np.random.default_rng(3)
    # bent: a curve well past its midpoint; not bent: the same points far below the midpoint (A ≤ 1 binds)
    c_mid = 1.5 if bent else 12.0
    y = sigmoid(c, A=0.7, B=2.0, C_mid=c_mid, R0=0.3) + rng.normal(0, 0.004, c.size)
    d = pr.points(_window(c, y))
    wts = np.array([3.0, 1, 1, 2, 1, 1, 1])  # per-point weights (the R0 point first)
    b, m = np.array([[2.0]]), np.array([[np.log(c_mid)]])
    lin = profile.linear(profile.s_grid(b, m, d.ln_c), d, np.diag(np.sqrt(wts)))
    _, _, sse_c = lin.constrained()
    t = float(sse_c[0, 0]) + (0.004 if bent else 0.02)  # not bent: the ellipse reaches past A = 1
    target = 12.0
    lo, hi, a_lo, a_hi = profile.ranges(lin, profile.s_grid(b, m, np.log(np.array([target]))), t)

    r0s, As = np.meshgrid(np.linspace(0.0, 0.6, 601), np.linspace(-4.0, 1.0, 5001), indexing="ij")
    s = expit(2.0 * (d.ln_c - np.log(c_mid)))  # s = 0 at compute 0
    sse = np.zeros_like(r0s)
    for w, sj, yj in zip(wts, s, d.y, strict=True):
        sse += w * (yj - (r0s * (1 - sj) + As * sj)) ** 2
    inside = sse <= t
    assert inside.any()
    s_t = expit(2.0 * (np.log(target) - np.log(c_mid)))
    pred = (r0s * (1 - s_t) + As * s_t)[inside]
    step = 0.6 / 600 + 5.0 / 5000  # lattice resolution
    assert lo[0] == pytest.approx(pred.min(), abs=step)
    assert hi[0] == pytest.approx(pred.max(), abs=step)
    assert a_lo == pytest.approx(As[inside].min(), abs=step)
    assert a_hi == pytest.approx(As[inside].max(), abs=step)
    if not bent:
        assert a_hi == 1.0  # the ceiling is what bounds the ridge
    # the gain R(target) − R(now) is the same kind of linear function of (R0, A), with a negative R0 weight
    now = 4.0
    s_now = expit(2.0 * (np.log(now) - np.log(c_mid)))
    g1 = np.full((1, 1, 1), s_t - s_now)
    ok, r2 = profile.region(lin, t)
    g_lo, g_hi = profile.linear_range(lin, -g1, g1, r2, ok)
    gains = ((As - r0s) * (s_t - s_now))[inside]
    assert g_lo[0] == pytest.approx(gains.min(), abs=step)
    assert g_hi[0] == pytest.approx(gains.max(), abs=step)


def test_noise_free_bent_curve_gives_the_curve_and_the_target_noise_in_quadrature() -> None:
    """Exact points of a bent curve. With no sampling noise the forecast is the curve, to the fit's precision;
    with a known eval variance v = 0.01² the target's own noise is that and the (small) wobble, and each side
    of the interval is √(curve side² + (t·σ_T)²)."""
    c = np.linspace(0.0, 10.0, 21)
    y = sigmoid(c, A=0.8, B=2.0, C_mid=2.0, R0=0.3)
    truth = float(sigmoid(20.0, A=0.8, B=2.0, C_mid=2.0, R0=0.3))
    exact = pr.predict_window(_window(c, y, eval_var=np.zeros(c.size)), [20.0]).predictions[0]
    assert exact.identified and exact.pass_rate == pytest.approx(truth, abs=1e-4)
    assert exact.hi - exact.lo < 1e-3

    ps = pr.predict_window(_window(c, y, eval_var=np.full(c.size, 0.01**2)), [20.0])
    p = ps.predictions[0]
    assert ps.sampling_sd == pytest.approx(0.01) and ps.excess == 1.0  # exact points: no residual at all
    # the wobble is estimated small (the mean of τ² under its likelihood, never exactly 0)
    assert ps.wobble_sd < 0.004 and ps.target_sd == pytest.approx(np.hypot(0.01, ps.wobble_sd))
    assert p.identified and p.pass_rate is not None and p.curve_lo <= truth <= p.curve_hi
    z = t_dist.ppf(0.975, 20 - 3) * ps.target_sd / 0.01  # Student quantile, ν = n − 3 (20 fitted points)
    assert p.hi - p.pass_rate == pytest.approx(np.hypot(p.curve_hi - p.pass_rate, z * 0.01), rel=1e-6)
    assert p.pass_rate - p.lo == pytest.approx(np.hypot(p.pass_rate - p.curve_lo, z * 0.01), rel=1e-6)


def test_an_unbent_curve_is_not_identified_and_its_range_is_bounded_by_a_ceiling_of_one() -> None:
    """Points that only rise (C_mid far beyond them): A and C_mid trade off, so no point is given, and the
    range runs up towards the ceiling the data allow (A ≤ 1), not beyond 1."""
    c = np.linspace(0.0, 10.0, 21)
    rng = np.random.default_rng(0)
    y = sigmoid(c, A=0.9, B=1.8, C_mid=30.0, R0=0.2) + rng.normal(0, 0.008, c.size)
    ps = pr.predict_window(_window(c, y, eval_var=np.full(c.size, 0.008**2)), [20.0, 40.0])
    for p in ps.predictions:
        assert not p.identified and p.pass_rate is None
        assert 0.0 <= p.lo < p.fitted < p.hi <= 1.0
        assert p.curve_hi - p.curve_lo > pr.MAX_CURVE_WIDTH
    assert ps.A_interval[1] == 1.0  # A is not bounded by the data
    far, near = ps.predictions[1], ps.predictions[0]
    assert far.curve_hi - far.curve_lo > near.curve_hi - near.curve_lo  # further out, less known


def test_a_given_r0_is_held_fixed_and_a_measured_one_counts_once() -> None:
    c = np.array([2.0, 4, 6, 8, 10, 12, 14])
    y = sigmoid(c, A=0.7, B=2.0, C_mid=5.0, R0=0.3)
    measured = fit_window(curve_from_arrays(c, y))  # no step-0 eval: the first eval is R0, at compute 2
    d = pr.points(measured)
    assert d.n == 6 and d.ln_c[0] == pytest.approx(np.log(2.0)) and d.y[0] == pytest.approx(y[0])
    assert d.wobbly[0]  # a trained checkpoint's eval: it has a wobble, unlike a step-0 eval
    given_win = fit_window(curve_from_arrays(c, y), r0=0.3)
    given = pr.points(given_win)
    assert given.n == 7 and given.v[0] < 1e-9 and not given.wobbly[0]  # R0 = 0.3 held fixed, at compute 0
    p = pr.predict_window(given_win, [30.0]).predictions[0]
    assert p.fitted == pytest.approx(float(sigmoid(30.0, A=0.7, B=2.0, C_mid=5.0, R0=0.3)), abs=1e-4)


def test_the_wobble_is_estimated_and_the_interval_grows_with_level_and_noise() -> None:
    """On simulated runs with and without a checkpoint wobble (known sampling noise): the REML wobble is
    larger with one, a 99% interval is wider than a 50% one, and the target's noise is at least its
    sampling noise."""
    def window(wobble: float) -> object:
        sim = simulate_run("bent", 1, SimSettings(wobble_sd=wobble))
        return fit_window(curve_from_records(sim.records), min_compute_fraction=0.1)

    calm, wobbly = pr.predict_window(window(0.0), [150.0]), pr.predict_window(window(0.3), [150.0])
    assert wobbly.wobble_sd > 2 * calm.wobble_sd
    assert wobbly.target_sd >= wobbly.sampling_sd
    win = window(0.05)
    narrow, wide = pr.predict_window(win, [150.0], level=0.5), pr.predict_window(win, [150.0], level=0.99)
    assert wide.predictions[0].hi - wide.predictions[0].lo > narrow.predictions[0].hi - narrow.predictions[0].lo
    assert wide.predictions[0].id_width == pytest.approx(narrow.predictions[0].id_width)  # the rule's own level


def test_bad_inputs_are_refused() -> None:
    c = np.linspace(0.0, 10.0, 11)
    win = _window(c, sigmoid(c, A=0.8, B=2.0, C_mid=2.0, R0=0.3))
    with pytest.raises(FitError, match="level"):
        pr.predict_window(win, [5.0], level=1.0)
    with pytest.raises(FitError, match="positive"):
        pr.predict_window(win, [0.0])


def test_one_prediction_costs_well_under_a_second() -> None:
    """The online fit runs after every eval: a prediction at three compute values, 40 evals of 128 prompts."""
    sim = simulate_run("near", 0, SimSettings(n_evals=40))
    win = fit_window(curve_from_records(sim.records), min_compute_fraction=0.1)
    pr.predict_window(win, [100.0])  # imports and caches warm
    with cpu_budget(0.5, "one prediction"):
        pr.predict_window(win, [100.0, 200.0, 400.0])
