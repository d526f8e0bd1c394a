"""Each eval's own sampling variance read from its records, and the one early-regime window of the CLI, the
bench and the online fit: a fraction of the run's total compute (issue #31)."""

from __future__ import annotations

import numpy as np
import pytest

from scalerl.config import FitConfig
from scalerl.report.online import analyse_run, budget_compute
from scalerl.scaling import curve_from_records, fit_window, sigmoid


def test_eval_variance_from_prompt_rates_or_counts() -> None:
    recs = [
        # 4 prompts of k = 4 samples: Σ r(1 − r)/(k − 1)/P² = (0 + 3/16 + 1/4 + 3/16)/3/16
        {"kind": "eval", "compute": 0.0, "pass_rate": 0.5, "k": 4, "prompt_pass_rates": [0.0, 0.25, 0.5, 0.75]},
        # counts only: p(1 − p)/(n_prompts·k) = 0.24/(100·8)
        {"kind": "eval", "compute": 1.0, "pass_rate": 0.6, "k": 8, "n_prompts": 100},
    ]
    v = curve_from_records(recs).eval_var
    assert v is not None
    assert v[0] == pytest.approx((3 / 16 + 1 / 4 + 3 / 16) / 3 / 16)
    assert v[1] == pytest.approx(0.24 / 800)
    recs.append({"kind": "eval", "compute": 2.0, "pass_rate": 0.7})  # no k: the curve has no variances
    assert curve_from_records(recs).eval_var is None


def _records(n: int = 21, end: float = 100.0) -> list[dict[str, object]]:
    c = np.linspace(0.0, end, n)
    y = sigmoid(c, A=0.8, B=2.0, C_mid=end / 5, R0=0.2)
    return [{"kind": "eval", "step": 10 * i, "compute": float(ci), "pass_rate": float(yi)}
            for i, (ci, yi) in enumerate(zip(c, y, strict=True))]


def test_the_window_does_not_move_with_the_end_of_the_fit() -> None:
    curve = curve_from_records(_records())
    full = fit_window(curve, min_compute_fraction=0.2)
    half = fit_window(curve, min_compute_fraction=0.2, max_compute=50.0)
    assert full.min_compute == half.min_compute == pytest.approx(20.0)  # 0.2 × the run's 100, both times
    assert half.compute.min() == full.compute.min() == 20.0
    budget = fit_window(curve, min_compute_fraction=0.1, max_compute=50.0, total_compute=200.0)
    assert budget.min_compute == pytest.approx(20.0) and budget.total_compute == 200.0  # 0.1 × the budget


def test_the_online_fit_takes_the_cutoff_of_the_runs_budget() -> None:
    """Half-way through a 200-step run (evals every 10 steps, compute 0.5 per step), the budget is the compute
    of the last eval × 200/100, and the online fit leaves out what the finished run's fit will."""
    recs = _records(n=11, end=50.0)  # steps 0..100
    assert budget_compute(recs, 200) == pytest.approx(100.0)
    assert budget_compute(recs[:1], 200) is None  # only step 0
    settings = FitConfig(min_compute_fraction=0.1, bootstrap=0)
    mid = analyse_run(recs, settings, total_steps=200)
    done = analyse_run(_records(n=21, end=100.0), settings, total_steps=200)
    assert mid is not None and done is not None
    assert mid.min_compute == done.min_compute == pytest.approx(10.0)
    so_far = analyse_run(recs, settings)  # without the plan: a fraction of the compute so far
    assert so_far is not None and so_far.min_compute == pytest.approx(5.0)
