"""Predictable scaling: fit, bootstrap, forecast and compare RL compute–performance curves (spec §1).

Pure math (numpy/scipy): nothing here reads or writes files; the commands over it (`scalerl fit`, `scalerl
compare`) are in `report.commands`, above both this package and the drawing.
Compute is in device-hours throughout; pass rates are fractions in [0, 1].

    from scalerl.scaling import curve_from_records, analyse_curve
    analysis = analyse_curve(curve_from_records(records), max_compute=50.0)
    analysis.fit.A, analysis.bootstrap.ci()["A"], analysis.forecasts

Paper map: formula §1.1 → `curves.sigmoid`; fitting §1.3 → `fit.fit_sigmoid`; margins and comparison
§1.4–1.5 → `curves.A_MARGIN`, `compare.compare_curves`; power law §1.7 → `fit.fit_power_law`;
linearised efficiency §1.1 → `curves.linearised_efficiency`; bootstrap (ours) → `bootstrap`; prediction
intervals of a measured eval and "not identified yet" (ours, issue #31) → `predict`; simulated runs for
their calibration → `simulate`.
"""

from typing import TYPE_CHECKING

from scalerl.lazy import lazy_exports

if TYPE_CHECKING:
    from scalerl.scaling.analysis import CurveAnalysis, Forecast, Holdout, analyse_curve, default_forecast_compute
    from scalerl.scaling.bootstrap import Bootstrap, bootstrap_sigmoid
    from scalerl.scaling.compare import Comparison, RunComparison, compare_curves
    from scalerl.scaling.curves import (
        A_MARGIN,
        FitError,
        PowerLawFit,
        SigmoidFit,
        linearised_efficiency,
        power_law,
        sigmoid,
    )
    from scalerl.scaling.data import (
        MIN_POINTS,
        Curve,
        FitWindow,
        curve_from_arrays,
        curve_from_records,
        fit_window,
    )
    from scalerl.scaling.fit import fit_power_law, fit_power_law_window, fit_sigmoid, fit_sigmoid_window
    from scalerl.scaling.predict import Gain, Prediction, PredictionSet, predict_gain, predict_window

_EXPORTS = {
    "A_MARGIN": "constants",
    "Bootstrap": "bootstrap",
    "Comparison": "compare",
    "Curve": "data",
    "CurveAnalysis": "analysis",
    "FitError": "curves",
    "FitWindow": "data",
    "Forecast": "analysis",
    "Holdout": "analysis",
    "MIN_POINTS": "data",
    "PowerLawFit": "curves",
    "Gain": "predict",
    "Prediction": "predict",
    "PredictionSet": "predict",
    "RunComparison": "compare",
    "SigmoidFit": "curves",
    "analyse_curve": "analysis",
    "bootstrap_sigmoid": "bootstrap",
    "compare_curves": "compare",
    "curve_from_arrays": "data",
    "curve_from_records": "data",
    "default_forecast_compute": "analysis",
    "fit_power_law": "fit",
    "fit_power_law_window": "fit",
    "fit_sigmoid": "fit",
    "fit_sigmoid_window": "fit",
    "fit_window": "data",
    "linearised_efficiency": "curves",
    "power_law": "curves",
    "predict_gain": "predict",
    "predict_window": "predict",
    "sigmoid": "curves",
}
__getattr__ = lazy_exports(__name__, _EXPORTS)

__all__ = [
    "A_MARGIN",
    "MIN_POINTS",
    "Bootstrap",
    "Comparison",
    "Curve",
    "CurveAnalysis",
    "FitError",
    "FitWindow",
    "Forecast",
    "Gain",
    "Holdout",
    "PowerLawFit",
    "Prediction",
    "PredictionSet",
    "RunComparison",
    "SigmoidFit",
    "analyse_curve",
    "bootstrap_sigmoid",
    "compare_curves",
    "curve_from_arrays",
    "curve_from_records",
    "default_forecast_compute",
    "fit_power_law",
    "fit_power_law_window",
    "fit_sigmoid",
    "fit_sigmoid_window",
    "fit_window",
    "linearised_efficiency",
    "power_law",
    "predict_gain",
    "predict_window",
    "sigmoid",
]
