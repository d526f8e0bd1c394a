"""Prediction intervals for one measured eval at compute C, and when a forecast is not identified (ours).

A forecast is checked against one measured eval, so its interval has to cover that measurement, not only
the expected pass rate (the curve). Three things make the measurement differ from a curve fitted earlier,
beyond what a bootstrap over prompts sees (`scaling.bootstrap`, issue #31):

1. noise shared by all prompts of an eval and correlated from one eval to the next (the policy wobbles
   between checkpoints): a prompt bootstrap keeps each eval's shared deviation, so it never sees it, and
   treating evals as independent overstates what they know;
2. the target eval's own noise: its binomial sampling (n_prompts × k samples) and its own wobble;
3. before the curve bends, A and C_mid trade off along a ridge: many curves fit the points about equally
   well and part later; only A ≤ 1 bounds the ridge.

Method: a profile likelihood of the curve under an explicit noise model, then the target's noise.

1. Noise (`scaling.noise`): each eval = curve + sampling noise (variance known from the eval's own prompts
   and samples, `Curve.eval_var`) + a wobble shared by its prompts, AR(1) over evals (correlation 0.7, a
   prior) with a variance τ² estimated by REML about a first fit.
2. The measured R0 is one more point of the likelihood: at compute 0, where s = 0 and no wobble, or at the
   first eval's compute when the run has no step-0 eval (never used twice). So R0 is a parameter anchored
   by its measurement and its noise reaches the forecast; a given R0 is held fixed.
3. Profile likelihood (`scaling.profile`): generalised least squares under that covariance, with (R0, A)
   exact for each (B, C_mid) of a grid and A ≤ 1. The curve interval at C is the range of R(C) over the
   region SSE ≤ SSE_min + s·χ²₁(level): the noise model's variances count as known (the sampling variance
   is measured, τ² is averaged over its likelihood), and s = max(1, SSE_min/ν), ν = n − 3, widens the
   region when the residuals are larger than the model says (never narrows it).
4. The prediction interval of a measured eval adds the target's own noise, σ_T² = (v_T + τ²)·s, v_T the
   sampling variance of the last fitted evals, per side in quadrature: hi = R̂ + √((hi_c − R̂)² +
   (t_ν σ_T)²), the same below, with the Student quantile t_ν of `level`: one eval's deviation, from a
   variance that rests on ν residuals.
5. Not identified: the rule reads the curve interval at `ID_LEVEL` (99%) with the threshold s·F(1, ν),
   which also charges for few points; wider than `MAX_CURVE_WIDTH`, the data do not pin the forecast (the
   ridge before the bend, or too few or too noisy evals): no point, only [lo, hi]. The 99% interval keeps
   out most fits that look pinned only because the wobble mimicked a bend.

The quantiles and the width come from the calibration (`bench/forecast_calibration.py` on simulated runs,
`scaling.simulate`). With F for the region the intervals from half a run were wider than needed (coverage
0.99, median width 0.122 where 0.12 is the target); with z for the target's noise the fits on three
quarters of a run covered only 0.90. The 99% curve interval at the end of a run fitted on its first half is
at most 0.23 wide in 95% of the runs bent by then (0.25 in 99%), and at least 0.32 in 95% of the fits on
the first quarter of a bent run (200 runs each): 0.25 lies between, nearer the forecasts that should be
given.

Why not the alternatives: a bootstrap over prompts cannot see noise shared by all prompts; one over points
or residual blocks costs hundreds of refits (the online fit runs after every eval) and still piles up at
A = 1 on the ridge, where the percentile interval is truncated; a Wald (delta-method) interval is a
straight line through a curved ridge; an iid residual variance misses the wobble the fitted curve absorbs.
The profile is exact along the ridge and costs a few passes over a grid (~35 ms of CPU for a window of
17–37 evals and three forecasts).

Shapes: compute [n] (the fit window), targets [M]; see `scaling.profile` for the grid's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy.stats import chi2
from scipy.stats import f as f_dist
from scipy.stats import t as t_dist

from scalerl.scaling import profile
from scalerl.scaling.curves import FitError, FloatArray
from scalerl.scaling.data import FitWindow
from scalerl.scaling.noise import WOBBLE_AR, covariance, jacobian, reml_tau2, whitener
from scalerl.scaling.profile import Points

METHOD = "profile likelihood, (R0, A) exact, A ≤ 1; sampling + AR(1) wobble noise (REML); + the eval's own noise"
ID_LEVEL = 0.99
"""The identification rule reads the curve's interval at this level, whatever the forecast's level."""
MAX_CURVE_WIDTH = 0.25
"""Refuse a point forecast when the curve's `ID_LEVEL` interval at C is wider than this (pass-rate
fraction); set from the calibration (see the module docstring)."""
_FIXED_VAR = 1e-12  # variance of a given R0's point: held fixed
_TAIL = 3  # the target's sampling variance: the mean of the last _TAIL fitted evals'


@dataclass(frozen=True, slots=True)
class Prediction:
    """A measured eval at `compute`: point forecast (None when not identified) and its intervals."""

    compute: float
    pass_rate: float | None
    """The fitted curve's value at `compute` (maximum likelihood), or None when not identified."""
    lo: float
    hi: float
    """Prediction interval of one measured eval at `compute` (fractions, at `PredictionSet.level`)."""
    curve_lo: float
    curve_hi: float
    """Interval of the expected pass rate (the curve) at `compute`, without the eval's own noise."""
    identified: bool
    """Whether the data pin the forecast: id_width ≤ MAX_CURVE_WIDTH."""
    fitted: float
    """The fitted curve's value at `compute`, given even when not identified (for drawing)."""
    id_width: float
    """Width of the curve's interval at `ID_LEVEL`, the one the identification rule reads."""


@dataclass(frozen=True, slots=True)
class PredictionSet:
    """The prediction intervals of one fit window and the noise model behind them (pass-rate fractions)."""

    predictions: tuple[Prediction, ...]
    level: float
    A_interval: tuple[float, float]
    """Profile-likelihood interval of A (checkpoint-to-checkpoint noise included, nothing resampled)."""
    sampling_sd: float
    """The evals' own sampling noise (root mean of their variances)."""
    wobble_sd: float
    """The checkpoint wobble's standard deviation, τ (REML, `scaling.noise`)."""
    target_sd: float
    """Standard deviation of the target eval's own noise (its sampling noise and the wobble)."""
    excess: float
    """Generalised SSE per degree of freedom when above 1 (the residuals exceed the noise model), else 1."""
    method: str = METHOD
    max_curve_width: float = MAX_CURVE_WIDTH

    def to_dict(self) -> dict[str, object]:
        return {
            "method": self.method,
            "level": self.level,
            "A_interval": list(self.A_interval),
            "sampling_sd": self.sampling_sd,
            "wobble_sd": self.wobble_sd,
            "wobble_ar": WOBBLE_AR,
            "target_sd": self.target_sd,
            "excess": self.excess,
            "identification": {"level": ID_LEVEL, "max_curve_width": self.max_curve_width},
        }


def points(win: FitWindow) -> Points:
    """The likelihood's points of a fit window: the R0 point first (its compute, or 0 for a given R0)."""
    n = int(win.compute.size)
    with np.errstate(divide="ignore"):
        ln_r0 = np.log(win.r0_compute) if win.r0_is_measured else -np.inf
    v = np.full(n, np.nan) if win.eval_var is None else np.asarray(win.eval_var, dtype=np.float64)
    v0 = np.nan if win.r0_var is None else win.r0_var
    if not win.r0_is_measured:
        v0 = _FIXED_VAR  # a given R0 is held fixed
    return Points(
        ln_c=np.concatenate([[ln_r0], np.log(win.compute)]),
        y=np.concatenate([[win.r0], win.pass_rate]),
        v=np.concatenate([[v0], v]),
        pos=np.concatenate([[0.0], np.flatnonzero(win.mask).astype(np.float64)]),
        wobbly=np.concatenate([[win.r0_is_measured and win.r0_compute > 0], np.ones(n, dtype=bool)]),
        n=n,
        p=4 if win.r0_is_measured else 3,
    )


def _noise_model(d: Points) -> tuple[Points, float, FloatArray]:
    """(the points with sampling variances filled in, τ², the whitener) from a first fit and REML."""
    v = d.v
    if np.isnan(v).any():  # no sampling variances: half of the residual variance of an unweighted fit
        weights = np.where(np.isnan(v), 1.0, 1.0 / np.sqrt(np.maximum(v, _FIXED_VAR)))
        _, sse0, _ = profile.fit(d, np.diag(weights))
        v = np.where(np.isnan(v), 0.5 * sse0 / _dof(d), v)
        d = Points(ln_c=d.ln_c, y=d.y, v=v, pos=d.pos, wobbly=d.wobbly, n=d.n, p=d.p)
    scale = float(np.mean(v[d.wobbly]))
    q0, _, _ = profile.fit(d, whitener(covariance(v, d.pos, d.wobbly, scale)))  # a first curve, τ² = v̄
    tau2 = reml_tau2(v, d.pos, d.wobbly, d.y - profile.curve(q0, d.ln_c), jacobian(q0, d.ln_c))
    return d, tau2, whitener(covariance(v, d.pos, d.wobbly, tau2))


def _dof(d: Points) -> int:
    """N − p: n points + a measured R0 less 4 parameters, or n points less 3 with R0 given (both n − 3)."""
    return max(d.n - 3, 1)


@dataclass(frozen=True, slots=True)
class _Fitted:
    """The curve of a fit window under its noise model: points d, whitener w, optimum q, its SSE, the coarse
    grid's linear solutions, the degrees of freedom ν, the excess scale s and τ²."""

    d: Points
    w: FloatArray
    q: FloatArray
    sse_min: float
    coarse: profile.Linear
    nu: int
    scale: float
    tau2: float

    def threshold(self, level: float) -> float:
        """The forecast's region {SSE ≤ t} at `level`: the noise model's variances counted as known."""
        return self.sse_min + self.scale * float(chi2.ppf(level, 1))

    def id_threshold(self) -> float:
        """The identification rule's region at `ID_LEVEL` (also charges for few points)."""
        return self.sse_min + self.scale * float(f_dist.ppf(ID_LEVEL, 1, self.nu))


def _fitted(win: FitWindow) -> _Fitted:
    d, tau2, w = _noise_model(points(win))
    q, sse_min, coarse = profile.fit(d, w)
    nu = _dof(d)
    scale = max(1.0, sse_min / nu)  # residuals larger than the noise model says: widen, never narrow
    return _Fitted(d=d, w=w, q=q, sse_min=sse_min, coarse=coarse, nu=nu, scale=scale, tau2=tau2)


def _check(level: float, compute: ArrayLike) -> FloatArray:
    if not 0 < level < 1:
        raise FitError(f"level must be in (0, 1), got {level}.")
    targets = np.atleast_1d(np.asarray(compute, dtype=np.float64))
    if not (np.isfinite(targets).all() and (targets > 0).all()):
        raise FitError(f"forecast compute values must be positive numbers, got {targets.tolist()}.")
    return targets


def predict_window(win: FitWindow, compute: ArrayLike, *, level: float = 0.95) -> PredictionSet:
    """Prediction intervals of a measured eval at each of `compute` ([M] in the window's unit, > 0).

    win: the fit window (`data.fit_window`); level: two-sided coverage, e.g. 0.95. Deterministic (no
    resampling). Raises FitError on a level outside (0, 1) or compute values that are not positive.
    """
    targets = _check(level, compute)
    f = _fitted(win)
    d, nu, scale, tau2 = f.d, f.nu, f.scale, f.tau2
    fitted = np.clip(profile.curve(f.q, np.log(targets)), 0.0, 1.0)
    ranges = _regions(f, np.log(targets), (f.threshold(level), f.id_threshold()))
    (lo_c, hi_c), (lo_i, hi_i) = ((np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)) for lo, hi in ranges[0])
    lo_c, hi_c = np.minimum(lo_c, fitted), np.maximum(hi_c, fitted)
    lo_i, hi_i = np.minimum(lo_i, fitted), np.maximum(hi_i, fitted)
    target_var = (float(np.mean(d.v[1:][-_TAIL:])) + tau2) * scale
    noise = float(t_dist.ppf((1 + level) / 2, nu)) * np.sqrt(target_var)
    out = []
    for k, c in enumerate(targets):
        fk = float(fitted[k])
        identified = bool(hi_i[k] - lo_i[k] <= MAX_CURVE_WIDTH)
        out.append(Prediction(
            compute=float(c), pass_rate=fk if identified else None,
            lo=float(np.clip(fk - np.hypot(fk - lo_c[k], noise), 0.0, 1.0)),
            hi=float(np.clip(fk + np.hypot(hi_c[k] - fk, noise), 0.0, 1.0)),
            curve_lo=float(lo_c[k]), curve_hi=float(hi_c[k]), identified=identified, fitted=fk,
            id_width=float(hi_i[k] - lo_i[k]),
        ))
    return PredictionSet(predictions=tuple(out), level=level, A_interval=ranges[1],
                         sampling_sd=float(np.sqrt(np.mean(d.v[1:]))), wobble_sd=float(np.sqrt(tau2)),
                         target_sd=float(np.sqrt(target_var)), excess=scale)


@dataclass(frozen=True, slots=True)
class Gain:
    """The curve's gain R(budget) − R(now) (pass-rate fraction, expected values: no eval noise in it)."""

    now: float
    budget: float
    """Compute now and at the end of the budget (the window's unit)."""
    fitted: float
    lo: float
    hi: float
    """The gain's profile-likelihood interval at `level` (two-sided)."""
    level: float
    identified: bool
    """Whether the curve at `budget` is identified (`Prediction.identified`): only then may a decision rest
    on the gain."""
    A_hi: float
    """The upper end of A's profile interval at `level`."""


def predict_gain(win: FitWindow, now: float, budget: float, *, level: float = 0.95) -> Gain:
    """What the compute left adds: the interval of R(budget) − R(now) over the profile-likelihood region at
    `level`, whether the curve at `budget` is identified, and A's upper end (the ceiling). now, budget > 0 in
    the window's unit, budget ≥ now. Deterministic; raises FitError on bad values."""
    c = _check(level, [now, budget])
    if c[1] < c[0]:
        raise FitError(f"the budget's compute {c[1]:g} is below the compute so far {c[0]:g}.")
    f = _fitted(win)
    ln = np.log(c)
    gain = float(np.diff(profile.curve(f.q, ln))[0])
    (gain_range,), a_interval = _regions(f, ln[1:], (f.threshold(level),), gain_from=float(ln[0]))
    (id_range,), _ = _regions(f, ln[1:], (f.id_threshold(),))
    id_width = float(min(id_range[1][0], 1.0) - max(id_range[0][0], 0.0))
    return Gain(now=float(c[0]), budget=float(c[1]), fitted=gain, lo=float(min(gain_range[0][0], gain)),
                hi=float(max(gain_range[1][0], gain)), level=level, identified=id_width <= MAX_CURVE_WIDTH,
                A_hi=a_interval[1])


def _regions(f: _Fitted, ln_t: FloatArray, thresholds: tuple[float, ...], *, gain_from: float | None = None
             ) -> tuple[list[tuple[FloatArray, FloatArray]], tuple[float, float]]:
    """Per threshold (lo, hi): [M] of R(C) at ln_t over {SSE ≤ t, A ≤ 1} (or of the gain R(C) − R(C_from)
    with `gain_from` = ln C_from), and A's range at the first threshold; from the coarse grid and a fine one
    over the region's box (a region far smaller than a coarse cell, from precise data, needs it). Unclipped;
    the optimum q is inside every region."""
    d, q, coarse = f.d, f.q, f.coarse
    ln_b, m = profile.grid(d.ln_c[1:])
    fine_b, fine_m = profile.zoom(ln_b, m, coarse.constrained()[2] <= max(thresholds), q)
    bounds = [(np.full(ln_t.size, np.inf), np.full(ln_t.size, -np.inf)) for _ in thresholds]
    a_lo, a_hi = float(q[1]), float(q[1])
    for gb, gm, lin in ((ln_b, m, coarse), (fine_b, fine_m, profile.on_grid(fine_b, fine_m, f.d, f.w))):
        s_t = profile.s_grid(np.exp(gb), gm, ln_t)
        if gain_from is None:
            g0, g1 = 1.0 - s_t, s_t
        else:
            g1 = s_t - profile.s_grid(np.exp(gb), gm, np.array([gain_from]))
            g0 = -g1
        for k, t in enumerate(thresholds):
            ok, r2 = profile.region(lin, t)
            if not ok.any():
                continue
            lo, hi = profile.linear_range(lin, g0, g1, r2, ok)
            bounds[k] = (np.minimum(bounds[k][0], lo), np.maximum(bounds[k][1], hi))
            if k == 0:
                alo, ahi = profile.a_range(lin, r2, ok)
                a_lo, a_hi = min(a_lo, alo), max(a_hi, ahi)
    return bounds, (max(a_lo, 0.0), min(a_hi, 1.0))
