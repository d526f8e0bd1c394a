"""The run's fit: the one procedure behind every A, interval and forecast a run shows.

The training loop refits after every eval (`analyse_run`) with the job's `fit` settings (`FitConfig`:
the early-regime cutoff, bootstrap resamples, seed, level) — the same settings `scalerl fit` and
`scalerl compare` default to on this run's folder and `write_report` uses. The result is computed once
and passed along: `fit_record` is the dict logged as a `{"kind": "fit", ...}` record in train.jsonl, put
in summary.json, published on the metrics topic (operator status) and exported by the learner's status
(dashboards); the same `CurveAnalysis` object is handed to `write_report` at the end of training.

`analyse_run` never raises on data the fit cannot use yet (too few points, no gain over R0 so far, a
bad value): it returns None, because a fit that cannot be made must never crash a training run. Given the
run's planned steps it also forecasts the last eval of the budget (`budget_*` keys of `fit_record`), and
`stop_decision` reads the job's `stop_policy` against it: the one place a forecast may end a run, and only
an identified one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scalerl.config import FitConfig, StopPolicyConfig
from scalerl.scaling import (
    CurveAnalysis,
    FitError,
    analyse_curve,
    curve_from_records,
    default_forecast_compute,
    predict_gain,
)

DEVICE_HOURS = "compute"
"""The paper's compute axis (device-hours), the column the run's fit uses."""


def analysis_options(settings: FitConfig) -> dict[str, Any]:
    """`analyse_curve` keyword arguments of the job's fit procedure."""
    return {"min_compute_fraction": settings.min_compute_fraction, "n_bootstrap": settings.bootstrap,
            "seed": settings.seed, "level": settings.level}


def budget_compute(records: Sequence[Mapping[str, Any]], total_steps: int, *, x: str = DEVICE_HOURS) -> float | None:
    """The run's total compute on column `x`, extrapolated from its last eval to `total_steps` (compute grows
    about linearly in steps): last compute × total_steps / last step; None before an eval past step 0."""
    evals = [r for r in records if r.get("kind", "eval") == "eval" and isinstance(r.get(x), int | float)
             and isinstance(r.get("step"), int) and r["step"] > 0]
    if not evals or total_steps <= 0:
        return None
    last = max(evals, key=lambda r: int(r["step"]))
    if float(last[x]) <= 0:
        return None
    return float(last[x]) * max(total_steps / int(last["step"]), 1.0)


def analyse_run(records: Sequence[Mapping[str, Any]], settings: FitConfig, *,
                x: str = DEVICE_HOURS, total_steps: int | None = None) -> CurveAnalysis | None:
    """The fit of `records` (metrics.jsonl records; non-eval ones are skipped) on column `x`, or None
    while the data cannot support one (fewer than 4 usable points, no gain over R0 yet, invalid values).

    total_steps: the run's planned steps; the early-regime cutoff is then `min_compute_fraction` of the
    run's budget (`budget_compute`), as `scalerl fit` and the forecast bench take it of a finished run, so
    the fit after every eval uses the window the finished run's analysis will use. Without it the cutoff
    is that fraction of the compute so far."""
    try:
        curve = curve_from_records(records, x=x)
        total = None if total_steps is None else budget_compute(records, total_steps, x=x)
        targets = default_forecast_compute(curve)
        if total is not None and total not in targets:
            targets.append(total)  # the end of the budget: where this run will land (at the end: the last eval)
        return analyse_curve(curve, **analysis_options(settings), total_compute=total, predict=targets)
    except FitError:
        return None


def budget_forecast(analysis: CurveAnalysis) -> dict[str, float] | None:
    """The flat `budget_*` fields of the forecast at the end of the run's budget (numbers only, for the metrics
    topic): compute, identified (1/0), the prediction interval [low, high] at the fit's level, and the point
    pass rate only when identified. None when the fit had no budget (no total_steps). After the last eval the
    budget's end is that eval's compute."""
    total = analysis.window.total_compute
    hits = [p for p in analysis.forecasts if p.compute == total and p.lo is not None and p.hi is not None]
    if not hits:
        return None
    p = hits[0]
    out = {"budget_compute": p.compute, "budget_identified": 1.0 if p.identified else 0.0,
           "budget_low": float(p.lo or 0.0), "budget_high": float(p.hi or 0.0)}
    if p.identified and p.pass_rate is not None:
        out["budget_pass_rate"] = float(p.pass_rate)
    return out


def stop_decision(analysis: CurveAnalysis | None, policy: StopPolicyConfig) -> dict[str, Any] | None:
    """Whether the run should stop on its forecast (`policy`, issue #31), as the record that says why:
    {"reason", "message", "compute", "budget_compute", "gain", "gain_low", "gain_high", "A_high", "level",
    "min_gain", "target"}; None to go on (policy off, no fit, no budget left, or not identified)."""
    if analysis is None or not policy.enabled:
        return None
    budget, now = analysis.window.total_compute, float(analysis.window.compute.max())
    if budget is None or budget <= now:
        return None
    try:
        g = predict_gain(analysis.window, now, budget, level=policy.level)
    except FitError:
        return None
    if not g.identified:
        return None
    rec: dict[str, Any] = {"compute": now, "budget_compute": budget, "gain": g.fitted, "gain_low": g.lo,
                           "gain_high": g.hi, "A_high": g.A_hi, "level": policy.level,
                           "min_gain": policy.min_gain, "target": policy.target}
    pct = f"{policy.level:.0%}"
    if policy.min_gain is not None and g.hi < policy.min_gain:
        return {**rec, "reason": "ForecastPlateau", "message": (
            f"the rest of the budget ({now:.4g} → {budget:.4g} device-hours) would add at most {g.hi:+.3f} to the "
            f"pass rate ({pct} interval of the fitted gain: [{g.lo:+.3f}, {g.hi:+.3f}]), below "
            f"stop_policy.min_gain {policy.min_gain:g}")}
    if policy.target is not None and g.A_hi < policy.target:
        return {**rec, "reason": "ForecastBelowTarget", "message": (
            f"the ceiling A is at most {g.A_hi:.3f} ({pct} interval), below stop_policy.target {policy.target:g}")}
    return None


def fit_record(analysis: CurveAnalysis, *, budget: bool = False) -> dict[str, Any]:
    """The JSON-able fit (`CurveAnalysis.to_dict()`, the `scalerl fit --json` object) plus `forecast`
    (= `predictions`) and the flat `A_low` / `A_high` of A's interval, for the metrics topic whose records
    carry numbers only; with `budget` (an `analyse_run` given the run's total_steps) the flat `budget_*` fields
    of the forecast at the budget's end (`budget_forecast`). Compute values are in the fitted column's unit
    (device-hours for the run's fit)."""
    from scalerl.report.runfiles import json_safe

    d: dict[str, Any] = json_safe(analysis.to_dict())
    d["forecast"] = d["predictions"]
    if budget:
        d.update(budget_forecast(analysis) or {})
    interval = (d.get("ci") or {}).get("A")
    if interval is not None:
        d["A_low"], d["A_high"] = interval
    return d


def fit_run_metrics(records: Sequence[Mapping[str, Any]], settings: FitConfig | None = None) -> dict[str, Any] | None:
    """`fit_record(analyse_run(records, settings))`, or None (settings: the JobSpec default when None)."""
    a = analyse_run(records, settings or FitConfig())
    return None if a is None else fit_record(a)
