"""Simulated RL runs from known curves: the calibration data of the forecast intervals (ours; issue #31).

Pure, seeded numpy; the records look like a run's metrics.jsonl eval records, so the calibration goes
through the same path as `scalerl fit` (`curve_from_records` → `analyse_curve`).

Noise model of one run (every eval uses the same held-out prompts, as a real run does):

1. A known curve: R0 ~ U(`R0_RANGE`), A ~ U(R0 + 0.2, min(0.9, R0 + 0.6)), B ~ U(`B_RANGE`) (the paper's
   fits lie in 1.09–2.44) and C_mid / total compute log-uniform in the regime's range (`REGIMES`).
2. Per-prompt difficulty: prompt i starts at r0_i ~ Beta with mean R0 and gains the fraction
   g_i ~ Beta with mean (A − R0)/(1 − R0) of what it has left, both of concentration
   `SimSettings.concentration`: p_i(C) = r0_i + g_i·(1 − r0_i)·s(C). The prompt set's mean is then
   exactly a sigmoid (with the set's own A and R0, which differ from the population's by sampling).
3. Policy wobble: at eval t every prompt's logit moves by the same w_t, an AR(1) process over evals
   (correlation `SimSettings.wobble_ar` from one eval to the next, marginal sd `SimSettings.wobble_sd`);
   the step-0 eval is the fixed starting checkpoint (no wobble).
4. Sampling: k samples per prompt, pass rate = the mean of n_prompts × k Bernoulli draws.

Regimes (C_mid as a fraction of the run's total compute): "bent" — the curve has bent over by half the
run; "near" — it bends around half; "not-yet" — it has not bent by half the run.

Shapes: per run, compute [E + 1] (step 0 first), per-prompt rates [E + 1, n_prompts].
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.special import expit, logit

from scalerl.scaling.curves import FloatArray

REGIMES: dict[str, tuple[float, float]] = {"bent": (0.08, 0.2), "near": (0.35, 0.6), "not-yet": (0.8, 1.6)}
"""C_mid / the run's total compute, log-uniform within these bounds, per regime."""
R0_RANGE = (0.1, 0.4)
B_RANGE = (1.2, 2.5)
_P_EPS = 1e-6  # keep probabilities off 0 and 1 before the logit


@dataclass(frozen=True, slots=True, kw_only=True)
class SimSettings:
    """One simulated run's eval set and noise (defaults: issue #31's careful-user setting)."""

    n_prompts: int = 128
    """Held-out prompts per eval (the same prompts at every eval)."""
    k: int = 8
    """Samples per prompt per eval."""
    n_evals: int = 40
    """Evals after the step-0 eval, evenly spaced in compute up to `total_compute`."""
    total_compute: float = 100.0
    """The run's total compute (device-hours; the unit does not matter)."""
    wobble_sd: float = 0.05
    """Marginal sd of the shared logit shift at an eval (≈ 0.009 in pass rate for these prompts, against a
    sampling sd of ≈ 0.013). With it the prompt bootstrap shipped before issue #31 behaves as the issue
    measured: from half the run its band covers the final eval in 0.91 / 0.85 / 0.88 of bent / near /
    not-yet runs (200 each; the issue: 0.91 / 0.78 / 0.82) and its point is within ±0.02 of it in about
    50% / 22% / 13% (60 each; the issue: 54% / 27% / 18%)."""
    wobble_ar: float = 0.7
    """Correlation of the shared shift from one eval to the next."""
    concentration: float = 2.0
    """Concentration (α + β) of the per-prompt Beta draws: small = very unequal prompts."""


@dataclass(frozen=True, slots=True, eq=False)
class SimRun:
    """One simulated run: its eval records and the curve its prompt set follows."""

    records: list[dict[str, Any]]
    regime: str
    A: float
    """The prompt set's ceiling (mean over prompts of r0_i + g_i·(1 − r0_i))."""
    B: float
    C_mid: float
    R0: float
    """The prompt set's starting pass rate (mean of r0_i)."""

    def true_curve(self, compute: FloatArray) -> FloatArray:
        """The prompt set's expected pass rate without wobble at compute [M]: [M]."""
        with np.errstate(divide="ignore"):
            s = expit(self.B * (np.log(compute) - np.log(self.C_mid)))
        return np.asarray(self.R0 + (self.A - self.R0) * s)


def _beta(rng: np.random.Generator, mean: float, conc: float, size: int) -> FloatArray:
    return rng.beta(max(mean * conc, 1e-3), max((1 - mean) * conc, 1e-3), size)


def simulate_run(regime: str, seed: int, settings: SimSettings | None = None) -> SimRun:
    """One run of `regime` ("bent", "near", "not-yet"); the same (regime, seed, settings) gives the same run."""
    if regime not in REGIMES:
        raise ValueError(f"regime must be one of {sorted(REGIMES)}, got {regime!r}")
    cfg = settings or SimSettings()
    rng = np.random.default_rng([seed, sorted(REGIMES).index(regime)])
    r0 = rng.uniform(*R0_RANGE)
    a = rng.uniform(r0 + 0.2, min(0.9, r0 + 0.6))
    b = rng.uniform(*B_RANGE)
    lo, hi = REGIMES[regime]
    c_mid = cfg.total_compute * float(np.exp(rng.uniform(np.log(lo), np.log(hi))))
    r0_i = _beta(rng, r0, cfg.concentration, cfg.n_prompts)  # [P]
    g_i = _beta(rng, (a - r0) / (1 - r0), cfg.concentration, cfg.n_prompts)  # [P]
    compute = np.linspace(0.0, cfg.total_compute, cfg.n_evals + 1)  # [E + 1]
    with np.errstate(divide="ignore"):
        s = expit(b * (np.log(compute) - np.log(c_mid)))  # [E + 1], 0 at step 0
    p = r0_i[None, :] + (g_i * (1 - r0_i))[None, :] * s[:, None]  # [E + 1, P]
    wobble = np.zeros(cfg.n_evals + 1)
    innov = rng.normal(0.0, cfg.wobble_sd, cfg.n_evals)
    wobble[1] = innov[0]
    for t in range(2, cfg.n_evals + 1):
        wobble[t] = cfg.wobble_ar * wobble[t - 1] + np.sqrt(1 - cfg.wobble_ar**2) * innov[t - 1]
    p = expit(logit(np.clip(p, _P_EPS, 1 - _P_EPS)) + wobble[:, None])
    rates = rng.binomial(cfg.k, p) / cfg.k  # [E + 1, P]
    records = [
        {
            "kind": "eval",
            "step": 10 * t,
            "compute": float(compute[t]),
            "pass_rate": float(rates[t].mean()),
            "k": cfg.k,
            "n_prompts": cfg.n_prompts,
            "prompt_pass_rates": rates[t].tolist(),
        }
        for t in range(cfg.n_evals + 1)
    ]
    a_set = float(np.mean(r0_i + g_i * (1 - r0_i)))
    return SimRun(records=records, regime=regime, A=a_set, B=b, C_mid=c_mid, R0=float(r0_i.mean()))
