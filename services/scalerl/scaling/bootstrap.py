"""Bootstrap intervals for a sigmoid fit and its forecasts (our addition; the paper has none, spec §1.4).

Two resampling schemes:

- **prompts** (preferred, used when every fitted eval record carries `prompt_pass_rates` in the same
  prompt order): draw the held-out prompts with replacement, once per resample, and rebuild every
  point's pass rate (and R0, when it was measured) from the same draw. This keeps the correlation
  between points that share prompts, which is where most of the uncertainty of A lives.
- **points**: draw the eval points with replacement (as multinomial weights on the points).

R0 is a measurement too, as noisy as any eval point, and it moves B and C_mid a lot (a 0.004 error in
R0 doubles the spread of B on Table-1-like data). So when R0 was measured it is resampled as well: from
the step-0 prompts under the prompt scheme, otherwise by adding a residual of the fit drawn at random
(scaled by √(n/(n − 3)) for the three fitted parameters). A given R0 stays fixed.

Each resample is refitted by a batched Levenberg–Marquardt on (A, B, ln C_mid), all resamples at once,
from a small grid of starts around the full-data optimum (A ± 0.03, C_mid × {½, 1, 2}); the lowest SSE
per resample wins. This is the "coarse grid, then refine" of the full fit, shrunk to the neighbourhood
the resamples live in, so that 200 resamples cost about as much as one full fit.

Intervals are percentile intervals at `level` (default 95%). Forecast intervals describe the expected
pass rate (the curve), not a single future noisy eval.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy.special import expit

from scalerl.scaling.curves import FitError, FloatArray, SigmoidFit
from scalerl.scaling.data import FitWindow
from scalerl.scaling.fit import B_BOUNDS

N_RESAMPLES = 200
LEVEL = 0.95
_START_DA = (-0.03, 0.0, 0.03)  # A offsets of the starts
_START_CMID = (0.5, 1.0, 2.0)  # C_mid factors of the starts
_LM_ITERS = 80
_PARAMS = ("A", "B", "C_mid")


@dataclass(frozen=True, slots=True, eq=False)
class Bootstrap:
    """Bootstrap distribution of a sigmoid fit.

    samples: [S, 4] columns A, B, C_mid (device-hours), R0 — one row per resample.
    """

    samples: FloatArray
    method: str
    """"prompts" or "points" (see the module docstring)."""
    level: float
    """Two-sided coverage of the percentile intervals, e.g. 0.95."""
    seed: int

    @property
    def n_resamples(self) -> int:
        return int(self.samples.shape[0])

    def _q(self) -> tuple[float, float]:
        return (1 - self.level) / 2, (1 + self.level) / 2

    def interval(self, name: str) -> tuple[float, float]:
        """Percentile interval of "A", "B", "C_mid" or "R0"."""
        col = self.samples[:, ("A", "B", "C_mid", "R0").index(name)]
        lo, hi = np.quantile(col, self._q())
        return float(lo), float(hi)

    def ci(self) -> dict[str, tuple[float, float]]:
        return {k: self.interval(k) for k in _PARAMS}

    def band(self, compute: ArrayLike) -> tuple[FloatArray, FloatArray]:
        """(lo, hi), each [M]: percentile band of the predicted pass rate at `compute` [M]."""
        c = np.atleast_1d(np.asarray(compute, dtype=np.float64))
        A, B, Cm, R0 = (self.samples[:, i : i + 1] for i in range(4))
        with np.errstate(divide="ignore"):
            pred = R0 + (A - R0) * expit(B * (np.log(c)[None, :] - np.log(Cm)))  # (S, M)
        lo, hi = np.quantile(pred, self._q(), axis=0)
        return lo, hi


def bootstrap_sigmoid(
    win: FitWindow,
    fit: SigmoidFit,
    *,
    n_resamples: int = N_RESAMPLES,
    seed: int = 0,
    level: float = LEVEL,
    method: str = "auto",
    r0_prompt_rates: FloatArray | None = None,
    fixed_a: float | None = None,
) -> Bootstrap:
    """Resample and refit `n_resamples` times; deterministic for a given `seed`.

    win: the fitted window; fit: its full-data fit (the starting point); method: "auto" (prompts when
    the window has per-prompt rates, else points), "prompts" or "points"; r0_prompt_rates: [P] step-0
    per-prompt rates, to resample R0 too when it was measured; fixed_a: hold A fixed (shared-A refits).
    """
    if n_resamples < 2:
        raise FitError(f"a bootstrap needs at least 2 resamples, got {n_resamples}.")
    if not 0 < level < 1:
        raise FitError(f"level must be in (0, 1), got {level}.")
    rng = np.random.default_rng(seed)
    n = win.pass_rate.size
    use_prompts = win.prompt_pass_rates is not None if method == "auto" else method == "prompts"
    if use_prompts and win.prompt_pass_rates is None:
        raise FitError("a prompt bootstrap needs prompt_pass_rates on every fitted eval record.")
    r0 = np.full(n_resamples, win.r0)
    r0_done = not win.r0_is_measured
    if use_prompts:
        P = win.prompt_pass_rates
        assert P is not None
        counts = _multinomial_counts(rng, n_resamples, P.shape[1])  # (S, P)
        y = counts @ P.T / P.shape[1]  # (S, n)
        w = np.ones_like(y)
        if not r0_done and r0_prompt_rates is not None and r0_prompt_rates.size == P.shape[1]:
            r0, r0_done = counts @ r0_prompt_rates / P.shape[1], True
    else:
        y = np.broadcast_to(win.pass_rate, (n_resamples, n)).copy()
        w = _multinomial_counts(rng, n_resamples, n)
    if not r0_done:
        resid = win.pass_rate - fit.predict(win.compute)
        resid = (resid - resid.mean()) * np.sqrt(n / max(n - 3, 1)) / np.sqrt(win.r0_count)
        r0 = np.clip(win.r0 + rng.choice(resid, size=n_resamples), 0.0, 1.0 - 1e-6)
    samples = _refit_batch(np.log(win.compute), y, w, r0, fit, fixed_a=fixed_a)
    return Bootstrap(samples=samples, method="prompts" if use_prompts else "points", level=level, seed=seed)


def _multinomial_counts(rng: np.random.Generator, s: int, n: int) -> FloatArray:
    """[s, n] how often each of n items is drawn in each of s resamples of size n."""
    idx = rng.integers(0, n, size=(s, n))
    counts = np.zeros((s, n))
    np.add.at(counts, (np.arange(s)[:, None], idx), 1.0)
    return counts


def _refit_batch(
    ln_c: FloatArray, y: FloatArray, w: FloatArray, r0: FloatArray, fit: SigmoidFit, *, fixed_a: float | None
) -> FloatArray:
    """Fit every resample from a grid of starts; return [S, 4] (A, B, C_mid, R0) of the best start."""
    s = y.shape[0]
    da = (0.0,) if fixed_a is not None else _START_DA
    a0 = fit.A if fixed_a is None else fixed_a
    starts = [(a0 + d, fit.B, np.log(fit.C_mid) + np.log(f)) for d in da for f in _START_CMID]
    k = len(starts)
    p0 = np.repeat(np.asarray(starts)[None], s, axis=0).reshape(s * k, 3)  # (S·k, 3)
    rep = np.repeat(np.arange(s), k)  # resample index of each row
    r0k = r0[rep]
    lo_m, hi_m = float(ln_c.min()) - np.log(1e3), float(ln_c.max()) + np.log(1e4)
    p0[:, 0] = np.maximum(p0[:, 0], r0k + 1e-3)
    lo = np.stack([r0k + 1e-6, np.full_like(r0k, B_BOUNDS[0]), np.full_like(r0k, lo_m)], axis=1)
    hi = np.stack([np.ones_like(r0k), np.full_like(r0k, B_BOUNDS[1]), np.full_like(r0k, hi_m)], axis=1)
    if fixed_a is not None:
        lo[:, 0] = hi[:, 0] = fixed_a
    p, sse = batched_lm(ln_c=ln_c, y=y[rep], w=w[rep], r0=r0k, p0=np.clip(p0, lo, hi), lo=lo, hi=hi)
    best = np.argmin(sse.reshape(s, k), axis=1)
    pb = p.reshape(s, k, 3)[np.arange(s), best]  # (S, 3)
    return np.column_stack([pb[:, 0], pb[:, 1], np.exp(pb[:, 2]), r0])


def batched_lm(
    *,
    ln_c: FloatArray,
    y: FloatArray,
    w: FloatArray,
    r0: FloatArray,
    p0: FloatArray,
    lo: FloatArray,
    hi: FloatArray,
    iters: int = _LM_ITERS,
) -> tuple[FloatArray, FloatArray]:
    """Levenberg–Marquardt on K independent sigmoid problems at once, with box bounds by projection.

    ln_c: [N]; y, w: [K, N]; r0: [K]; p0, lo, hi: [K, 3] over (A, B, ln C_mid); a parameter with
    lo == hi is held fixed. Returns (p: [K, 3], sse: [K]).
    """
    free = (hi > lo).astype(np.float64)  # (K, 3)
    p = p0.copy()
    sse = np.sum(w * (y - _model(ln_c, r0, p)[0]) ** 2, axis=1)
    lam = np.full(p.shape[0], 1e-3)
    active = np.ones(p.shape[0], dtype=bool)
    for _ in range(iters):
        k = np.flatnonzero(active)
        if k.size == 0:
            break
        pk, yk, wk, r0k, fr = p[k], y[k], w[k], r0[k], free[k]
        f, s, x = _model(ln_c, r0k, pk)
        d = (pk[:, 0] - r0k)[:, None]
        ds = s * (1 - s)
        J = np.stack([s, d * ds * x, -d * ds * pk[:, 1:2]], axis=2) * fr[:, None, :]  # ∂f/∂p: (k, N, 3)
        Jw = J * wk[:, :, None]
        H = np.matmul(Jw.transpose(0, 2, 1), J)  # (k, 3, 3)
        g = np.einsum("kni,kn->ki", Jw, yk - f)
        diag = np.einsum("kii->ki", H)
        M = H + (lam[k, None] * diag + (1 - fr) + 1e-12)[:, :, None] * np.eye(3)
        step = np.linalg.solve(M, g[:, :, None])[:, :, 0]
        cand = np.clip(pk + step * fr, lo[k], hi[k])
        sse_c = np.sum(wk * (yk - _model(ln_c, r0k, cand)[0]) ** 2, axis=1)
        ok = sse_c < sse[k]
        gain = np.where(ok, sse[k] - sse_c, 0.0)
        p[k] = np.where(ok[:, None], cand, pk)
        sse[k] = np.where(ok, sse_c, sse[k])
        lam[k] = np.clip(np.where(ok, lam[k] / 3, lam[k] * 4), 1e-9, 1e9)
        # converged: a tiny relative gain, or repeated failures (λ large) mean no step helps any more
        active[k] = ~((ok & (gain <= 1e-10 * (sse[k] + 1e-12))) | (lam[k] >= 1e6))
    return p, sse


def _model(ln_c: FloatArray, r0: FloatArray, p: FloatArray) -> tuple[FloatArray, FloatArray, FloatArray]:
    """f, σ, ln C − ln C_mid, each [K, N], for parameters p: [K, 3] = (A, B, ln C_mid)."""
    x = ln_c[None, :] - p[:, 2:3]
    s = expit(p[:, 1:2] * x)
    return r0[:, None] + (p[:, 0] - r0)[:, None] * s, s, x
