"""The noise of a run's evals: sampling noise plus a checkpoint wobble correlated over evals (ours; issue #31).

Each eval's pass rate is y_j = R(c_j) + w_j + e_j, where

- e_j is the sampling noise of its n_prompts × k samples: independent from eval to eval (fresh samples),
  variance v_j known from the eval itself (`Curve.eval_var`);
- w_j is the policy's wobble: shared by every prompt of the eval (so a bootstrap over prompts never sees
  it) and an AR(1) process over evals, with correlation `WOBBLE_AR` from one eval to the next and variance
  τ². The step-0 eval measures the starting checkpoint itself, which has no wobble.

So the evals' covariance is Σ = diag(v) + τ²·R with R_ij = φ^|i − j| between evals with a wobble (i, j
count evals of the run, so an eval left out of the window still counts in the distance).

τ² is estimated by restricted maximum likelihood (REML) about a fitted curve: with r the residuals and J
[N, 4] the curve's Jacobian there,

    ℓ(τ²) = −½ (log|Σ| + log|JᵀΣ⁻¹J| + rᵀ(Σ⁻¹ − Σ⁻¹J(JᵀΣ⁻¹J)⁻¹JᵀΣ⁻¹)r),

evaluated over τ²/v̄ ∈ [1/64, 64] on a log grid (v̄ the mean sampling variance). Unlike the residual
variance, REML counts what the fitted curve absorbs of a slow wobble: a curve fitted to 5–30 evals follows
a wobble that lasts several evals, and its residuals hardly show it. One short run pins τ² poorly: the
REML maximum is 0 in about half of the simulated runs fitted on half of their compute, though every one
has a wobble. So τ² is its mean under the REML likelihood with a log-uniform prior on [v̄/64, 64·v̄], not
the maximum (below v̄/64 the wobble adds under 2% to an eval's variance: the lower end hardly matters). On
simulated runs with a known wobble (τ² ≈ 8e-5) this mean averages 1e-4, where the maximum's median is low
by a third and a flat prior's mean is high by a factor of 4.

φ is fixed, not estimated: the residuals of one short run cannot tell φ = 0.5 from 0.9. 0.7 is a prior
(consecutive checkpoints share most of their training). A wrong φ costs little: with runs simulated at
φ = 0.4 or 0.9 (`bench/forecast_calibration.py --wobble-ar`, 100 runs per regime) the intervals from half a
run still cover 0.93–0.99 of the final evals, and from three quarters 0.91–0.98.

Without sampling variances (records without `k` or per-prompt rates) half of the residual variance of an
unweighted fit is taken as sampling noise.

Shapes: N data points (the R0 point first, then the fitted evals by compute); matrices [N, N].
"""

from __future__ import annotations

import numpy as np
from scipy.linalg import solve_triangular
from scipy.special import expit

from scalerl.scaling.curves import FloatArray

WOBBLE_AR = 0.7
"""Correlation of the checkpoint wobble from one eval to the next (a prior, see the module docstring)."""
_TAU2_GRID = np.geomspace(1 / 64, 64, 25)  # τ² / v̄
_V_MIN = 1e-12  # variance floor: a noise-free point still has a finite weight


def covariance(v: FloatArray, pos: FloatArray, wobbly: np.ndarray, tau2: float, phi: float = WOBBLE_AR) -> FloatArray:
    """Σ = diag(v) + τ²·R: [N, N]. v: [N] sampling variances; pos: [N] eval positions in the run; wobbly: [N]
    bool, the evals with a wobble (not the step-0 eval nor a given R0)."""
    lag = np.abs(pos[:, None] - pos[None, :])
    r = np.where(wobbly[:, None] & wobbly[None, :], phi**lag, 0.0)
    return np.diag(np.maximum(v, _V_MIN)) + tau2 * r


def whitener(cov: FloatArray) -> FloatArray:
    """W: [N, N] with Wᵀ W = Σ⁻¹ (the inverse Cholesky factor), so ‖W r‖² is the generalised SSE."""
    chol = np.linalg.cholesky(cov)
    return np.asarray(solve_triangular(chol, np.eye(cov.shape[0]), lower=True))


def jacobian(q: FloatArray, ln_c: FloatArray) -> FloatArray:
    """∂R/∂(R0, A, B, ln C_mid) of R = R0·(1 − s) + A·s, s = expit(B·(ln c − ln C_mid)): [N, 4]."""
    x = ln_c - q[3]
    with np.errstate(invalid="ignore"):
        s = expit(q[2] * x)
    ds = s * (1 - s)
    gain = q[1] - q[0]
    finite = np.isfinite(x)  # ln c = −∞ (compute 0): s = 0 and every derivative but ∂/∂R0 vanishes
    db = np.where(finite, gain * ds * np.where(finite, x, 0.0), 0.0)
    dm = np.where(finite, -gain * ds * q[2], 0.0)
    return np.column_stack([1 - s, s, db, dm])


def reml_tau2(v: FloatArray, pos: FloatArray, wobbly: np.ndarray, resid: FloatArray, jac: FloatArray,
              phi: float = WOBBLE_AR) -> float:
    """The wobble variance τ² from the residuals [N] of a fitted curve and its Jacobian [N, p]: its mean under
    the REML likelihood with a log-uniform prior on [v̄/64, 64·v̄] (see the module docstring)."""
    scale = float(np.mean(v[wobbly])) if wobbly.any() else float(np.mean(v))
    tau2 = _TAU2_GRID * scale  # log-spaced: equal prior mass per point
    ll = np.array([_reml_loglik(covariance(v, pos, wobbly, float(t), phi), resid, jac) for t in tau2])
    if not np.isfinite(ll).any():
        return float(scale)
    post = np.exp(ll - ll[np.isfinite(ll)].max())  # 0 where not finite
    return float(np.sum(post * tau2) / np.sum(post))


def _reml_loglik(cov: FloatArray, resid: FloatArray, jac: FloatArray) -> float:
    try:
        chol = np.linalg.cholesky(cov)
    except np.linalg.LinAlgError:
        return -np.inf
    whitened = solve_triangular(chol, np.column_stack([resid, jac]), lower=True)  # W·[r, J], W = L⁻¹
    wr, wj = whitened[:, 0], whitened[:, 1:]
    info = wj.T @ wj  # JᵀΣ⁻¹J
    sign, logdet_info = np.linalg.slogdet(info + 1e-12 * np.eye(info.shape[0]) * np.trace(info))
    if sign <= 0:
        return -np.inf
    proj = np.linalg.lstsq(wj, wr, rcond=None)[0]
    quad = float(wr @ wr - wr @ (wj @ proj))
    logdet_cov = 2.0 * float(np.sum(np.log(np.diag(chol))))  # |Σ| = |L|², L triangular
    return float(-0.5 * (logdet_cov + logdet_info + quad))
