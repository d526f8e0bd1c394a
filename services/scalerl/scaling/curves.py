"""The two compute–performance curves of ScaleRL (spec §1.1, §1.7) and their fitted-parameter records.

Units: compute `C` is in device-hours (the paper's GPU-hours on GB200; ours are devices allocated × wall
hours, summed over roles). Pass rates are fractions in [0, 1] (mean@k on the held-out set).

    sigmoid    R(C) = R0 + (A − R0) / (1 + (C_mid / C)^B)       (spec §1.1)
    power law  R(C) = A − D / C^B                                (spec §1.7, App. A.4)
    linearised F(R) = C_mid^B / ((A − R0) / (R − R0) − 1) = C^B   (spec §1.1: log F vs log C has slope B)

The sigmoid is written as `R0 + (A − R0)·expit(B·(ln C − ln C_mid))`, which is the same function but
finite for every C ≥ 0: at C = 0 it is exactly R0 (the limit of the formula), so a step-0 eval record
is consistent with the curve even though it carries no information about A, B or C_mid.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import expit

from scalerl.scaling.constants import A_MARGIN as A_MARGIN

FloatArray = NDArray[np.float64]



class FitError(ValueError):
    """The data cannot support a fit. The message says what is wrong and what is needed."""


def sigmoid(compute: ArrayLike, *, A: float, B: float, C_mid: float, R0: float) -> FloatArray:
    """Pass rate of the saturating curve at `compute` (spec §1.1).

    compute: [...] device-hours, ≥ 0 (C = 0 gives R0). Returns an array of the same shape.
    """
    c = np.asarray(compute, dtype=np.float64)
    with np.errstate(divide="ignore"):
        z = B * (np.log(c) - np.log(C_mid))  # ln 0 = −inf → expit(−inf) = 0 → R0
    return np.asarray(R0 + (A - R0) * expit(z), dtype=np.float64)


def power_law(compute: ArrayLike, *, A: float, B: float, D: float) -> FloatArray:
    """Pass rate of the power law R = A − D / C^B (spec §1.7). compute: [...] device-hours, > 0."""
    c = np.asarray(compute, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.asarray(A - D * c ** (-B), dtype=np.float64)


def linearised_efficiency(pass_rate: ArrayLike, *, A: float, B: float, C_mid: float, R0: float) -> FloatArray:
    """F(R) = C_mid^B / ((A − R0)/(R − R0) − 1), which equals C^B on the curve (spec §1.1).

    Plotting log F against log C therefore gives a line of slope B through the origin; the paper uses
    this view to compare efficiency at a shared A (LOO, §1.5). pass_rate: [...]; entries outside
    (R0, A) have no finite F and come back as NaN.
    """
    r = np.asarray(pass_rate, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        f = C_mid**B / ((A - R0) / (r - R0) - 1.0)
    inside = (r > min(R0, A)) & (r < max(R0, A))
    return np.where(inside & np.isfinite(f) & (f > 0), f, np.nan)


@dataclass(frozen=True, slots=True)
class SigmoidFit:
    """A fitted sigmoid. A, R0: pass rates in [0, 1]; B: dimensionless (> 0); C_mid: device-hours."""

    A: float
    """Asymptotic pass rate (the ceiling), R0 < A ≤ 1."""
    B: float
    """Scaling exponent: steepness on log-compute; larger is more compute-efficient."""
    C_mid: float
    """Compute (device-hours) at which half of the gain A − R0 is reached."""
    R0: float
    """Pass rate at zero RL compute (the starting checkpoint); fixed, not fitted, unless given."""
    n_points: int
    """Points in the sum of squares (compute > 0 and inside the fit window)."""
    sse: float
    """Sum of squared residuals of the pass rate over those points."""
    r2: float
    """1 − SSE / total sum of squares about the mean of those points."""

    def predict(self, compute: ArrayLike) -> FloatArray:
        """Expected pass rate at `compute` ([...] device-hours); same shape as the input."""
        return sigmoid(compute, A=self.A, B=self.B, C_mid=self.C_mid, R0=self.R0)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class PowerLawFit:
    """A fitted power law R = A − D / C^B; compute in device-hours (shown beside the sigmoid, §1.7)."""

    A: float
    """Asymptote; bounded by 1.0, where an early fit usually lands (the paper's A = 1.0 vs 0.65)."""
    B: float
    """Exponent (> 0)."""
    D: float
    """Scale (> 0), in pass-rate × device-hours^B."""
    n_points: int
    sse: float
    r2: float

    def predict(self, compute: ArrayLike) -> FloatArray:
        return power_law(compute, A=self.A, B=self.B, D=self.D)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def r_squared(y: FloatArray, sse: float, weights: FloatArray | None = None) -> float:
    """1 − SSE/SST for observations y: [N] (weighted when `weights` [N] is given)."""
    w = np.ones_like(y) if weights is None else weights
    mean = float(np.sum(w * y) / np.sum(w))
    sst = float(np.sum(w * (y - mean) ** 2))
    return 1.0 - sse / sst if sst > 0 else float("nan")
