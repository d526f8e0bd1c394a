"""PNG plots of scaling fits and training diagnostics (matplotlib, Agg canvas, imported lazily).

Figures are built with `matplotlib.figure.Figure` and the Agg canvas, never pyplot, so plotting neither
needs a display nor changes the backend of a process that imported us.
"""

from __future__ import annotations

import io
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from scalerl.scaling import Comparison, Curve, CurveAnalysis, linearised_efficiency
from scalerl.scaling.compute import axis_label

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

DIAGNOSTICS = (
    ("loss", ("loss",)),
    ("truncation / interruption rate", ("truncation_rate", "interruption_rate")),
    ("entropy", ("entropy",)),
    ("clip fraction", ("clip_frac",)),
    ("staleness (versions)", ("staleness_mean", "staleness_max")),
    ("token age (versions)", ("token_age.mean", "token_age.max")),
    ("effective batch (prompts)", ("effective_batch",)),
    ("dropped stale", ("dropped_stale",)),
    ("dropped zero-variance groups", ("dropped_zero_variance",)),
    ("train pass rate", ("train_pass_rate",)),
    ("IS ratio", ("ratio_mean", "ratio_max")),
)
"""(panel title, train.jsonl keys; "a.b" reads key b of the record's mapping a) of the diagnostics grid;
panels without data are left out."""


def _figure(w: float, h: float) -> Figure:
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(w, h), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def _x_label(x: str) -> str:
    return axis_label(x)


def fit_png(
    curve: Curve | None,
    analysis: CurveAnalysis | None,
    *,
    title: str = "",
    x: str = "compute",
    note: str = "",
) -> bytes:
    """Pass rate vs compute (log x): points, sigmoid with bootstrap band, forecasts, power law, windows.

    Without an analysis (too few points) only the points are drawn, with `note` written on the plot.
    """
    fig = _figure(7.5, 4.6)
    ax = fig.add_subplot()
    if curve is not None and (curve.compute > 0).any():
        draw_fit(ax, curve, analysis)
    if note:
        ax.text(
            0.5,
            0.5,
            note,
            transform=ax.transAxes,
            ha="center",
            va="center",
            wrap=True,
            fontsize=10,
            bbox={"boxstyle": "round", "fc": "lightyellow", "ec": "0.6"},
        )
    ax.set_xlabel(_x_label(x))
    ax.set_ylabel("pass rate")
    ax.set_title(title, fontsize=11)
    return _png(fig)


def draw_fit(ax: Axes, curve: Curve, analysis: CurveAnalysis | None, *, color: str = "C0", label: str = "") -> None:
    """Draw one curve (and its fit, when there is one) on `ax`."""
    pos = curve.compute > 0
    c, y = curve.compute, curve.pass_rate
    used = analysis.window.mask if analysis is not None else pos
    ax.scatter(c[used], y[used], s=16, color=color, zorder=3, label=f"{label} eval points".strip())
    if analysis is not None:
        below = pos & (c < analysis.min_compute)
        beyond = pos & (c > (np.inf if analysis.max_compute is None else analysis.max_compute))
        if below.any():
            ax.scatter(c[below], y[below], s=16, facecolors="none", edgecolors="0.5", label="below min compute")
        if beyond.any():
            ax.scatter(c[beyond], y[beyond], s=26, marker="x", color="C3", zorder=3, label="held out (beyond max)")
    ax.set_xscale("log")
    if analysis is None:
        return
    f = analysis.fit
    targets = [p.compute for p in analysis.forecasts]
    lo_x, hi_x = float(c[pos].min()) / 1.5, max(float(c.max()), *targets) * 1.3
    grid = np.geomspace(lo_x, hi_x, 300)
    ax.plot(
        grid,
        f.predict(grid),
        color=color,
        lw=2,
        label=f"{label} sigmoid: A={f.A:.3f}, B={f.B:.2f}, C_mid={f.C_mid:.4g}".strip(),
    )
    if analysis.bootstrap is not None:
        blo, bhi = analysis.bootstrap.band(grid)
        ax.fill_between(
            grid,
            blo,
            bhi,
            color=color,
            alpha=0.2,
            lw=0,
            label=f"{analysis.bootstrap.level:.0%} bootstrap band",
        )
    ax.axhline(f.A, color=color, ls=":", lw=1)
    ax.axhline(f.R0, color="0.5", ls="--", lw=0.8, label=f"R0 = {f.R0:.3f} (step 0)")
    shown = [p for p in analysis.forecasts if p.pass_rate is not None]
    if shown:
        fc = np.array([[p.compute, p.pass_rate, np.nan if p.lo is None else p.lo, np.nan if p.hi is None else p.hi]
                       for p in shown])
        err = np.nan_to_num(np.abs(fc[:, 2:4].T - fc[:, 1]), nan=0.0)
        ax.errorbar(fc[:, 0], fc[:, 1], yerr=err, fmt="D", ms=5, color="C1", capsize=3, zorder=4,
                    label="forecast (prediction interval)")
    ranges = [(p.compute, p.lo, p.hi) for p in analysis.forecasts
              if p.pass_rate is None and p.lo is not None and p.hi is not None]
    if ranges:  # not identified yet: the range only, no point
        xs, los, his = (np.array(col, dtype=np.float64) for col in zip(*ranges, strict=True))
        ax.vlines(xs, los, his, color="C1", lw=2, linestyles="dotted", zorder=4, label="not identified yet (range)")
    pl = analysis.power_law
    if pl is not None:
        ax.plot(
            grid,
            np.clip(pl.predict(grid), 0, 1),
            color="C2",
            ls="--",
            lw=1.2,
            label=f"power law: A={pl.A:.3f} (contrast)",
        )
    if analysis.max_compute is not None:
        ax.axvline(analysis.max_compute, color="C3", ls="-.", lw=1, label="max compute (fit window)")
    y_lo = max(0.0, min(float(y.min()), f.R0) - 0.05)
    ax.set_ylim(y_lo, min(1.02, max(float(y.max()), f.A) + 0.08))
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")


def comparison_png(comparison: Comparison, *, x: str = "compute") -> bytes:
    """Left: every run's points and fit. Right: the linearised view log F(R) vs log C (slope B, §1.1)."""
    fig = _figure(11, 4.4)
    left, right = fig.subplots(1, 2)
    for k, row in enumerate(comparison.rows):
        color = f"C{k % 10}"
        c, y = row.curve.compute, row.curve.pass_rate
        pos = c > 0
        left.scatter(c[pos], y[pos], s=12, color=color)
        grid = np.geomspace(float(c[pos].min()) / 1.5, float(c.max()) * 2, 200)
        left.plot(
            grid,
            row.fit.predict(grid),
            color=color,
            lw=1.8,
            label=f"#{row.rank} {row.name}: A={row.fit.A:.3f}",
        )
        f = row.ranked_fit
        if row.shared_fit is not None:
            left.plot(grid, f.predict(grid), color=color, lw=1, ls="--")
        m = row.window.mask
        F = linearised_efficiency(y[m], A=f.A, B=f.B, C_mid=f.C_mid, R0=f.R0)
        ok = np.isfinite(F)
        right.scatter(c[m][ok], F[ok], s=12, color=color)
        right.plot(grid, grid**f.B, color=color, lw=1.5, label=f"{row.name}: slope B={f.B:.2f}")
    left.set_xscale("log")
    left.set_xlabel(_x_label(x))
    left.set_ylabel("pass rate")
    title = "own fits" + (" (dashed: shared A)" if comparison.shared_a is not None else "")
    left.set_title(title, fontsize=10)
    left.legend(fontsize=7)
    right.set_xscale("log")
    right.set_yscale("log")
    right.set_xlabel(_x_label(x))
    right.set_ylabel("F(R) = C_mid^B / ((A−R0)/(R−R0) − 1)")
    sub = f"at shared A = {comparison.shared_a:.3f}" if comparison.shared_a is not None else "at each run's A"
    right.set_title(f"linearised efficiency {sub}", fontsize=10)
    right.legend(fontsize=7)
    for ax in (left, right):
        ax.grid(True, which="both", alpha=0.3)
    return _png(fig)


def _is_num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _field(record: dict[str, Any], key: str) -> Any:
    """record[key], or record[a][b] for a dotted key "a.b" (None when absent)."""
    head, _, rest = key.partition(".")
    value = record.get(head)
    return (value.get(rest) if isinstance(value, dict) else None) if rest else value


def _series(records: Sequence[dict[str, Any]], key: str) -> tuple[np.ndarray, np.ndarray]:
    pts = [(r["step"] if _is_num(r.get("step")) else i, _field(r, key)) for i, r in enumerate(records)
           if _is_num(_field(r, key))]
    if not pts:
        return np.empty(0), np.empty(0)
    a = np.asarray(pts, dtype=np.float64)
    return a[:, 0], a[:, 1]


_SMOOTH_ABOVE = 60  # series longer than this get a running mean over the faint raw trace


def _trace(ax: Axes, s: np.ndarray, v: np.ndarray, color: str, label: str | None) -> None:
    if s.size <= _SMOOTH_ABOVE:
        ax.plot(s, v, lw=1, color=color, label=label)
        return
    k = max(3, s.size // 30)
    smooth = np.convolve(v, np.ones(k) / k, mode="valid")  # running mean over k steps
    ax.plot(s, v, lw=0.6, color=color, alpha=0.3)
    ax.plot(s[k - 1 :], smooth, lw=1.4, color=color, label=label)


def diagnostics_png(train: Sequence[dict[str, Any]]) -> bytes | None:
    """Small multiples of the step records' diagnostics (long series: raw trace faint, running mean bold);
    None when none of them has data."""
    steps = [r for r in train if r.get("kind", "step") == "step"]
    panels = [
        (t, tuple(k for k in keys if _series(steps, k)[0].size))
        for t, keys in DIAGNOSTICS
        if any(_series(steps, k)[0].size for k in keys)
    ]
    if not panels:
        return None
    cols = min(4, len(panels))
    rows = -(-len(panels) // cols)
    fig = _figure(3.0 * cols, 2.2 * rows)
    axes = np.atleast_1d(fig.subplots(rows, cols)).ravel()
    for ax, (title, keys) in zip(axes, panels, strict=False):
        for j, k in enumerate(keys):
            s, v = _series(steps, k)
            if s.size:
                _trace(ax, s, v, f"C{j}", k if len(keys) > 1 else None)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(True, alpha=0.3)
        if len(keys) > 1:
            ax.legend(fontsize=6)
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    return _png(fig)


def online_fits_png(fits: Sequence[dict[str, Any]]) -> bytes | None:
    """How the online estimate of A (with its interval, when logged) moved as compute grew."""
    pts = [(r["compute"], r["A"]) for r in fits if _is_num(r.get("compute")) and _is_num(r.get("A"))]
    if not pts:
        return None
    c, a = np.asarray(pts, dtype=np.float64).T
    fig = _figure(6, 2.8)
    ax = fig.add_subplot()
    ax.plot(c, a, marker="o", ms=3, lw=1.2, label="A (online fit)")
    ci = [(r["compute"], *r["ci"]["A"]) for r in fits if isinstance((r.get("ci") or {}).get("A"), list)]
    if ci:
        arr = np.asarray(ci, dtype=np.float64)
        ax.fill_between(arr[:, 0], arr[:, 1], arr[:, 2], alpha=0.2, lw=0, label="interval of A")
    ax.set_xlabel("compute (device-hours)")
    ax.set_ylabel("fitted A")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    return _png(fig)
