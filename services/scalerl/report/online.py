"""The online refit the training loop runs after every eval (cheap: a small bootstrap).

`fit_run_metrics` never raises on data the fit cannot use yet (too few points, no gain over R0 so far,
a bad value): it returns None, because a forecast must never stop a training run. The loop logs the
returned dict as a `{"kind": "fit", ...}` record in train.jsonl and in summary.json.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scalerl.scaling import FitError, analyse_curve, curve_from_records

ONLINE_BOOTSTRAP = 50
"""Resamples of the online fit: enough for a rough interval at a few tens of milliseconds."""


def fit_run_metrics(
    records: Sequence[Mapping[str, Any]],
    *,
    r0: float | None = None,
    min_compute: float = 0.0,
    max_compute: float | None = None,
    forecast_compute: Sequence[float] | None = None,
    n_bootstrap: int = ONLINE_BOOTSTRAP,
    seed: int = 0,
    level: float = 0.95,
) -> dict[str, Any] | None:
    """Refit the pass-rate curve of `records` (metrics.jsonl records; non-eval ones are skipped).

    Returns a JSON-able dict {"A", "B", "C_mid", "R0", "r2", "n_points", "sse", "ci": {"A": [lo, hi],
    "B": [...], "C_mid": [...]}, "forecast": [{"compute", "pass_rate", "lo", "hi"}, ...]} with compute in
    device-hours (default forecasts: last compute × 1, 2, 4), or None while the data cannot support a
    fit (fewer than 4 usable points, no gain over R0 yet, invalid values).
    """
    try:
        a = analyse_curve(
            curve_from_records(records),
            r0=r0,
            min_compute=min_compute,
            max_compute=max_compute,
            predict=forecast_compute,
            n_bootstrap=n_bootstrap,
            seed=seed,
            level=level,
        )
    except FitError:
        return None
    d = a.to_dict()
    return {
        "A": d["A"],
        "B": d["B"],
        "C_mid": d["C_mid"],
        "R0": d["R0"],
        "r2": d["r2"],
        "n_points": d["n_points"],
        "sse": d["sse"],
        "ci": d["ci"],
        "forecast": d["predictions"],
    }
