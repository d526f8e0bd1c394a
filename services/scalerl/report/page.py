"""`write_report`: one self-contained HTML page (images inlined as base64 PNG data URIs) per run folder.

The page renders whatever the folder holds: a run with fewer than 4 usable eval points still gets its
points plotted, a note that the fit needs at least 4, and its diagnostics.
"""

from __future__ import annotations

import base64
import html
import json
from importlib import resources
from pathlib import Path
from string import Template
from typing import Any

from scalerl.config import FitConfig
from scalerl.report import plots, tables
from scalerl.report.online import analysis_options
from scalerl.report.runfiles import RunFolder, fit_settings, json_safe, load_run
from scalerl.scaling import MIN_POINTS, Curve, CurveAnalysis, FitError, analyse_curve, curve_from_records
from scalerl.scaling.compute import axis_column, axis_label, column_unit

CURVE_PNG = "curve.png"
REPORT_HTML = "report.html"

_SUMMARY_LABELS = {
    "name": ("run", ""),
    "initial_pass_rate": ("initial pass rate (R0)", ""),
    "final_pass_rate": ("final pass rate", ""),
    "gain": ("held-out gain, final − initial (same prompts)", ""),
    "gain_interval": ("its interval (paired bootstrap over prompts, at fit.level)", ""),
    "steps": ("steps", ""),
    "compute": ("compute", " device-hours"),
    "compute_flops": ("compute (machine-independent)", " FLOPs"),
    "n_params": ("policy parameters", ""),
    "devices": ("devices held at the end", " devices"),
    "wall_s": ("wall time", " s"),
}


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, list) and len(v) == 2 and all(isinstance(x, int | float) for x in v):
        return f"[{_fmt(v[0])}, {_fmt(v[1])}]"  # an interval
    if isinstance(v, bool) or not isinstance(v, int | float):
        return str(v)
    return str(v) if isinstance(v, int) else tables.num(float(v))


def _summary_html(run: RunFolder) -> str:
    s = run.summary
    if not s:
        return '<p class="note">No summary.json in this run folder (the run may still be going).</p>'
    items = [(label, _fmt(s[k]) + unit) for k, (label, unit) in _SUMMARY_LABELS.items() if k in s]
    items += [(k, _fmt(v)) for k, v in s.items() if k not in _SUMMARY_LABELS and k != "fit" and _is_scalar(v)]
    ages = s.get("token_age")
    if isinstance(ages, dict) and ages.get("tokens"):
        items.append(("token age (learner version at train time − sampling version, per trained token)",
                      token_age_text(ages)))
    fit = s.get("fit")
    if isinstance(fit, dict):
        parts = [f"{k} = {_fmt(fit[k])}" for k in ("A", "B", "C_mid", "R0", "r2") if k in fit]
        interval = (fit.get("ci") or {}).get("A")
        if isinstance(interval, list) and len(interval) == 2:
            parts.append(f"interval of A [{_fmt(interval[0])}, {_fmt(interval[1])}]")
        items.append(("fit at the end of training", ", ".join(parts)))
        if isinstance(fit.get("budget_compute"), int | float):
            items.append(("forecast at the end of the budget (train.steps)", budget_text(fit)))
    elif "fit" in s:
        items.append(("fit at the end of training", "none (see the scaling curve below)"))
    warnings = s.get("warnings")
    notes = [f'<p class="warn">{html.escape(str(w))}</p>' for w in warnings] if isinstance(warnings, list) else []
    stop = s.get("stopped_early")
    if isinstance(stop, dict):
        notes.insert(0, f'<p class="warn">Stopped early by stop_policy at step {html.escape(str(stop.get("step")))} '
                        f'({html.escape(str(stop.get("reason")))}): {html.escape(str(stop.get("message")))}.</p>')
    return "\n".join([*notes, tables.key_value_html(items)])


def budget_text(fit: dict[str, Any]) -> str:
    """The forecast of the last eval of the budget from a fit record's flat `budget_*` fields."""
    at = f"at {_fmt(fit['budget_compute'])} device-hours"
    interval = f"[{_fmt(fit.get('budget_low'))}, {_fmt(fit.get('budget_high'))}]"
    if fit.get("budget_identified"):
        return f"{_fmt(fit.get('budget_pass_rate'))} {at}, prediction interval {interval}"
    return f"not identified yet {at}: the curve has not bent enough to pin it; range {interval}"


def token_age_text(ages: dict[str, Any]) -> str:
    """"mean 1.75, max 3 versions over 719 tokens; 0: 13%, 1: 28%, ..." from summary.json's `token_age`."""
    hist = {int(a): int(n) for a, n in ages["hist"].items()}
    n = sum(hist.values())
    shares = ", ".join(f"{a}: {100 * c / n:.0f}%" for a, c in sorted(hist.items()))
    return f"mean {_fmt(ages['mean'])}, max {ages['max']} versions over {n} tokens; share by age: {shares}"


def _is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, str | int | float | bool)


def _analyse(run: RunFolder, opts: dict[str, Any], x: str) -> tuple[Curve | None, CurveAnalysis | None, str]:
    """(curve, analysis, note); a note explains a missing curve or fit."""
    try:
        curve = curve_from_records(run.metrics, x=x)
    except FitError as e:
        return None, None, f"No usable eval records yet: {e}"
    try:
        return curve, analyse_curve(curve, **opts), ""
    except FitError as e:
        n = int((curve.compute > 0).sum())
        if n < MIN_POINTS:
            return (
                curve,
                None,
                f"The fit needs ≥ {MIN_POINTS} eval points after step 0; this run has {n} so far.",
            )
        return curve, None, f"No fit: {e}"


def _fit_html(a: CurveAnalysis | None, note: str, x: str) -> str:
    if a is None:
        return f'<p class="note">{html.escape(note)}</p>'
    window = (f"<p>Fit window: compute ≥ {tables.num(a.min_compute)} {column_unit(x)} "
              f"(max(min compute, {a.min_compute_fraction:g} × the run's total compute): the early regime is left "
              "out as in the paper).</p>")
    parts = ["<h3>Fitted sigmoid</h3>", window, tables.render_html(tables.fit_table(a, x=x))]
    parts += [f'<p class="warn">{html.escape(w)}</p>' for w in a.warnings]
    parts += ["<h3>Forecast</h3>", tables.render_html(tables.forecast_table(a, x=x))]
    if a.holdout is not None:
        h = a.holdout
        parts.append(
            f"<p>Held-out check: {h.n_points} points beyond the fit window; mean |observed − forecast| "
            f"{h.mean_abs_error:.4f}, max {h.max_abs_error:.4f}, at the last point {h.final_error:+.4f}.</p>"
        )
    parts += ["<h3>Power-law alternative</h3>", tables.render_html(tables.power_law_table(a))]
    parts += [
        "<details><summary>Eval points</summary>",
        tables.render_html(tables.points_table(a, x=x)),
        "</details>",
    ]
    return "\n".join(parts)


def _online_html(run: RunFolder) -> str:
    fits = [r for r in run.train if r.get("kind") == "fit"]
    png = plots.online_fits_png(fits) if fits else None
    if png is None:
        return '<p class="note">No online fit records in train.jsonl.</p>'
    return _img(png, "fitted A over compute") + f"<p>{len(fits)} refits logged during training.</p>"


def write_report(
    run_dir: Path,
    *,
    analysis: CurveAnalysis | None = None,
    settings: FitConfig | None = None,
    axis: str = "device-hours",
) -> Path:
    """Write `curve.png` and a self-contained `report.html` into `run_dir`; return the HTML path.

    `analysis`: the run's fit as the training loop computed it (passed along, not recomputed; it must be
    of the `axis` column). Without it the fit is computed with `settings`, by default the run's own `fit`
    settings (its spec.yaml), the procedure summary.json and `scalerl fit` use. `axis`: device-hours
    (the paper's) or flops. Raises RunFileError when `run_dir` is not a folder or a file in it is not
    readable JSON(L); ValueError on an unknown axis.
    """
    run_dir = Path(run_dir)
    x = axis_column(axis)
    run = load_run(run_dir)
    curve: Curve | None
    if analysis is not None:
        curve, note = analysis.curve, ""
    else:
        opts = analysis_options(settings if settings is not None else fit_settings(run_dir))
        curve, analysis, note = _analyse(run, opts, x)
    curve_png = plots.fit_png(curve, analysis, title=f"{run.name}: pass rate vs {axis_label(x)}", note=note, x=x)
    (run_dir / CURVE_PNG).write_bytes(curve_png)
    diag = plots.diagnostics_png(run.train)
    n_eval = 0 if curve is None else len(curve)
    subtitle = f"{n_eval} eval points, {sum(r.get('kind', 'step') == 'step' for r in run.train)} training steps"
    page = Template(resources.files("scalerl.report").joinpath("template.html").read_text(encoding="utf-8"))
    out = page.substitute(
        title=html.escape(run.name),
        subtitle=html.escape(subtitle),
        summary=_summary_html(run),
        curve=_img(curve_png, f"pass rate vs {axis_label(x)} with the fitted sigmoid"),
        fit=_fit_html(analysis, note, x),
        online=_online_html(run),
        diagnostics=_img(diag, "training diagnostics") if diag else '<p class="note">No train.jsonl records.</p>',
        footer=html.escape(_fit_json(analysis)),
    )
    path = run_dir / REPORT_HTML
    path.write_text(out, encoding="utf-8")
    return path


def _fit_json(a: CurveAnalysis | None) -> str:
    """The fit's numbers exactly as summary.json and `scalerl fit --json` give them (no rounding)."""
    if a is None:
        return ""
    d = a.to_dict()
    keys = ("A", "B", "C_mid", "R0", "r2", "n_points", "ci", "predictions", "window")
    return "Fit: " + json.dumps(json_safe({k: d[k] for k in keys}), allow_nan=False)
