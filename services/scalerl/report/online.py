"""The run's fit: the one procedure behind every A, interval and forecast a run shows.

The training loop refits after every eval (`analyse_run`) with the job's `fit` settings (`FitConfig`:
the early-regime cutoff, bootstrap resamples, seed, level) — the same settings `scalerl fit` and
`scalerl compare` default to on this run's folder and `write_report` uses. The result is computed once
and passed along: `fit_record` is the dict logged as a `{"kind": "fit", ...}` record in train.jsonl, put
in summary.json, published on the metrics topic (operator status) and exported by the learner's status
(dashboards); the same `CurveAnalysis` object is handed to `write_report` at the end of training.

`analyse_run` never raises on data the fit cannot use yet (too few points, no gain over R0 so far, a
bad value): it returns None, because a forecast must never stop a training run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scalerl.config import FitConfig
from scalerl.scaling import CurveAnalysis, FitError, analyse_curve, curve_from_records

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
        total = None if total_steps is None else budget_compute(records, total_steps, x=x)
        return analyse_curve(curve_from_records(records, x=x), **analysis_options(settings), total_compute=total)
    except FitError:
        return None


def fit_record(analysis: CurveAnalysis) -> dict[str, Any]:
    """The JSON-able fit (`CurveAnalysis.to_dict()`, the `scalerl fit --json` object) plus `forecast`
    (= `predictions`) and the flat `A_low` / `A_high` of A's interval, for the metrics topic whose records
    carry numbers only. Compute values are in the fitted column's unit (device-hours for the run's fit)."""
    from scalerl.report.runfiles import json_safe

    d: dict[str, Any] = json_safe(analysis.to_dict())
    d["forecast"] = d["predictions"]
    interval = (d.get("ci") or {}).get("A")
    if interval is not None:
        d["A_low"], d["A_high"] = interval
    return d


def fit_run_metrics(records: Sequence[Mapping[str, Any]], settings: FitConfig | None = None) -> dict[str, Any] | None:
    """`fit_record(analyse_run(records, settings))`, or None (settings: the JobSpec default when None)."""
    a = analyse_run(records, settings or FitConfig())
    return None if a is None else fit_record(a)
