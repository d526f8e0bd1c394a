"""Fitting the sigmoid and the power law the way the paper does (spec §1.3, §1.7), vectorised.

Sigmoid procedure:

1. R0 is fixed to the measured step-0 pass rate (or given); compute-0 points are R0 information only.
2. Grid over A (step 0.005, like the paper's {0.450, 0.455, …}) × C_mid (log-spaced); for every pair B
   is fitted by least squares. All pairs are solved at once: B starts from the best of a closed-form
   guess (regression of logit((R − R0)/(A − R0)) on ln C − ln C_mid) and a few fixed values, then a
   damped Gauss–Newton iteration runs on every pair in parallel.
3. The pair with the lowest SSE wins; a bounded joint refinement of (A, B, ln C_mid) starts there
   (`scipy.optimize.least_squares`) and is kept only if it lowers the SSE.

Departures from the paper, with reasons:

1. The grids adapt to the data instead of the paper's fixed A ∈ [0.45, 0.80], C_mid ∈ [100, 40000]
   GPU-hours, so one procedure serves a CPU quickstart (~0.001–0.2 device-hours) and a 100k GPU-hour run:
   A runs from 0.02 below the best observed pass rate (the best point of a noisy, saturated run sits
   above the asymptote) up to 1.0; C_mid runs log-spaced from min(C)/10 to max(C)×100.
2. C_mid is log-spaced (the paper: 100 linear values), because the curve is a function of ln C.
3. The final joint refinement is ours; the paper stops at the grid. It only ever lowers the SSE.
"""

from __future__ import annotations

import numpy as np
from scipy.optimize import least_squares
from scipy.special import expit, logit

from scalerl.scaling.curves import FitError, FloatArray, PowerLawFit, SigmoidFit, power_law, r_squared
from scalerl.scaling.data import FitWindow, curve_from_arrays, fit_window

A_STEP = 0.005
"""Grid step on A (the paper's step)."""
A_BELOW_BEST = 0.02
"""The A grid starts this far below the best observed pass rate (noise puts that point above A)."""
N_C_MID = 80
"""Log-spaced C_mid grid values."""
B_BOUNDS = (0.02, 30.0)
"""Range of B (the paper's fits lie in 1.09–2.44; a step function needs B ≫ 10)."""
C_MID_SPAN = (0.1, 100.0)
"""C_mid grid spans [min(C)·0.1, max(C)·100]."""
_B_STARTS = (0.5, 1.0, 2.0, 4.0)  # fixed starting values tried beside the closed-form guess
_GN_ITERS = 8
_GN_ITERS_ALL = 2  # Gauss–Newton steps on every pair before pruning
_PRUNE_FACTOR = 10.0  # then continue only on pairs within 10× the best SSE so far …
_PRUNE_MIN_KEEP = 256  # … and at least this many: a pair that far behind after the first steps never wins
_CHUNK_ELEMS = 2_000_000  # a × c × N elements per vectorised block (~16 MB per float64 array)
_A_EPS = 1e-6  # A must stay strictly above R0: the curve has no gain at A = R0


def a_grid(best: float, r0: float, *, step: float = A_STEP) -> FloatArray:
    """A values from max(R0 + step, best − 0.02) to 1.0 on the `step` lattice: [a]."""
    lo = max(r0 + step, best - A_BELOW_BEST)
    lo = min(np.ceil(lo / step - 1e-9) * step, 1.0)
    return np.unique(np.clip(np.arange(lo, 1.0 + step / 2, step), lo, 1.0))


def c_mid_grid(compute: FloatArray, *, n: int = N_C_MID) -> FloatArray:
    """[n] log-spaced C_mid candidates spanning well beyond the observed compute (device-hours)."""
    lo, hi = float(compute.min()) * C_MID_SPAN[0], float(compute.max()) * C_MID_SPAN[1]
    return np.geomspace(lo, hi, n)


def _sse_b(b: np.ndarray, x: np.ndarray, d: np.ndarray, yr: np.ndarray, w: np.ndarray) -> np.ndarray:
    """SSE for B: [a, c] given x = ln C − ln C_mid: [c, N], d = A − R0: [a, 1, 1], yr = R − R0: [N]."""
    r = yr - d * expit(b[..., None] * x[None])  # (a, c, N)
    return np.asarray((r * r) @ w)  # (a, c)


def profile_b(
    *, ln_c: FloatArray, y: FloatArray, w: FloatArray, r0: float, a: FloatArray, ln_c_mid: FloatArray
) -> tuple[FloatArray, FloatArray]:
    """Least-squares B for every (A, C_mid) pair.

    ln_c: [N] ln compute; y: [N] pass rates; w: [N] weights; a: [a] values of A; ln_c_mid: [c].
    Returns (B: [a, c], sse: [a, c]).
    """
    chunk = max(1, _CHUNK_ELEMS // max(1, ln_c_mid.size * ln_c.size))
    bs, sses = [], []
    for i in range(0, a.size, chunk):
        b, s = _profile_b_block(ln_c, y, w, r0, a[i : i + chunk], ln_c_mid)
        bs.append(b)
        sses.append(s)
    return np.concatenate(bs), np.concatenate(sses)


def _profile_b_block(
    ln_c: FloatArray, y: FloatArray, w: FloatArray, r0: float, a: FloatArray, ln_c_mid: FloatArray
) -> tuple[FloatArray, FloatArray]:
    # float32 halves the memory traffic; the grid only has to find the basin, the refinement is float64.
    f32 = np.float32
    x = (ln_c[None, :] - ln_c_mid[:, None]).astype(f32)  # ln C − ln C_mid: (c, N)
    d = (a - r0).astype(f32)[:, None, None]  # A − R0: (a, 1, 1)
    yr, w32 = (y - r0).astype(f32), w.astype(f32)  # (N,)
    # Closed-form start: logit((R − R0)/(A − R0)) ≈ B·(ln C − ln C_mid); weighted by the delta method.
    q = np.clip(yr / d, 0.02, 0.98)  # (a, 1, N)
    v = w32 * (q * (1 - q)) ** 2
    num = np.einsum("aon,cn->ac", v * logit(q), x)
    den = np.einsum("aon,cn->ac", v, x**2)
    b = np.clip(num / np.maximum(den, 1e-30), *B_BOUNDS)  # (a, c)
    sse = _sse_b(b, x, d, yr, w32)
    for b_fixed in _B_STARTS:
        cand = np.full_like(b, b_fixed)
        sse_c = _sse_b(cand, x, d, yr, w32)
        better = sse_c < sse
        b, sse = np.where(better, cand, b), np.where(better, sse_c, sse)
    # Gauss–Newton on B, first on every pair, then only on the pairs that can still win.
    b, sse = _gauss_newton_b(b, sse, x[None], d, yr, w32, _GN_ITERS_ALL)
    keep = np.flatnonzero(sse.ravel() <= _PRUNE_FACTOR * sse.min())
    if keep.size < _PRUNE_MIN_KEEP:
        keep = np.argsort(sse.ravel())[:_PRUNE_MIN_KEEP]
    ia, ic = np.unravel_index(keep, sse.shape)
    bk, sk = _gauss_newton_b(b[ia, ic], sse[ia, ic], x[ic], d[ia, 0], yr, w32, _GN_ITERS - _GN_ITERS_ALL)
    b[ia, ic], sse[ia, ic] = bk, sk
    return b.astype(np.float64), sse.astype(np.float64)


def _gauss_newton_b(
    b: np.ndarray, sse: np.ndarray, x: np.ndarray, d: np.ndarray, yr: np.ndarray, w: np.ndarray, iters: int
) -> tuple[np.ndarray, np.ndarray]:
    """Damped Gauss–Newton on B for many pairs at once. b, sse: [...]; x: [..., N] (broadcast);
    d: [..., 1]; yr, w: [N]. A step that does not lower the SSE is rejected and the next one shrunk."""
    scale = np.ones_like(b)  # per-pair step multiplier (quartered on failure, doubled on success)
    for _ in range(iters):
        s = expit(b[..., None] * x)  # (..., N)
        r = yr - d * s
        g = d * (s * (1 - s)) * x  # ∂f/∂B: (..., N)
        step = ((g * r) @ w) / np.maximum((g * g) @ w, 1e-30)
        cand = np.clip(b + scale * step, *B_BOUNDS)
        rc = yr - d * expit(cand[..., None] * x)
        sse_c = (rc * rc) @ w
        ok = sse_c < sse
        b, sse = np.where(ok, cand, b), np.where(ok, sse_c, sse)
        scale = np.where(ok, np.minimum(2 * scale, 1.0), scale / 4)
    return b, sse


def fit_sigmoid(
    compute: FloatArray,
    pass_rate: FloatArray,
    *,
    r0: float | None = None,
    min_compute: float = 0.0,
    max_compute: float | None = None,
    fixed_a: float | None = None,
) -> SigmoidFit:
    """Fit R = R0 + (A − R0)/(1 + (C_mid/C)^B) to measured points (spec §1.3).

    compute: [N] device-hours ≥ 0; pass_rate: [N] in [0, 1]. R0 defaults to the pass rate at the
    smallest compute (the step-0 eval). `fixed_a` holds A fixed (the paper's shared-A refit).
    Raises FitError on data that cannot support a fit.
    """
    curve = curve_from_arrays(compute, pass_rate)
    win = fit_window(curve, r0=r0, min_compute=min_compute, max_compute=max_compute)
    return fit_sigmoid_window(win, fixed_a=fixed_a)


def fit_sigmoid_window(win: FitWindow, *, fixed_a: float | None = None) -> SigmoidFit:
    """The grid + refinement fit on an already selected window (see `fit_window`)."""
    c, y, r0 = win.compute, win.pass_rate, win.r0
    w = np.ones_like(y)
    if fixed_a is not None:
        if not (r0 < fixed_a <= 1.0):
            raise FitError(f"shared A = {fixed_a:.4g} is not in (R0 = {r0:.4g}, 1]; it cannot be held fixed.")
        grid_a = np.array([fixed_a])
    else:
        grid_a = a_grid(float(y.max()), r0)
    ln_c, ln_cm = np.log(c), np.log(c_mid_grid(c))
    b, sse = profile_b(ln_c=ln_c, y=y, w=w, r0=r0, a=grid_a, ln_c_mid=ln_cm)
    i, j = np.unravel_index(int(np.argmin(sse)), sse.shape)
    start = (float(grid_a[i]), float(b[i, j]), float(ln_cm[j]))
    (a_fit, b_fit, ln_cmid), best = _refine(ln_c, y, r0, start, free_a=fixed_a is None)
    return SigmoidFit(
        A=a_fit,
        B=b_fit,
        C_mid=float(np.exp(ln_cmid)),
        R0=r0,
        n_points=int(y.size),
        sse=best,
        r2=r_squared(y, best),
    )


def _refine(
    ln_c: FloatArray, y: FloatArray, r0: float, start: tuple[float, float, float], *, free_a: bool
) -> tuple[tuple[float, float, float], float]:
    """Bounded joint least squares over (A, B, ln C_mid) (or (B, ln C_mid) with A fixed) from `start`;
    returns ((A, B, ln C_mid), SSE in float64), the start itself unless the SSE went down."""
    a0 = start[0]
    lo_m, hi_m = float(ln_c.min()) - np.log(1e3), float(ln_c.max()) + np.log(1e4)

    def resid(p: FloatArray) -> FloatArray:
        a = p[0] if free_a else a0
        return np.asarray(y - (r0 + (a - r0) * expit(p[-2] * (ln_c - p[-1]))))

    x0 = np.array(start if free_a else start[1:])
    sse = float(np.sum(resid(x0) ** 2))
    lo = np.array([r0 + _A_EPS, B_BOUNDS[0], lo_m][-x0.size :])
    hi = np.array([1.0, B_BOUNDS[1], hi_m][-x0.size :])
    try:
        sol = least_squares(resid, np.clip(x0, lo, hi), bounds=(lo, hi), method="trf", x_scale="jac")
    except (ValueError, np.linalg.LinAlgError):  # pragma: no cover - keep the grid optimum
        return start, sse
    new = float(np.sum(sol.fun**2))
    if not (np.isfinite(new) and new < sse):
        return start, sse
    p = sol.x
    return ((float(p[0]) if free_a else a0), float(p[-2]), float(p[-1])), new


def fit_power_law(
    compute: FloatArray, pass_rate: FloatArray, *, min_compute: float = 0.0, max_compute: float | None = None
) -> PowerLawFit:
    """Fit R = A − D/C^B (spec §1.7) to points (compute: [N] device-hours, pass_rate: [N]).

    Compute-0 points are left out (the power law is −∞ there); `min_compute` is the paper's C_0.
    """
    win = fit_window(curve_from_arrays(compute, pass_rate), min_compute=min_compute, max_compute=max_compute)
    return fit_power_law_window(win)


def fit_power_law_window(win: FitWindow, *, step: float = A_STEP) -> PowerLawFit:
    """Fit R = A − D/C^B on the window's points, the same way as the sigmoid: grid over A, LS for the rest.

    For each A on a grid from just above the best point to 1.0, (ln D, B) come from the linear least
    squares of ln(A − R) on ln C; the best A in pass-rate SSE is then refined jointly, bounded A ≤ 1.
    """
    c, y = win.compute, win.pass_rate
    top = float(y.max())
    if top >= 1.0 - step:
        raise FitError("the power law needs an asymptote above every point, and a point is already at 1.0.")
    grid = np.arange(np.ceil((top + 1e-9) / step) * step, 1.0 + step / 2, step)
    grid = np.unique(np.clip(grid, top + step / 10, 1.0))
    X = np.log(c)
    V = np.log(grid[:, None] - y[None, :])  # (a, N)
    xm, vm = X.mean(), V.mean(axis=1, keepdims=True)
    slope = ((V - vm) * (X - xm)).sum(axis=1) / max(float(((X - xm) ** 2).sum()), 1e-30)  # −B
    B = np.clip(-slope, 1e-4, 10.0)
    lnD = vm[:, 0] + B * xm
    pred = grid[:, None] - np.exp(lnD[:, None] - B[:, None] * X[None, :])
    sse = ((y - pred) ** 2).sum(axis=1)
    k = int(np.argmin(sse))
    x0 = np.array([grid[k], B[k], lnD[k]])
    best = float(sse[k])

    def resid(p: FloatArray) -> FloatArray:
        return y - power_law(c, A=p[0], B=p[1], D=float(np.exp(p[2])))

    lo, hi = np.array([0.0, 1e-4, -50.0]), np.array([1.0, 10.0, 50.0])
    try:
        sol = least_squares(resid, np.clip(x0, lo, hi), bounds=(lo, hi), method="trf", x_scale="jac")
        if float(np.sum(sol.fun**2)) < best:
            x0, best = sol.x, float(np.sum(sol.fun**2))
    except (ValueError, np.linalg.LinAlgError):  # pragma: no cover - keep the grid optimum
        pass
    return PowerLawFit(
        A=float(x0[0]),
        B=float(x0[1]),
        D=float(np.exp(x0[2])),
        n_points=int(y.size),
        sse=best,
        r2=r_squared(y, best),
    )
