"""The side port's metrics follow the role's status(): counters by delta, gauges by value."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from scalerl.runtime.telemetry_glue import StatusMetrics
from scalerl.telemetry.steps import StepTimes


def _values(metrics: StatusMetrics) -> dict[str, float]:
    return {s.name: s.value for fam in text_string_to_metric_families(metrics.render().decode())
            for s in fam.samples if not s.labels}


def test_learner_status_becomes_metrics():
    status = {"ready": True, "tokens_trained": 100, "groups_consumed": 8, "policy_version": 2,
              "staleness_versions": 0.5, "eval_pass_rate": 0.41, "compute_device_hours": 0.002,
              "fit_A": 0.8, "fit_A_low": 0.7, "fit_A_high": 0.9, "fit_B": 1.5, "fit_C_mid": 0.01, "fit_R0": 0.4,
              "staleness_bound": 8.0}
    m = StatusMetrics("learner", lambda: status)
    v = _values(m)
    assert v["scalerl_learner_tokens_total"] == 100 and v["scalerl_learner_groups_in_total"] == 8
    status.update(tokens_trained=250)  # a counter grows by the difference, never resets
    v = _values(m)
    assert v["scalerl_learner_tokens_total"] == 250
    assert v["scalerl_learner_policy_version"] == 2 and v["scalerl_learner_ready"] == 1
    assert v["scalerl_learner_eval_pass_rate"] == 0.41 and v["scalerl_learner_fit_a_high"] == 0.9
    assert v["scalerl_learner_fit_c_mid_device_hours"] == 0.01
    assert v["scalerl_learner_staleness_bound_versions"] == 8


def test_fit_and_eval_gauges_have_no_sample_until_the_learner_has_them():
    status: dict = {"ready": True, "staleness_bound": 2.0, "compute_device_hours": 0.0}
    m = StatusMetrics("learner", lambda: status)
    text = m.render().decode()
    v = _values(m)
    assert "scalerl_learner_eval_pass_rate" not in v and "scalerl_learner_fit_a" not in v  # not a 0
    assert "# TYPE scalerl_learner_fit_a gauge" in text  # the family is declared, without a sample
    assert v["scalerl_learner_staleness_bound_versions"] == 2
    status.update(eval_pass_rate=0.25, fit_A=0.6)
    v = _values(m)
    assert v["scalerl_learner_eval_pass_rate"] == 0.25 and v["scalerl_learner_fit_a"] == 0.6
    del status["fit_A"]  # the newest data cannot support a fit: no value, rather than the old one
    assert "scalerl_learner_fit_a" not in _values(m)


def test_step_durations_go_into_the_histogram_once():
    steps = StepTimes()
    m = StatusMetrics("generator", lambda: {"ready": True}, steps)
    for s in (0.02, 0.3, 4.0):
        steps.observe(s)
    v = _values(m)
    assert v["scalerl_generator_step_seconds_count"] == 3
    assert abs(v["scalerl_generator_step_seconds_sum"] - 4.32) < 1e-9
    steps.observe(1.0)
    v = _values(m)  # drained at each scrape: the three earlier ones are not observed again
    assert v["scalerl_generator_step_seconds_count"] == 4
    assert abs(v["scalerl_generator_step_seconds_sum"] - 5.32) < 1e-9


def test_every_role_feeds_groups_in_and_out():
    statuses = {
        "generator": {"prompts_consumed": 5, "groups_generated": 4, "staleness_versions": 1},
        "verifier": {"rollouts_consumed": 6, "groups_scored": 6},
        "learner": {"groups_consumed": 8, "versions_published": 3},
        "curriculum": {"scored_consumed": 7, "prompts_issued": 9, "lag": {"job.scored": 2}},
    }
    for role, status in statuses.items():
        v = _values(StatusMetrics(role, lambda s=status: s))
        ins = next(val for key, val in status.items() if key in ("prompts_consumed", "rollouts_consumed",
                                                                 "groups_consumed", "scored_consumed"))
        outs = next(val for key, val in status.items() if key in ("groups_generated", "groups_scored",
                                                                  "versions_published", "prompts_issued"))
        assert v[f"scalerl_{role}_groups_in_total"] == ins, role
        assert v[f"scalerl_{role}_groups_out_total"] == outs, role
    v = _values(StatusMetrics("generator", lambda: statuses["generator"]))
    assert v["scalerl_generator_policy_staleness_versions"] == 1
    lag = StatusMetrics("curriculum", lambda: statuses["curriculum"]).render().decode()
    assert 'scalerl_curriculum_queue_lag_messages{topic="job.scored"} 2.0' in lag


def test_the_budget_forecast_is_exported_without_a_point_while_not_identified():
    from types import SimpleNamespace

    from scalerl.runtime.learner_service import LearnerService

    fit = {"A": 0.7, "budget_compute": 0.4, "budget_identified": 0.0, "budget_low": 0.3, "budget_high": 0.9}
    host = SimpleNamespace(spec=SimpleNamespace(off_policy=SimpleNamespace(k=4)), last_eval={"pass_rate": 0.5},
                           last_fit=fit)
    status = {"ready": True, **LearnerService._progress(host)}  # type: ignore[arg-type]
    v = _values(StatusMetrics("learner", lambda: status))
    assert v["scalerl_learner_forecast_budget_identified"] == 0.0
    assert (v["scalerl_learner_forecast_budget_low"], v["scalerl_learner_forecast_budget_high"]) == (0.3, 0.9)
    assert "scalerl_learner_forecast_budget_pass_rate" not in v  # a range, not a point
    host.last_fit = {**fit, "budget_identified": 1.0, "budget_pass_rate": 0.62}
    status = {"ready": True, **LearnerService._progress(host)}  # type: ignore[arg-type]
    assert _values(StatusMetrics("learner", lambda: status))["scalerl_learner_forecast_budget_pass_rate"] == 0.62
