"""`scalerl run` stops on an identified plateau forecast (issue #31): the real training loop, checkpoints,
summary and report, with the held-out evaluation replaced by a simulated one whose pass rate saturates (a
trained tiny model cannot be relied on to plateau within a unit test's budget)."""

from __future__ import annotations

import json

import numpy as np
import pytest

import scalerl.runtime.trainer as trainer_mod
from scalerl.config import spec_from_dict
from scalerl.evaluation.heldout import EvalResult
from scalerl.runtime.embedded import EmbeddedRun

# one_kernel: the stop follows the simulated evaluations, whatever the trained weights
pytestmark = pytest.mark.one_kernel

STEPS, EVERY, PROMPTS, K = 30, 1, 64, 8


def _spec(tiny_spec, stop_policy: dict | None):
    tree = tiny_spec.model_dump()
    tree["train"].update(steps=STEPS, checkpoint_every=STEPS)
    tree["eval"]["every_steps"] = EVERY
    tree["fit"] = {"bootstrap": 0}
    if stop_policy is not None:
        tree["stop_policy"] = stop_policy
    return spec_from_dict(tree)


def _simulated_evals(monkeypatch, shape) -> list[int]:
    """Replace the held-out evaluation: the i-th eval's prompts pass at rate shape(i) (i = 0 at step 0),
    k = 8 Bernoulli samples each from a seeded generator. Returns the list of eval indices seen."""
    rng = np.random.default_rng(7)
    seen: list[int] = []

    def fake(*args, **kwargs) -> EvalResult:
        i = len(seen)
        seen.append(i)
        rates = rng.binomial(K, shape(i), PROMPTS) / K
        return EvalResult(pass_rate=float(rates.mean()), k=K, n_prompts=PROMPTS, gen_tokens=0, truncation_rate=0.0,
                          prompt_pass_rates=rates.tolist())

    monkeypatch.setattr(trainer_mod, "evaluate_mean_at_k", fake)
    return seen


def plateau(i: int) -> float:
    """Saturated by the 4th eval (step 8): 0.2 → 0.7."""
    return 0.2 + 0.5 * (1.0 - np.exp(-i / 1.5))


def not_yet_bent(i: int) -> float:
    """A sigmoid whose midpoint lies at twice the budget (eval 60 of 30): far from bent until near the end."""
    return 0.1 + 0.8 / (1.0 + (60.0 / i) ** 1.5) if i else 0.1


@pytest.mark.timeout(600)
def test_a_simulated_plateau_stops_the_run_early_with_the_reason(tiny_spec, tmp_path, monkeypatch) -> None:
    _simulated_evals(monkeypatch, plateau)
    out = tmp_path / "run"
    summary = EmbeddedRun(_spec(tiny_spec, {"min_gain": 0.03}), out, show_progress=False).run()
    stop = summary["stopped_early"]
    assert stop is not None and stop["reason"] == "ForecastPlateau"
    assert summary["steps"] == stop["step"] < STEPS
    assert stop["gain_high"] < 0.03 and stop["budget_compute"] > stop["compute"] > 0
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["stopped_early"]["reason"] == "ForecastPlateau"
    assert (out / "checkpoints" / f"step_{stop['step']:06d}").is_dir()  # the stopping step's weights are kept
    kinds = [json.loads(line)["kind"] for line in (out / "train.jsonl").read_text().splitlines()]
    assert kinds.count("stop") == 1
    assert "ForecastPlateau" in (out / "report.html").read_text()


@pytest.mark.timeout(600)
def test_an_unidentified_forecast_never_stops_the_run(tiny_spec, tmp_path, monkeypatch) -> None:
    """min_gain 0.99: any identified forecast of the budget's end would stop the run (its gain's upper end is
    below 0.99), so the run must go on through every fit whose forecast is not identified, and stop, if at
    all, at the first identified one (near the end, forecasting the end gets easy)."""
    seen = _simulated_evals(monkeypatch, not_yet_bent)
    out = tmp_path / "run"
    summary = EmbeddedRun(_spec(tiny_spec, {"min_gain": 0.99}), out, show_progress=False).run()
    fits = [r for r in map(json.loads, (out / "train.jsonl").read_text().splitlines()) if r["kind"] == "fit"]
    unidentified = [f["step"] for f in fits if f.get("budget_identified") == 0.0]
    assert len(unidentified) >= 3, [(f["step"], f.get("budget_identified")) for f in fits]
    stop = summary["stopped_early"]
    # (the last eval's fit forecasts that eval itself: nothing is left to stop)
    first_identified = next((f["step"] for f in fits if f.get("budget_identified") == 1.0 and f["step"] < STEPS),
                            None)
    if stop is None:
        assert first_identified is None and summary["steps"] == STEPS and len(seen) == STEPS // EVERY + 1
    else:
        assert stop["step"] == first_identified == summary["steps"] and stop["reason"] == "ForecastPlateau"
        assert all(step < stop["step"] for step in unidentified)
