"""Profile likelihood of the ScaleRL sigmoid with its linear parameters exact (ours; `scaling.predict` uses it).

R(c) = R0·(1 − s) + A·s with s = expit(B·(ln c − ln C_mid)) is linear in (R0, A) once (B, C_mid) is fixed.
So for every point of a grid over (ln B, ln C_mid), under a generalised least-squares metric ‖W·(y − R)‖²
(W the whitener of the evals' covariance, `scaling.noise`):

- the best (R0, A) and its SSE are a 2 × 2 solve;
- the region {(R0, A): SSE ≤ t} is an ellipse about that optimum, with radius² t − SSE and shape given by
  the inverse normal matrix;
- A ≤ 1 cuts it along the chord A = 1, and the constrained optimum lies on that chord when the
  unconstrained one has A > 1;
- the range of a forecast R(C) = R0·(1 − s_C) + A·s_C over ellipse ∩ {A ≤ 1} is that of a linear function
  over a convex set: the ellipse's extreme point in the direction (1 − s_C, s_C) when it has A ≤ 1, else
  the matching end of the chord.

The union over the grid is the profile-likelihood region's range, exact up to the grid's resolution; a
second, fine grid (`zoom`) over the box of the region resolves regions smaller than a coarse cell.

Shapes: N data points; grids ln B: [nb, 1], ln C_mid: [1, nm]; per grid point [nb, nm]; per target
[nb, nm, M]; parameter vectors q = (R0, A, B, ln C_mid): [4].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import least_squares
from scipy.special import expit

from scalerl.scaling.curves import FloatArray

B_RANGE = (0.2, 12.0)
"""B on the grid and in the refinement (the paper's fits lie in 1.09–2.44; a step needs B ≫ 10)."""
_N_B = 36  # B grid values, log-spaced over B_RANGE
_N_M = 90  # ln C_mid grid values, over [ln min(c) − ln 100, ln max(c) + ln 1000]
_N_ZOOM = 40  # per side of the fine grid over the likelihood region


@dataclass(frozen=True, slots=True)
class Points:
    """Points of the likelihood, the R0 point first: ln_c, y, v (sampling variances), pos (eval positions in
    the run), wobbly (with a checkpoint wobble): [N]; the fitted points' count n and the parameters' p."""

    ln_c: FloatArray
    y: FloatArray
    v: FloatArray
    pos: FloatArray
    wobbly: np.ndarray
    n: int
    p: int


def grid(ln_c: FloatArray) -> tuple[FloatArray, FloatArray]:
    """(ln B: [nb, 1], ln C_mid: [1, nm]) over the fitted compute range ln_c: [n]."""
    b = np.linspace(np.log(B_RANGE[0]), np.log(B_RANGE[1]), _N_B)[:, None]
    m = np.linspace(ln_c.min() - np.log(100.0), ln_c.max() + np.log(1000.0), _N_M)[None, :]
    return b, m


def s_grid(b: FloatArray, m: FloatArray, ln_c: FloatArray) -> FloatArray:
    """expit(B·(ln c − ln C_mid)): [nb, nm, len(ln_c)] (0 at ln c = −inf)."""
    with np.errstate(invalid="ignore"):
        return np.asarray(expit(b[..., None] * (ln_c[None, None, :] - m[..., None])))


@dataclass(frozen=True, slots=True)
class Linear:
    """Per grid point: unconstrained (R0, A) [nb, nm] each, its SSE, the inverse normal matrix entries."""

    r0: FloatArray
    a: FloatArray
    sse_u: FloatArray
    i00: FloatArray
    i01: FloatArray
    i11: FloatArray
    m00: FloatArray

    def constrained(self) -> tuple[FloatArray, FloatArray, FloatArray]:
        """(R0, A, SSE) minimised under A ≤ 1, each [nb, nm]."""
        over = np.maximum(self.a - 1.0, 0.0)
        return (self.r0 - self.i01 / self.i11 * over, np.minimum(self.a, 1.0), self.sse_u + over**2 / self.i11)


def linear(s: FloatArray, d: Points, w: FloatArray) -> Linear:
    """Generalised least squares of y on the columns (1 − s, s) for every grid point; s: [nb, nm, N], w: [N, N]
    the whitener (`noise.whitener`): the sums of squares are those of W·(y − X·β)."""
    u, sw, yw = (1.0 - s) @ w.T, s @ w.T, w @ d.y  # whitened columns: [nb, nm, N]
    m00, m01, m11 = np.sum(u * u, -1), np.sum(u * sw, -1), np.sum(sw * sw, -1)
    m11 = m11 + 1e-12 * (m00 + m11)  # s ≈ 0 everywhere (C_mid far beyond the data): A is unconstrained
    b0, b1 = u @ yw, sw @ yw
    det = np.maximum(m00 * m11 - m01**2, 1e-15 * m00 * m11)
    i00, i01, i11 = m11 / det, -m01 / det, m00 / det
    r0, a = i00 * b0 + i01 * b1, i01 * b0 + i11 * b1
    sse_u = np.maximum(float(yw @ yw) - (b0 * r0 + b1 * a), 0.0)
    return Linear(r0=r0, a=a, sse_u=sse_u, i00=i00, i01=i01, i11=i11, m00=m00)


def refine(d: Points, w: FloatArray, start: tuple[float, float, float, float]) -> tuple[FloatArray, float]:
    """Joint generalised least squares over (R0, A, B, ln C_mid) from the grid optimum, A ≤ 1; (q, SSE)."""

    def resid(q: FloatArray) -> FloatArray:
        return np.asarray(w @ (d.y - curve(q, d.ln_c)))

    x0 = np.array(start)
    lo = np.array([-1.0, -1.0, B_RANGE[0], x0[3] - 5.0])
    hi = np.array([2.0, 1.0, B_RANGE[1], x0[3] + 5.0])
    x0 = np.clip(x0, lo, hi)
    sse0 = float(np.sum(resid(x0) ** 2))
    try:
        sol = least_squares(resid, x0, bounds=(lo, hi), method="trf", x_scale="jac", max_nfev=200)
    except (ValueError, np.linalg.LinAlgError):  # pragma: no cover - keep the grid optimum
        return x0, sse0
    sse = float(np.sum(sol.fun**2))
    return (sol.x, sse) if np.isfinite(sse) and sse < sse0 else (x0, sse0)


def fit(d: Points, w: FloatArray) -> tuple[FloatArray, float, Linear]:
    """The generalised least-squares curve under whitener w: (q = (R0, A, B, ln C_mid), SSE, coarse grid)."""
    ln_b, m = grid(d.ln_c[1:])
    coarse = on_grid(ln_b, m, d, w)
    r0_c, a_c, sse_c = coarse.constrained()
    i, j = np.unravel_index(int(np.argmin(sse_c)), sse_c.shape)
    q, sse = refine(d, w, (float(r0_c[i, j]), float(a_c[i, j]), float(np.exp(ln_b[i, 0])), float(m[0, j])))
    return q, min(sse, float(sse_c[i, j])), coarse


def curve(q: FloatArray, ln_c: FloatArray) -> FloatArray:
    """R0·(1 − s) + A·s at ln_c: [K] for q = (R0, A, B, ln C_mid)."""
    with np.errstate(invalid="ignore"):
        s = expit(q[2] * (ln_c - q[3]))
    return np.asarray(q[0] * (1 - s) + q[1] * s)


def on_grid(ln_b: FloatArray, m: FloatArray, d: Points, w: FloatArray) -> Linear:
    """The linear solution on a grid of ln B: [nb, 1] × ln C_mid: [1, nm], whitener w: [N, N]."""
    return linear(s_grid(np.exp(ln_b), m, d.ln_c), d, w)


def zoom(ln_b: FloatArray, m: FloatArray, ok: np.ndarray, q: FloatArray) -> tuple[FloatArray, FloatArray]:
    """A `_N_ZOOM`² grid (ln B: [nz, 1], ln C_mid: [1, nz]) over the box of the coarse cells in the region
    (ok: [nb, nm]) one cell wider on each side, and the refined optimum q."""
    rows, cols = np.nonzero(ok)
    nb, nm = ok.shape
    lb, mm = ln_b[:, 0], m[0]
    b_lo, b_hi = np.log(q[2]), np.log(q[2])
    m_lo, m_hi = q[3], q[3]
    if rows.size:
        b_lo, b_hi = min(b_lo, lb[max(rows.min() - 1, 0)]), max(b_hi, lb[min(rows.max() + 1, nb - 1)])
        m_lo, m_hi = min(m_lo, mm[max(cols.min() - 1, 0)]), max(m_hi, mm[min(cols.max() + 1, nm - 1)])
    db, dm = lb[1] - lb[0], mm[1] - mm[0]  # at least one coarse cell around the optimum
    b_lo, b_hi = min(b_lo, np.log(q[2]) - db), max(b_hi, np.log(q[2]) + db)
    m_lo, m_hi = min(m_lo, q[3] - dm), max(m_hi, q[3] + dm)
    return np.linspace(b_lo, b_hi, _N_ZOOM)[:, None], np.linspace(m_lo, m_hi, _N_ZOOM)[None, :]


def region(lin: Linear, t: float) -> tuple[np.ndarray, FloatArray]:
    """(ok: [nb, nm] the grid points whose {SSE ≤ t} ∩ {A ≤ 1} is not empty, r2: [nb, nm] the squared radius
    of each one's ellipse about its unconstrained optimum, 0 where not ok)."""
    ok = lin.constrained()[2] <= t
    return ok, np.where(ok, t - lin.sse_u, 0.0)


def a_range(lin: Linear, r2: FloatArray, ok: np.ndarray) -> tuple[float, float]:
    """A's range over the region (`region`), capped at 1; (inf, −inf) when the region is empty."""
    if not ok.any():
        return np.inf, -np.inf
    return (float((lin.a - np.sqrt(r2 * lin.i11))[ok].min()),
            float(np.minimum(lin.a + np.sqrt(r2 * lin.i11), 1.0)[ok].max()))


def ranges(lin: Linear, s_t: FloatArray, t: float) -> tuple[FloatArray, FloatArray, float, float]:
    """(lo, hi: [M] of R(C), and lo, hi of A) over {SSE ≤ t, A ≤ 1} on one grid; s_t: [nb, nm, M]."""
    ok, r2 = region(lin, t)
    a_lo, a_hi = a_range(lin, r2, ok)
    if not ok.any():
        m_count = s_t.shape[-1]
        return np.full(m_count, np.inf), np.full(m_count, -np.inf), a_lo, a_hi
    lo, hi = curve_range(lin, s_t, r2, ok)
    return lo, hi, a_lo, a_hi


def curve_range(lin: Linear, s_t: FloatArray, r2: FloatArray, ok: np.ndarray) -> tuple[FloatArray, FloatArray]:
    """(lo, hi): [M] the range of R(C) = R0·(1 − s_C) + A·s_C over {SSE ≤ t, A ≤ 1} and the grid, clipped to
    [0, 1]; s_t: [nb, nm, M], r2: [nb, nm] the ellipse's squared radius about the unconstrained optimum."""
    lo, hi = linear_range(lin, 1.0 - s_t, s_t, r2, ok)
    return np.clip(lo, 0.0, 1.0), np.clip(hi, 0.0, 1.0)


def linear_range(lin: Linear, g0: FloatArray, g1: FloatArray, r2: FloatArray, ok: np.ndarray
                 ) -> tuple[FloatArray, FloatArray]:
    """(lo, hi): [M] the range of g0·R0 + g1·A over {SSE ≤ t, A ≤ 1} and the grid; g0, g1: [nb, nm, M].

    A forecast R(C) is g0 = 1 − s_C, g1 = s_C; the gain R(C2) − R(C1) is g0 = −(s_2 − s_1), g1 = s_2 − s_1.
    Where an extreme of the ellipse has A > 1 the constrained extreme lies on the chord A = 1 (a linear
    function over a convex set whose unconstrained optimum is cut off), at the chord's end that g0 favours."""
    i00, i01, i11 = (x[..., None] for x in (lin.i00, lin.i01, lin.i11))
    r0, a, r = lin.r0[..., None], lin.a[..., None], np.sqrt(r2)[..., None]
    vg = np.maximum(g0 * g0 * i00 + 2 * g0 * g1 * i01 + g1 * g1 * i11, 0.0)
    sd = np.sqrt(vg)
    center = g0 * r0 + g1 * a
    with np.errstate(invalid="ignore", divide="ignore"):
        u_a = np.where(sd > 0, (i01 * g0 + i11 * g1) / sd, 0.0)  # A-component of the extreme's direction
    chord_r2 = np.maximum(r * r - (1.0 - a) ** 2 / i11, 0.0)
    r0_c = r0 + i01 / i11 * (1.0 - a)
    half = np.abs(g0) * np.sqrt(chord_r2 / lin.m00[..., None])
    hi = np.where(a + r * u_a <= 1.0, center + r * sd, g0 * r0_c + half + g1)
    lo = np.where(a - r * u_a <= 1.0, center - r * sd, g0 * r0_c - half + g1)
    mask = ok[..., None]
    m_count = g0.shape[-1]
    return (np.where(mask, lo, np.inf).reshape(-1, m_count).min(axis=0),
            np.where(mask, hi, -np.inf).reshape(-1, m_count).max(axis=0))
