"""The iso-compute frontier and its train-or-sample answer, on hand-made checkpoints."""

from __future__ import annotations

import pytest

from scalerl.evaluation.frontier import (
    CheckpointCurve,
    compute_points,
    frontier_report,
    pareto_frontier,
    train_or_sample,
)

# Two checkpoints. Inference: 1e-6 device-hours per token, 100 tokens per sample, 10 problems served
# -> k samples cost k * 100 * 1e-6 * 10 = k * 1e-3 device-hours.
EARLY = CheckpointCurve(step=100, rl_device_hours=0.010, device_hours_per_token=1e-6, ks=(1, 4, 16),
                        accuracy=(0.50, 0.70, 0.80), gen_tokens_per_problem=(100.0, 400.0, 1600.0))
LATE = CheckpointCurve(step=200, rl_device_hours=0.020, device_hours_per_token=1e-6, ks=(1, 4, 16),
                       accuracy=(0.60, 0.75, 0.82), gen_tokens_per_problem=(100.0, 400.0, 1600.0))


def test_totals_add_rl_and_inference():
    pts = {(p.step, p.k): p for p in compute_points([EARLY, LATE], problems=10)}
    assert pts[(100, 4)].inference_device_hours == pytest.approx(0.004)
    assert pts[(100, 4)].total_device_hours == pytest.approx(0.014)
    assert pts[(200, 16)].total_device_hours == pytest.approx(0.036)


def test_pareto_frontier():
    # totals: early 0.011/0.014/0.026 (acc .50/.70/.80), late 0.021/0.024/0.036 (acc .60/.75/.82)
    # by total: .011 .50 | .014 .70 | .021 .60 (dominated) | .024 .75 | .026 .80 | .036 .82
    front = pareto_frontier(compute_points([EARLY, LATE], problems=10))
    assert [(p.step, p.k) for p in front] == [(100, 1), (100, 4), (200, 4), (100, 16), (200, 16)]


def test_answer_sample_more_when_a_smaller_model_with_more_samples_wins():
    pts = compute_points([EARLY, LATE], problems=10)
    # budget 0.021 (the late checkpoint, 1 sample): early x4 (0.014, acc .70) beats late x1 (.60)
    a = train_or_sample(pts, 0.021)
    assert a["answer"] == "sample more"
    assert (a["best"]["step"], a["best"]["k"]) == (100, 4)
    assert (a["best_sampling_once"]["step"], a["best_sampling_once"]["k"]) == (200, 1)
    assert a["gain_over_sampling_once"] == pytest.approx(0.10)
    # from the best (early, k=4): next k (16) gains .10 over .012 device-hours; next checkpoint (late, k=4)
    # gains .05 over .010 device-hours
    m = a["marginal_accuracy_per_device_hour"]
    assert m["next_k"] == pytest.approx(0.10 / 0.012)
    assert m["next_checkpoint"] == pytest.approx(0.05 / 0.010)


def test_answer_train_more_when_serving_many_problems():
    # 10,000 problems: k samples cost k device-hours, so only single samples fit small budgets.
    pts = compute_points([EARLY, LATE], problems=10_000)
    a = train_or_sample(pts, 1.05)
    assert a["answer"] == "train more" and (a["best"]["step"], a["best"]["k"]) == (200, 1)
    assert train_or_sample(pts, 0.5)["answer"] == "over budget"


def test_report_default_budgets_are_the_single_sample_totals():
    rep = frontier_report([EARLY, LATE], problems=10)
    assert [a["budget_device_hours"] for a in rep["answers"]] == pytest.approx([0.011, 0.021])
    assert rep["answers"][0]["answer"] == "train more"  # only early x1 fits 0.011
    with pytest.raises(ValueError, match="problems"):
        compute_points([EARLY], problems=0)
