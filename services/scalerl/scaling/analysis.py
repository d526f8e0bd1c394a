"""One call that does everything `scalerl fit`, the report and the online refit show (pure; no I/O).

`analyse_curve` fits the sigmoid, bootstraps it, fits the power law for contrast, forecasts, and — when
points lie beyond `max_compute` — checks the forecast against them (the paper's "fit on half, extend"
check, §1.6), and collects plain-language warnings about what the data cannot yet tell.
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

DEFAULT_FORECAST_FACTORS = (1.0, 2.0, 4.0)
"""Default forecasts: at the last observed compute × 1, × 2 and × 4 (the paper extrapolates 2–2.8×)."""


@dataclass(frozen=True, slots=True)
class Forecast:
    """Expected pass rate at `compute` (device-hours) with its bootstrap interval (None without one)."""

    compute: float
    pass_rate: float
    lo: float | None
    hi: float | None


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
                {"compute": p.compute, "pass_rate": p.pass_rate, "lo": p.lo, "hi": p.hi} for p in self.forecasts
            ],
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
) -> CurveAnalysis:
    """Fit, bootstrap (skipped when n_bootstrap == 0), power law, forecasts at `predict` (the curve's
    compute unit; default `default_forecast_compute`), holdout check. The window is `fit_window`'s (points
    below max(min_compute, min_compute_fraction × largest compute) are left out). Raises FitError on
    unusable data."""
    win = fit_window(curve, r0=r0, min_compute=min_compute, max_compute=max_compute,
                     min_compute_fraction=min_compute_fraction)
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
    return CurveAnalysis(
        curve=curve,
        window=win,
        fit=fit,
        bootstrap=boot,
        power_law=power,
        forecasts=forecast(fit, boot, targets),
        holdout=_holdout(curve, fit, max_compute),
        min_compute=win.min_compute,
        max_compute=max_compute,
        warnings=_warnings(win, fit, boot),
        min_compute_fraction=min_compute_fraction,
    )


def forecast(fit: SigmoidFit, boot: Bootstrap | None, compute: Sequence[float]) -> tuple[Forecast, ...]:
    """Point forecasts with bootstrap intervals at `compute` [M] device-hours."""
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
