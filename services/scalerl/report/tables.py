"""Tables of fits, forecasts and rankings, rendered as aligned text (CLI) or HTML (report).

A table is (header, rows) of strings, built once and rendered either way, so the terminal and the
report always show the same numbers.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

import numpy as np

from scalerl.scaling import A_MARGIN, Comparison, CurveAnalysis
from scalerl.scaling.compute import column_unit
from scalerl.scaling.constants import A_AT_BOUND

Table = tuple[list[str], list[list[str]]]


def num(v: float | None, digits: int = 4) -> str:
    """`digits` significant digits, without an exponent between 1e-3 and 1e7; "—" for None/NaN."""
    if v is None or not np.isfinite(v):
        return "—"
    if v == 0:
        return "0"
    mag = int(np.floor(np.log10(abs(v))))
    if -3 <= mag < 7:
        text = f"{v:.{max(0, digits - 1 - mag)}f}"
        return text.rstrip("0").rstrip(".") if "." in text else text
    return f"{v:.{digits}g}"


def rate(v: float | None) -> str:
    """A pass rate with 4 decimals; "—" for None/NaN."""
    return "—" if v is None or not np.isfinite(v) else f"{v:.4f}"


def interval(lo: float | None, hi: float | None, fmt: Callable[[float | None], str] = num) -> str:
    return "—" if lo is None or hi is None else f"[{fmt(lo)}, {fmt(hi)}]"


def span(pair: tuple[float, float] | None, fmt: Callable[[float | None], str] = num) -> str:
    """An interval given as a (lo, hi) pair or None."""
    return "—" if pair is None else interval(pair[0], pair[1], fmt)


def compute_unit(x: str) -> str:
    """Unit of a compute column: device-hours (`compute`), FLOPs (`compute_flops`), else the name."""
    return column_unit(x)


def fit_table(a: CurveAnalysis, *, x: str = "compute") -> Table:
    """Parameter | value | interval | meaning."""
    f, b = a.fit, a.bootstrap
    ci = b.ci() if b is not None else {}
    lvl = f"{b.level:.0%} bootstrap ({b.n_resamples}× over {b.method})" if b is not None else "no bootstrap"
    m_lo, m_hi = a.a_margin_interval()
    r0_note = "measured at the first eval (fixed)" if a.window.r0_is_measured else "given (fixed)"
    rows = [
        [
            "A",
            rate(f.A),
            span(ci.get("A"), rate),
            f"asymptotic pass rate; paper margin ±{A_MARGIN}: {interval(m_lo, m_hi, rate)}",
        ],
        [
            "B",
            f"{f.B:.3f}",
            span(ci.get("B"), lambda v: num(v, 3)),
            "scaling exponent (higher = more efficient)",
        ],
        [
            "C_mid",
            num(f.C_mid),
            span(ci.get("C_mid")),
            f"{compute_unit(x)} to reach half of the gain A − R0",
        ],
        ["R0", rate(f.R0), "", r0_note],
        ["R²", rate(f.r2), "", f"over {f.n_points} fitted points (SSE {f.sse:.3g})"],
    ]
    return ["parameter", "value", lvl, "meaning"], rows


NOT_IDENTIFIED = "not identified yet"
"""What a forecast shows instead of a point when the data do not pin it (the range is in the interval)."""


def forecast_table(a: CurveAnalysis, *, x: str = "compute") -> Table:
    """Compute | × last fitted | pass rate (or "not identified yet") | prediction interval | left to A."""
    last = float(a.curve.compute[a.window.mask].max())
    rows = [
        [
            num(p.compute),
            f"×{p.compute / last:.3g}",
            rate(p.pass_rate) if p.identified else NOT_IDENTIFIED,
            interval(p.lo, p.hi, rate),
            rate(a.fit.A - p.pass_rate) if p.pass_rate is not None else "—",
        ]
        for p in a.forecasts
    ]
    level = a.prediction.level if a.prediction is not None else None
    shown = "prediction interval" if level is None else f"{level:.0%} prediction interval"
    return [f"{compute_unit(x)}", "vs last fitted", "pass rate", shown, "left to A"], rows


def points_table(a: CurveAnalysis, *, x: str = "compute") -> Table:
    c, y, m = a.curve.compute, a.curve.pass_rate, a.window.mask
    pred = a.fit.predict(c)
    rows = []
    for i in range(c.size):
        if c[i] == 0:
            role = "R0 (step 0)"
        elif m[i]:
            role = "fitted"
        elif c[i] < a.min_compute:
            role = "below min compute"
        else:
            role = "held out"
        rows.append([num(c[i]), rate(y[i]), rate(pred[i]), f"{y[i] - pred[i]:+.4f}", role])
    return [compute_unit(x), "pass rate", "fitted", "residual", "role"], rows


def power_law_table(a: CurveAnalysis) -> Table:
    pl = a.power_law
    if pl is None:
        return ["power law"], [["not fitted (a point is already at the ceiling 1.0)"]]
    gap = pl.A - a.fit.A
    if pl.A >= A_AT_BOUND and a.fit.A >= A_AT_BOUND:
        verdict = "both ceilings sit at the fits' bound 1.0: neither is identified yet, nothing to compare"
    elif gap > A_MARGIN:
        verdict = f"its ceiling is {gap:+.3f} from the sigmoid's: power laws fitted early overshoot"
    elif gap < -A_MARGIN:
        verdict = f"its ceiling is {gap:+.3f} from the sigmoid's (below it)"
    else:
        verdict = f"its ceiling agrees with the sigmoid's within the ±{A_MARGIN:g} margin ({gap:+.3f})"
    return ["A", "B", "D", "R²", "reading"], [[rate(pl.A), num(pl.B, 3), num(pl.D, 3), rate(pl.r2), verdict]]


def comparison_table(cmp: Comparison, *, x: str = "compute") -> Table:
    """One row per run, best first; C_mid in the unit of the compute column `x`."""
    rows = []
    for r in cmp.rows:
        rows.append(
            [
                f"={r.rank}" if r.tied else str(r.rank),
                r.name,
                rate(r.fit.A),
                span(r.A_ci, rate),
                f"{r.fit.B:.3f}",
                num(r.fit.C_mid),
                f"{r.shared_fit.B:.3f}" if r.shared_fit else "—",
                span(r.B_ci, lambda v: num(v, 3)),
                r.reason,
            ]
        )
    shared = f"B at A={cmp.shared_a:.3f}" if cmp.shared_a is not None else "B at shared A"
    return ["rank", "run", "A", "A interval", "B", f"C_mid ({compute_unit(x)})", shared, "B interval", "reason"], rows


def render_text(table: Table, *, indent: str = "  ") -> str:
    """Aligned plain-text table (the last column is not padded)."""
    head, rows = table
    cols = list(zip(*([head, *rows]), strict=True)) if rows else [[h] for h in head]
    widths = [max(len(s) for s in col) for col in cols]
    lines = []
    for k, row in enumerate([head, *rows]):
        cells = [s.ljust(w) if i < len(row) - 1 else s for i, (s, w) in enumerate(zip(row, widths, strict=True))]
        lines.append(indent + "  ".join(cells).rstrip())
        if k == 0:
            lines.append(indent + "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def render_html(table: Table) -> str:
    head, rows = table
    th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f'<td class="{_cls(c)}">{html.escape(c)}</td>' for c in row) + "</tr>" for row in rows
    )
    return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"


def _cls(cell: str) -> str:
    try:
        float(cell.replace("×", ""))
    except ValueError:
        return "txt"
    return "num"


def key_value_html(items: Sequence[tuple[str, str]]) -> str:
    rows = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in items)
    return f"<table><tbody>{rows}</tbody></table>"
