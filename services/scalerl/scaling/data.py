"""Measured pass-rate curves: extraction from metric records and validation for fitting (no file I/O).

A record is a mapping as in `runs/<name>/metrics.jsonl` (or a CSV row from another framework):

- records with a `kind` other than `"eval"` (train steps, fit records) are skipped;
- an eval record (`kind == "eval"`) must carry both columns, else it is an error;
- a record without `kind` is used when it has both columns and skipped otherwise (CSV exports from
  other loggers leave the eval column empty on non-eval rows).

`prompt_pass_rates` (one pass rate per held-out prompt, the same prompt order in every record) is kept
when every used record has it with the same length and its mean matches `pass_rate`; it lets the
bootstrap resample prompts instead of points.

`eval_var` is each eval's own sampling (binomial) variance, the noise a repeated eval of the same checkpoint
on the same prompts would show: Σ_p r_p(1 − r_p)/(k − 1) / P² from the per-prompt rates r_p of k samples
each (unbiased), else p(1 − p)/(n_prompts·k) from the record's counts (an upper bound: prompts of unequal
difficulty vary less). It is kept when every used record yields one; the prediction interval
(`scaling.predict`) uses it as a floor on the noise and as the target eval's own noise.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from scalerl.scaling.curves import FitError, FloatArray

MIN_POINTS = 4
"""Three parameters are fitted (A, B, C_mid), so a fit needs at least one more point than that."""
_PROMPT_MEAN_TOL = 1e-3  # mean(prompt_pass_rates) vs pass_rate: rounding in the logger, not a mismatch


@dataclass(frozen=True, slots=True, eq=False)
class Curve:
    """A measured curve, sorted by compute.

    compute: [N] ≥ 0 (device-hours when the column is `compute`); pass_rate: [N] in [0, 1];
    prompt_pass_rates: [N, P] per-prompt pass rates, or None when not every record has them;
    eval_var: [N] each eval's own sampling variance (see the module docstring), or None.
    """

    compute: FloatArray
    pass_rate: FloatArray
    prompt_pass_rates: FloatArray | None = None
    eval_var: FloatArray | None = None

    def __len__(self) -> int:
        return int(self.compute.shape[0])

    def starting_pass_rate(self) -> float:
        """R0 as measured: the mean pass rate of the record(s) at the smallest compute (step 0)."""
        return float(np.mean(self.pass_rate[self.compute == self.compute.min()]))

    def starting_prompt_rates(self) -> FloatArray | None:
        """[P] per-prompt rates at the smallest compute (for a prompt bootstrap of R0), or None."""
        if self.prompt_pass_rates is None:
            return None
        rows = self.prompt_pass_rates[self.compute == self.compute.min()]
        return np.asarray(rows.mean(axis=0), dtype=np.float64)


def curve_from_arrays(
    compute: Any,
    pass_rate: Any,
    prompt_pass_rates: Any = None,
    *,
    x: str = "compute",
    y: str = "pass_rate",
    eval_var: Any = None,
) -> Curve:
    """Validate arrays (compute: [N], pass_rate: [N], prompt_pass_rates: [N, P] or None, eval_var: [N] or
    None) into a Curve."""
    c = np.asarray(compute, dtype=np.float64).reshape(-1)
    r = np.asarray(pass_rate, dtype=np.float64).reshape(-1)
    if c.shape != r.shape or c.size == 0:
        raise FitError(
            f"compute has {c.size} values and pass_rate {r.size}; a fit needs two equally long, non-empty lists."
        )
    _validate(c, r, x=x, y=y)
    order = np.argsort(c, kind="stable")
    m = None
    if prompt_pass_rates is not None:
        m = np.asarray(prompt_pass_rates, dtype=np.float64)
        if m.ndim != 2 or m.shape[0] != c.size:
            raise FitError(f"prompt_pass_rates has shape {m.shape}; expected [{c.size}, n_prompts].")
        m = m[order]
    v = None
    if eval_var is not None:
        v = np.asarray(eval_var, dtype=np.float64).reshape(-1)
        if v.shape != c.shape or not (np.isfinite(v).all() and (v >= 0).all()):
            raise FitError(f"eval_var must be {c.size} finite variances ≥ 0, got shape {v.shape}.")
        v = v[order]
    return Curve(compute=c[order], pass_rate=r[order], prompt_pass_rates=m, eval_var=v)


def _number(rec: Mapping[str, Any], key: str, where: str) -> float:
    v = rec[key]
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise FitError(f"{where}: {key!r} is {v!r}, not a number. Every eval record needs numeric {key!r}.")
    return float(v)


def curve_from_records(records: Sequence[Mapping[str, Any]], *, x: str = "compute", y: str = "pass_rate") -> Curve:
    """Build a validated `Curve` from metric records (see the module docstring for which are used).

    Raises FitError when no record has both columns, or a used value is NaN, infinite, negative
    (compute) or outside [0, 1] (pass rate).
    """
    xs: list[float] = []
    ys: list[float] = []
    prompts: list[Any] = []
    variances: list[float | None] = []
    for i, rec in enumerate(records, start=1):
        kind = rec.get("kind")
        where = f"record {i}" + (f" (step {rec['step']})" if "step" in rec else "")
        if kind is not None and kind != "eval":
            continue
        missing = [k for k in (x, y) if rec.get(k) is None]
        if missing:
            if kind == "eval":
                raise FitError(
                    f"{where} is an eval record without {' and '.join(map(repr, missing))}. Eval records "
                    f"need both {x!r} and {y!r}; choose other columns with --x/--y."
                )
            continue
        xv, yv = _number(rec, x, where), _number(rec, y, where)
        _validate(np.array([xv]), np.array([yv]), x=x, y=y, where=where)
        xs.append(xv)
        ys.append(yv)
        prompts.append(rec.get("prompt_pass_rates"))
        variances.append(_eval_var(rec, yv) if y == "pass_rate" else None)
    if not xs:
        raise FitError(
            f"no eval records with both {x!r} and {y!r} were found. The fit needs eval records such as "
            f'{{"kind": "eval", "{x}": 0.5, "{y}": 0.42}} (or CSV columns {x},{y}).'
        )
    compute = np.asarray(xs, dtype=np.float64)
    rate = np.asarray(ys, dtype=np.float64)
    order = np.argsort(compute, kind="stable")
    matrix = _prompt_matrix(prompts, rate) if y == "pass_rate" else None
    var = None if any(v is None for v in variances) else np.asarray(variances, dtype=np.float64)[order]
    return Curve(
        compute=compute[order],
        pass_rate=rate[order],
        prompt_pass_rates=None if matrix is None else matrix[order],
        eval_var=var,
    )


def _eval_var(rec: Mapping[str, Any], rate: float) -> float | None:
    """One eval's sampling variance from its per-prompt rates and `k`, else from `n_prompts` × `k`; None
    when the record has neither (see the module docstring)."""
    k = rec.get("k")
    if isinstance(k, bool) or not isinstance(k, int | float) or not (math.isfinite(k) and k >= 2):
        return None
    rates = rec.get("prompt_pass_rates")
    if isinstance(rates, list | tuple) and len(rates) >= 2:
        try:
            r = np.asarray(rates, dtype=np.float64)
        except (TypeError, ValueError):
            r = np.array([np.nan])
        if np.isfinite(r).all() and ((r >= 0) & (r <= 1)).all():
            return float(np.sum(r * (1 - r)) / (k - 1) / r.size**2)
    n = rec.get("n_prompts")
    if isinstance(n, bool) or not isinstance(n, int | float) or not (math.isfinite(n) and n >= 1):
        return None
    return rate * (1 - rate) / (n * k)


def _validate(compute: FloatArray, rate: FloatArray, *, x: str, y: str, where: str = "") -> None:
    """Raise FitError on NaN/inf, negative compute or a pass rate outside [0, 1]; `where` names the
    record (else the position in the arrays is given)."""

    def at(i: int) -> str:
        return where or f"value {i + 1}"

    for name, arr in ((x, compute), (y, rate)):
        bad = np.flatnonzero(~np.isfinite(arr))
        if bad.size:
            raise FitError(
                f"{at(int(bad[0]))}: {name!r} is {arr[bad[0]]} (NaN or infinite). A fit needs finite numbers; "
                "remove or repair that record."
            )
    if (compute < 0).any():
        i = int(np.flatnonzero(compute < 0)[0])
        raise FitError(
            f"{at(i)}: {x!r} is negative ({compute[i]:g}). Compute must be ≥ 0 (device-hours since the start "
            "of RL; 0 only for the step-0 eval)."
        )
    if ((rate < 0) | (rate > 1)).any():
        i = int(np.flatnonzero((rate < 0) | (rate > 1))[0])
        raise FitError(
            f"{at(i)}: {y!r} is {rate[i]:g}, outside [0, 1]. The sigmoid models a pass rate (a fraction, "
            "e.g. mean@k); rescale percentages to fractions."
        )


def _prompt_matrix(prompts: list[Any], rate: FloatArray) -> FloatArray | None:
    if any(not isinstance(p, list | tuple) or len(p) < 2 for p in prompts):
        return None
    if len({len(p) for p in prompts}) != 1:
        return None
    try:
        m = np.asarray(prompts, dtype=np.float64)
    except (TypeError, ValueError):
        return None
    if not np.isfinite(m).all() or (m < 0).any() or (m > 1).any():
        return None
    if np.abs(m.mean(axis=1) - rate).max() > _PROMPT_MEAN_TOL:
        return None
    return m


@dataclass(frozen=True, slots=True, eq=False)
class FitWindow:
    """The points of a curve that enter the sum of squares, and R0.

    mask: [N] bool over the curve; compute, pass_rate: [n] the selected points; prompt_pass_rates:
    [n, P] or None; eval_var: [n] the points' own sampling variances or None; r0: float; r0_is_measured:
    whether R0 came from the data (True) or was given; r0_count: how many records R0 averages (records at
    the smallest compute); r0_compute: their compute (0 for a step-0 eval).
    """

    mask: np.ndarray
    compute: FloatArray
    pass_rate: FloatArray
    prompt_pass_rates: FloatArray | None
    r0: float
    r0_is_measured: bool
    r0_count: int = 1
    min_compute: float = 0.0
    """The cutoff applied: max(min_compute, min_compute_fraction × the run's total compute)."""
    eval_var: FloatArray | None = None
    r0_compute: float = 0.0
    """Compute of the record(s) R0 was measured on: 0 for a step-0 eval, else the first eval's compute."""
    r0_var: float | None = None
    """Sampling variance of the measured R0 (its records' eval_var / their count), or None."""
    total_compute: float = 0.0
    """The run's total compute the early-regime fraction refers to (see `fit_window`)."""


def fit_window(
    curve: Curve,
    *,
    r0: float | None = None,
    min_compute: float = 0.0,
    max_compute: float | None = None,
    require_gain: bool = True,
    min_compute_fraction: float = 0.0,
    total_compute: float | None = None,
) -> FitWindow:
    """Select the points to fit and fix R0; raise FitError when they cannot support a fit.

    Points at compute 0 inform R0 only (the sigmoid is R0 there for every A, B, C_mid). Without a step-0
    eval, R0 is the pass rate at the smallest compute and those records inform R0 only too: one measurement
    is not used twice, once as R0 and once as a point of the sum of squares.

    The early regime the paper leaves out (~1.5k GPU-hours, §1.3) is every point below the cutoff
    max(`min_compute`, `min_compute_fraction` × `total_compute`), where `total_compute` is the run's total
    (budget) compute — by default the curve's largest compute, its last eval, whatever `max_compute` is. So
    the window's lower end does not move with the end of the fit window: fitting the first half of a run
    (`max_compute`) leaves out the same early points as fitting all of it, and as the online fit does when
    it is given the run's budget. Points above `max_compute` (fit early, forecast later) are left out of
    the sum of squares but R0 still comes from the first record.
    """
    if not (math.isfinite(min_compute_fraction) and 0.0 <= min_compute_fraction < 1.0):
        raise FitError(f"min_compute_fraction = {min_compute_fraction!r}; give a fraction in [0, 1).")
    if total_compute is not None and not (math.isfinite(total_compute) and total_compute > 0):
        raise FitError(f"total_compute = {total_compute!r}; give the run's total compute (> 0).")
    first = curve.compute == curve.compute.min()
    if r0 is None:
        r0_value, measured = curve.starting_pass_rate(), True
    else:
        if not (math.isfinite(r0) and 0.0 <= r0 < 1.0):
            raise FitError(f"R0 = {r0!r} is not a pass rate in [0, 1). Give the step-0 pass rate.")
        r0_value, measured = float(r0), False
    if max_compute is not None and max_compute <= min_compute:
        raise FitError(
            f"the fit window is empty: max_compute {max_compute:g} ≤ min_compute {min_compute:g}. "
            "Give a max_compute above min_compute."
        )
    hi = np.inf if max_compute is None else max_compute
    total = float(curve.compute.max()) if total_compute is None else float(total_compute)
    min_compute = max(min_compute, min_compute_fraction * total)
    mask = (curve.compute > 0) & (curve.compute >= min_compute) & (curve.compute <= hi)
    if measured:
        mask &= ~first  # the R0 records (step 0, or the first eval when there is none) are R0 only
    n = int(mask.sum())
    if n < MIN_POINTS:
        raise FitError(
            f"only {n} usable point(s) (compute > 0, within [{min_compute:g}, {hi:g}], not the R0 eval) out of "
            f"{len(curve)}. The sigmoid has 3 free parameters, so the fit needs at least {MIN_POINTS} points; "
            "evaluate more often, train longer, or widen the min/max compute window."
        )
    c = curve.compute[mask]
    if np.unique(c).size < 3 or c.max() / c.min() < 1.0 + 1e-9:
        raise FitError(
            f"the {n} points have no spread in compute (values {np.unique(c)[:5].tolist()}). A curve needs "
            "eval points at at least 3 different compute values."
        )
    y = curve.pass_rate[mask]
    if require_gain and y.max() <= r0_value:
        raise FitError(
            f"no point rises above R0 = {r0_value:.4g} (best {y.max():.4g}). The saturating curve "
            "models a gain over the starting pass rate; there is no gain to fit yet."
        )
    p = None if curve.prompt_pass_rates is None else curve.prompt_pass_rates[mask]
    v = None if curve.eval_var is None else curve.eval_var[mask]
    n0 = int(first.sum())
    r0_var = None
    if measured and curve.eval_var is not None:
        r0_var = float(curve.eval_var[first].mean()) / n0
    return FitWindow(
        mask=mask,
        compute=c,
        pass_rate=y,
        prompt_pass_rates=p,
        r0=r0_value,
        r0_is_measured=measured,
        r0_count=n0,
        min_compute=min_compute,
        eval_var=v,
        r0_compute=float(curve.compute.min()) if measured else 0.0,
        r0_var=r0_var,
        total_compute=total,
    )
