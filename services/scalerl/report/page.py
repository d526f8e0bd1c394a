"""`write_report`: one self-contained HTML page (images inlined as base64 PNG data URIs) per run folder.

The page renders whatever the folder holds: a run with fewer than 4 usable eval points still gets its
points plotted, a note that the fit needs at least 4, and its diagnostics.
"""

from __future__ import annotations

import base64
import html
import json
import math
from importlib import resources
from pathlib import Path
from string import Template
from typing import Any

from scalerl.report import plots, tables
from scalerl.report.runfiles import RunFolder, load_run
from scalerl.scaling import MIN_POINTS, Curve, CurveAnalysis, FitError, analyse_curve, curve_from_records

CURVE_PNG = "curve.png"
REPORT_HTML = "report.html"

_SUMMARY_LABELS = {
    "name": ("run", ""),
    "initial_pass_rate": ("initial pass rate (R0)", ""),
    "final_pass_rate": ("final pass rate", ""),
    "steps": ("steps", ""),
    "compute": ("compute", " device-hours"),
    "wall_s": ("wall time", " s"),
}


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode("ascii")}">'


def _fmt(v: Any) -> str:
    if v is None:
        return "—"
    if isinstance(v, bool) or not isinstance(v, int | float):
        return str(v)
    return str(v) if isinstance(v, int) else tables.num(float(v))


def _summary_html(run: RunFolder) -> str:
    s = run.summary
    if not s:
        return '<p class="note">No summary.json in this run folder (the run may still be going).</p>'
    items = [(label, _fmt(s[k]) + unit) for k, (label, unit) in _SUMMARY_LABELS.items() if k in s]
    items += [(k, _fmt(v)) for k, v in s.items() if k not in _SUMMARY_LABELS and k != "fit" and _is_scalar(v)]
    fit = s.get("fit")
    if isinstance(fit, dict):
        parts = [f"{k} = {_fmt(fit[k])}" for k in ("A", "B", "C_mid", "R0", "r2") if k in fit]
        items.append(("fit at the end of training", ", ".join(parts)))
    elif "fit" in s:
        items.append(("fit at the end of training", "none (see the scaling curve below)"))
    warnings = s.get("warnings")
    notes = [f'<p class="warn">{html.escape(str(w))}</p>' for w in warnings] if isinstance(warnings, list) else []
    return "\n".join([*notes, tables.key_value_html(items)])


def _is_scalar(v: Any) -> bool:
    return v is None or isinstance(v, str | int | float | bool)


def _analyse(run: RunFolder, opts: dict[str, Any]) -> tuple[Curve | None, CurveAnalysis | None, str]:
    """(curve, analysis, note); a note explains a missing curve or fit."""
    try:
        curve = curve_from_records(run.metrics)
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


def _fit_html(a: CurveAnalysis | None, note: str) -> str:
    if a is None:
        return f'<p class="note">{html.escape(note)}</p>'
    parts = ["<h3>Fitted sigmoid</h3>", tables.render_html(tables.fit_table(a))]
    parts += [f'<p class="warn">{html.escape(w)}</p>' for w in a.warnings]
    parts += ["<h3>Forecast</h3>", tables.render_html(tables.forecast_table(a))]
    if a.holdout is not None:
        h = a.holdout
        parts.append(
            f"<p>Held-out check: {h.n_points} points beyond the fit window; mean |observed − forecast| "
            f"{h.mean_abs_error:.4f}, max {h.max_abs_error:.4f}, at the last point {h.final_error:+.4f}.</p>"
        )
    parts += ["<h3>Power-law alternative</h3>", tables.render_html(tables.power_law_table(a))]
    parts += [
        "<details><summary>Eval points</summary>",
        tables.render_html(tables.points_table(a)),
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
    min_compute: float = 0.0,
    max_compute: float | None = None,
    n_bootstrap: int = 200,
    seed: int = 0,
) -> Path:
    """Write `curve.png` and a self-contained `report.html` into `run_dir`; return the HTML path.

    Raises RunFileError when `run_dir` is not a folder or a file in it is not readable JSON(L).
    """
    run_dir = Path(run_dir)
    run = load_run(run_dir)
    opts = {"min_compute": min_compute, "max_compute": max_compute, "n_bootstrap": n_bootstrap, "seed": seed}
    curve, analysis, note = _analyse(run, opts)
    curve_png = plots.fit_png(curve, analysis, title=f"{run.name}: pass rate vs compute", note=note)
    (run_dir / CURVE_PNG).write_bytes(curve_png)
    diag = plots.diagnostics_png(run.train)
    n_eval = 0 if curve is None else len(curve)
    subtitle = f"{n_eval} eval points, {sum(r.get('kind', 'step') == 'step' for r in run.train)} training steps"
    page = Template(resources.files("scalerl.report").joinpath("template.html").read_text(encoding="utf-8"))
    out = page.substitute(
        title=html.escape(run.name),
        subtitle=html.escape(subtitle),
        summary=_summary_html(run),
        curve=_img(curve_png, "pass rate vs compute with the fitted sigmoid"),
        fit=_fit_html(analysis, note),
        online=_online_html(run),
        diagnostics=_img(diag, "training diagnostics") if diag else '<p class="note">No train.jsonl records.</p>',
        footer=html.escape(_fit_json(analysis)),
    )
    path = run_dir / REPORT_HTML
    path.write_text(out, encoding="utf-8")
    return path


def _fit_json(a: CurveAnalysis | None) -> str:
    if a is None:
        return ""
    d = {k: a.to_dict()[k] for k in ("A", "B", "C_mid", "R0", "r2", "n_points")}
    return "Fit: " + json.dumps(
        {k: (round(v, 6) if isinstance(v, float) and math.isfinite(v) else v) for k, v in d.items()}
    )
