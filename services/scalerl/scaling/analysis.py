"""One call that does everything `scalerl fit`, the report and the online refit show (pure; no I/O).

`analyse_curve` fits the sigmoid, bootstraps it, fits the power law for contrast, forecasts, and — when
points lie beyond `max_compute` — checks the forecast against them (the paper's "fit on half, extend"
check, §1.6), and collects plain-language warnings about what the data cannot yet tell.

Forecasts are predictions of a measured eval at the given compute (`scaling.predict`): a prediction
interval that includes checkpoint-to-checkpoint noise and the eval's own noise, and no point when the data
do not pin it ("not identified yet": `identified` false, `pass_rate` None, [lo, hi] the range). The
bootstrap (`scaling.bootstrap`) still gives the intervals of A, B and C_mid (`ci`), labelled by what it
resamples: held-out prompts (or points), not checkpoints.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scalerl.scaling.bootstrap import LEVEL, N_RESAMPLES, Bootstrap, bootstrap_sigmoid
from scalerl.scaling.constants import A_AT_BOUND
from scalerl.scaling.curves import A_MARGIN, FitError, FloatArray, PowerLawFit, SigmoidFit
from scalerl.scaling.data import Curve, FitWindow, fit_window
from scalerl.scaling.fit import fit_power_law_window, fit_sigmoid_window
from scalerl.scaling.predict import PredictionSet, predict_window

DEFAULT_FORECAST_FACTORS = (1.0, 2.0, 4.0)
"""Default forecasts: at the last observed compute × 1, × 2 and × 4 (the paper extrapolates 2–2.8×)."""


@dataclass(frozen=True, slots=True)
class Forecast:
    """A measured eval at `compute` (the curve's unit): point forecast and prediction interval [lo, hi]."""

    compute: float
    pass_rate: float | None
    """The point forecast, or None when the data do not identify it (then [lo, hi] is the range)."""
    lo: float | None
    hi: float | None
    identified: bool = True
    """Whether the curve's interval at `compute` is narrow enough for a point (`predict.MAX_CURVE_WIDTH`)."""
    curve_lo: float | None = None
    curve_hi: float | None = None
    """Interval of the expected pass rate (the curve) at `compute`, without the eval's own noise."""


@dataclass(frozen=True, slots=True)
class Holdout:
    """Forecast error on the points beyond max_compute (observed − predicted pass rate)."""

    n_points: int
    mean_abs_error: float
    max_abs_error: float
    final_error: float
    """At the last observed point: the error of forecasting the end of the run."""


@dataclass(frozen=True, slots=True, eq=False)
class CurveAnalysis:
    """Everything known about one curve. `window.mask` marks the fitted points of `curve`."""

    curve: Curve
    window: FitWindow
    fit: SigmoidFit
    bootstrap: Bootstrap | None
    power_law: PowerLawFit | None
    forecasts: tuple[Forecast, ...]
    holdout: Holdout | None
    min_compute: float
    """The cutoff applied (points below it are left out), in the curve's compute unit."""
    max_compute: float | None
    warnings: tuple[str, ...]
    min_compute_fraction: float = 0.0
    prediction: PredictionSet | None = None
    """The noise model and A's profile interval behind the forecasts' intervals."""

    def a_margin_interval(self) -> tuple[float, float]:
        """The paper's ±0.02 rule on A (spec §1.4), clipped to [R0, 1]."""
        return max(self.fit.R0, self.fit.A - A_MARGIN), min(1.0, self.fit.A + A_MARGIN)

    def to_dict(self) -> dict[str, Any]:
        """JSON-able summary (the `scalerl fit --json` object)."""
        f = self.fit
        ci: dict[str, list[float] | None] = {k: None for k in ("A", "B", "C_mid")}
        if self.bootstrap is not None:
            ci = {k: list(v) for k, v in self.bootstrap.ci().items()}
        pl = self.power_law
        return {
            "A": f.A,
            "B": f.B,
            "C_mid": f.C_mid,
            "R0": f.R0,
            "n_points": f.n_points,
            "sse": f.sse,
            "r2": f.r2,
            "ci": ci,
            "a_margin": {"margin": A_MARGIN, "interval": list(self.a_margin_interval())},
            "bootstrap": None
            if self.bootstrap is None
            else {
                "n_resamples": self.bootstrap.n_resamples,
                "method": self.bootstrap.method,
                "level": self.bootstrap.level,
                "seed": self.bootstrap.seed,
            },
            "predictions": [
                {"compute": p.compute, "pass_rate": p.pass_rate, "lo": p.lo, "hi": p.hi, "identified": p.identified,
                 "curve_lo": p.curve_lo, "curve_hi": p.curve_hi}
                for p in self.forecasts
            ],
            "prediction": None if self.prediction is None else self.prediction.to_dict(),
            "power_law": None if pl is None else {"A": pl.A, "B": pl.B, "D": pl.D, "r2": pl.r2},
            "holdout": None
            if self.holdout is None
            else {
                "n_points": self.holdout.n_points,
                "mean_abs_error": self.holdout.mean_abs_error,
                "max_abs_error": self.holdout.max_abs_error,
                "final_error": self.holdout.final_error,
            },
            "window": {
                "min_compute": self.min_compute,
                "min_compute_fraction": self.min_compute_fraction,
                "max_compute": self.max_compute,
                "total_compute": self.window.total_compute,
            },
            "r0_source": "measured" if self.window.r0_is_measured else "given",
            "warnings": list(self.warnings),
        }


def default_forecast_compute(curve: Curve, max_compute: float | None = None) -> list[float]:
    """Last observed compute (within max_compute) × 1, × 2, × 4 — device-hours."""
    c = curve.compute if max_compute is None else curve.compute[curve.compute <= max_compute]
    last = float(c.max()) if c.size else float(curve.compute.max())
    return [last * k for k in DEFAULT_FORECAST_FACTORS]


def analyse_curve(
    curve: Curve,
    *,
    r0: float | None = None,
    min_compute: float = 0.0,
    max_compute: float | None = None,
    predict: Sequence[float] | None = None,
    n_bootstrap: int = N_RESAMPLES,
    seed: int = 0,
    level: float = LEVEL,
    min_compute_fraction: float = 0.0,
    total_compute: float | None = None,
) -> CurveAnalysis:
    """Fit, bootstrap (skipped when n_bootstrap == 0), power law, forecasts at `predict` (the curve's
    compute unit; default `default_forecast_compute`) with prediction intervals at `level`, holdout check.
    The window is `fit_window`'s: points below max(min_compute, min_compute_fraction × total_compute) are
    left out, total_compute being the run's total (default: the curve's largest compute, whatever
    max_compute is). Raises FitError on unusable data."""
    win = fit_window(curve, r0=r0, min_compute=min_compute, max_compute=max_compute,
                     min_compute_fraction=min_compute_fraction, total_compute=total_compute)
    fit = fit_sigmoid_window(win)
    boot = None
    if n_bootstrap:
        boot = bootstrap_sigmoid(
            win,
            fit,
            n_resamples=n_bootstrap,
            seed=seed,
            level=level,
            r0_prompt_rates=curve.starting_prompt_rates(),
        )
    try:
        power: PowerLawFit | None = fit_power_law_window(win)
    except FitError:
        power = None
    targets = list(predict) if predict is not None else default_forecast_compute(curve, max_compute)
    if any(not (np.isfinite(t) and t > 0) for t in targets):
        raise FitError(f"forecast compute values must be positive numbers, got {targets}.")
    prediction = predict_window(win, targets, level=level)
    return CurveAnalysis(
        curve=curve,
        window=win,
        fit=fit,
        bootstrap=boot,
        power_law=power,
        forecasts=forecasts_of(prediction),
        holdout=_holdout(curve, fit, max_compute),
        min_compute=win.min_compute,
        max_compute=max_compute,
        warnings=_warnings(win, fit, boot),
        min_compute_fraction=min_compute_fraction,
        prediction=prediction,
    )


def forecasts_of(prediction: PredictionSet) -> tuple[Forecast, ...]:
    """The forecasts of a prediction set: a point only where identified, always the interval."""
    return tuple(
        Forecast(compute=p.compute, pass_rate=p.pass_rate, lo=p.lo, hi=p.hi, identified=p.identified,
                 curve_lo=p.curve_lo, curve_hi=p.curve_hi)
        for p in prediction.predictions
    )


def bootstrap_band_forecast(fit: SigmoidFit, boot: Bootstrap | None, compute: Sequence[float]) -> tuple[Forecast, ...]:
    """The forecasts shipped before issue #31, for comparison: the fitted curve's value as the point and the
    bootstrap's percentile band of the curve as the interval (a confidence band of the curve over the
    resampled prompts, not a prediction of one eval), at `compute` [M]; never refused."""
    c = np.asarray(compute, dtype=np.float64)
    mid = fit.predict(c)
    lo: FloatArray | None = None
    hi: FloatArray | None = None
    if boot is not None:
        lo, hi = boot.band(c)
    return tuple(
        Forecast(
            compute=float(c[i]),
            pass_rate=float(mid[i]),
            lo=None if lo is None else float(lo[i]),
            hi=None if hi is None else float(hi[i]),
        )
        for i in range(c.size)
    )


def _holdout(curve: Curve, fit: SigmoidFit, max_compute: float | None) -> Holdout | None:
    if max_compute is None:
        return None
    beyond = curve.compute > max_compute
    if not beyond.any():
        return None
    err = curve.pass_rate[beyond] - fit.predict(curve.compute[beyond])
    return Holdout(
        n_points=int(beyond.sum()),
        mean_abs_error=float(np.abs(err).mean()),
        max_abs_error=float(np.abs(err).max()),
        final_error=float(err[-1]),
    )


def _warnings(win: FitWindow, fit: SigmoidFit, boot: Bootstrap | None) -> tuple[str, ...]:
    out = []
    c_max = float(win.compute.max())
    if fit.A >= A_AT_BOUND:
        out.append(
            "A sits at its bound 1.0: the points do not yet show the curve bending over, so the ceiling is "
            "not identified; train further before trusting A or long forecasts."
        )
    if fit.C_mid > 2 * c_max:
        out.append(
            f"C_mid ({fit.C_mid:.4g}) lies beyond twice the largest fitted compute ({c_max:.4g}): the fit "
            "has not seen the midpoint, so A and C_mid trade off and forecasts are extrapolations."
        )
    if boot is not None:
        lo, hi = boot.interval("A")
        if hi - lo > 2 * A_MARGIN:
            out.append(
                f"the {boot.level:.0%} interval of A is {hi - lo:.3f} wide, wider than the paper's "
                f"±{A_MARGIN} margin: comparisons on A with this run are not conclusive yet."
            )
    if fit.r2 < 0.8:
        out.append(f"R² = {fit.r2:.2f}: the points scatter a lot around the curve (noisy or unstable run).")
    return tuple(out)
